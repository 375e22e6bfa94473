// What the client knows of the cluster: the alive members with their gRPC addresses, the ring
// they make, and the rules in force; and how it learns them: `GET {seed}/v1/cluster` of an
// HTTP seed names the members, then ringlimit.v1 `Topology` and `WatchTopology` on one member
// keep the view fresh (a `grpc://` seed starts there directly). Nodes that serve no `Topology`
// are read over HTTP (`/v1/cluster`, `/v1/rules`) every refresh interval instead.
import type * as grpc from '@grpc/grpc-js';
import { Ring } from './hash.js';
import { ruleInfo } from './grpc.js';
import { resolveNamed, type Algorithm, type Resolved, type RuleInfoLike } from './rules.js';
import type { TopologyResponse__Output } from './gen/ringlimit/v1/TopologyResponse.js';
import { httpsJson, type Tls } from './tls.js';

export interface Member {
  nodeId: string;
  /** Where it serves ringlimit.v1 (`host:port`); empty when it serves no gRPC. */
  grpcAddr: string;
  httpAddr: string;
}

/** An immutable snapshot, replaced whole when the cluster changes. */
export interface Topology {
  clusterId: string;
  version: string;
  members: Member[];
  ring: Ring;
  /** Undefined until rules were learnt once. */
  rules: Map<string, Resolved> | undefined;
  /** Where it came from: a member's gRPC address or an HTTP base URL. */
  source: string;
}

export const EMPTY: Topology = { clusterId: '', version: '', members: [], ring: new Ring([]), rules: undefined, source: '' };

/** A seed as given: `http://host:port` (`host:port` alone is HTTP too; with TLS,
 * `https://host:port` or `host:port`) or `grpc://host:port`. `http` is the HTTP API's base URL. */
export type Seed = { http: string } | { grpc: string };

export function parseSeed(s: string, tls = false): Seed | undefined {
  const t = s.trim().replace(/\/+$/, '');
  const grpcm = /^grpc:\/\/([^/\s]+:\d+)$/.exec(t);
  if (grpcm) return { grpc: grpcm[1]! };
  const httpm = (tls ? /^(?:https:\/\/)?([^/\s:]+|\[[0-9a-fA-F:.]+\]):(\d+)$/ : /^(?:http:\/\/)?([^/\s:]+|\[[0-9a-fA-F:.]+\]):(\d+)$/).exec(t);
  const scheme = tls ? 'https' : 'http';
  if (httpm && Number(httpm[2]) > 0 && Number(httpm[2]) < 65536) return { http: `${scheme}://${httpm[1]}:${httpm[2]}` };
  return undefined;
}

/** An HTTP address as members advertise it (`host:port`, maybe with a scheme) as a base URL. */
export function httpBase(addr: string, tls = false): string | undefined {
  const s = parseSeed(addr, tls);
  return s && 'http' in s ? s.http : undefined;
}

function rulesOf(infos: RuleInfoLike[]): Map<string, Resolved> {
  const rules = new Map<string, Resolved>();
  for (const info of infos) {
    const r = resolveNamed(info);
    if (r) rules.set(info.name, r);
  }
  return rules;
}

/** A ringlimit.v1 TopologyResponse as a snapshot. */
export function fromTopology(t: TopologyResponse__Output, source: string): Topology {
  const members = t.members
    .map((m) => ({ nodeId: m.nodeId, grpcAddr: m.grpcAddr, httpAddr: m.httpAddr }))
    .sort((a, b) => (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
  const vnodes = t.ring && t.ring.vnodesPerMember > 0 ? t.ring.vnodesPerMember : undefined;
  return {
    clusterId: t.clusterId,
    version: String(t.version),
    members,
    ring: new Ring(
      members.map((m) => m.nodeId),
      vnodes,
    ),
    rules: rulesOf(t.rules.map(ruleInfo)),
    source,
  };
}

/** `GET /v1/cluster`'s answer, as far as the client reads it. */
export interface ClusterJson {
  node_id: string;
  cluster_id: string;
  members: Array<{ node_id: string; http_addr: string; peer_addr?: string; grpc_addr?: string; state: string }>;
}

/** `GET /v1/rules`' answer, as far as the client reads it. */
export interface RulesJson {
  rules: Array<{
    name: string;
    limit: number;
    period_ms: number;
    period: string;
    algorithm: Algorithm;
    burst?: number | null;
    mode: 'owner' | 'global';
    on_owner_unreachable: 'open' | 'closed';
    shadow?: boolean;
    lease?: 'auto' | 'off';
    calendar?: boolean;
    timezone?: string | null;
  }>;
}

/** The alive members of a `/v1/cluster` answer. */
export function membersOf(cluster: ClusterJson): Member[] {
  return cluster.members
    .filter((m) => m.state === 'alive')
    .map((m) => ({ nodeId: m.node_id, grpcAddr: m.grpc_addr ?? '', httpAddr: m.http_addr }))
    .sort((a, b) => (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
}

/** A snapshot from `/v1/cluster` and `/v1/rules` (nodes without ringlimit.v1's Topology). */
export function fromHttp(cluster: ClusterJson, rules: RulesJson, source: string): Topology {
  const members = membersOf(cluster);
  const infos: RuleInfoLike[] = rules.rules.map((r) => {
    const info: RuleInfoLike = {
      name: r.name,
      algorithm: r.algorithm,
      limit: r.limit,
      periodMs: r.period_ms,
      period: r.period,
      global: r.mode === 'global',
      failClosed: r.on_owner_unreachable === 'closed',
      shadow: r.shadow ?? false,
      leasable: (r.lease ?? 'auto') === 'auto',
      calendar: r.calendar ?? false,
      timezone: r.timezone ?? '',
    };
    if (typeof r.burst === 'number') info.burst = r.burst;
    return info;
  });
  return {
    clusterId: cluster.cluster_id,
    version: '',
    members,
    ring: new Ring(members.map((m) => m.nodeId)),
    rules: rulesOf(infos),
    source,
  };
}

/** Whether two rule sets resolve the same (so that cached bucket ids stay right). */
export function sameRules(a: Map<string, Resolved> | undefined, b: Map<string, Resolved> | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  if (a.size !== b.size) return false;
  for (const [name, r] of a) {
    const o = b.get(name);
    if (
      !o ||
      o.seed !== r.seed ||
      o.limit !== r.limit ||
      o.periodMs !== r.periodMs ||
      o.burst !== r.burst ||
      o.global !== r.global ||
      o.failClosed !== r.failClosed ||
      o.shadow !== r.shadow ||
      o.leasable !== r.leasable ||
      o.calendar?.zone !== r.calendar?.zone
    ) {
      return false;
    }
  }
  return true;
}

/** GET a JSON document within `timeoutMs` (over HTTPS with `tls`). */
export async function getJson<T>(url: string, timeoutMs: number, tls?: Tls): Promise<T> {
  if (tls) return httpsJson<T>(url, timeoutMs, tls);
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return (await res.json()) as T;
}

/** A unary Topology call on `client` within `timeoutMs`. */
export function topologyCall(client: { Topology: (req: object, md: grpc.Metadata, opts: grpc.CallOptions, cb: grpc.requestCallback<TopologyResponse__Output>) => unknown }, md: grpc.Metadata, timeoutMs: number): Promise<TopologyResponse__Output> {
  return new Promise((resolve, reject) => {
    client.Topology({}, md, { deadline: Date.now() + timeoutMs }, (err, res) => (err || !res ? reject(err ?? new Error('no topology')) : resolve(res)));
  });
}

