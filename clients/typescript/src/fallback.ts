// The local limiter a client answers from when the cluster cannot (owner unreachable, past the
// deadline, no member known): the nodes' algorithms over this client's share of each limit
// (limit ÷ members alive, or a fixed fraction), in a bounded store. Answers carry the whole
// rule's limit and `degraded: true`. Calendar windows are approximated by windows of their
// nominal length here (a degraded answer is a share, not the exact window).
import { type Answer, instantMs } from './answer.js';
import type { Algorithm, Resolved } from './rules.js';

/** How much of a limit the local fallback admits. */
export type FallbackShare = 'per-member' | { fraction: number };

/** The share's parameters of a rule. */
export interface ShareRule {
  algorithm: Algorithm;
  limit: number;
  periodMs: number;
  burst: number;
}

/** A share of `rule` among `alive` members (limit and burst divided, never below one), or a
 * fraction of it (rounded up, never zero). */
export function shareOf(rule: ShareRule, alive: number, policy: FallbackShare = 'per-member'): ShareRule {
  if (policy === 'per-member') {
    const n = Math.max(1, alive);
    return { ...rule, limit: Math.max(1, Math.floor(rule.limit / n)), burst: Math.max(1, Math.floor(rule.burst / n)) };
  }
  const scale = (n: number) => Math.min(n, Math.max(1, Math.ceil(n * policy.fraction)));
  return { ...rule, limit: scale(rule.limit), burst: scale(rule.burst) };
}

/** A decision of one bucket. */
interface Decision {
  allowed: boolean;
  remaining: number;
  resetMs: number;
  retryAfterMs: number;
}

type State =
  | { kind: 'gcra'; tat: number }
  | { kind: 'fixed'; end: number; count: number }
  | { kind: 'sliding'; until: number; current: number; previous: number }
  | { kind: 'log'; times: number[] };

function fresh(a: Algorithm): State {
  switch (a) {
    case 'token_bucket':
    case 'leaky_bucket':
      return { kind: 'gcra', tat: 0 };
    case 'fixed_window':
      return { kind: 'fixed', end: 0, count: 0 };
    case 'sliding_window':
      return { kind: 'sliding', until: 0, current: 0, previous: 0 };
    case 'sliding_log':
      return { kind: 'log', times: [] };
  }
}

/** `rule`'s decision of a check of `cost` on `s` at `now` (Unix ms), as core's limiters decide. */
export function decide(s: State, rule: ShareRule, now: number, cost: number): Decision {
  const need = Math.max(1, cost);
  switch (s.kind) {
    case 'gcra': {
      const t = rule.periodMs / rule.limit;
      const capacity = t * rule.burst;
      const base = Math.max(s.tat, now);
      const after = base + t * need;
      const fits = after - now <= capacity + 1e-9;
      if (fits && cost > 0) {
        s.tat = after;
        return { allowed: true, remaining: Math.floor((now + capacity - after) / t + 1e-9), resetMs: after, retryAfterMs: 0 };
      }
      return {
        allowed: fits,
        remaining: Math.max(0, Math.floor((now + capacity - base) / t + 1e-9)),
        resetMs: base,
        retryAfterMs: fits ? 0 : after - capacity - now,
      };
    }
    case 'fixed': {
      const end = now - (now % rule.periodMs) + rule.periodMs;
      const used = s.end === end ? s.count : 0;
      const fits = used + need <= rule.limit;
      if (fits && cost > 0) {
        s.end = end;
        s.count = used + cost;
        return { allowed: true, remaining: rule.limit - s.count, resetMs: end, retryAfterMs: 0 };
      }
      return { allowed: fits, remaining: Math.max(0, rule.limit - used), resetMs: end, retryAfterMs: fits ? 0 : end - now };
    }
    case 'sliding': {
      const p = rule.periodMs;
      const start = now - (now % p);
      const end = start + p;
      const [cur, prev] = s.until === end + p ? [s.current, s.previous] : s.until === end ? [0, s.current] : [0, 0];
      const used = prev * ((p - (now - start)) / p) + cur;
      const fits = used + need <= rule.limit + 1e-9;
      if (fits && cost > 0) {
        s.until = end + p;
        s.current = cur + cost;
        s.previous = prev;
        return { allowed: true, remaining: Math.max(0, Math.floor(rule.limit - used - cost + 1e-9)), resetMs: end + p, retryAfterMs: 0 };
      }
      // Denied: the earliest time the previous window's weight lets `need` in, or the next window.
      let retry = 0;
      if (!fits) {
        const room = rule.limit - cur - need;
        retry = prev > 0 && room >= 0 ? Math.max(0, start + p * (1 - room / prev) - now) : end - now;
      }
      return { allowed: fits, remaining: Math.max(0, Math.floor(rule.limit - used + 1e-9)), resetMs: cur > 0 ? end + p : prev > 0 ? end : now, retryAfterMs: retry };
    }
    case 'log': {
      const from = now - rule.periodMs;
      let drop = 0;
      while (drop < s.times.length && s.times[drop]! <= from) drop++;
      if (drop > 0) s.times.splice(0, drop);
      const used = s.times.length;
      const fits = used + need <= rule.limit;
      if (fits && cost > 0) {
        for (let i = 0; i < cost; i++) s.times.push(now);
        return { allowed: true, remaining: rule.limit - s.times.length, resetMs: now + rule.periodMs, retryAfterMs: 0 };
      }
      const oldest = s.times[Math.max(0, used + need - rule.limit - 1)];
      return {
        allowed: fits,
        remaining: Math.max(0, rule.limit - used),
        resetMs: used > 0 ? s.times[used - 1]! + rule.periodMs : now,
        retryAfterMs: fits || oldest === undefined ? 0 : oldest + rule.periodMs - now,
      };
    }
  }
}

