// The client: each check goes straight to its key's owner over ringlimit.v1 (one gRPC channel
// per member and one CheckStream on it, concurrent checks for one owner coalesced into one
// request; unary CheckBatch calls where a member takes no stream), within a short
// deadline; past it, or when the owner cannot be reached, the local fallback answers
// (`degraded`). Hot keys are optionally leased and decided in process (`leased`).
import * as grpc from '@grpc/grpc-js';
import { randomUUID } from 'node:crypto';
import { type Answer, unixMs } from './answer.js';
import { ConfigError, RinglimitError, splitStatus } from './errors.js';
import { Fallback, type FallbackShare, type ShareTaken } from './fallback.js';
import { connect, num, toAnswer, toMark, unreachable, type RateLimiterClient } from './grpc.js';
import { HOT_DEFAULTS, HotKeys, type HotSettings } from './hotkeys.js';
import { CheckStream, refusesStream } from './stream.js';
import { loadTls, type Tls, type TlsOptions } from './tls.js';
import { DENIED, FORWARD, Held, LEASE_DEFAULTS, type Due, type Grant_, type LeaseEntry, type LeaseSettings, type Mark, type Return } from './lease.js';
import { bucketId } from './hash.js';
import { checkKey, invalidKeyLength, maxCost, resolveInline, type InlineRule, type Resolved } from './rules.js';
import {
  EMPTY,
  fromHttp,
  fromTopology,
  getJson,
  membersOf,
  parseSeed,
  sameRules,
  topologyCall,
  type ClusterJson,
  type RulesJson,
  type Seed,
  type Topology,
} from './topology.js';
import type { CheckBatchResponse__Output } from './gen/ringlimit/v1/CheckBatchResponse.js';
import type { CheckRequest } from './gen/ringlimit/v1/CheckRequest.js';
import type { LeaseResponse__Output } from './gen/ringlimit/v1/LeaseResponse.js';
import type { GiveBackResponse__Output } from './gen/ringlimit/v1/GiveBackResponse.js';
import type { ReserveResponse__Output } from './gen/ringlimit/v1/ReserveResponse.js';
import type { CheckResponse__Output } from './gen/ringlimit/v1/CheckResponse.js';
import type { TopologyResponse__Output } from './gen/ringlimit/v1/TopologyResponse.js';

/** One check: may `key` spend `cost` under the rule now? */
export interface Check {
  /** The client identity (user id, IP, API key...), 1 to 512 bytes. */
  key: string;
  /** A rule of the cluster (its name), or an inline rule. */
  rule?: string | InlineRule;
  /** Shorthand for an inline token bucket of `limit` per `periodMs` (with `algorithm`, `burst`). */
  limit?: number;
  periodMs?: number;
  algorithm?: InlineRule['algorithm'];
  burst?: number;
  /** Tokens this check takes (default 1); 0 reads the state without taking. */
  cost?: number;
}

export interface ClientOptions {
  /** Nodes to discover the cluster from: HTTP base URLs (`http://host:8080`; `https://` for
   * nodes with `--tls-cert`), or `grpc://host:port` (ringlimit.v1's Topology directly). */
  seeds: string[];
  /** TLS to nodes with `--tls-cert` (implied by `https://` seeds): every channel and discovery
   * request, to seeds and to the members the topology names, then speaks TLS. `ca`: the CA of
   * the nodes' certificates (PEM, or a file's path; default Node's roots); `serverName`: the
   * name their certificates are checked against when members are dialed by IP. */
  tls?: TlsOptions;
  /** A client credential (a token of role `check`): sent as `authorization: Bearer <token>`
   * on every call. Leases and all-or-nothing give-backs need it when the nodes have a secret
   * or tokens. */
  token?: string;
  /** Lease hot keys from their owners and decide their checks in process (default false). */
  leases?: boolean;
  /** The cluster's id: nodes of another cluster are ignored (default `ringlimit`). */
  clusterId?: string;
  /** How long a check waits for its owner before the fallback answers (default 5 ms). */
  deadlineMs?: number;
  /** Each discovery request's timeout (default 500 ms). */
  discoveryTimeoutMs?: number;
  /** How often nodes without WatchTopology are read again (default 1000 ms). */
  refreshMs?: number;
  /** WatchTopology's longest quiet time (default 2000 ms): a stream silent for longer is
   * replaced by one to another member. */
  heartbeatMs?: number;
  /** `open` (default): the fallback answers, `degraded`; `closed`: an `unavailable` error. */
  failMode?: 'open' | 'closed';
  /** The fallback's share of a limit: `per-member` (limit ÷ members alive, default) or a
   * fixed `{ fraction }`. */
  fallbackShare?: FallbackShare;
  /** Bound on the fallback's buckets (default 100,000). */
  fallbackMaxKeys?: number;
  /** Who holds this client's leases (default a random UUID per client). */
  holder?: string;
  /** gRPC addresses (`host:port`) of members that advertise none, by node id: nodes older
   * than ringlimit.v1's Topology call say only their HTTP address. */
  grpcAddrs?: Record<string, string>;
  /** Lease and hot-key tuning (tests). */
  leaseSettings?: Partial<LeaseSettings>;
  hotSettings?: Partial<HotSettings>;
}

/** What a client has done so far. */
export interface ClientStats {
  /** Checks answered by their owner. */
  direct: number;
  /** Checks answered by the local fallback. */
  degraded: number;
  /** Checks decided in process on a lease (admitted, and denied as the owner said). */
  leased: number;
  leasedDenied: number;
  /** Requests sent (CheckStream requests, or CheckBatch calls) and the checks they carried
   * (checks ÷ batches: the batching factor). */
  batches: number;
  checksSent: number;
  /** Of `batches`, those answered on a CheckStream; and the streams opened. */
  streamed: number;
  streamsOpened: number;
  /** Lease asks sent, slices granted, tokens held now, tokens given back. */
  leaseAsks: number;
  leaseGrants: number;
  leasedTokens: number;
  tokensGivenBack: number;
  /** Topology messages applied, and failed discovery rounds. */
  refreshes: number;
  refreshFailures: number;
  fallbackBuckets: number;
}

