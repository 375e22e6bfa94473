// Leases, the holder's side (core's `lease::Held`, same arithmetic): slices of hot buckets
// taken from their owners (ringlimit.v1 `Lease`), spent here without a round trip, and what
// they had left given back (`GiveBack`). Slices are taken from the bucket before they are
// spent, so a holder never admits more than its owner granted.
//
// What a slice is, per algorithm (decided by the owner, told as `valid_ns`):
// - fixed and sliding window: a count taken in the window current at the grant, spent only
//   while that window lasts;
// - token bucket: tokens spent within 500 ms of the grant.
// A slice's time counts from when the ask left (before the owner decided), so it ends here no
// later than at the owner.
//
// Times are milliseconds on a monotonic clock (the caller's `now`), injected for tests.
import type { Answer } from './answer.js';
import type { Resolved } from './rules.js';

export interface LeaseSettings {
  /** A slice asked for is this much of the holder's demand (ms). */
  spanMs: number;
  /** Most buckets leased at once. */
  maxLeases: number;
  /** Demand assumed before any was measured (checks/s): the hot keys' threshold. */
  initialDemandPerS: number;
  /** After an owner keeps a bucket to itself (or the ask failed), how long before asking again. */
  backoffMs: number;
}

export const LEASE_DEFAULTS: LeaseSettings = { spanMs: 100, maxLeases: 1024, initialDemandPerS: 1_000, backoffMs: 1_000 };

/** Most slices of one bucket kept (the current one and renewals that came early). */
const MOST_GRANTS = 3;

/** A slice's mark, opaque: sent back as received (u64 ns as decimal strings). */
export interface Mark {
  resetNs: string;
  atNs: string;
}

/** Why a holder stopped leasing a bucket. */
export type Release = 'cooled' | 'ring' | 'revoked' | 'closed';

interface Grant {
  seq: number;
  tokens: number;
  mark: Mark;
  untilMs: number;
  limit: number;
  resetAtMs: number;
}

/** One bucket leased (or wanted) here. */
export class LeaseEntry {
  /** What an ask names: learnt from the first check of the bucket after it became hot. */
  key: string | undefined;
  rule: Resolved | undefined;
  grants: Grant[] = [];
  /** The owner's denial, and until when it holds (ms). */
  denied: Answer | undefined;
  deniedUntil = 0;
  /** No ask before then. */
  quietUntil = 0;
  /** An ask is due or on its way. */
  asking = false;
  /** The last slice's size: asks come when less than half of it is left. */
  lastGranted = 0;
  /** Spent since `since`: the demand an ask reports. */
  spent = 0;
  since = 0;
  /** Released: a check holding this entry looks the bucket up again. */
  released = false;

  constructor(readonly id: bigint) {}

  tokens(): number {
    let n = 0;
    for (const g of this.grants) n += g.tokens;
    return n;
  }
}

/** An ask due to a bucket's owner, asked at `atMs`. */
export interface Due {
  entry: LeaseEntry;
  key: string;
  rule: Resolved;
  want: number;
  demandPerS: number;
  atMs: number;
}

/** Unused tokens of a slice going back to the bucket's owner under the grant's mark. */
export interface Return {
  id: bigint;
  key: string;
  rule: Resolved;
  tokens: number;
  mark: Mark;
}

/** The owner's answer to an ask (ringlimit.v1's LeaseGrant). */
export type Grant_ =
  | { granted: { tokens: number; validMs: number; mark: Mark; limit: number; resetAtMs: number } }
  | { refused: Answer }
  | { error: { code: string; message: string } };

/** What `take` found. */
export const FORWARD = 0;
export const LEASED = 1;
export const DENIED = 2;
export type Took = typeof FORWARD | typeof LEASED | typeof DENIED;

/** The leases a client holds: which buckets, their slices, what is due to their owners. */
export class Held {
  readonly entries = new Map<bigint, LeaseEntry>();
  /** Bumped whenever an entry is added or released: cached entries are looked up again. */
  gen = 0;
  private seq = 1;
  private due: LeaseEntry[] = [];
  private back: Return[] = [];
  readonly released: Record<Release, number> = { cooled: 0, ring: 0, revoked: 0, closed: 0 };

  constructor(
    readonly settings: LeaseSettings = LEASE_DEFAULTS,
    /** Called when an ask becomes due or tokens are to go back. */
    private readonly wake: () => void = () => {},
  ) {}

  get count(): number {
    return this.entries.size;
  }

  /** Tokens held in slices now. */
  tokens(): number {
    let n = 0;
    for (const e of this.entries.values()) n += e.tokens();
    return n;
  }

  /** Bucket `id` became hot: lease it (asked at its next check, which names it). False when
   * the table is full. */
  want(id: bigint): boolean {
    if (this.entries.has(id)) return true;
    if (this.entries.size >= this.settings.maxLeases) return false;
    this.entries.set(id, new LeaseEntry(id));
    this.gen++;
    return true;
  }

