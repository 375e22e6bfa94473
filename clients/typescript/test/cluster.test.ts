// Against a real three-node cluster started from $RINGLIMIT_BIN (skipped, with the reason,
// when it is unset): owner routing without a forwarded check, exact limits across nodes,
// all-or-nothing with a denial giving back holds, reservations, leases, fail-open when a node
// is SIGKILLed under load (its check stream broken), the middleware, and a credential on
// Lease, GiveBack and the check stream.
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import type { Answer } from '../src/answer.js';
import { Client } from '../src/client.js';
import { RinglimitError } from '../src/errors.js';
import { guardedService } from '../examples/guarded-service.js';
import { Cluster, SKIP, until } from './cluster.js';

const MINUTE = 60_000;
/** Generous: the machine is small and busy; these tests are about exactness, not latency. */
const DEADLINE = 2_000;

describe('a three-node cluster', { skip: SKIP }, () => {
  let cluster: Cluster;
  let grpcSdk = false;
  const clients: Client[] = [];
  const client = async (opts: Partial<ConstructorParameters<typeof Client>[0]> = {}) => {
    // Nodes without the SDK calls do not advertise their gRPC addresses: the client is told.
    const grpcAddrs = grpcSdk ? undefined : Object.fromEntries(cluster.nodes.map((n) => [n.id, n.grpc]));
    const c = new Client({ seeds: cluster.seeds(), deadlineMs: DEADLINE, discoveryTimeoutMs: 2_000, grpcAddrs, ...opts });
    clients.push(c);
    await c.ready();
    return c;
  };
  /** Skips a test needing the SDK calls (Topology, Lease, GiveBack, holds, grpc_addr), with why. */
  const needsSdkServer = (t: { skip: (m: string) => void }): boolean => {
    if (!grpcSdk) t.skip('this ringlimit binary does not advertise members\' gRPC addresses (no ringlimit.v1 SDK calls)');
    return !grpcSdk;
  };

  before(async () => {
    cluster = await Cluster.start();
    grpcSdk = await cluster.advertisesGrpc();
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    cluster?.stop();
  });

  test('discovery finds every member, and each check goes straight to its owner', async () => {
    const c = await client();
    assert.deepEqual(c.members(), ['n0', 'n1', 'n2']);
    const forwarded = await cluster.total('ringlimit_forwarded_total');
    const relayed = await cluster.total('ringlimit_relayed_total');
    const keys = Array.from({ length: 300 }, (_, i) => `user:${i}`);
    const owners = new Set(keys.map((key) => c.ownerOf({ key, rule: 'api' })));
    assert.equal(owners.size, 3, 'keys spread over every member');
    const named = await Promise.all(keys.map((key) => c.check({ key, rule: 'api' })));
    const inline = await Promise.all(keys.map((key) => c.check({ key, limit: 5, periodMs: MINUTE })));
    for (const a of [...named, ...inline]) assert.ok(a.allowed && !a.degraded, JSON.stringify(a));
    assert.equal(named[0]!.limit, 10);
    assert.equal(named[0]!.remaining, 9);
    assert.equal(await cluster.total('ringlimit_forwarded_total'), forwarded, 'no check forwarded');
    assert.equal(await cluster.total('ringlimit_relayed_total'), relayed, 'no check relayed');
    const s = c.stats();
    assert.equal(s.direct, 600);
    assert.equal(s.degraded, 0);
    assert.ok(s.batches < 600, `concurrent checks coalesced: ${s.batches} batches for ${s.checksSent} checks`);
    assert.ok(s.streamed > 0 && s.streamsOpened <= 3, `checks on one stream per member: ${JSON.stringify(s)}`);
    // A global rule goes to any member; an unknown rule and a bad key are errors with the nodes' codes.
    assert.ok((await c.check({ key: 'g', rule: 'everywhere' })).allowed);
    await assert.rejects(c.check({ key: 'k', rule: 'no-such-rule' }), (e: RinglimitError) => e.code === 'unknown_rule');
    await assert.rejects(c.check({ key: '', rule: 'api' }), (e: RinglimitError) => e.code === 'invalid_key');
  });

  test('a limit is exact across nodes and clients', async () => {
    const [a, b] = [await client(), await client(grpcSdk ? { seeds: [`grpc://${cluster.nodes[1]!.grpc}`] } : {})];
    for (const key of ['acct:1', 'acct:2', 'acct:3']) {
      const answers = await Promise.all(Array.from({ length: 80 }, (_, i) => (i % 2 ? a : b).check({ key, rule: 'exact' })));
      assert.equal(answers.filter((x) => x.allowed).length, 50, `${key}: exactly the limit`);
      assert.ok(answers.every((x) => !x.degraded));
      const denied = answers.find((x) => !x.allowed)!;
      assert.ok(denied.retryAfterMs > 0 && denied.remaining === 0);
    }
  });

  test('all-or-nothing: a denial gives back what the other limits held', async (t) => {
    if (needsSdkServer(t)) return;
    const c = await client();
    // Keys owned by different members, so that the give-back crosses owners.
    const keys = Array.from({ length: 50 }, (_, i) => `ip:${i}`);
    const ip = keys.find((k) => c.ownerOf({ key: k, rule: 'api' }) === 'n0')!;
    const user = keys.find((k) => c.ownerOf({ key: k, limit: 1, periodMs: MINUTE }) !== 'n0')!;
    const both = [
      { key: ip, rule: 'api' },
      { key: user, limit: 1, periodMs: MINUTE },
    ];
    const first = await c.checkAll(both);
    assert.ok(first.allowed && !first.degraded, JSON.stringify(first));
    assert.equal(first.binding, 1);
    const second = await c.checkAll(both);
    assert.ok(!second.allowed);
    assert.equal(second.binding, 1, 'the limit that denied');
    assert.equal(second.results[0]!.remaining, 9, 'reads as if the request never came');
    const peek = await c.check({ key: ip, rule: 'api', cost: 0 });
    assert.equal(peek.remaining, 9, 'the hold was given back at its owner');
    assert.ok(c.stats().tokensGivenBack >= 1);
  });

  test('reserve and settle at the owner', async () => {
    const c = await client();
    const result = await c.reserve({ key: 'team:1', rule: 'api', cost: 6 }, async (r) => {
      assert.ok(r.allowed && r.id);
      assert.equal(r.answer.remaining, 4);
      r.actual = 2;
      return 'done';
    });
    assert.equal(result, 'done');
    assert.equal((await c.check({ key: 'team:1', rule: 'api', cost: 0 })).remaining, 8, 'settled at 2: 4 given back');
    const held = await c.reserve({ key: 'team:2', rule: 'api', cost: 10 });
    assert.ok(held.allowed);
    const denied = await c.reserve({ key: 'team:2', rule: 'api', cost: 1 });
    assert.ok(!denied.allowed && denied.id === '');
    assert.equal(await denied.settle(), undefined, 'nothing to settle');
    const after = await held.settle(3);
    assert.ok(after && after.remaining === 7, JSON.stringify(after));
    await assert.rejects(c.settle('not-an-id', 1), (e: RinglimitError) => e.code === 'unknown_reservation' || e.code === 'invalid_request');
  });

  test('leases: a hot key is decided in process and never over the limit', async (t) => {
    if (needsSdkServer(t)) return;
    // Promoted at 20 checks/s (1,000 by default): the test does not depend on this machine's speed.
    const c = await client({ leases: true, deadlineMs: 500, hotSettings: { promoteAt: 20, demoteAt: 10 } });
    const check = { key: 'hot:1', rule: 'hot' };
    const LIMIT = 20_000;
    // Admissions by window (a fixed window's answers carry its end): each within the limit.
    const admitted = new Map<number, number>();
    let leased = 0;
    let deniedAfterLimit = 0;
    const end = Date.now() + 15_000;
    // Rounds of concurrent checks, well over the hot keys' 1000/s, until the limit is spent
    // and denials come.
    while (Date.now() < end && deniedAfterLimit < 1_000) {
      const round: Answer[] = await Promise.all(Array.from({ length: 200 }, () => c.check(check)));
      for (const a of round) {
        if (a.allowed) admitted.set(a.resetAtMs, (admitted.get(a.resetAtMs) ?? 0) + 1);
        else deniedAfterLimit++;
        if (a.leased) leased++;
      }
    }
    const total = [...admitted.values()].reduce((x, y) => x + y, 0);
    for (const [reset, n] of admitted) assert.ok(n <= LIMIT, `window ending ${reset}: admitted ${n} of ${LIMIT}`);
    assert.ok(deniedAfterLimit >= 1_000, `the limit was reached (admitted ${total})`);
    const s = c.stats();
    assert.ok(leased > 0 && s.leaseGrants > 0, `some checks decided on a lease (stats ${JSON.stringify(s)})`);
    t.diagnostic(`admitted ${total}, decided on a lease ${leased}, stats ${JSON.stringify(s)}`);
  });

  test('the example service against the cluster: /hello at 5 per 10 s', async () => {
    const c = await client();
    const server = guardedService(c).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const key = `alice-${Date.now()}`;
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) statuses.push((await fetch(`${base}/hello`, { headers: { 'x-api-key': key } })).status);
      assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
      const denied = await fetch(`${base}/hello`, { headers: { 'x-api-key': key } });
      assert.equal(denied.status, 429);
      assert.match(denied.headers.get('ratelimit-policy') ?? '', /^"5-per-10000ms";q=5;w=10$/);
      assert.ok(Number(denied.headers.get('retry-after')) >= 1);
    } finally {
      server.close();
    }
  });

  // Last: it kills a node.
  test('a node SIGKILLed under load: no exception, degraded only while unreachable', async (t) => {
    const victim = cluster.nodes[2]!;
    // Its topology stream is on the victim: killed, the client must watch another member.
    const c = await client(grpcSdk ? { deadlineMs: 200, seeds: [`grpc://${victim.grpc}`] } : { deadlineMs: 200 });
    const keys = Array.from({ length: 60 }, (_, i) => `load:${i}`);
    const victimKeys = keys.filter((key) => c.ownerOf({ key, rule: 'loaded' }) === victim.id);
    assert.ok(victimKeys.length > 0);
    let errors = 0;
    let degraded = 0;
    let running = true;
    const load = (async () => {
      while (running) {
        const round = await Promise.allSettled(keys.map((key) => c.check({ key, rule: 'loaded' })));
        for (const r of round) {
          if (r.status === 'rejected') errors++;
          else if (r.value.degraded) degraded++;
        }
      }
    })();
    await new Promise((r) => setTimeout(r, 300));
    await cluster.kill(victim);
    await until('the client routes around the dead node', () => c.members().length === 2, 30_000);
    running = false;
    await load;
    assert.equal(errors, 0, 'no check failed');
    // The checks went on the members' check streams; the victim's broke under them.
    assert.ok(c.stats().streamed > 0, JSON.stringify(c.stats()));
    // Once the topology dropped the node, nothing is degraded.
    const settled = await Promise.all(keys.map((key) => c.check({ key, rule: 'loaded' })));
    assert.ok(
      settled.every((a) => a.allowed && !a.degraded),
      JSON.stringify(settled.filter((a) => a.degraded)),
    );
    t.diagnostic(`degraded answers while the node was unreachable: ${degraded}`);
  });
});