/** A request decided against all its limits (POST /v1/check/all). */
export interface AllAnswer {
  /** Every enforced limit admitted, and each took its cost. */
  allowed: boolean;
  /** The index of the binding limit: when denied, the denying check with the longest wait;
   * when admitted, the enforced check with the least remaining. */
  binding: number;
  /** One answer per check, in order; after a denial they read as if the request never came. */
  results: Answer[];
  /** Any result was made without its owner. */
  degraded: boolean;
}

/** A reservation of an estimated cost at the bucket's owner: `settle` it with the actual cost. */
export interface Reservation {
  /** The estimate is taken (false: denied, nothing kept, nothing to settle). */
  readonly allowed: boolean;
  /** Its id (empty when denied): any node's `POST /v1/settle` can settle it too. */
  readonly id: string;
  readonly estimate: number;
  /** The check's answer to the estimate. */
  readonly answer: Answer;
  /** The actual cost `settle()` and the `reserve(..., fn)` helper settle with (default: the estimate). */
  actual: number;
  /** Settles at `actual` (once; later calls answer the first settle's answer). */
  settle(actual?: number): Promise<Answer | undefined>;
}

/** A resolved rule and the buckets of it seen so far. */
interface RuleCache {
  rule: Resolved;
  slots: Map<string, Slot>;
}

/** A (rule, key) seen before: its bucket id, owner and lease, cached so that the hot path does
 * not hash. */
interface Slot {
  id: bigint;
  key: string;
  rule: Resolved;
  ringGen: number;
  link: Link | undefined;
  leaseGen: number;
  lease: LeaseEntry | undefined;
}

/** A check waiting for its owner. */
interface Pending {
  req: CheckRequest;
  slot: Slot;
  cost: number;
  /** Unix ms by which it must be answered. */
  deadline: number;
  resolve: (a: Answer) => void;
  reject: (e: Error) => void;
}

/** One gRPC channel to one member, and its batch queue. */
interface Link {
  nodeId: string;
  addr: string;
  client: RateLimiterClient;
  queue: Pending[];
  inFlight: boolean;
  scheduled: boolean;
  /** Its check stream (opened at the first check, again after one breaks). */
  stream?: CheckStream;
  /** The member refused the stream (an older node, no credential): unary calls there. */
  unaryOnly?: boolean;
}

/** Most checks in one CheckBatch. */
const MAX_BATCH = 1000;
/** Most checks in one all-or-nothing request. */
export const MAX_ALL = 32;
/** How long lease asks and give-backs may take (checks go to the owner meanwhile). */
const LEASE_WITHIN_MS = 500;
/** How often held slices are looked at while any are held. */
const SWEEP_MS = 20;
/** Refreshes asked for by failing checks are at most this frequent. */
const MIN_REFRESH_GAP_MS = 100;
/** Bound on cached (rule, key) pairs per rule; beyond it the rule's cache starts again. */
const MAX_SLOTS = 100_000;
/** Bound on cached inline rules. */
const MAX_INLINE_RULES = 10_000;
/** One check in this many is counted for hot keys, with this weight. */
const SAMPLE = 8;
/** Reconnect backoff of the topology stream. */
const BACKOFF_MIN_MS = 100;
const BACKOFF_MAX_MS = 5_000;

const monotonic = () => performance.now();

export class Client {
  private readonly seeds: Seed[];
  private readonly tls: Tls | undefined;
  private readonly opts: Required<Pick<ClientOptions, 'clusterId' | 'deadlineMs' | 'discoveryTimeoutMs' | 'refreshMs' | 'heartbeatMs' | 'failMode'>>;
  private readonly md = new grpc.Metadata();
  private readonly grpcAddrs: Record<string, string>;
  private readonly fallback: Fallback;
  private topo: Topology = EMPTY;
  private ringGen = 0;
  private links = new Map<string, Link>();
  /** Members' links that serve gRPC, for global rules and members without an address. */
  private anyLinks: Link[] = [];
  private nextAny = 0;
  private named = new Map<string, RuleCache>();
  private inline = new Map<string, RuleCache>();
  private inlineByObject = new WeakMap<object, RuleCache>();
  private readonly held: Held | undefined;
  private readonly hot: HotKeys | undefined;
  readonly holder: string;
  private turn = 0;
  private closed = false;
  private readonly timers: NodeJS.Timeout[] = [];
  private readyResolve!: () => void;
  private readonly readyPromise: Promise<void>;
  private started = false;
  private watch: grpc.ClientReadableStream<TopologyResponse__Output> | undefined;
  private watchdog: NodeJS.Timeout | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  private backoffMs = BACKOFF_MIN_MS;
  private lastRefresh = 0;
  private refreshing: Promise<void> | undefined;
  private askScheduled = false;
  private asking = false;
  private sweep: NodeJS.Timeout | undefined;
  private readonly stat = {
    direct: 0,
    degraded: 0,
    leased: 0,
    leasedDenied: 0,
    batches: 0,
    checksSent: 0,
    streamed: 0,
    streamsOpened: 0,
    leaseAsks: 0,
    leaseGrants: 0,
    tokensGivenBack: 0,
    refreshes: 0,
    refreshFailures: 0,
  };