  /** Bucket `id` is no longer leased here: what its slices have left goes back (but for a
   * revoked bucket). Returns whether it was leased. */
  release(id: bigint, why: Release): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.entries.delete(id);
    e.released = true;
    this.gen++;
    this.released[why]++;
    if (why === 'revoked') return true;
    const before = this.back.length;
    for (const g of e.grants.splice(0)) this.giveUp(e, g);
    if (this.back.length > before) this.wake();
    return true;
  }

  releaseAll(why: Release): number {
    let n = 0;
    for (const id of [...this.entries.keys()]) if (this.release(id, why)) n++;
    return n;
  }

  private giveUp(e: LeaseEntry, g: Grant): void {
    if (g.tokens > 0 && e.key !== undefined && e.rule !== undefined) {
      this.back.push({ id: e.id, key: e.key, rule: e.rule, tokens: g.tokens, mark: g.mark });
    }
  }

  private expire(e: LeaseEntry, now: number): void {
    while (e.grants.length > 0 && e.grants[0]!.untilMs <= now) this.giveUp(e, e.grants.shift()!);
  }

  /** A check of `cost` of the bucket of `e` at `now`: admitted on a slice (LEASED), denied
   * while the owner said so (DENIED), or to be sent to the owner (FORWARD); `out` receives the
   * answer of the first two. `key` and `rule` name the bucket for an ask. Allocates nothing on
   * a leased bucket's steady path. */
  take(e: LeaseEntry, cost: number, now: number, key: string, rule: Resolved, out: Answer): Took {
    if (e.released) return FORWARD;
    if (e.key === undefined) {
      e.key = key;
      e.rule = rule;
    }
    if (e.grants.length > 0 && e.grants[0]!.untilMs <= now) this.expire(e, now);
    // What a slice still holds is spent first, denial or not: those tokens were taken already,
    // and left unspent they would be false denies.
    let took: Grant | undefined;
    if (cost > 0) {
      for (const g of e.grants) {
        if (g.tokens >= cost) {
          took = g;
          break;
        }
      }
    }
    if (took === undefined && e.denied !== undefined) {
      if (now < e.deniedUntil && cost > 0) {
        Object.assign(out, e.denied);
        out.retryAfterMs = Math.max(1, Math.ceil(e.deniedUntil - now));
        out.leased = true;
        out.degraded = false;
        return DENIED;
      }
      e.denied = undefined;
    }
    if (took !== undefined) took.tokens -= cost;
    const left = e.grants.length === 1 ? e.grants[0]!.tokens : e.tokens();
    const low = left * 2 < Math.max(1, e.lastGranted);
    if (!e.asking && now >= e.quietUntil && (took === undefined || low)) {
      e.asking = true;
      this.due.push(e);
      this.wake();
    }
    if (took === undefined) return FORWARD;
    e.spent += cost;
    out.allowed = true;
    out.limit = took.limit;
    out.remaining = left;
    out.resetAtMs = took.resetAtMs;
    out.retryAfterMs = 0;
    out.degraded = false;
    out.leased = true;
    return LEASED;
  }

  /** The asks due now, each marked as on its way. */
  dueAsks(now: number): Due[] {
    const out: Due[] = [];
    for (const e of this.due.splice(0)) {
      if (e.released) continue;
      if (e.key === undefined || e.rule === undefined) {
        e.asking = false;
        continue;
      }
      const elapsed = now - e.since;
      const demand = e.spent > 0 && elapsed > 0 && e.since > 0 ? Math.floor((e.spent * 1000) / elapsed) : this.settings.initialDemandPerS;
      const want = Math.max(1, Math.floor((demand * this.settings.spanMs) / 1000));
      out.push({ entry: e, key: e.key, rule: e.rule, want, demandPerS: demand, atMs: now });
    }
    return out;
  }

  /** The owner's answer to the ask `due`, received at `now`. */
  answered(due: Due, grant: Grant_, now: number): void {
    const e = due.entry;
    if (e.released || this.entries.get(e.id) !== e) {
      // Released meanwhile: the slice goes straight back.
      if ('granted' in grant && grant.granted.tokens > 0) {
        this.back.push({ id: e.id, key: due.key, rule: due.rule, tokens: grant.granted.tokens, mark: grant.granted.mark });
        this.wake();
      }
      return;
    }
    e.asking = false;
    if ('granted' in grant) {
      const g = grant.granted;
      e.grants.push({ seq: this.seq++, tokens: g.tokens, mark: g.mark, untilMs: due.atMs + g.validMs, limit: g.limit, resetAtMs: g.resetAtMs });
      e.lastGranted = g.tokens;
      e.denied = undefined;
      e.spent = 0;
      e.since = now;
      while (e.grants.length > MOST_GRANTS) this.giveUp(e, e.grants.shift()!);
    } else if ('refused' in grant && !grant.refused.allowed) {
      e.denied = grant.refused;
      e.deniedUntil = due.atMs + grant.refused.retryAfterMs;
    } else {
      e.quietUntil = now + this.settings.backoffMs;
    }
  }

  /** The ask of `due` got no answer: asked again after a tenth of the backoff. */
  unanswered(due: Due, now: number): void {
    due.entry.asking = false;
    due.entry.quietUntil = now + this.settings.backoffMs / 10;
  }

  /** What goes back to owners now: slices whose time is up, released buckets' slices. */
  returns(now: number): Return[] {
    for (const e of this.entries.values()) this.expire(e, now);
    return this.back.splice(0);
  }
}
