// Rules as the client knows them: a named rule from the cluster's topology, or an inline rule
// given in a check, validated as a node validates it and resolved to its bucket-id seed.
import { RinglimitError } from './errors.js';
import type { InlineRule as WireInlineRule } from './gen/ringlimit/v1/InlineRule.js';
import { type Algorithm, type CalendarUnit, ALGORITHM_CODES, calendarSeed, inlineSeed, namedSeed } from './hash.js';

export type { Algorithm, CalendarUnit };

/** A rule given in the request: `limit` requests per `periodMs` milliseconds. */
export interface InlineRule {
  limit: number;
  /** The period in ms (a calendar rule may leave it out: its unit says). */
  periodMs?: number;
  /** Default `token_bucket`. */
  algorithm?: Algorithm;
  /** Capacity of a token or leaky bucket; default `limit`. */
  burst?: number;
  /** Calendar windows (fixed_window only): `1d`, `1w` or `1mo`. */
  period?: CalendarUnit;
  /** Windows of local calendar days, weeks (from Monday) or months, with `period`. */
  calendar?: boolean;
  /** The IANA zone of calendar windows; default UTC. */
  timezone?: string;
}

/** A rule as the client uses it. */
export interface Resolved {
  /** The named rule's name, or the inline rule's policy name (for the IETF fields). */
  name: string;
  named: boolean;
  algorithm: Algorithm;
  limit: number;
  periodMs: number;
  burst: number;
  /** Token and leaky buckets: burst; others: limit. */
  capacity: number;
  seed: bigint;
  /** `mode: global`: any member decides. */
  global: boolean;
  failClosed: boolean;
  shadow: boolean;
  leasable: boolean;
  calendar?: { unit: CalendarUnit; zone: string };
  /** The rule as ringlimit.v1 carries it in a request. */
  wire: { rule: string } | { inline: WireInline };
}

/** ringlimit.v1's InlineRule, as sent. */
export type WireInline = WireInlineRule & { limit: number };

export const MAX_KEY_BYTES = 512;
export const MAX_LIMIT = 1_000_000_000;
export const MAX_SLIDING_LOG_LIMIT = 10_000;
const MIN_EMISSION_NS = 1_000;
const MAX_PERIOD_MS = 366 * 24 * 3600 * 1000;
const NOMINAL_MS: Record<CalendarUnit, number> = { '1d': 86_400_000, '1w': 604_800_000, '1mo': 2_678_400_000 };
const WIRE_ALGORITHM: Record<Algorithm, 'TOKEN_BUCKET' | 'FIXED_WINDOW' | 'SLIDING_WINDOW' | 'SLIDING_LOG' | 'LEAKY_BUCKET'> = {
  token_bucket: 'TOKEN_BUCKET',
  fixed_window: 'FIXED_WINDOW',
  sliding_window: 'SLIDING_WINDOW',
  sliding_log: 'SLIDING_LOG',
  leaky_bucket: 'LEAKY_BUCKET',
};

export function hasBurst(a: Algorithm): boolean {
  return a === 'token_bucket' || a === 'leaky_bucket';
}

/** Whether buckets of `a` may be leased (the meter's spacing and the log's exact times would
 * not survive a slice spent elsewhere). */
export function leasableAlgorithm(a: Algorithm): boolean {
  return a === 'token_bucket' || a === 'fixed_window' || a === 'sliding_window';
}

/** The UTF-8 length of a key when it is invalid (empty or over 512 bytes), else -1. */
export function invalidKeyLength(key: string): number {
  // Fast path: a short string cannot exceed 512 UTF-8 bytes (3 bytes per UTF-16 unit at most).
  if (typeof key !== 'string') return 0;
  if (key.length > 0 && key.length <= 170) return -1;
  const n = Buffer.byteLength(key, 'utf8');
  return n === 0 || n > MAX_KEY_BYTES ? n : -1;
}

export function checkKey(key: string): void {
  const n = invalidKeyLength(key);
  if (n >= 0) throw new RinglimitError('invalid_key', `\`key\` must be 1 to 512 bytes, got ${n} bytes`);
}

