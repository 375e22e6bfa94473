// Unit tests: fallback shares, lease arithmetic on an injected clock, hot keys, headers,
// validation, and a client no node answers for.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Answer } from '../src/answer.js';
import { Client } from '../src/client.js';
import { ConfigError, RinglimitError } from '../src/errors.js';
import { Fallback, shareOf } from '../src/fallback.js';
import { answersHeaders, ietfValues, retryAfterSecs } from '../src/headers.js';
import { HotKeys } from '../src/hotkeys.js';
import { DENIED, FORWARD, Held, LEASED, type Grant_, type Mark } from '../src/lease.js';
import { inlinePolicyName, resolveInline } from '../src/rules.js';
import { closedPort } from './helpers.js';

const HOUR = 3_600_000;

function admitted(f: Fallback, id: bigint, limit: number, alive: number, now = 1_000): number {
  const rule = resolveInline({ limit, periodMs: HOUR });
  let n = 0;
  for (let i = 0; i < 100; i++) {
    const [a] = f.fallBack(id, rule, 1, alive, now);
    assert.ok(a.degraded);
    assert.equal(a.limit, limit, 'answered with the whole limit');
    if (a.allowed) n++;
  }
  return n;
}

test('per member, the fallback admits the limit divided among the members alive', () => {
  const f = new Fallback(1_000, 'per-member');
  assert.equal(admitted(f, 1n, 12, 1), 12);
  assert.equal(admitted(f, 2n, 12, 3), 4);
  assert.equal(admitted(f, 3n, 12, 100), 1, 'never less than one');
  assert.equal(admitted(f, 4n, 12, 0), 12, 'no member known: the whole limit');
});

test('a fraction share is that fraction of the limit, rounded up', () => {
  const f = new Fallback(1_000, { fraction: 0.25 });
  assert.equal(admitted(f, 1n, 10, 1), 3);
  assert.equal(admitted(f, 2n, 10, 5), 3);
  assert.deepEqual(shareOf({ algorithm: 'token_bucket', limit: 10, periodMs: 1000, burst: 20 }, 3), { algorithm: 'token_bucket', limit: 3, periodMs: 1000, burst: 6 });
});

test('a rule never learnt is admitted without a limit, a fail-closed one denied', () => {
  const f = new Fallback(1_000);
  const [unknown, t1] = f.fallBack(7n, undefined, 1, 1, 5_000);
  assert.deepEqual([unknown.allowed, unknown.degraded, unknown.limit, t1], [true, true, 0, undefined]);
  const closed = { ...resolveInline({ limit: 10, periodMs: HOUR }), failClosed: true };
  const [c, t2] = f.fallBack(7n, closed, 1, 1, 5_000);
  assert.deepEqual([c.allowed, c.degraded, c.retryAfterMs, t2], [false, true, 1000, undefined]);
  assert.equal(f.size, 0, 'neither holds a bucket');
});

test('what a share took is given back, every algorithm, and buckets are bounded', () => {
  for (const algorithm of ['token_bucket', 'fixed_window', 'sliding_window', 'sliding_log', 'leaky_bucket'] as const) {
    const f = new Fallback(2);
    const rule = resolveInline({ limit: 1, periodMs: HOUR, algorithm });
    const now = 1_700_000_000_123;
    const [a, taken] = f.fallBack(1n, rule, 1, 1, now);
    assert.ok(a.allowed && taken, algorithm);
    assert.equal(f.fallBack(1n, rule, 1, 1, now)[0].allowed, false, `${algorithm}: spent`);
    f.refund(taken!, now);
    assert.equal(f.fallBack(1n, rule, 1, 1, now)[0].allowed, true, `${algorithm}: given back`);
    for (let id = 2n; id < 10n; id++) f.fallBack(id, rule, 1, 1, now);
    assert.ok(f.size <= 2);
  }
});