  constructor(options: ClientOptions) {
    if (!options || !Array.isArray(options.seeds) || options.seeds.length === 0) throw new ConfigError("no seeds: give at least one node's address");
    const schemes = new Set(options.seeds.filter((s) => typeof s === 'string' && s.includes('://')).map((s) => s.trim().split('://')[0]!.toLowerCase()));
    if (schemes.has('http') && schemes.has('https')) throw new ConfigError("seeds mix http:// and https://: a cluster's nodes serve TLS (--tls-cert) or none does");
    // TLS on every channel and discovery request: an https:// seed, or the `tls` option.
    const tls = schemes.has('https') || options.tls !== undefined;
    this.seeds = options.seeds.map((s) => {
      const seed = typeof s === 'string' ? parseSeed(s, tls) : undefined;
      if (!seed && tls && typeof s === 'string' && s.trim().startsWith('http://')) throw new ConfigError(`seed ${JSON.stringify(s)} is plaintext, but \`tls\` asks for TLS: give https://`);
      if (!seed) throw new ConfigError(`seed ${JSON.stringify(s)} is not an http://host:port, https://host:port or grpc://host:port address`);
      return seed;
    });
    this.tls = tls ? loadTls(options.tls ?? {}) : undefined;
    const deadlineMs = options.deadlineMs ?? 5;
    if (!(deadlineMs > 0)) throw new ConfigError('deadlineMs must be greater than zero');
    const share = options.fallbackShare ?? 'per-member';
    if (share !== 'per-member' && !(share.fraction > 0 && share.fraction <= 1)) throw new ConfigError(`fallback share ${share.fraction} must be in (0, 1]`);
    this.opts = {
      clusterId: options.clusterId ?? 'ringlimit',
      deadlineMs,
      discoveryTimeoutMs: options.discoveryTimeoutMs ?? 500,
      refreshMs: options.refreshMs ?? 1_000,
      heartbeatMs: Math.min(60_000, Math.max(1_000, options.heartbeatMs ?? 2_000)),
      failMode: options.failMode ?? 'open',
    };
    this.grpcAddrs = { ...options.grpcAddrs };
    if (options.token) this.md.set('authorization', `Bearer ${options.token}`);
    this.fallback = new Fallback(options.fallbackMaxKeys ?? 100_000, share);
    this.holder = options.holder ?? randomUUID();
    this.readyPromise = new Promise((r) => (this.readyResolve = r));
    if (options.leases) {
      this.held = new Held({ ...LEASE_DEFAULTS, ...options.leaseSettings }, () => this.scheduleAsk());
      this.hot = new HotKeys({ ...HOT_DEFAULTS, ...options.hotSettings });
      this.every(this.hot.settings.tickMs, () => this.tickHot());
    }
    void this.discover();
  }

  // ---------------------------------------------------------------------------------------
  // Checks

  /** Decides one check: in process on a lease, at its owner within the deadline, or from the
   * local fallback (`degraded`). Rejects only for a mistake in the check itself (a
   * RinglimitError: invalid_key, unknown_rule, invalid_limit...), or with fail mode `closed`. */
  check(check: Check): Promise<Answer> {
    let answer: Answer | undefined;
    try {
      answer = this.tryCheck(check);
    } catch (e) {
      return Promise.reject(e);
    }
    return answer ? Promise.resolve(answer) : this.remote(check);
  }

  /** The synchronous fast path: the answer when this process can decide `check` alone (a
   * leased hot key: admitted on its slice, or denied as its owner said), else undefined (call
   * `check`). With `out`, the answer is written there and nothing is allocated. */
  tryCheck(check: Check, out?: Answer): Answer | undefined {
    const held = this.held;
    if (held === undefined || !this.started) return undefined;
    const slot = this.slot(check);
    if (slot === undefined || slot.rule.global || !slot.rule.leasable) return undefined;
    if (++this.turn === SAMPLE) {
      this.turn = 0;
      this.hot!.record(slot.id, SAMPLE);
    }
    if (held.count === 0) return undefined;
    if (slot.leaseGen !== held.gen) {
      slot.lease = held.entries.get(slot.id);
      slot.leaseGen = held.gen;
    }
    const e = slot.lease;
    if (e === undefined) return undefined;
    const a = out ?? ({} as Answer);
    const took = held.take(e, check.cost ?? 1, monotonic(), slot.key, slot.rule, a);
    if (took === FORWARD) return undefined;
    if (took === DENIED) this.stat.leasedDenied++;
    else this.stat.leased++;
    return a;
  }

  /** A check that goes over the network (or to the fallback). */
  private async remote(check: Check): Promise<Answer> {
    if (!this.started) await this.readyPromise;
    let slot = this.slot(check);
    if (slot === undefined) {
      // A named rule the topology lacks: look again once (rules change), then it is an error.
      const name = check.rule as string;
      if (this.topo.rules === undefined) return this.degrade(undefined, undefined, check.cost ?? 1);
      await this.refreshSoon();
      slot = this.slot(check);
      if (slot === undefined) throw new RinglimitError('unknown_rule', `no rule named ${JSON.stringify(name)} is configured`);
    }
    const cost = check.cost ?? 1;
    const link = this.route(slot);
    if (link === undefined) return this.degrade(slot.id, slot.rule, cost);
    return new Promise<Answer>((resolve, reject) => {
      const req: CheckRequest = { key: slot.key, cost, ...slot.rule.wire };
      this.enqueue(link, { req, slot: slot!, cost, deadline: Date.now() + this.opts.deadlineMs, resolve, reject });
    });
  }

  /** The cached slot of a check, made on first sight: the key and rule validated, the bucket
   * named. Undefined for a named rule the topology does not know (or before it is known). */
  private slot(check: Check): Slot | undefined {
    const key = check.key;
    const rule = check.rule;
    let cache: RuleCache | undefined;
    if (typeof rule === 'string') {
      cache = this.named.get(rule);
      if (cache === undefined) {
        const r = this.topo.rules?.get(rule);
        if (r === undefined) {
          checkKey(key);
          return undefined;
        }
        cache = { rule: r, slots: new Map() };
        this.named.set(rule, cache);
      }
    } else {
      cache = this.inlineCache(check);
    }
    let slot = cache.slots.get(key);
    if (slot === undefined) {
      if (invalidKeyLength(key) >= 0) checkKey(key);
      const cost = check.cost ?? 1;
      if (!Number.isSafeInteger(cost) || cost < 0) throw new RinglimitError('invalid_cost', `\`cost\` must be a whole number of tokens, got ${String(cost)}`);
      if (cache.slots.size >= MAX_SLOTS) cache.slots.clear();
      slot = { id: bucketId(cache.rule.seed, key), key, rule: cache.rule, ringGen: -1, link: undefined, leaseGen: -1, lease: undefined };
      cache.slots.set(key, slot);
    }
    const cost = check.cost;
    if (cost !== undefined && cost !== 1) {
      if (!Number.isSafeInteger(cost) || cost < 0) throw new RinglimitError('invalid_cost', `\`cost\` must be a whole number of tokens, got ${String(cost)}`);
      const capacity = maxCost(slot.rule);
      if (cost > capacity) throw new RinglimitError('invalid_cost', `\`cost\` ${cost} exceeds the capacity ${capacity} of this rule, so it could never be admitted`);
    }
    return slot;
  }