describe('a cluster with a secret and a client token', { skip: SKIP }, () => {
  let cluster: Cluster;
  const token = 'sdk-token-0123456789abcdef';
  before(async () => {
    cluster = await Cluster.start({ secret: 'cluster-secret-0123456789abcdef', clientToken: token });
  });
  after(() => cluster?.stop());

  test('checks need no credential; give-backs are honoured only with the token', async (t) => {
    if (!(await cluster.advertisesGrpc())) {
      t.skip('this ringlimit binary has no ringlimit.v1 SDK calls');
      return;
    }
    const run = async (withToken: boolean) => {
      const c = new Client({ seeds: cluster.seeds(), deadlineMs: DEADLINE, discoveryTimeoutMs: 2_000, token: withToken ? token : undefined });
      try {
        await c.ready();
        const tag = withToken ? 'a' : 'b';
        const both = [
          { key: `ip:${tag}`, limit: 10, periodMs: MINUTE },
          { key: `user:${tag}`, limit: 1, periodMs: MINUTE },
        ];
        assert.ok((await c.checkAll(both)).allowed, 'checks need no credential');
        const denied = await c.checkAll(both);
        assert.ok(!denied.allowed);
        const peek = await c.check({ ...both[0]!, cost: 0 });
        // The check stream needs the credential here: without it, the check went unary.
        return [peek.remaining, c.stats().tokensGivenBack, c.stats().streamed > 0];
      } finally {
        await c.close();
      }
    };
    assert.deepEqual(await run(true), [9, 1, true], 'given back with the token');
    assert.deepEqual(await run(false), [8, 0, false], 'without it the hold stays taken (under-admission only)');
  });
});
