// What the Express and Fastify middleware share: one limit (a rule name or an inline rule), a
// key taken from each request (default: the client's IP), and the response a decision makes:
// admitted requests go on with the rate-limit fields; denied ones get 429 with `Retry-After`
// and the same fields, as a node's HTTP edge writes them. A request without a key passes
// unlimited. An unreachable cluster never fails a request (the client's fallback answers)
// unless the client is fail-closed: then 503 with `Retry-After: 1`.
import type { Answer } from './answer.js';
import type { Check } from './client.js';
import { ConfigError, RinglimitError } from './errors.js';
import { answersHeaders, deniedBody, errorBody } from './headers.js';
import { resolveInline, type InlineRule } from './rules.js';

/** What the middleware needs of a client (a `Client`, or a fake in tests). */
export interface Checker {
  check(check: Check): Promise<Answer>;
  /** The synchronous fast path (a leased key): used first when present. */
  tryCheck?(check: Check, out?: Answer): Answer | undefined;
  /** A named rule's period in ms, for the IETF fields (undefined: not learnt yet). */
  periodMs?(rule: string): number | undefined;
}

export interface LimitOptions<Req> {
  client: Checker;
  /** A rule of the cluster (its name) or an inline rule... */
  rule?: string | InlineRule;
  /** ...or an inline token bucket of `limit` per `periodMs`. */
  limit?: number;
  periodMs?: number;
  /** Tokens each request takes (default 1). */
  cost?: number;
  /** The request's key (undefined or empty: not limited). Default: the client's IP. */
  key?: (req: Req) => string | undefined;
}

/** A decision as a response: go on (with headers), or answer with `status` and `body`. */
export interface Outcome {
  allowed: boolean;
  status: number;
  headers: Array<[string, string]>;
  body?: string;
}

/** The limit's decision of a request keyed `key`: synchronous when the client's fast path
 * answers, else a promise. */
export type Decide = (key: string) => Outcome | Promise<Outcome>;

export function limiter<Req>(opts: LimitOptions<Req>): Decide {
  if (!opts || !opts.client) throw new ConfigError('rate limit middleware: give a `client`');
  let rule: string | InlineRule;
  if (typeof opts.rule === 'string' || (opts.rule && typeof opts.rule === 'object')) rule = opts.rule;
  else if (opts.limit !== undefined && opts.periodMs !== undefined) rule = { limit: opts.limit, periodMs: opts.periodMs };
  else throw new ConfigError('rate limit middleware: give a `rule` (a name or an inline rule) or `limit` and `periodMs`');
  // An inline rule is checked once, here: a broken one is the service's mistake, said at start.
  let name: string;
  let inlinePeriod = 0;
  if (typeof rule === 'string') {
    name = rule;
  } else {
    try {
      const r = resolveInline(rule);
      name = r.name;
      inlinePeriod = r.periodMs;
    } catch (e) {
      throw new ConfigError(`rate limit middleware: ${(e as Error).message}`);
    }
  }
  const client = opts.client;
  const cost = opts.cost ?? 1;
  const period = () => (typeof rule === 'string' ? client.periodMs?.(rule) ?? 0 : inlinePeriod);
  const outcome = (a: Answer): Outcome => {
    const headers = answersHeaders([{ answer: a, name, periodMs: period() }], 0);
    return a.allowed ? { allowed: true, status: 200, headers } : { allowed: false, status: 429, headers, body: deniedBody(a) };
  };
  const failed = (e: unknown): Outcome => {
    if (e instanceof RinglimitError && e.code === 'unavailable') {
      return { allowed: false, status: 503, headers: [['retry-after', '1']], body: errorBody('unavailable', `The rate limiter is unavailable: ${e.message}.`) };
    }
    return { allowed: false, status: 500, headers: [], body: errorBody('rate_limit_misconfigured', 'The rate limit of this endpoint is misconfigured.') };
  };
  return (key: string) => {
    const check: Check = { key, rule, cost };
    try {
      const fast = client.tryCheck?.(check);
      if (fast) return outcome(fast);
    } catch (e) {
      return failed(e);
    }
    return client.check(check).then(outcome, failed);
  };
}