test('fallback windows reset and token buckets refill with time', () => {
  const f = new Fallback();
  const fixed = resolveInline({ limit: 2, periodMs: 1000, algorithm: 'fixed_window' });
  const t0 = 1_700_000_000_000;
  assert.ok(f.fallBack(1n, fixed, 2, 1, t0 + 100)[0].allowed);
  const denied = f.fallBack(1n, fixed, 1, 1, t0 + 400)[0];
  assert.deepEqual([denied.allowed, denied.retryAfterMs, denied.resetAtMs], [false, 600, t0 + 1000]);
  assert.ok(f.fallBack(1n, fixed, 1, 1, t0 + 1000)[0].allowed, 'the next window');
  const bucket = resolveInline({ limit: 10, periodMs: 1000 });
  for (let i = 0; i < 10; i++) assert.ok(f.fallBack(2n, bucket, 1, 1, t0)[0].allowed);
  const empty = f.fallBack(2n, bucket, 1, 1, t0)[0];
  assert.deepEqual([empty.allowed, empty.retryAfterMs], [false, 100]);
  assert.ok(f.fallBack(2n, bucket, 1, 1, t0 + 100)[0].allowed, 'one token back after 100 ms');
});

// ---- leases, on an injected clock (ms)

const mark: Mark = { resetNs: '1700000001000000000', atNs: '1700000000000000000' };
const granted = (tokens: number, validMs: number): Grant_ => ({ granted: { tokens, validMs, mark, limit: 100, resetAtMs: 1_700_000_001_000 } });
const rule = resolveInline({ limit: 100, periodMs: 1000, algorithm: 'fixed_window' });

function leased(h: Held, id = 1n, now = 10): { e: ReturnType<Held['entries']['get']> & object } {
  assert.ok(h.want(id));
  const e = h.entries.get(id)!;
  const out = {} as Answer;
  assert.equal(h.take(e, 1, now, 'k', rule, out), FORWARD, 'no slice yet: to the owner, and an ask is due');
  return { e };
}

test('a holder never admits more than granted, and asks again when half is spent', () => {
  let wakes = 0;
  const h = new Held(undefined, () => wakes++);
  const { e } = leased(h);
  const [due] = h.dueAsks(10);
  assert.ok(due && wakes === 1);
  assert.deepEqual([due.key, due.want, due.demandPerS], ['k', 100, 1000], 'initial demand 1000/s over a 100 ms span');
  assert.equal(h.dueAsks(11).length, 0, 'one ask at a time');
  h.answered(due, granted(10, 1000), 12);
  const out = {} as Answer;
  let admitted = 0;
  for (let i = 0; i < 50; i++) if (h.take(e, 1, 20, 'k', rule, out) === LEASED) admitted++;
  assert.equal(admitted, 10, 'exactly the slice');
  assert.deepEqual([out.leased, out.limit, out.resetAtMs], [true, 100, 1_700_000_001_000]);
  const renew = h.dueAsks(20);
  assert.equal(renew.length, 1, 'asked again once below half');
  assert.equal(renew[0]!.demandPerS, 1250, '10 spent in 8 ms');
  assert.equal(renew[0]!.want, 125);
});

test('a slice ends at its time and what it had left goes back under its mark', () => {
  const h = new Held();
  const { e } = leased(h);
  const due = h.dueAsks(10)[0]!;
  h.answered(due, granted(10, 500), 30);
  const out = {} as Answer;
  assert.equal(h.take(e, 3, 100, 'k', rule, out), LEASED);
  assert.equal(out.remaining, 7);
  // The slice's time counts from the ask (10 ms), not from the answer (30 ms).
  assert.equal(h.take(e, 1, 509, 'k', rule, out), LEASED);
  assert.equal(h.take(e, 1, 510, 'k', rule, out), FORWARD, 'past valid_ns: to the owner');
  const back = h.returns(511);
  assert.deepEqual(back.map((r) => [r.key, r.tokens, r.mark]), [['k', 6, mark]]);
  assert.equal(h.returns(512).length, 0, 'once');
});

