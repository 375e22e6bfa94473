// The SDK's benchmark, printed as one JSON object:
// - leased: checks decided in process on one hot key from one thread (the synchronous
//   `tryCheck` fast path, and `await client.check()` on the same path), with what was admitted
//   against the rule's limit (never more);
// - round trip: p50/p99 of `await client.check()` without leases (one at a time), and the
//   checks and CheckBatch calls sent.
//
//   node dist/bench/bench.js [--seeds http://h:8080,...] [--seconds 3]
// Without --seeds it starts a three-node cluster from $RINGLIMIT_BIN (as the tests do).
import { setImmediate as tick } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import type { Answer } from '../src/answer.js';
import { Client, type Check } from '../src/client.js';
import { BIN, Cluster } from '../test/cluster.js';

const { values } = parseArgs({
  options: {
    seeds: { type: 'string' },
    seconds: { type: 'string', default: '3' },
    samples: { type: 'string', default: '2000' },
    limit: { type: 'string', default: '10000000' },
    // One phase only: round_trip (no leases) or leased.
    only: { type: 'string', default: 'all' },
    // Callers of the concurrent phase (only when asked: --only concurrent).
    concurrency: { type: 'string', default: '32' },
  },
});
const seconds = Number(values.seconds);
const limit = Number(values.limit);
const only = values.only;
// The client credential (leases need one on nodes with a secret).
const token = process.env.RINGLIMIT_CLIENT_TOKEN || undefined;
if (!['all', 'round_trip', 'leased', 'concurrent'].includes(only)) {
  console.error('--only: all, round_trip, leased or concurrent');
  process.exit(2);
}

let cluster: Cluster | undefined;
let seeds: string[];
if (values.seeds) {
  seeds = values.seeds.split(',');
} else if (BIN) {
  cluster = await Cluster.start();
  seeds = cluster.seeds();
} else {
  console.error('give --seeds, or set RINGLIMIT_BIN to start a cluster');
  process.exit(2);
}

const percentile = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor(xs.length * p))]!;

async function roundTrip() {
  // Round trips without leases, one check at a time, keys spread over the owners.
  const plain = new Client({ seeds, token, deadlineMs: 1_000 });
  await plain.ready();
  const rtts: number[] = [];
  const samples = Number(values.samples);
  let degraded = 0;
  const loopStart = performance.now();
  for (let i = 0; i < samples; i++) {
    const t0 = performance.now();
    const a = await plain.check({ key: `rtt:${i % 500}`, limit: 1_000_000, periodMs: 1_000 });
    rtts.push(performance.now() - t0);
    if (a.degraded) degraded++;
  }
  // The loop's own time: its rate is the Rust SDK's in the like-for-like comparison.
  const loopSeconds = (performance.now() - loopStart) / 1000;
  rtts.sort((a, b) => a - b);
  // Concurrent checks coalesce per owner: one round of 1000 at once.
  const before = plain.stats();
  const t1 = performance.now();
  await Promise.all(Array.from({ length: 1_000 }, (_, i) => plain.check({ key: `burst:${i}`, limit: 1_000_000, periodMs: 1_000 })));
  const burstMs = performance.now() - t1;
  const after = plain.stats();

  const result = {
    round_trip_ms: { p50: +percentile(rtts, 0.5).toFixed(3), p99: +percentile(rtts, 0.99).toFixed(3), samples, degraded },
    round_trip_seconds: +loopSeconds.toFixed(3),
    burst_1000_concurrent_ms: +burstMs.toFixed(1),
    checks_sent: after.checksSent,
    batches: after.batches,
    burst_batches: after.batches - before.batches,
  };
  await plain.close();
  return result;
}

