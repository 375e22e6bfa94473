// Every case of clients/golden/owners.json: the client names buckets and picks owners exactly
// as the nodes do (seed, bucket id, owner in each ring, ring points).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { bucketId, namedSeed, Ring, ringPoint, VNODES_PER_MEMBER, type Algorithm } from '../src/hash.js';
import { resolveInline, type InlineRule } from '../src/rules.js';
import { packageRoot } from './helpers.js';

interface GoldenInline {
  algorithm: Algorithm;
  burst: number | null;
  calendar: boolean;
  limit: number;
  period: string;
  period_ms: number;
  timezone: string;
}
interface Case {
  rule: { name: string; algorithm: Algorithm } | { inline: GoldenInline };
  seed: string;
  key: string;
  bucket_id: string;
  owners: Record<string, string>;
}
interface Golden {
  scheme: string;
  vnodes_per_member: number;
  rings: Record<string, string[]>;
  ring_points: Record<string, Array<[string, number, string]>>;
  cases: Case[];
}

const golden: Golden = JSON.parse(readFileSync(join(packageRoot(), '..', 'golden', 'owners.json'), 'utf8'));

test('the golden file is the scheme this client implements', () => {
  assert.equal(golden.scheme, 'xxh3-64-v1');
  assert.equal(golden.vnodes_per_member, VNODES_PER_MEMBER);
  assert.ok(golden.cases.length >= 200, `${golden.cases.length} cases`);
});

test('ring points are the nodes\' points', () => {
  let n = 0;
  for (const [ring, samples] of Object.entries(golden.ring_points)) {
    for (const [member, i, point] of samples) {
      assert.equal(ringPoint(member, i).toString(), point, `${ring}: ${member} #${i}`);
      n++;
    }
  }
  assert.ok(n > 0);
});

test('every case: seed, bucket id and owner in each ring', () => {
  const rings = Object.fromEntries(Object.entries(golden.rings).map(([name, members]) => [name, new Ring(members)]));
  for (const [i, c] of golden.cases.entries()) {
    const what = `case ${i} (${JSON.stringify(c.rule)}, ${JSON.stringify(c.key)})`;
    let seed: bigint;
    if ('inline' in c.rule) {
      const g = c.rule.inline;
      const rule: InlineRule = { limit: g.limit, algorithm: g.algorithm, periodMs: g.period_ms };
      if (g.burst !== null) rule.burst = g.burst;
      if (g.calendar) Object.assign(rule, { calendar: true, period: g.period, timezone: g.timezone || undefined });
      seed = resolveInline(rule).seed;
    } else {
      seed = namedSeed(c.rule.name, c.rule.algorithm);
    }
    assert.equal(seed.toString(), c.seed, `${what}: seed`);
    const id = bucketId(seed, c.key);
    assert.equal(id.toString(), c.bucket_id, `${what}: bucket id`);
    for (const [ring, owner] of Object.entries(c.owners)) {
      assert.equal(rings[ring]!.owner(id), owner, `${what}: owner in ${ring}`);
    }
  }
});

test('a ring does not depend on the order its members are listed in', () => {
  const a = new Ring(['c', 'a', 'b', 'a']);
  const b = new Ring(['a', 'b', 'c']);
  assert.deepEqual(a.members, ['a', 'b', 'c']);
  for (let i = 0n; i < 500n; i++) assert.equal(a.owner(i * 0x9e3779b97f4a7c15n), b.owner(i * 0x9e3779b97f4a7c15n));
  assert.equal(new Ring([]).owner(1n), undefined);
  assert.equal(new Ring(['solo']).owner(42n), 'solo');
});