test('a refused ask denies locally until its retry, a kept bucket backs off', () => {
  const h = new Held();
  const { e } = leased(h);
  const due = h.dueAsks(10)[0]!;
  const refused: Answer = { allowed: false, limit: 100, remaining: 0, resetAtMs: 5, retryAfterMs: 300, degraded: false, leased: false };
  h.answered(due, { refused }, 20);
  const out = {} as Answer;
  assert.equal(h.take(e, 1, 100, 'k', rule, out), DENIED);
  assert.deepEqual([out.allowed, out.leased, out.retryAfterMs], [false, true, 210], 'until the ask time plus retry_after');
  assert.equal(h.take(e, 0, 100, 'k', rule, out), FORWARD, 'a read goes to the owner');
  assert.equal(h.take(e, 1, 310, 'k', rule, out), FORWARD, 'after it: to the owner, asking again');
  const again = h.dueAsks(310)[0]!;
  h.answered(again, { refused: { ...refused, allowed: true } }, 320);
  assert.equal(h.take(e, 1, 400, 'k', rule, out), FORWARD);
  assert.equal(h.dueAsks(400).length, 0, 'backing off');
  assert.equal(h.take(e, 1, 1_320, 'k', rule, out), FORWARD);
  assert.equal(h.dueAsks(1_320).length, 1, 'asked again after the backoff');
});

test('a released bucket gives its slices back and a late grant goes straight back', () => {
  let wakes = 0;
  const h = new Held(undefined, () => wakes++);
  const { e } = leased(h);
  const due = h.dueAsks(10)[0]!;
  h.answered(due, granted(8, 1000), 12);
  assert.equal(h.tokens(), 8);
  assert.ok(h.release(1n, 'cooled'));
  assert.ok(e.released);
  assert.equal(h.take(e, 1, 20, 'k', rule, {} as Answer), FORWARD);
  assert.deepEqual(h.returns(20).map((r) => r.tokens), [8]);
  const { e: e2 } = leased(h, 2n);
  const due2 = h.dueAsks(30)[0]!;
  h.release(2n, 'ring');
  h.answered(due2, granted(5, 1000), 31);
  assert.deepEqual(h.returns(32).map((r) => r.tokens), [5], 'granted after release: back');
  assert.ok(e2.released && h.count === 0 && h.released.cooled === 1 && h.released.ring === 1);
});

test('early renewals are kept, at most three slices, the oldest spent first', () => {
  const h = new Held();
  const { e } = leased(h);
  const d = h.dueAsks(10)[0]!;
  // Four grants for one bucket (renewals that came before the last slice was spent).
  for (let i = 0; i < 4; i++) h.answered(d, granted(2, 1000), 10 + i);
  assert.equal(e.grants.length, 3);
  assert.deepEqual(h.returns(20).map((r) => r.tokens), [2], 'the oldest of four went back');
  assert.equal(h.tokens(), 6);
});

// ---- hot keys

test('one check in eight counted eight times promotes a key at 1000/s within a tick', () => {
  const promotedAfter = (checks: number) => {
    const hk = new HotKeys();
    for (let i = 0; i < Math.floor(checks / 8); i++) hk.record(7n, 8);
    return hk.tick().promoted.includes(7n);
  };
  assert.ok(promotedAfter(504));
  assert.ok(!promotedAfter(496));
});