  private inlineCache(check: Check): RuleCache {
    const given = check.rule;
    if (given !== undefined && typeof given === 'object') {
      const known = this.inlineByObject.get(given);
      if (known) return known;
    }
    const spec: InlineRule =
      given !== undefined && typeof given === 'object'
        ? given
        : check.limit !== undefined || check.periodMs !== undefined
          ? { limit: check.limit as number, periodMs: check.periodMs as number, algorithm: check.algorithm, burst: check.burst }
          : (() => {
              throw new RinglimitError('invalid_rule', 'invalid rule: give `rule` (a name or an inline rule) or `limit` and `periodMs`');
            })();
    const sig = `${spec.limit}|${spec.periodMs}|${spec.algorithm ?? ''}|${spec.burst ?? ''}|${spec.period ?? ''}|${spec.calendar ?? ''}|${spec.timezone ?? ''}`;
    let cache = this.inline.get(sig);
    if (cache === undefined) {
      cache = { rule: resolveInline(spec), slots: new Map() };
      if (this.inline.size >= MAX_INLINE_RULES) this.inline.clear();
      this.inline.set(sig, cache);
    }
    if (given !== undefined && typeof given === 'object') this.inlineByObject.set(given, cache);
    return cache;
  }

  /** The link a slot's checks go to: its owner's (global rules: any member's). */
  private route(slot: Slot): Link | undefined {
    if (slot.rule.global) return this.anyLink();
    if (slot.ringGen !== this.ringGen) {
      const owner = this.topo.ring.owner(slot.id);
      slot.link = owner === undefined ? undefined : this.links.get(owner) ?? this.anyLink();
      slot.ringGen = this.ringGen;
    }
    return slot.link;
  }

  private anyLink(): Link | undefined {
    const n = this.anyLinks.length;
    if (n === 0) return undefined;
    this.nextAny = (this.nextAny + 1) % n;
    return this.anyLinks[this.nextAny];
  }

  /** The fallback's answer (or, fail-closed, the error). */
  private degrade(id: bigint | undefined, rule: Resolved | undefined, cost: number): Answer {
    if (this.opts.failMode === 'closed') {
      throw new RinglimitError('unavailable', id === undefined ? 'no cluster member reached yet' : 'no cluster member answered');
    }
    this.stat.degraded++;
    return this.fallback.fallBack(id ?? 0n, rule, cost, this.topo.ring.size, unixMs())[0];
  }

  private settleFallback(p: Pending): void {
    try {
      p.resolve(this.degrade(p.slot.id, p.slot.rule, p.cost));
    } catch (e) {
      p.reject(e as Error);
    }
  }

  private enqueue(link: Link, p: Pending): void {
    link.queue.push(p);
    if (!link.inFlight && !link.scheduled) {
      link.scheduled = true;
      // Whatever is checked in this turn of the event loop goes in one batch; no wait in time.
      queueMicrotask(() => this.flush(link));
    }
  }

  /** Sends what is queued for `link` as one request on its check stream, or one CheckBatch
   * where the member takes no stream (what queues meanwhile goes next). */
  private flush(link: Link): void {
    link.scheduled = false;
    if (link.inFlight || link.queue.length === 0) return;
    const now = Date.now();
    // Checks whose deadline passed while queued behind a slow call are answered at once.
    let batch = link.queue.splice(0, MAX_BATCH);
    const late = batch.filter((p) => p.deadline <= now);
    if (late.length > 0) {
      for (const p of late) this.settleFallback(p);
      this.refreshSoon();
      batch = batch.filter((p) => p.deadline > now);
    }
    if (batch.length === 0) {
      if (link.queue.length > 0) this.flush(link);
      return;
    }
    link.inFlight = true;
    this.stat.batches++;
    this.stat.checksSent += batch.length;
    if (!link.unaryOnly && this.sendOnStream(link, batch)) return;
    this.sendUnary(link, batch);
  }

  /** `batch` as one request on `link`'s check stream (opened when it has none or it broke);
   * false when it could not be sent there. The request has the oldest check's deadline:
   * unanswered by then, the stream is aborted (its checks fall back; the next request opens
   * a new one), as a unary call is cancelled at its deadline. */
  private sendOnStream(link: Link, batch: Pending[]): boolean {
    let s = link.stream;
    if (s === undefined || s.broken) {
      try {
        s = link.stream = new CheckStream(link.client, this.md);
      } catch {
        return false;
      }
      this.stat.streamsOpened++;
    }
    const stream = s;
    const timer = setTimeout(() => stream.abort(), Math.max(batch[0]!.deadline - Date.now(), 0));
    const sent = stream.send(
      batch.map((p) => p.req),
      (err, res) => {
        clearTimeout(timer);
        if (err && refusesStream(err.code)) {
          // Never decided there: unary calls decide them, and the member's checks from now on.
          link.unaryOnly = true;
          link.stream = undefined;
          this.sendUnary(link, batch);
          return;
        }
        link.inFlight = false;
        if (res?.error) {
          const e = new RinglimitError(res.error.error, res.error.message);
          for (const p of batch) p.reject(e);
        } else {
          if (res) this.stat.streamed++;
          this.answerBatch(batch, err, res);
        }
        if (link.queue.length > 0 && !link.scheduled) this.flush(link);
      },
    );
    if (!sent) clearTimeout(timer);
    return sent;
  }

  /** `batch` as one CheckBatch call. */
  private sendUnary(link: Link, batch: Pending[]): void {
    const done = (err: grpc.ServiceError | null, res?: CheckBatchResponse__Output) => {
      link.inFlight = false;
      this.answerBatch(batch, err, res);
      if (link.queue.length > 0 && !link.scheduled) this.flush(link);
    };
    try {
      link.client.CheckBatch({ checks: batch.map((p) => p.req) }, this.md, { deadline: batch[0]!.deadline }, done);
    } catch (e) {
      done({ code: grpc.status.UNAVAILABLE, details: String(e) } as grpc.ServiceError);
    }
  }

  private answerBatch(batch: Pending[], err: grpc.ServiceError | null, res?: Pick<CheckBatchResponse__Output, 'results'>): void {
    if (err || !res) {
      if (!err || unreachable(err.code)) {
        for (const p of batch) this.settleFallback(p);
        this.refreshSoon();
      } else {
        const e = splitStatus(err.details, 'invalid_request');
        for (const p of batch) p.reject(e);
      }
      return;
    }
    batch.forEach((p, i) => {
      const r = res.results[i];
      if (r?.answer) {
        this.stat.direct++;
        p.resolve(toAnswer(r.answer));
      } else if (r?.error) {
        if (r.error.error === 'unknown_rule') this.refreshSoon();
        p.reject(new RinglimitError(r.error.error, r.error.message));
      } else {
        this.settleFallback(p);
      }
    });
  }

