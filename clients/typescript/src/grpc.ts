// ringlimit.v1 over gRPC: the service loaded from the package's copy of the proto with
// @grpc/proto-loader (the types in src/gen/ are generated from the same file by
// scripts/gen.mjs, with the same options), and the conversions between its messages and the
// SDK's types.
//
// Why proto-loader: it and its type generator are pure JavaScript from the grpc-node project,
// so `npm ci` needs no protoc binary (grpc-tools downloads one at install, which a machine
// without internet access cannot do) and the checked-in types can be regenerated and compared
// in a test anywhere. The messages are small; the leased fast path never touches them.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Answer } from './answer.js';
import type { Mark } from './lease.js';
import type { Algorithm, RuleInfoLike } from './rules.js';
import type { RateLimiterClient } from './gen/ringlimit/v1/RateLimiter.js';
import type { CheckResponse__Output } from './gen/ringlimit/v1/CheckResponse.js';
import type { RuleInfo__Output } from './gen/ringlimit/v1/RuleInfo.js';
import type { ProtoGrpcType } from './gen/ratelimiter.js';
import { channelOptions, type Tls } from './tls.js';

export type { RateLimiterClient };

/** The proto's place in the package (shipped beside dist/). */
export const PROTO_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'proto');

let constructor: (new (address: string, credentials: grpc.ChannelCredentials, options?: grpc.ClientOptions) => RateLimiterClient) | undefined;

/** The RateLimiter client class, loaded once. */
export function rateLimiterClass(): new (address: string, credentials: grpc.ChannelCredentials, options?: grpc.ClientOptions) => RateLimiterClient {
  if (!constructor) {
    const def = protoLoader.loadSync('ringlimit/v1/ratelimiter.proto', {
      includeDirs: [PROTO_DIR],
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const loaded = grpc.loadPackageDefinition(def) as unknown as ProtoGrpcType;
    constructor = loaded.ringlimit.v1.RateLimiter as unknown as typeof constructor;
  }
  return constructor!;
}

/** A channel to one member's gRPC address (`host:port`): over TLS with `tls`, else plaintext. */
export function connect(addr: string, tls?: Tls): RateLimiterClient {
  const Client = rateLimiterClass();
  return new Client(addr, tls ? tls.credentials : grpc.credentials.createInsecure(), {
    ...channelOptions(tls),
    // Reconnect soon after a member comes back; a dead one fails calls at once meanwhile.
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 2_000,
    'grpc.keepalive_time_ms': 10_000,
    'grpc.keepalive_timeout_ms': 5_000,
  });
}

const ALGORITHMS: Record<string, Algorithm> = {
  ALGORITHM_UNSPECIFIED: 'token_bucket',
  TOKEN_BUCKET: 'token_bucket',
  FIXED_WINDOW: 'fixed_window',
  SLIDING_WINDOW: 'sliding_window',
  SLIDING_LOG: 'sliding_log',
  LEAKY_BUCKET: 'leaky_bucket',
};

/** A u64 the loader gives as a decimal string, as a number (exact below 2^53: counts, ms). */
export function num(v: string | number | undefined | null): number {
  return v === undefined || v === null ? 0 : Number(v);
}

/** ringlimit.v1's CheckResponse as the SDK's answer. */
export function toAnswer(r: CheckResponse__Output): Answer {
  const a: Answer = {
    allowed: r.allowed,
    limit: num(r.limit),
    remaining: num(r.remaining),
    resetAtMs: num(r.resetAtMs),
    retryAfterMs: num(r.retryAfterMs),
    degraded: r.degraded,
    leased: r.leased,
  };
  if (r.replica) a.replica = true;
  if (r.blocked) a.blocked = true;
  if (r.shadowDenied !== undefined && r.shadowDenied !== null) a.shadowDenied = r.shadowDenied;
  return a;
}

export function toMark(m: { resetNs: string; atNs: string } | null | undefined): Mark | undefined {
  return m ? { resetNs: String(m.resetNs), atNs: String(m.atNs) } : undefined;
}

/** ringlimit.v1's RuleInfo as the client's rule description. */
export function ruleInfo(r: RuleInfo__Output): RuleInfoLike {
  const info: RuleInfoLike = {
    name: r.name,
    algorithm: ALGORITHMS[r.algorithm] ?? 'token_bucket',
    limit: num(r.limit),
    periodMs: num(r.periodMs),
    period: r.period,
    global: r.mode === 'GLOBAL',
    failClosed: r.failClosed,
    shadow: r.shadow,
    leasable: r.leasable,
    calendar: r.calendar,
    timezone: r.timezone,
    seed: BigInt(r.seed || '0'),
  };
  if (r.burst !== undefined && r.burst !== null) info.burst = num(r.burst);
  return info;
}

/** Whether a failed call means the member could not answer (fall back), rather than a refusal. */
export function unreachable(code: grpc.status): boolean {
  return (
    code === grpc.status.UNAVAILABLE ||
    code === grpc.status.DEADLINE_EXCEEDED ||
    code === grpc.status.CANCELLED ||
    code === grpc.status.UNKNOWN ||
    code === grpc.status.INTERNAL ||
    code === grpc.status.RESOURCE_EXHAUSTED ||
    code === grpc.status.UNIMPLEMENTED
  );
}