test('a hot key among many cold ones is promoted, then demoted when it cools', () => {
  const hk = new HotKeys();
  let promoted = false;
  for (let t = 0; t < 4 && !promoted; t++) {
    for (let i = 0; i < 500; i++) {
      hk.record(1n, 1);
      hk.record(BigInt(1000 + ((i * 7919 + t * 104729) % 100_000)), 1);
    }
    const c = hk.tick();
    assert.ok(c.promoted.every((id) => id === 1n), `a cold key promoted: ${c.promoted}`);
    promoted = c.promoted.includes(1n);
  }
  assert.ok(promoted && hk.isHot(1n));
  assert.ok(hk.tracked <= 256);
  let demoted = false;
  for (let t = 0; t < 6 && !demoted; t++) {
    for (let i = 0; i < 25; i++) hk.record(1n, 1);
    demoted = hk.tick().demoted.includes(1n);
  }
  assert.ok(demoted && hk.hotCount === 0);
});

// ---- headers

test('the IETF fields list every limit as structured fields, as a node writes them', () => {
  const a: Answer = { allowed: true, limit: 100, remaining: 42, resetAtMs: 1_700_000_018_000, retryAfterMs: 0, degraded: false, leased: false };
  const b: Answer = { ...a, limit: 5, remaining: 0, resetAtMs: 1_700_000_000_250 };
  const nowMs = 1_700_000_000_000;
  const { policy, state } = ietfValues([
    { name: 'per-user', periodMs: 60_000, answer: a, nowMs },
    { name: 'odd"name', periodMs: 250, answer: b, nowMs },
  ]);
  assert.equal(policy, '"per-user";q=100;w=60, "odd\\"name";q=5;w=1');
  assert.equal(state, '"per-user";r=42;t=18, "odd\\"name";r=0;t=1');
  assert.equal(inlinePolicyName(10, 1000, 'sliding_log'), '10-per-1000ms-sliding_log');
  assert.equal(inlinePolicyName(10, 1000, 'token_bucket', 20), '10-per-1000ms-burst-20');
  assert.equal(resolveInline({ limit: 10000, period: '1mo', calendar: true, algorithm: 'fixed_window', timezone: 'europe/berlin' }).name, '10000-per-1mo-Europe/Berlin-fixed_window');
});

test('a denial rounds up to whole seconds and an unknown limit sends no fields', () => {
  const a: Answer = { allowed: false, limit: 10, remaining: 0, resetAtMs: 1_700_000_000_001, retryAfterMs: 1, degraded: false, leased: false };
  assert.deepEqual(answersHeaders([{ answer: a, name: 'api', periodMs: 1000 }], 0, 1_700_000_000_000), [
    ['x-ratelimit-limit', '10'],
    ['x-ratelimit-remaining', '0'],
    ['x-ratelimit-reset', '1700000001'],
    ['ratelimit-policy', '"api";q=10;w=1'],
    ['ratelimit', '"api";r=0;t=1'],
    ['retry-after', '1'],
  ]);
  assert.equal(retryAfterSecs({ ...a, retryAfterMs: 0 }), 1);
  assert.equal(retryAfterSecs({ ...a, retryAfterMs: 2001 }), 3);
  const unknown: Answer = { ...a, allowed: true, limit: 0 };
  assert.deepEqual(answersHeaders([{ answer: unknown, name: 'api', periodMs: 0 }], 0), []);
});

// ---- validation, as a node validates

test('inline rules and keys are refused with the nodes\' codes', () => {
  const code = (f: () => unknown) => {
    try {
      f();
    } catch (e) {
      assert.ok(e instanceof RinglimitError, String(e));
      return e.code;
    }
    return 'none';
  };
  assert.equal(code(() => resolveInline({ limit: 0, periodMs: 1000 })), 'invalid_limit');
  assert.equal(code(() => resolveInline({ limit: 1, periodMs: 0 })), 'invalid_period');
  assert.equal(code(() => resolveInline({ limit: 1, periodMs: 1000, algorithm: 'fixed_window', burst: 2 })), 'invalid_burst');
  assert.equal(code(() => resolveInline({ limit: 20_000, periodMs: 1000, algorithm: 'sliding_log' })), 'invalid_limit');
  assert.equal(code(() => resolveInline({ limit: 2_000_000, periodMs: 1000 })), 'invalid_limit', 'over one per microsecond');
  assert.equal(code(() => resolveInline({ limit: 1, period: '1d', calendar: true, algorithm: 'token_bucket' })), 'invalid_rule');
  assert.equal(code(() => resolveInline({ limit: 1, period: '1d', calendar: true, algorithm: 'fixed_window', timezone: 'Nowhere/Town' })), 'invalid_rule');
  assert.equal(code(() => resolveInline({ limit: 5, periodMs: 1000 })), 'none');
});

