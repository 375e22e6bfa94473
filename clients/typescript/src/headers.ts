// The rate-limit fields of a response, exactly as a node's HTTP edge writes them (core's
// `headers.rs`): `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix seconds, rounded up), the
// IETF `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), and on a
// denial `Retry-After` (whole seconds, rounded up, at least 1). Framework-free: the middleware
// for Express and Fastify set what these functions return.
import { type Answer, unixMs } from './answer.js';

/** One limit as the IETF fields describe it. */
export interface Policy {
  /** The rule's name (an inline rule's: see `inlinePolicyName`). */
  name: string;
  periodMs: number;
  answer: Answer;
  /** When the answer was made, Unix ms rounded up (the `t` parameter counts from it). */
  nowMs: number;
}

/** A structured-field string (RFC 8941): printable ASCII in quotes, `"` and `\` escaped. */
function sfString(s: string): string {
  let out = '"';
  for (const c of s) {
    if (c < ' ' || c > '~') continue;
    if (c === '"' || c === '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

/** `RateLimit-Policy` and `RateLimit`, one list item per limit in order:
 * `"name";q=<limit>;w=<period, s>` and `"name";r=<remaining>;t=<s until full or reset>`
 * (seconds rounded up; a window shorter than a second is `w=1`). */
export function ietfValues(limits: Iterable<Policy>): { policy: string; state: string } {
  let policy = '';
  let state = '';
  for (const l of limits) {
    if (policy) {
      policy += ', ';
      state += ', ';
    }
    const name = sfString(l.name);
    const w = Math.max(1, Math.ceil(l.periodMs / 1000));
    const t = Math.ceil(Math.max(0, l.answer.resetAtMs - l.nowMs) / 1000);
    policy += `${name};q=${l.answer.limit};w=${w}`;
    state += `${name};r=${l.answer.remaining};t=${t}`;
  }
  return { policy, state };
}

/** Whole seconds to wait before retrying a denied check: rounded up, at least 1. */
export function retryAfterSecs(a: Answer): number {
  return Math.max(1, Math.ceil(a.retryAfterMs / 1000));
}

/** Every field for one answer of a limit named `name` with period `periodMs`, as
 * [name, value] pairs in the order a node writes them; none for a limit never learnt
 * (limit 0). `nowMs` defaults to now. */
export function rateLimitHeaders(answer: Answer, name: string, periodMs: number, nowMs = Math.ceil(unixMs())): Array<[string, string]> {
  return answersHeaders([{ answer, name, periodMs }], 0, nowMs);
}

/** The fields of several limits decided together: `X-RateLimit-*` and `Retry-After` of the
 * binding one, the IETF fields of every limit known. */
export function answersHeaders(
  limits: ReadonlyArray<{ answer: Answer; name: string; periodMs: number }>,
  binding: number,
  nowMs = Math.ceil(unixMs()),
): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  const b = limits[binding]?.answer;
  if (b && b.limit !== 0) {
    out.push(['x-ratelimit-limit', String(b.limit)], ['x-ratelimit-remaining', String(b.remaining)], ['x-ratelimit-reset', String(Math.ceil(b.resetAtMs / 1000))]);
  }
  const known = limits.filter((l) => l.periodMs > 0 && l.answer.limit > 0).map((l) => ({ ...l, nowMs }));
  if (known.length > 0) {
    const { policy, state } = ietfValues(known);
    out.push(['ratelimit-policy', policy], ['ratelimit', state]);
  }
  if (b && !b.allowed) out.push(['retry-after', String(retryAfterSecs(b))]);
  return out;
}

/** The HTTP API's error body. */
export function errorBody(code: string, message: string): string {
  return JSON.stringify({ error: code, message });
}

/** A denial's body, as the node's edge words it. */
export function deniedBody(a: Answer): string {
  return errorBody('rate_limited', `Too many requests; retry after ${retryAfterSecs(a)} s.`);
}