function fieldError(field: string, reason: string): RinglimitError {
  const code =
    field === 'limit' ? 'invalid_limit' : field === 'period' || field === 'period_ms' ? 'invalid_period' : field === 'burst' ? 'invalid_burst' : 'invalid_rule';
  return new RinglimitError(code, `invalid rule: \`${field}\` ${reason}`);
}

function isAlgorithm(a: unknown): a is Algorithm {
  return typeof a === 'string' && Object.prototype.hasOwnProperty.call(ALGORITHM_CODES, a);
}

function isUint(n: unknown): n is number {
  return typeof n === 'number' && Number.isSafeInteger(n) && n >= 0;
}

/** An IANA zone's name as the time zone database spells it (`europe/berlin` is
 * `Europe/Berlin`), or undefined for a zone this runtime does not know. */
export function canonicalZone(name: string): string | undefined {
  if (name.length === 0 || name.length > 64) return undefined;
  let resolved: string;
  try {
    resolved = new Intl.DateTimeFormat('en-US', { timeZone: name }).resolvedOptions().timeZone;
  } catch {
    return undefined;
  }
  if (resolved.toLowerCase() === name.toLowerCase()) return resolved;
  // The runtime resolved an alias to another zone: the database's spelling of the alias itself.
  const lower = name.toLowerCase();
  const listed = (Intl as unknown as { supportedValuesOf?: (k: string) => string[] }).supportedValuesOf?.('timeZone') ?? [];
  return listed.find((z) => z.toLowerCase() === lower) ?? name;
}

/** Validates an inline rule as a node does and resolves it (its seed, its policy name). */
export function resolveInline(r: InlineRule): Resolved {
  if (r === null || typeof r !== 'object') throw fieldError('rule', 'must be a rule name or an inline rule');
  const algorithm = r.algorithm ?? 'token_bucket';
  if (!isAlgorithm(algorithm)) throw fieldError('algorithm', `is not one of ${Object.keys(ALGORITHM_CODES).join(', ')}`);
  const { limit } = r;
  if (!isUint(limit) || limit < 1 || limit > MAX_LIMIT) throw fieldError('limit', `must be between 1 and ${MAX_LIMIT}, got ${String(limit)}`);
  let calendar: Resolved['calendar'];
  let periodMs = r.periodMs ?? 0;
  if (!isUint(periodMs)) throw fieldError('period_ms', 'must be between 1 and 31622400000 (366 days)');
  if (r.calendar || r.period !== undefined) {
    const unit = r.period;
    if (!r.calendar) throw fieldError('period', 'applies only to calendar windows: add `calendar: true`');
    if (algorithm !== 'fixed_window') throw fieldError('calendar', `applies only to fixed_window, not ${algorithm}`);
    if (unit !== '1d' && unit !== '1w' && unit !== '1mo') {
      throw fieldError('calendar', 'needs a period of 1d, 1w or 1mo (a local day, a week from Monday, a month from the first)');
    }
    if (periodMs !== 0 && periodMs !== NOMINAL_MS[unit]) throw fieldError('period_ms', `must be ${NOMINAL_MS[unit]} for a calendar ${unit}`);
    const zone = r.timezone ? canonicalZone(r.timezone) : 'UTC';
    if (zone === undefined) throw fieldError('timezone', `unknown time zone ${JSON.stringify(r.timezone)}`);
    calendar = { unit, zone };
    periodMs = NOMINAL_MS[unit];
  } else if (r.timezone) {
    throw fieldError('timezone', 'applies only to calendar windows: add `calendar: true`');
  }
  if (periodMs === 0) throw fieldError('period_ms', 'must be greater than 0');
  if (periodMs > MAX_PERIOD_MS) throw fieldError('period_ms', 'must be between 1 and 31622400000 (366 days)');
  if (algorithm === 'sliding_log' && limit > MAX_SLIDING_LOG_LIMIT) {
    throw fieldError(
      'limit',
      `is ${limit}, but sliding_log keeps one entry per request and allows at most ${MAX_SLIDING_LOG_LIMIT}; use sliding_window for large limits`,
    );
  }
  let burst = limit;
  if (r.burst !== undefined && r.burst !== null) {
    if (!hasBurst(algorithm)) throw fieldError('burst', `applies only to token_bucket and leaky_bucket, not ${algorithm}`);
    if (!isUint(r.burst) || r.burst === 0 || r.burst > MAX_LIMIT) throw fieldError('burst', `must be between 1 and ${MAX_LIMIT}, got ${String(r.burst)}`);
    burst = r.burst;
  }
  const periodNs = BigInt(periodMs) * 1_000_000n;
  if (hasBurst(algorithm) && periodNs / BigInt(limit) < BigInt(MIN_EMISSION_NS)) {
    throw fieldError('limit', `${limit} per ${periodMs} ms is over one request per microsecond, the finest rate ${algorithm} supports`);
  }
  let seed = inlineSeed(algorithm, limit, periodNs, burst);
  if (calendar) seed = calendarSeed(seed, calendar.unit, calendar.zone);
  const wire: WireInline = {
    limit,
    periodMs: calendar ? 0 : periodMs,
    algorithm: WIRE_ALGORITHM[algorithm],
    period: calendar ? calendar.unit : '',
    calendar: calendar !== undefined,
    timezone: calendar && r.timezone ? calendar.zone : '',
  };
  if (r.burst !== undefined && r.burst !== null) wire.burst = r.burst;
  return {
    name: inlinePolicyName(limit, periodMs, algorithm, r.burst ?? undefined, calendar),
    named: false,
    algorithm,
    limit,
    periodMs,
    burst,
    capacity: hasBurst(algorithm) ? burst : limit,
    seed,
    global: false,
    failClosed: false,
    shadow: false,
    leasable: leasableAlgorithm(algorithm),
    calendar,
    wire: { inline: wire },
  };
}