test('settings that cannot work are refused at once', () => {
  assert.throws(() => new Client({ seeds: [] }), ConfigError);
  assert.throws(() => new Client({ seeds: ['host'] }), ConfigError);
  assert.throws(() => new Client({ seeds: ['https://h:1/v1'] }), ConfigError);
  assert.throws(() => new Client({ seeds: ['ftp://h:1'] }), ConfigError);
  assert.throws(() => new Client({ seeds: ['h:1'], deadlineMs: 0 }), ConfigError);
  assert.throws(() => new Client({ seeds: ['h:1'], fallbackShare: { fraction: 1.5 } }), ConfigError);
});

// ---- a client nobody answers for

test('without a member, inline limits hold on the fallback and named rules are admitted', async () => {
  const port = await closedPort();
  const client = new Client({ seeds: [`http://127.0.0.1:${port}`, `grpc://127.0.0.1:${port}`], discoveryTimeoutMs: 200 });
  try {
    const answers = await Promise.all([0, 1, 2, 3].map(() => client.check({ key: 'k', limit: 3, periodMs: HOUR })));
    assert.deepEqual(answers.map((a) => [a.allowed, a.degraded, a.limit]), [
      [true, true, 3],
      [true, true, 3],
      [true, true, 3],
      [false, true, 3],
    ]);
    const named = await client.check({ key: 'k', rule: 'api' });
    assert.deepEqual([named.allowed, named.degraded, named.limit], [true, true, 0]);
    await assert.rejects(client.check({ key: '', rule: 'api' }), (e: RinglimitError) => e.code === 'invalid_key');
    await assert.rejects(client.check({ key: 'x'.repeat(513), limit: 3, periodMs: HOUR }), (e: RinglimitError) => e.code === 'invalid_key');
    await assert.rejects(client.check({ key: 'k', limit: 3, periodMs: HOUR, cost: 4 }), (e: RinglimitError) => e.code === 'invalid_cost');
    await assert.rejects(client.check({ key: 'k', limit: 0, periodMs: HOUR }), (e: RinglimitError) => e.code === 'invalid_limit');
    const s = client.stats();
    assert.deepEqual([s.degraded, s.direct, s.batches, s.fallbackBuckets], [5, 0, 0, 1]);
    assert.ok(s.refreshFailures >= 1);
    await assert.rejects(client.reserve({ key: 'k', limit: 3, periodMs: HOUR }), (e: RinglimitError) => e.code === 'unavailable');
  } finally {
    await client.close();
  }
});

test('all-or-nothing on the fallback alone: a denial takes nothing from the other limits', async () => {
  const port = await closedPort();
  const client = new Client({ seeds: [`127.0.0.1:${port}`], discoveryTimeoutMs: 200 });
  try {
    const ip = { key: 'ip:1', limit: 10, periodMs: HOUR };
    const user = { key: 'user:1', limit: 1, periodMs: HOUR };
    const first = await client.checkAll([ip, user]);
    assert.ok(first.allowed && first.degraded);
    assert.equal(first.binding, 1, 'the least left');
    const second = await client.checkAll([ip, user]);
    assert.ok(!second.allowed);
    assert.equal(second.binding, 1, 'the limit that denied');
    assert.equal(second.results[0]!.remaining, 9, 'reads as if the request never came');
    const peek = await client.check({ ...ip, cost: 0 });
    assert.equal(peek.remaining, 9, 'given back');
    await assert.rejects(client.checkAll([]), (e: RinglimitError) => e.code === 'invalid_batch');
    await assert.rejects(client.checkAll([ip, ip]), (e: RinglimitError) => e.code === 'duplicate_check');
    await assert.rejects(client.checkAll([ip, { ...user, key: '' }]), (e: RinglimitError) => e.code === 'invalid_key' && e.index === 1);
  } finally {
    await client.close();
  }
});

