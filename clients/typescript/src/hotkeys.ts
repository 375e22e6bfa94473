// Hot keys: which buckets this client checks most, with bounded memory, and which are hot
// enough to lease (core's `hot_keys`). Counting is Filtered Space-Saving: `k` counters hold
// every bucket whose share of the checks exceeds 1/k, each with an error bound (its count less
// the error is a lower bound of its true count); buckets not monitored add to a small array of
// hashed counters first, and enter only once that beats the smallest monitored count. Counts
// are halved at every tick, so a count is a rate: a steady `r` checks/s with ticks every `w` s
// converges to 2·r·w. A bucket is promoted once its rate's lower bound reaches `promoteAt`,
// demoted once its estimate falls below `demoteAt` (lower): a bucket steady at the threshold
// does not flap.

export interface HotSettings {
  /** Counters kept. */
  k: number;
  /** Milliseconds between ticks. */
  tickMs: number;
  /** Checks per second at which a bucket is promoted (its rate's lower bound). */
  promoteAt: number;
  /** Checks per second below which a promoted bucket is demoted (its rate's estimate). */
  demoteAt: number;
}

export const HOT_DEFAULTS: HotSettings = { k: 256, tickMs: 250, promoteAt: 1_000, demoteAt: 500 };

interface Counter {
  count: number;
  error: number;
}

export interface Changes {
  promoted: bigint[];
  demoted: bigint[];
}

export class HotKeys {
  private readonly counters = new Map<bigint, Counter>();
  private readonly alphas: Float64Array;
  private readonly mask: bigint;
  private readonly promoted = new Set<bigint>();

  constructor(readonly settings: HotSettings = HOT_DEFAULTS) {
    // Hashed counters: a power of two, a few per monitored counter.
    let n = 1;
    while (n < settings.k * 4) n *= 2;
    this.alphas = new Float64Array(n);
    this.mask = BigInt(n - 1);
  }

  /** Counts `weight` checks of bucket `id` (ids are hashes already: their low bits spread). */
  record(id: bigint, weight: number): void {
    const c = this.counters.get(id);
    if (c) {
      c.count += weight;
      return;
    }
    const h = Number(id & this.mask);
    const alpha = this.alphas[h]!;
    if (this.counters.size < this.settings.k) {
      this.counters.set(id, { count: alpha + weight, error: alpha });
      return;
    }
    let minId: bigint | undefined;
    let min = Infinity;
    for (const [k, v] of this.counters) {
      if (v.count < min) {
        min = v.count;
        minId = k;
      }
    }
    if (alpha + weight > min && minId !== undefined) {
      // The evicted bucket's count stays as its hashed counter's.
      this.counters.delete(minId);
      const eh = Number(minId & this.mask);
      this.alphas[eh] = Math.max(this.alphas[eh]!, min);
      this.counters.set(id, { count: alpha + weight, error: alpha });
    } else {
      this.alphas[h] = alpha + weight;
    }
  }

  /** Ends a tick: promotes and demotes by the rates counted so far, then halves the counts. */
  tick(): Changes {
    const perCount = 1000 / (2 * Math.max(1, this.settings.tickMs));
    const changes: Changes = { promoted: [], demoted: [] };
    for (const [id, c] of this.counters) {
      if ((c.count - c.error) * perCount >= this.settings.promoteAt && !this.promoted.has(id)) {
        this.promoted.add(id);
        changes.promoted.push(id);
      }
    }
    for (const id of this.promoted) {
      const c = this.counters.get(id);
      if (!c || c.count * perCount < this.settings.demoteAt) {
        this.promoted.delete(id);
        changes.demoted.push(id);
      }
    }
    for (const c of this.counters.values()) {
      c.count /= 2;
      c.error /= 2;
    }
    for (let i = 0; i < this.alphas.length; i++) this.alphas[i]! /= 2;
    changes.promoted.sort(cmp);
    changes.demoted.sort(cmp);
    return changes;
  }

  isHot(id: bigint): boolean {
    return this.promoted.has(id);
  }

  get hotCount(): number {
    return this.promoted.size;
  }

  /** Buckets counted (at most `k`). */
  get tracked(): number {
    return this.counters.size;
  }
}

function cmp(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
