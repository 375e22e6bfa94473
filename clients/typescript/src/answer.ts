/** A check's answer. */
export interface Answer {
  /** Admitted (it took its cost), or denied. */
  allowed: boolean;
  /** The rule's limit (0: a named rule this client never learnt). */
  limit: number;
  /** Whole requests still admissible now. */
  remaining: number;
  /** Unix ms when the bucket is full again (or the window resets). */
  resetAtMs: number;
  /** 0 when allowed, else how long until this request would be admitted. */
  retryAfterMs: number;
  /** Answered without the key's owner (the local fallback share). */
  degraded: boolean;
  /** Decided in this process on a slice leased from the owner (hot keys). */
  leased: boolean;
  /** Decided by the owner's replica because the owner did not answer. */
  replica?: boolean;
  /** Denied by a block of the key (`retryAfterMs` is the block's rest). */
  blocked?: boolean;
  /** For a shadow rule (always allowed): whether it would have denied. */
  shadowDenied?: boolean;
}

/** Unix time in ms (fractional), on a clock that does not step back. */
export function unixMs(): number {
  return performance.timeOrigin + performance.now();
}

/** An instant as answers carry it: whole Unix ms, rounded up. */
export function instantMs(ms: number): number {
  return Math.ceil(ms);
}