  // ---------------------------------------------------------------------------------------
  // All-or-nothing

  /** Decides one request against all `checks` (1 to 32), all-or-nothing: each is held at its
   * owner; when any enforced limit denies, every held one is given back (GiveBack) before the
   * answer returns, and none keeps its cost. Owners that cannot answer are replaced by the
   * fallback share, as for `check`. */
  async checkAll(checks: Check[]): Promise<AllAnswer> {
    if (!Array.isArray(checks) || checks.length === 0 || checks.length > MAX_ALL) {
      throw new RinglimitError('invalid_batch', `\`checks\` must hold 1 to ${MAX_ALL} checks, got ${Array.isArray(checks) ? checks.length : 0}`);
    }
    if (!this.started) await this.readyPromise;
    const slots: Array<Slot | undefined> = [];
    for (const [index, c] of checks.entries()) {
      try {
        let s = this.slot(c);
        if (s === undefined && this.topo.rules !== undefined) {
          await this.refreshSoon();
          s = this.slot(c);
          if (s === undefined) throw new RinglimitError('unknown_rule', `no rule named ${JSON.stringify(c.rule)} is configured`);
        }
        slots.push(s);
      } catch (e) {
        if (e instanceof RinglimitError) throw new RinglimitError(e.code, `check ${index}: ${e.message}`, index);
        throw e;
      }
    }
    for (let second = 1; second < slots.length; second++) {
      const first = slots.findIndex((s, i) => i < second && s !== undefined && slots[second] !== undefined && s.id === slots[second]!.id);
      if (first >= 0) {
        throw new RinglimitError('duplicate_check', `checks ${first} and ${second} name the same bucket (same rule and key); give it once with the summed \`cost\``);
      }
    }
    const n = checks.length;
    const results: Answer[] = new Array(n);
    const holds: Array<Mark | undefined> = new Array(n);
    const taken: Array<ShareTaken | undefined> = new Array(n);
    const costs = checks.map((c) => c.cost ?? 1);
    const byLink = new Map<Link, number[]>();
    const local: number[] = [];
    slots.forEach((s, i) => {
      const link = s === undefined ? undefined : this.route(s);
      if (link === undefined) local.push(i);
      else byLink.set(link, [...(byLink.get(link) ?? []), i]);
    });
    const fallBack = (i: number) => {
      const s = slots[i];
      if (this.opts.failMode === 'closed') throw new RinglimitError('unavailable', `check ${i}: no cluster member answered`, i);
      this.stat.degraded++;
      const [a, t] = this.fallback.fallBack(s?.id ?? 0n, s?.rule, costs[i]!, this.topo.ring.size, unixMs());
      results[i] = a;
      taken[i] = t;
    };
    local.forEach(fallBack);
    const errors: RinglimitError[] = [];
    await Promise.all(
      [...byLink].map(async ([link, idx]) => {
        const reqs: CheckRequest[] = idx.map((i) => ({ key: slots[i]!.key, cost: costs[i], hold: !slots[i]!.rule.global, ...slots[i]!.rule.wire }));
        try {
          const res = await this.unary<CheckBatchResponse__Output>(link, 'CheckBatch', { checks: reqs }, Math.max(this.opts.deadlineMs, 1));
          this.stat.batches++;
          this.stat.checksSent += idx.length;
          idx.forEach((i, j) => {
            const r = res.results[j];
            if (r?.answer) {
              this.stat.direct++;
              results[i] = toAnswer(r.answer);
              holds[i] = toMark(r.answer.hold);
            } else if (r?.error) {
              errors.push(new RinglimitError(r.error.error, `check ${i}: ${r.error.message}`, i));
            } else {
              fallBack(i);
            }
          });
        } catch (e) {
          if (e instanceof RinglimitError) {
            errors.push(e);
            return;
          }
          this.refreshSoon();
          idx.forEach(fallBack);
        }
      }),
    );
    const shadow = slots.map((s) => s?.rule.shadow ?? false);
    const allowed = results.every((a) => a !== undefined && a.allowed);
    if (errors.length > 0 || !allowed) {
      await this.giveBackAll(slots, costs, results, holds, taken);
      if (errors.length > 0) throw errors.sort((a, b) => (a.index ?? 0) - (b.index ?? 0))[0];
    }
    return { allowed, binding: binding(results, shadow), results, degraded: results.some((a) => a.degraded) };
  }

  /** Gives back what an all-or-nothing request's admitted checks took: holds at their owners
   * (GiveBack under each hold's mark), fallback shares here; their answers then read as if the
   * request never came. */
  private async giveBackAll(slots: Array<Slot | undefined>, costs: number[], results: Answer[], holds: Array<Mark | undefined>, taken: Array<ShareTaken | undefined>): Promise<void> {
    const now = unixMs();
    const byLink = new Map<Link, Array<{ i: number; mark: Mark }>>();
    results.forEach((a, i) => {
      if (!a?.allowed) return;
      const t = taken[i];
      if (t) this.fallback.refund(t, now);
      const mark = holds[i];
      const s = slots[i];
      if (mark && s) {
        const link = this.route(s);
        if (link) byLink.set(link, [...(byLink.get(link) ?? []), { i, mark }]);
      }
      if (t || mark) a.remaining += costs[i]!;
    });
    await Promise.all(
      [...byLink].map(async ([link, items]) => {
        const req = { items: items.map(({ i, mark }) => ({ key: slots[i]!.key, tokens: costs[i], mark, ...slots[i]!.rule.wire })) };
        try {
          const res = await this.unary<GiveBackResponse__Output>(link, 'GiveBack', req, LEASE_WITHIN_MS);
          for (const h of res.honoured) this.stat.tokensGivenBack += num(h);
        } catch {
          // Not given back: those costs stay taken at the owner (under-admission only).
        }
      }),
    );
  }

  // ---------------------------------------------------------------------------------------
  // Reservations