/** What a share decision took: enough to give it back. */
export interface ShareTaken {
  id: bigint;
  share: ShareRule;
  cost: number;
  /** The window it was counted in, and when. */
  mark: number;
  at: number;
}

/** Answers of a rule that fails closed: denied for a second, marked degraded. */
export function closedAnswer(limit: number, now: number): Answer {
  return { allowed: false, limit, remaining: 0, resetAtMs: Math.floor(now) + 1000, retryAfterMs: 1000, degraded: true, leased: false };
}

/** A named rule never learnt (no node ever reached): admitted, without a limit to report. */
export function unknownRuleAnswer(now: number): Answer {
  return { allowed: true, limit: 0, remaining: 0, resetAtMs: instantMs(now), retryAfterMs: 0, degraded: true, leased: false };
}

/** The local fallback: buckets of this client's shares, at most `maxKeys` (oldest first out). */
export class Fallback {
  private readonly store = new Map<bigint, { state: State; algorithm: Algorithm }>();

  constructor(
    private readonly maxKeys = 100_000,
    private readonly policy: FallbackShare = 'per-member',
  ) {}

  get size(): number {
    return this.store.size;
  }

  /** The answer for bucket `id` of `rule` (undefined: a named rule never learnt) among `alive`
   * members at `now` (Unix ms), and what it took. */
  fallBack(id: bigint, rule: Resolved | undefined, cost: number, alive: number, now: number): [Answer, ShareTaken | undefined] {
    if (!rule) return [unknownRuleAnswer(now), undefined];
    if (rule.failClosed) return [closedAnswer(rule.limit, now), undefined];
    return this.hold(id, rule, cost, alive, now);
  }

  /** Decides bucket `id` alone on this client's share of `rule` (a cost above the share's
   * capacity takes the whole share). */
  hold(id: bigint, rule: ShareRule, cost: number, alive: number, now: number): [Answer, ShareTaken | undefined] {
    const share = shareOf(rule, alive, this.policy);
    const capacity = share.algorithm === 'token_bucket' || share.algorithm === 'leaky_bucket' ? share.burst : share.limit;
    const c = Math.min(cost, capacity);
    let entry = this.store.get(id);
    if (!entry || entry.algorithm !== share.algorithm) {
      entry = { state: fresh(share.algorithm), algorithm: share.algorithm };
      this.store.set(id, entry);
      if (this.store.size > this.maxKeys) {
        const oldest = this.store.keys().next();
        if (!oldest.done) this.store.delete(oldest.value);
      }
    }
    const d = decide(entry.state, share, now, c);
    const taken = d.allowed && c > 0 ? { id, share, cost: c, mark: markOf(entry.state), at: now } : undefined;
    const answer: Answer = {
      allowed: d.allowed,
      limit: rule.limit,
      remaining: d.remaining,
      resetAtMs: instantMs(d.resetMs),
      retryAfterMs: Math.ceil(d.retryAfterMs),
      degraded: true,
      leased: false,
    };
    return [answer, taken];
  }

  /** Gives back what `hold` took (an all-or-nothing request another limit denied). */
  refund(t: ShareTaken, now: number): void {
    const s = this.store.get(t.id)?.state;
    if (!s) return;
    switch (s.kind) {
      case 'gcra': {
        const back = s.tat - (t.share.periodMs / t.share.limit) * t.cost + (now - t.at);
        s.tat = Math.min(back, s.tat);
        break;
      }
      case 'fixed':
        if (s.end === t.mark) s.count = Math.max(0, s.count - t.cost);
        break;
      case 'sliding':
        if (s.until === t.mark) s.current = Math.max(0, s.current - t.cost);
        else if (s.until === t.mark + t.share.periodMs) s.previous = Math.max(0, s.previous - t.cost);
        break;
      case 'log': {
        let n = t.cost;
        for (let i = s.times.length - 1; i >= 0 && n > 0; i--) {
          if (s.times[i] === t.at) {
            s.times.splice(i, 1);
            n--;
          }
        }
        break;
      }
    }
  }
}

function markOf(s: State): number {
  switch (s.kind) {
    case 'gcra':
      return s.tat;
    case 'fixed':
      return s.end;
    case 'sliding':
      return s.until;
    case 'log':
      return 0;
  }
}