async function leased() {
  // Leased: one hot key under a window of --limit per hour, reached within a few seconds at
  // the target rate: what is admitted stays within it, and the rest is denied in process too.
  const leasing = new Client({ seeds, token, leases: true, deadlineMs: 1_000 });
  await leasing.ready();
  const check: Check = { key: 'hot:bench', rule: { limit, periodMs: 3_600_000, algorithm: 'fixed_window' } };
  const warmEnd = Date.now() + 10_000;
  let warm = 0;
  while (!leasing.tryCheck(check) && Date.now() < warmEnd) {
    await Promise.all(Array.from({ length: 100 }, () => leasing.check(check)));
    warm += 100;
  }
  const out = {} as Answer;
  let decided = 0;
  let admitted = 0;
  let denied = 0;
  let viaOwner = 0;
  let windowReset = 0;
  const end = performance.now() + seconds * 1_000;
  const t2 = performance.now();
  while (performance.now() < end) {
    // Synchronous chunks; between them the event loop runs (renewals, give-backs).
    let i = 0;
    for (; i < 50_000; i++) {
      const a = leasing.tryCheck(check, out);
      if (a === undefined) break;
      decided++;
      if (a.allowed) admitted++;
      else denied++;
    }
    if (i < 50_000) {
      const a = await leasing.check(check);
      viaOwner++;
      if (a.allowed) admitted++;
      windowReset = a.resetAtMs;
    }
    await tick();
  }
  const syncS = (performance.now() - t2) / 1_000;
  windowReset ||= out.resetAtMs;
  // The same path through the promise API: `await client.check()`.
  let awaited = 0;
  const end2 = performance.now() + Math.min(1, seconds) * 1_000;
  const t3 = performance.now();
  while (performance.now() < end2) {
    for (let i = 0; i < 10_000; i++) {
      const a = await leasing.check(check);
      awaited++;
      if (a.allowed) admitted++;
    }
    await tick();
  }
  const awaitS = (performance.now() - t3) / 1_000;
  const ls = leasing.stats();
  const result = {
    try_check_per_s: Math.round(decided / syncS),
    await_check_per_s: Math.round(awaited / awaitS),
    decided_in_process: decided + awaited,
    sent_to_owner: viaOwner,
    warmup_checks: warm,
    admitted,
    denied_in_process: denied,
    limit,
    admitted_within_limit: admitted <= limit,
    window_reset_at_ms: windowReset,
    lease_asks: ls.leaseAsks,
    lease_grants: ls.leaseGrants,
    tokens_given_back: ls.tokensGivenBack,
  };
  await leasing.close();
  return result;
}

// `--concurrency` callers checking keys spread over 100,000 (a token bucket of 1,000,000 a
// minute, as the Rust SDK's sdk_load does) without leases: the per-owner batching's load.
async function concurrent() {
  const c = new Client({ seeds, token, deadlineMs: 1_000 });
  await c.ready();
  const callers = Number(values.concurrency);
  const lat: number[] = [];
  let checks = 0;
  let degraded = 0;
  let seed = 0x9e3779b9;
  const end = performance.now() + seconds * 1_000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (performance.now() < end) {
        seed = (seed * 1103515245 + 12345) >>> 0;
        const t = performance.now();
        const a = await c.check({ key: `load:${seed % 100_000}`, limit: 1_000_000, periodMs: 60_000 });
        lat.push(performance.now() - t);
        checks++;
        if (a.degraded) degraded++;
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1_000;
  lat.sort((a, b) => a - b);
  const s = c.stats();
  await c.close();
  return {
    callers,
    checks,
    checks_per_s: Math.round(checks / elapsed),
    p50_ms: +percentile(lat, 0.5).toFixed(3),
    p99_ms: +percentile(lat, 0.99).toFixed(3),
    degraded,
    checks_sent: s.checksSent,
    batches: s.batches,
  };
}

try {
  const result: Record<string, unknown> = { seeds: seeds.length };
  if (only === 'concurrent') result.concurrent = await concurrent();
  if (only === 'all' || only === 'round_trip') Object.assign(result, await roundTrip());
  if (only === 'all' || only === 'leased') result.leased = await leased();
  console.log(JSON.stringify(result, null, 2));
} finally {
  cluster?.stop();
}