/** The name an inline rule goes by in the IETF fields (as the nodes name it): `100-per-60000ms`,
 * `10-per-1000ms-sliding_log`, `10-per-1000ms-burst-20`, `10000-per-1mo-Europe/Berlin-fixed_window`. */
export function inlinePolicyName(limit: number, periodMs: number, algorithm: Algorithm, burst?: number, calendar?: { unit: string; zone: string }): string {
  let name = calendar ? `${limit}-per-${calendar.unit}-${calendar.zone}` : `${limit}-per-${periodMs}ms`;
  if (algorithm !== 'token_bucket') name += `-${algorithm}`;
  if (burst !== undefined) name += `-burst-${burst}`;
  return name;
}

/** A rule of the topology (ringlimit.v1's RuleInfo, or GET /v1/rules), as the client uses it;
 * undefined for one no node would serve. */
export interface RuleInfoLike {
  name: string;
  algorithm: Algorithm;
  limit: number;
  periodMs: number;
  period: string;
  burst?: number;
  global: boolean;
  failClosed: boolean;
  shadow: boolean;
  leasable: boolean;
  calendar: boolean;
  timezone: string;
  /** The seed the node computed, when it said (ringlimit.v1); checked against ours. */
  seed?: bigint;
}

export function resolveNamed(info: RuleInfoLike): Resolved | undefined {
  const { name, algorithm, limit } = info;
  if (!isAlgorithm(algorithm) || !isUint(limit) || limit < 1 || limit > MAX_LIMIT) return undefined;
  const burst = hasBurst(algorithm) && info.burst ? info.burst : limit;
  const unit = info.period;
  const calendar = info.calendar && (unit === '1d' || unit === '1w' || unit === '1mo') ? { unit: unit as CalendarUnit, zone: info.timezone || 'UTC' } : undefined;
  const periodMs = calendar ? NOMINAL_MS[calendar.unit] : info.periodMs;
  if (!isUint(periodMs) || periodMs < 1) return undefined;
  // A rule's seed depends on its name and algorithm alone: computed here, whatever a node said
  // (the golden file's tests prove both agree).
  const seed = namedSeed(name, algorithm);
  return {
    name,
    named: true,
    algorithm,
    limit,
    periodMs,
    burst,
    capacity: hasBurst(algorithm) ? burst : limit,
    seed,
    global: info.global,
    failClosed: info.failClosed,
    shadow: info.shadow,
    leasable: info.leasable && leasableAlgorithm(algorithm),
    calendar,
    wire: { rule: name },
  };
}

/** The largest cost a check of `r` may ask for (a bigger one could never be admitted). */
export function maxCost(r: Resolved): number {
  return r.global ? r.limit : r.capacity;
}
