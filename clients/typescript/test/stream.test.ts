// The client's check stream against an in-process stand-in for one node (grpc-js server on
// loopback): checks travel on one stream; a node without CheckStream (an older one) gets
// unary calls; a stream that breaks or stops answering fails its checks over to the fallback
// (no rejection) and the next check opens a new one.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { join } from 'node:path';
import { Client } from '../src/client.js';
import { namedSeed } from '../src/hash.js';
import { packageRoot } from './helpers.js';

type Mode = 'answer' | 'absent' | 'hang';

interface Fake {
  addr: string;
  mode: Mode;
  /** The stream breaks (UNAVAILABLE) at this request, counted over all streams. */
  breakAt?: number;
  requests: number;
  streams: number;
  unary: number;
  server: grpc.Server;
}

const answer = { allowed: true, limit: '10', remaining: '9', resetAtMs: '1', retryAfterMs: '0' };

async function fake(mode: Mode, breakAt?: number): Promise<Fake> {
  const def = protoLoader.loadSync('ringlimit/v1/ratelimiter.proto', {
    includeDirs: [join(packageRoot(), 'proto')],
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(def) as unknown as { ringlimit: { v1: { RateLimiter: { service: grpc.ServiceDefinition } } } };
  const server = new grpc.Server();
  const f = { mode, breakAt, requests: 0, streams: 0, unary: 0, server } as Fake;
  const topology = () => ({
    nodeId: 'f0',
    clusterId: 'ringlimit',
    version: '1',
    members: [{ nodeId: 'f0', grpcAddr: f.addr }],
    ring: { scheme: 'xxh3-64-v1', vnodesPerMember: 160 },
    rules: [{ name: 'api', algorithm: 'FIXED_WINDOW', limit: '10', periodMs: '3600000', period: '1h', mode: 'OWNER', leasable: false, seed: namedSeed('api', 'fixed_window').toString() }],
  });
  const impl: Record<string, unknown> = {
    Topology: (_c: unknown, cb: grpc.sendUnaryData<unknown>) => cb(null, topology()),
    Check: (_c: unknown, cb: grpc.sendUnaryData<unknown>) => {
      f.unary++;
      cb(null, answer);
    },
    CheckBatch: (call: grpc.ServerUnaryCall<{ checks: unknown[] }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      f.unary++;
      cb(null, { results: call.request.checks.map(() => ({ answer })) });
    },
  };
  if (mode !== 'absent') {
    impl.CheckStream = (call: grpc.ServerDuplexStream<{ id: string; checks: unknown[] }, unknown>) => {
      f.streams++;
      call.on('data', (r: { id: string; checks: unknown[] }) => {
        f.requests++;
        if (f.requests === f.breakAt) {
          call.emit('error', { code: grpc.status.UNAVAILABLE, details: 'the fake broke the stream' });
          return;
        }
        if (f.mode === 'hang') return;
        call.write({ id: r.id, results: r.checks.map(() => ({ answer })) });
      });
      call.on('end', () => call.end());
      call.on('error', () => {});
    };
  }
  server.addService(pkg.ringlimit.v1.RateLimiter.service, impl as grpc.UntypedServiceImplementation);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  f.addr = `127.0.0.1:${port}`;
  return f;
}

const open: Array<{ c: Client; f: Fake }> = [];
afterEach(async () => {
  for (const { c, f } of open.splice(0)) {
    await c.close();
    f.server.forceShutdown();
  }
});

async function client(f: Fake, deadlineMs = 1_000): Promise<Client> {
  const c = new Client({ seeds: [`grpc://${f.addr}`], deadlineMs, discoveryTimeoutMs: 2_000 });
  open.push({ c, f });
  await c.ready();
  return c;
}

test('checks travel on one stream, coalesced', async () => {
  const f = await fake('answer');
  const c = await client(f);
  const got = await Promise.all(Array.from({ length: 50 }, (_, i) => c.check({ key: `k${i}`, rule: 'api' })));
  assert.ok(got.every((a) => a.allowed && !a.degraded));
  for (let i = 0; i < 5; i++) assert.ok(!(await c.check({ key: 'one', rule: 'api' })).degraded);
  const s = c.stats();
  assert.equal(f.streams, 1);
  assert.equal(f.unary, 0);
  assert.equal(s.streamsOpened, 1);
  assert.ok(s.streamed >= 6 && s.batches < s.checksSent, JSON.stringify(s));
});

test('a node without CheckStream gets unary calls, and no check fails', async () => {
  const f = await fake('absent');
  const c = await client(f);
  for (let i = 0; i < 5; i++) {
    const a = await c.check({ key: `u${i}`, rule: 'api' });
    assert.ok(a.allowed && !a.degraded, 'the refused stream\'s checks are sent again, unary');
  }
  assert.equal(f.unary, 5);
  assert.equal(c.stats().streamed, 0);
  assert.equal(c.stats().streamsOpened, 1, 'asked once');
});

test('a stream that breaks fails its checks over, and the next check opens another', async () => {
  const f = await fake('answer', 3);
  const c = await client(f, 30_000);
  const got = [];
  const t0 = performance.now();
  for (let i = 0; i < 4; i++) got.push(await c.check({ key: 'b', rule: 'api' }));
  assert.ok(performance.now() - t0 < 10_000, 'failed over when the stream broke, not at the deadline');
  assert.deepEqual(
    got.map((a) => a.degraded),
    [false, false, true, false],
  );
  assert.equal(f.streams, 2);
  assert.equal(c.stats().streamsOpened, 2);
});

test('a stream that stops answering falls back at the deadline and is replaced', async () => {
  const f = await fake('hang');
  const c = await client(f, 100);
  const hung = await c.check({ key: 'h', rule: 'api' });
  assert.ok(hung.degraded && hung.allowed, 'the fallback answered at the deadline');
  f.mode = 'answer';
  const next = await c.check({ key: 'h', rule: 'api' });
  assert.ok(!next.degraded, 'a new stream answers');
  assert.equal(f.streams, 2);
});