  /** Reserves `cost` (the estimate) of the check's bucket at its owner for `ttlMs` (default
   * 60 s). With `fn`, calls it with the reservation and settles on its exit (also when it
   * throws) at the `actual` cost it set (default the estimate), answering what `fn` returns;
   * without, answers the reservation to `settle()` later. A denied reservation keeps nothing
   * and settles nothing. Reservations live at the owner and never fall back: without one,
   * a RinglimitError `unavailable`. */
  reserve(check: Check & { ttlMs?: number }): Promise<Reservation>;
  reserve<T>(check: Check & { ttlMs?: number }, fn: (r: Reservation) => T | Promise<T>): Promise<T>;
  async reserve<T>(check: Check & { ttlMs?: number }, fn?: (r: Reservation) => T | Promise<T>): Promise<Reservation | T> {
    if (!this.started) await this.readyPromise;
    let slot = this.slot(check);
    if (slot === undefined) {
      if (this.topo.rules === undefined) throw new RinglimitError('unavailable', 'no cluster member reached yet');
      await this.refreshSoon();
      slot = this.slot(check);
      if (slot === undefined) throw new RinglimitError('unknown_rule', `no rule named ${JSON.stringify(check.rule)} is configured`);
    }
    const link = this.route(slot);
    if (link === undefined) throw new RinglimitError('unavailable', 'no cluster member alive');
    const estimate = check.cost ?? 1;
    const req: Record<string, unknown> = { check: { key: slot.key, cost: estimate, ...slot.rule.wire } };
    if (check.ttlMs !== undefined) req.ttlMs = check.ttlMs;
    let res: ReserveResponse__Output;
    try {
      res = await this.unary<ReserveResponse__Output>(link, 'Reserve', req, Math.max(this.opts.deadlineMs, this.opts.discoveryTimeoutMs));
    } catch (e) {
      if (e instanceof RinglimitError) throw e;
      this.refreshSoon();
      throw new RinglimitError('unavailable', `the bucket's owner did not answer: ${(e as Error).message}`);
    }
    const answer = res.answer ? toAnswer(res.answer) : ({ allowed: false } as Answer);
    let settled: Promise<Answer | undefined> | undefined;
    const r: Reservation = {
      allowed: res.reservation !== '',
      id: res.reservation,
      estimate,
      answer,
      actual: estimate,
      settle: (actual?: number) => {
        if (actual !== undefined) r.actual = actual;
        if (!r.allowed) return Promise.resolve(undefined);
        settled ??= this.settle(r.id, r.actual, link);
        return settled;
      },
    };
    if (!fn) return r;
    try {
      return await fn(r);
    } finally {
      await r.settle();
    }
  }

  /** Settles reservation `id` at its `actual` cost: the bucket's answer afterwards. */
  async settle(id: string, actual: number, via?: Link): Promise<Answer> {
    const link = via && this.links.get(via.nodeId) === via ? via : this.anyLink();
    if (link === undefined) throw new RinglimitError('unavailable', 'no cluster member alive');
    try {
      return toAnswer(await this.unary<CheckResponse__Output>(link, 'Settle', { reservation: id, cost: actual }, Math.max(this.opts.deadlineMs, this.opts.discoveryTimeoutMs)));
    } catch (e) {
      if (e instanceof RinglimitError) throw e;
      throw new RinglimitError('unavailable', `the bucket's owner did not answer: ${(e as Error).message}`);
    }
  }