test('fail-closed without a member is an unavailable error', async () => {
  const port = await closedPort();
  const client = new Client({ seeds: [`127.0.0.1:${port}`], discoveryTimeoutMs: 200, failMode: 'closed' });
  try {
    await assert.rejects(client.check({ key: 'k', limit: 3, periodMs: HOUR }), (e: RinglimitError) => e.code === 'unavailable');
    assert.equal(client.stats().degraded, 0);
  } finally {
    await client.close();
  }
});

test('seeds are HTTP base URLs or grpc:// addresses', async () => {
  const { parseSeed, fromHttp } = await import('../src/topology.js');
  assert.deepEqual(parseSeed('http://10.0.0.1:8080/'), { http: 'http://10.0.0.1:8080' });
  assert.deepEqual(parseSeed('node-1:8080'), { http: 'http://node-1:8080' });
  assert.deepEqual(parseSeed('grpc://10.0.0.1:50051'), { grpc: '10.0.0.1:50051' });
  assert.deepEqual(parseSeed('http://[::1]:8080'), { http: 'http://[::1]:8080' });
  for (const bad of ['host', 'https://h:1', 'h:0', 'h:70000', 'grpc://h']) assert.equal(parseSeed(bad), undefined, bad);
  // With TLS: https:// (or no scheme) is the HTTP API over TLS; http:// is not accepted.
  assert.deepEqual(parseSeed('https://10.0.0.1:8080/', true), { http: 'https://10.0.0.1:8080' });
  assert.deepEqual(parseSeed('node-1:8080', true), { http: 'https://node-1:8080' });
  assert.deepEqual(parseSeed('grpc://10.0.0.1:50051', true), { grpc: '10.0.0.1:50051' });
  assert.equal(parseSeed('http://10.0.0.1:8080', true), undefined);
  // Over HTTP: the alive members, sorted, and the rules resolved as the nodes resolve them.
  const t = fromHttp(
    {
      node_id: 'n0',
      cluster_id: 'ringlimit',
      members: [
        { node_id: 'n1', http_addr: '10.0.0.2:8080', state: 'alive', grpc_addr: '10.0.0.2:50051' },
        { node_id: 'n0', http_addr: '10.0.0.1:8080', state: 'alive' },
        { node_id: 'n2', http_addr: '10.0.0.3:8080', state: 'dead' },
      ],
    },
    {
      rules: [
        { name: 'api', limit: 10, period_ms: 60_000, period: '1m', algorithm: 'token_bucket', burst: 10, mode: 'owner', on_owner_unreachable: 'closed', lease: 'off' },
        { name: 'g', limit: 5, period_ms: 1_000, period: '1s', algorithm: 'fixed_window', mode: 'global', on_owner_unreachable: 'open' },
        { name: 'broken', limit: 0, period_ms: 1_000, period: '1s', algorithm: 'fixed_window', mode: 'owner', on_owner_unreachable: 'open' },
      ],
    },
    'http://10.0.0.1:8080',
  );
  assert.deepEqual(t.ring.members, ['n0', 'n1']);
  assert.deepEqual(t.members.map((m) => m.grpcAddr), ['', '10.0.0.2:50051']);
  assert.deepEqual([...t.rules!.keys()].sort(), ['api', 'g'], 'a rule no node would serve is left out');
  const api = t.rules!.get('api')!;
  assert.deepEqual([api.failClosed, api.leasable, api.global, api.capacity], [true, false, false, 10]);
  assert.ok(t.rules!.get('g')!.global);
});
