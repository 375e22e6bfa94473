// Bucket identity and owners, computed exactly as the nodes compute them (the `xxh3-64-v1`
// scheme of ringlimit.v1's RingParams; clients/golden/owners.json holds worked examples).
//
// XXH3-64 with 64-bit seeds comes from @node-rs/xxhash: the reference C implementation behind
// a native addon (prebuilt per platform inside the registry packages, so nothing is compiled
// or downloaded at install), synchronous, taking and returning bigints. A JavaScript or
// WebAssembly port would need an async start or a 128-bit seed split; this one is called only
// when a (rule, key) is first seen (the client caches bucket ids) and when the ring changes.
import { xxh3 } from '@node-rs/xxhash';

/** Algorithm codes of the scheme (and of ringlimit.v1's Algorithm enum). */
export const ALGORITHM_CODES = {
  token_bucket: 1,
  fixed_window: 2,
  sliding_window: 3,
  sliding_log: 4,
  leaky_bucket: 5,
} as const;

export type Algorithm = keyof typeof ALGORITHM_CODES;

/** Calendar units' codes in a calendar inline rule's seed. */
export const UNIT_CODES = { '1d': 1, '1w': 2, '1mo': 3 } as const;
export type CalendarUnit = keyof typeof UNIT_CODES;

const U64 = (1n << 64n) - 1n;
const NAMED = 0x6e616d656400n; // "named\0"
const INLINE = 0x696e6c696e65n; // "inline"
const CALENDAR = 0x63616c656e64n; // "calend"

/** XXH3-64 of `bytes` with `seed` (0 when none is given). */
export function xxh3_64(bytes: Uint8Array | string, seed = 0n): bigint {
  // Strings go in as they are: the addon hashes their UTF-8 bytes.
  return xxh3.xxh64(bytes, seed & U64);
}

/** A rule of the cluster's rules file (or admin API): its seed depends on name and algorithm. */
export function namedSeed(name: string, algorithm: Algorithm): bigint {
  return xxh3_64(name, NAMED | BigInt(ALGORITHM_CODES[algorithm]));
}

/** An inline rule's seed; `burst` is the limit when unset, `periodNs` a calendar unit's nominal length. */
export function inlineSeed(algorithm: Algorithm, limit: number, periodNs: bigint, burst: number): bigint {
  const buf = Buffer.alloc(25);
  buf[0] = ALGORITHM_CODES[algorithm];
  buf.writeBigUInt64LE(BigInt(limit), 1);
  buf.writeBigUInt64LE(periodNs, 9);
  buf.writeBigUInt64LE(BigInt(burst), 17);
  return xxh3_64(buf, INLINE);
}

/** A calendar inline rule's seed: its inline seed mixed with the unit and the zone's IANA name. */
export function calendarSeed(inline: bigint, unit: CalendarUnit, zone: string): bigint {
  const name = Buffer.from(zone, 'utf8');
  const buf = Buffer.alloc(1 + name.length);
  buf[0] = UNIT_CODES[unit];
  name.copy(buf, 1);
  return xxh3_64(buf, inline ^ CALENDAR);
}

/** The bucket of `key` under a rule of seed `seed`. */
export function bucketId(seed: bigint, key: string): bigint {
  return xxh3_64(key, seed);
}

/** The point of a ring member's `i`-th virtual node. */
export function ringPoint(member: string, i: number): bigint {
  const name = Buffer.from(member, 'utf8');
  const buf = Buffer.alloc(name.length + 4);
  name.copy(buf, 0);
  buf.writeUInt32LE(i, name.length);
  return xxh3_64(buf);
}

/** Where a bucket lands on the ring. */
export function bucketPoint(id: bigint): bigint {
  const buf = Buffer.alloc(8);
  buf.writeBigUInt64LE(id & U64);
  return xxh3_64(buf);
}

export const VNODES_PER_MEMBER = 160;

/** The consistent-hash ring of the alive members: the owner of a bucket is the member of the
 * first point at or after the bucket's point, wrapping to the smallest. */
export class Ring {
  /** Members, sorted and distinct. */
  readonly members: readonly string[];
  private readonly points: BigUint64Array;
  private readonly owners: Uint32Array;

  constructor(members: Iterable<string>, vnodes = VNODES_PER_MEMBER) {
    this.members = [...new Set(members)].sort();
    const n = this.members.length * vnodes;
    const pairs: Array<[bigint, number]> = new Array(n);
    let k = 0;
    this.members.forEach((m, at) => {
      for (let i = 0; i < vnodes; i++) pairs[k++] = [ringPoint(m, i), at];
    });
    pairs.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
    this.points = new BigUint64Array(n);
    this.owners = new Uint32Array(n);
    pairs.forEach(([p, m], i) => {
      this.points[i] = p;
      this.owners[i] = m;
    });
  }

  get size(): number {
    return this.members.length;
  }

  /** The index in `members` of the owner of bucket `id` (-1 on an empty ring). */
  ownerIndex(id: bigint): number {
    const len = this.members.length;
    if (len === 0) return -1;
    if (len === 1) return 0;
    const key = bucketPoint(id);
    const pts = this.points;
    let lo = 0;
    let hi = pts.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (pts[mid]! < key) lo = mid + 1;
      else hi = mid;
    }
    return this.owners[lo === pts.length ? 0 : lo]!;
  }

  /** The owner of bucket `id`, undefined on an empty ring. */
  owner(id: bigint): string | undefined {
    const i = this.ownerIndex(id);
    return i < 0 ? undefined : this.members[i];
  }

  /** Whether two rings have the same members. */
  sameMembers(other: Ring): boolean {
    return this.members.length === other.members.length && this.members.every((m, i) => m === other.members[i]);
  }
}