  /** A unary call on `link` within `ms`: the answer, a RinglimitError for a refusal, or the
   * gRPC error for a member that could not answer. */
  private unary<T>(link: Link, method: 'CheckBatch' | 'GiveBack' | 'Reserve' | 'Settle' | 'Lease', req: object, ms: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const call = (link.client as unknown as Record<string, (r: object, md: grpc.Metadata, o: grpc.CallOptions, cb: (e: grpc.ServiceError | null, v?: T) => void) => void>)[method]!;
      try {
        call.call(link.client, req, this.md, { deadline: Date.now() + ms }, (err, res) => {
          if (err) reject(unreachable(err.code) ? err : splitStatus(err.details, err.code === grpc.status.NOT_FOUND ? 'unknown_reservation' : 'invalid_request'));
          else if (res === undefined) reject(new Error('no answer'));
          else resolve(res);
        });
      } catch (e) {
        reject(e);
      }
    });
  }

  // ---------------------------------------------------------------------------------------
  // Leases

  private tickHot(): void {
    const changes = this.hot!.tick();
    for (const id of changes.promoted) this.held!.want(id);
    for (const id of changes.demoted) this.held!.release(id, 'cooled');
  }

  private scheduleAsk(): void {
    if (this.askScheduled || this.closed) return;
    this.askScheduled = true;
    setImmediate(() => {
      this.askScheduled = false;
      void this.askStep();
    });
  }

  /** One round of the asking task: asks due (one Lease call per owner), returns due (one
   * GiveBack call per owner). */
  private async askStep(): Promise<void> {
    const held = this.held;
    if (!held || this.asking || this.closed) return;
    this.asking = true;
    try {
      const due = held.dueAsks(monotonic());
      if (due.length > 0) await this.ask(due);
      const back = held.returns(monotonic());
      if (back.length > 0) await this.giveBack(back);
    } finally {
      this.asking = false;
    }
    if (held.count > 0 && this.sweep === undefined && !this.closed) {
      this.sweep = setInterval(() => {
        if (held.count === 0 && this.sweep) {
          clearInterval(this.sweep);
          this.sweep = undefined;
        }
        this.scheduleAsk();
      }, SWEEP_MS);
      this.sweep.unref();
    }
  }

  private ownerLink(id: bigint): Link | undefined {
    const owner = this.topo.ring.owner(id);
    return owner === undefined ? undefined : this.links.get(owner);
  }

  private async ask(due: Due[]): Promise<void> {
    const held = this.held!;
    const byLink = new Map<Link, Due[]>();
    for (const d of due) {
      const link = this.ownerLink(d.entry.id);
      if (link === undefined) held.unanswered(d, monotonic());
      else byLink.set(link, [...(byLink.get(link) ?? []), d]);
    }
    await Promise.all(
      [...byLink].map(async ([link, ds]) => {
        this.stat.leaseAsks += ds.length;
        const req = { holder: this.holder, asks: ds.map((d) => ({ key: d.key, want: d.want, demandPerS: d.demandPerS, ...d.rule.wire })) };
        let res: LeaseResponse__Output;
        try {
          res = await this.unary<LeaseResponse__Output>(link, 'Lease', req, LEASE_WITHIN_MS);
        } catch (e) {
          // Refused (no credential, a forbidden one): asked again after the full backoff;
          // unanswered: sooner.
          const now = monotonic();
          for (const d of ds) {
            if (e instanceof RinglimitError) held.answered(d, { error: { code: e.code, message: e.message } }, now);
            else held.unanswered(d, now);
          }
          return;
        }
        const now = monotonic();
        ds.forEach((d, i) => {
          const g = res.grants[i];
          let grant: Grant_;
          if (g?.granted) {
            const a = g.granted.answer;
            grant = {
              granted: {
                tokens: num(g.granted.tokens),
                validMs: num(g.granted.validNs) / 1e6,
                mark: toMark(g.granted.mark) ?? { resetNs: '0', atNs: '0' },
                limit: a ? num(a.limit) : d.rule.limit,
                resetAtMs: a ? num(a.resetAtMs) : 0,
              },
            };
            this.stat.leaseGrants++;
          } else if (g?.refused) {
            grant = { refused: toAnswer(g.refused) };
          } else {
            const code = g?.error?.error ?? 'unsupported';
            if (code === 'not_owner') this.refreshSoon();
            grant = { error: { code, message: g?.error?.message ?? 'the owner does not lease' } };
          }
          held.answered(d, grant, now);
        });
      }),
    );
  }

  private async giveBack(back: Return[]): Promise<void> {
    const byLink = new Map<Link, Return[]>();
    for (const r of back) {
      const link = this.ownerLink(r.id);
      if (link) byLink.set(link, [...(byLink.get(link) ?? []), r]);
    }
    await Promise.all(
      [...byLink].map(async ([link, rs]) => {
        const req = { items: rs.map((r) => ({ key: r.key, tokens: r.tokens, mark: r.mark, ...r.rule.wire })) };
        try {
          const res = await this.unary<GiveBackResponse__Output>(link, 'GiveBack', req, LEASE_WITHIN_MS);
          for (const h of res.honoured) this.stat.tokensGivenBack += num(h);
        } catch {
          // Not given back: those tokens stay taken (under-admission only).
        }
      }),
    );
  }

  // ---------------------------------------------------------------------------------------
  // Topology

  /** Resolves once the first discovery round ended (a topology learnt, or every seed tried). */
  ready(): Promise<void> {
    return this.readyPromise;
  }

  /** The members the client routes to now. */
  members(): string[] {
    return [...this.topo.ring.members];
  }

  /** The node that owns the check's bucket now (undefined: unknown rule, no members). */
  ownerOf(check: Check): string | undefined {
    const s = this.slot(check);
    return s === undefined || s.rule.global ? undefined : this.topo.ring.owner(s.id);
  }

  /** The topology version last applied (ringlimit.v1's; empty when read over HTTP). */
  get topologyVersion(): string {
    return this.topo.version;
  }

  /** A rule's period in ms, as the client knows it (undefined: a named rule not learnt). */
  periodMs(rule: string | InlineRule): number | undefined {
    if (typeof rule === 'string') return this.topo.rules?.get(rule)?.periodMs;
    try {
      return this.inlineCache({ key: 'k', rule }).rule.periodMs;
    } catch {
      return undefined;
    }
  }

  /** The resolved rule of a check (its policy name and period, for headers). */
  resolvedRule(check: Check): Resolved | undefined {
    if (typeof check.rule === 'string') return this.topo.rules?.get(check.rule);
    return this.inlineCache(check).rule;
  }

  stats(): ClientStats {
    return {
      ...this.stat,
      leasedTokens: this.held?.tokens() ?? 0,
      fallbackBuckets: this.fallback.size,
    };
  }

  /** Ends background work, gives back leased tokens (best effort), closes every channel. */
  async close(): Promise<void> {
    if (this.closed) return;
    if (this.held) {
      this.held.releaseAll('closed');
      const back = this.held.returns(monotonic());
      if (back.length > 0) await this.giveBack(back).catch(() => {});
    }
    this.closed = true;
    for (const t of this.timers) clearInterval(t);
    if (this.sweep) clearInterval(this.sweep);
    if (this.pollTimer) clearTimeout(this.pollTimer);
    if (this.watchdog) clearTimeout(this.watchdog);
    this.watch?.cancel();
    for (const l of this.links.values()) this.closeLink(l);
    this.links.clear();
    this.anyLinks = [];
    this.started = true;
    this.readyResolve();
  }

  private every(ms: number, f: () => void): void {
    const t = setInterval(f, ms);
    t.unref();
    this.timers.push(t);
  }

  private closeLink(l: Link): void {
    for (const p of l.queue.splice(0)) this.settleFallback(p);
    l.stream?.abort();
    l.client.close();
  }

  /** Applies a topology: links for new members (or moved ones), rules, the ring. */
  private apply(next: Topology): void {
    if (this.closed) return;
    if (next.clusterId && next.clusterId !== this.opts.clusterId) throw new Error(`node of cluster ${JSON.stringify(next.clusterId)}, not ${JSON.stringify(this.opts.clusterId)}`);
    const old = this.topo;
    for (const m of next.members) if (!m.grpcAddr && this.grpcAddrs[m.nodeId]) m.grpcAddr = this.grpcAddrs[m.nodeId]!;
    const links = new Map<string, Link>();
    for (const m of next.members) {
      if (!m.grpcAddr) continue;
      const have = this.links.get(m.nodeId);
      if (have && have.addr === m.grpcAddr) links.set(m.nodeId, have);
      else links.set(m.nodeId, { nodeId: m.nodeId, addr: m.grpcAddr, client: connect(m.grpcAddr, this.tls), queue: [], inFlight: false, scheduled: false });
    }
    for (const [id, l] of this.links) if (links.get(id) !== l) this.closeLink(l);
    this.links = links;
    this.anyLinks = [...links.values()];
    const ringChanged = !next.ring.sameMembers(old.ring) || [...links.values()].some((l) => old.members.find((m) => m.nodeId === l.nodeId)?.grpcAddr !== l.addr);
    if (!sameRules(old.rules, next.rules)) this.named.clear();
    this.topo = next;
    if (ringChanged) {
      this.ringGen++;
      // Owners may have moved: leases are asked again of the new owners.
      if (old.ring.size > 0) this.held?.releaseAll('ring');
    }
    this.stat.refreshes++;
    this.markStarted();
  }

  private markStarted(): void {
    if (!this.started) {
      this.started = true;
      this.readyResolve();
    }
  }

  /** The first discovery round, then the watch. */
  private async discover(): Promise<void> {
    const found = await this.findTopology();
    this.markStarted();
    if (this.closed) return;
    if (found === undefined) {
      this.stat.refreshFailures++;
      this.retryLater();
      return;
    }
    this.follow(found);
  }

  /** Where to learn the topology from now, in order: the members known, then the seeds.
   * Returns how it was learnt (a member's gRPC address to watch, or an HTTP base to poll). */
  private async findTopology(): Promise<{ grpc: string } | { http: string } | undefined> {
    const t = this.opts.discoveryTimeoutMs;
    const grpcCandidates = this.topo.members.filter((m) => m.grpcAddr).map((m) => m.grpcAddr);
    const tried = new Set<string>();
    const viaGrpc = async (addr: string): Promise<boolean> => {
      if (tried.has(addr)) return false;
      tried.add(addr);
      const client = this.links.get(this.topo.members.find((m) => m.grpcAddr === addr)?.nodeId ?? '')?.client ?? connect(addr, this.tls);
      const own = !this.anyLinks.some((l) => l.client === client);
      try {
        const res = await topologyCall(client, this.md, t);
        this.apply(fromTopology(res, addr));
        return true;
      } catch {
        return false;
      } finally {
        if (own) client.close();
      }
    };
    for (const addr of grpcCandidates) if (await viaGrpc(addr)) return { grpc: addr };
    for (const seed of this.seeds) {
      if ('grpc' in seed) {
        if (await viaGrpc(seed.grpc)) return { grpc: seed.grpc };
        continue;
      }
      let cluster: ClusterJson;
      try {
        cluster = await getJson<ClusterJson>(`${seed.http}/v1/cluster`, t, this.tls);
      } catch {
        continue;
      }
      if (cluster.cluster_id !== this.opts.clusterId) continue;
      for (const m of membersOf(cluster)) if (m.grpcAddr && (await viaGrpc(m.grpcAddr))) return { grpc: m.grpcAddr };
      // Nodes that serve no ringlimit.v1 Topology: read over HTTP.
      try {
        const rules = await getJson<RulesJson>(`${seed.http}/v1/rules`, t, this.tls);
        this.apply(fromHttp(cluster, rules, seed.http));
        return { http: seed.http };
      } catch {
        continue;
      }
    }
    return undefined;
  }

  private retryLater(): void {
    if (this.closed) return;
    const wait = this.backoffMs;
    this.backoffMs = Math.min(BACKOFF_MAX_MS, this.backoffMs * 2);
    this.pollTimer = setTimeout(() => void this.rediscover(), wait);
    this.pollTimer.unref();
  }

  private async rediscover(): Promise<void> {
    if (this.closed) return;
    const found = await this.findTopology();
    if (this.closed) return;
    if (found === undefined) {
      this.stat.refreshFailures++;
      this.retryLater();
    } else {
      this.follow(found);
    }
  }

  /** Keeps the topology fresh from where it was learnt: a WatchTopology stream, or polling. */
  private follow(from: { grpc: string } | { http: string }): void {
    if ('http' in from) {
      this.backoffMs = BACKOFF_MIN_MS;
      this.pollTimer = setTimeout(() => void this.rediscover(), this.opts.refreshMs);
      this.pollTimer.unref();
      return;
    }
    const link = [...this.links.values()].find((l) => l.addr === from.grpc);
    const client = link?.client ?? connect(from.grpc, this.tls);
    const stream = client.WatchTopology({ heartbeatMs: this.opts.heartbeatMs }, this.md);
    this.watch = stream;
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      if (this.watchdog) clearTimeout(this.watchdog);
      if (this.watch === stream) this.watch = undefined;
      stream.cancel();
      if (!link) client.close();
      this.retryLater();
    };
    const arm = () => {
      if (this.watchdog) clearTimeout(this.watchdog);
      // A stream silent past its heartbeat (and some) is dead: watch another member.
      this.watchdog = setTimeout(end, this.opts.heartbeatMs * 2.5);
      this.watchdog.unref();
    };
    arm();
    stream.on('data', (res: TopologyResponse__Output) => {
      arm();
      this.backoffMs = BACKOFF_MIN_MS;
      try {
        if (res.version === '0' || String(res.version) !== this.topo.version || this.topo.source !== from.grpc) this.apply(fromTopology(res, from.grpc));
      } catch {
        end();
      }
    });
    stream.on('error', end);
    stream.on('end', end);
  }

  /** Looks at the topology again soon (a check failed, a rule is unknown, an owner said it is
   * not the owner), at most every MIN_REFRESH_GAP_MS. */
  private refreshSoon(): Promise<void> {
    if (this.refreshing) return this.refreshing;
    const now = monotonic();
    if (now - this.lastRefresh < MIN_REFRESH_GAP_MS || this.closed) return Promise.resolve();
    this.lastRefresh = now;
    const source = this.topo.source;
    const link = [...this.links.values()].find((l) => l.addr === source) ?? this.anyLink();
    const once = async () => {
      if (link) {
        try {
          const res = await topologyCall(link.client, this.md, this.opts.discoveryTimeoutMs);
          this.apply(fromTopology(res, this.topo.source || link.addr));
          return;
        } catch {
          // Fall through to a full discovery round.
        }
      }
      await this.findTopology();
    };
    this.refreshing = once()
      .catch(() => {})
      .finally(() => (this.refreshing = undefined));
    return this.refreshing;
  }
}

/** The binding answer's index (core's all-or-nothing rule): when any enforced check denies,
 * the denying one with the longest wait; when all admit, the enforced one with the least left;
 * shadow rules count only when no enforced rule does. */
export function binding(answers: Answer[], shadow: boolean[]): number {
  const allowed = answers.every((a) => a.allowed);
  const pick = (enforcedOnly: boolean): number | undefined => {
    let best: number | undefined;
    answers.forEach((a, i) => {
      if (enforcedOnly && shadow[i]) return;
      if (allowed) {
        if (best === undefined || a.remaining < answers[best]!.remaining) best = i;
      } else if (!a.allowed && (best === undefined || a.retryAfterMs >= answers[best]!.retryAfterMs)) {
        best = i;
      }
    });
    return best;
  };
  return pick(true) ?? pick(false) ?? 0;
}

