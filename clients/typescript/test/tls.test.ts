// Against nodes that serve HTTP and gRPC over TLS (`--tls-cert`), with certificates this test
// makes (openssl, as the TLS guide does): checks reach their owners over TLS, by `https://` and
// `grpc://` seeds; a client that trusts another CA, checks another name, or speaks plaintext is
// degraded, never rejected; the server name override for certificates that name a host while
// members are dialed by IP. Skipped (with why) without $RINGLIMIT_BIN or openssl.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, type ClientOptions } from '../src/client.js';
import { ConfigError } from '../src/errors.js';
import { Cluster, makeCerts, NO_OPENSSL, SKIP, type Certs } from './cluster.js';

const HOUR = 3_600_000;
/** Generous: the machine is small and busy; the fallback must not decide the direct checks. */
const DEADLINE = 3_000;
/** Short: the clients that cannot reach the cluster give up discovery soon. */
const GIVE_UP = 300;
const NAME = 'ringlimit.test';

test('TLS settings that cannot work are refused', () => {
  const refused = (opts: ClientOptions, why: RegExp) => assert.throws(() => new Client(opts), (e: unknown) => e instanceof ConfigError && why.test(e.message));
  refused({ seeds: ['http://127.0.0.1:1', 'https://127.0.0.1:2'] }, /mix http:\/\/ and https:\/\//);
  refused({ seeds: ['http://127.0.0.1:1'], tls: { serverName: NAME } }, /plaintext/);
  refused({ seeds: ['https://127.0.0.1:1'], tls: { ca: '/nonexistent/ringlimit-ca.pem' } }, /cannot read/);
  refused({ seeds: ['https://127.0.0.1:1'], tls: { ca: Buffer.from('not a certificate') } }, /no PEM certificate/);
  refused({ seeds: ['https://127.0.0.1:1'], tls: { cert: 'c.pem', key: 'k.pem' } as never }, /no client certificate/);
});

describe('nodes serving TLS', { skip: SKIP || NO_OPENSSL }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'ringlimit-ts-tls-'));
  let ip: Certs;
  let named: Certs;
  let other: Certs;
  let cluster: Cluster;
  const clients: Client[] = [];
  const client = async (opts: ClientOptions) => {
    const c = new Client({ deadlineMs: DEADLINE, discoveryTimeoutMs: 2_000, ...opts });
    clients.push(c);
    await c.ready();
    return c;
  };
  /** Keys of both members answered by their owners, a limit exact. */
  const checksGoDirect = async (c: Client, tag: string) => {
    assert.deepEqual(c.members(), ['n0', 'n1']);
    const keys = Array.from({ length: 20 }, (_, i) => `tls:${tag}:${i}`);
    assert.equal(new Set(keys.map((key) => c.ownerOf({ key, limit: 100, periodMs: HOUR }))).size, 2, 'keys of both members');
    const got = await Promise.all(keys.map((key) => c.check({ key, limit: 100, periodMs: HOUR })));
    for (const a of got) assert.ok(a.allowed && !a.degraded, JSON.stringify(a));
    const exact: boolean[] = [];
    for (let i = 0; i < 4; i++) exact.push((await c.check({ key: `tls:${tag}:exact`, limit: 3, periodMs: HOUR })).allowed);
    assert.deepEqual(exact, [true, true, true, false]);
    const s = c.stats();
    assert.equal(s.direct, 24, JSON.stringify(s));
    assert.equal(s.degraded, 0, JSON.stringify(s));
  };
  /** No member reached: the fallback answers, `degraded`, and nothing is rejected. */
  const degraded = async (c: Client) => {
    assert.deepEqual(c.members(), []);
    const got = [];
    for (let i = 0; i < 3; i++) got.push(await c.check({ key: 'tls:fallback', limit: 2, periodMs: HOUR }));
    assert.deepEqual(
      got.map((a) => a.allowed),
      [true, true, false],
    );
    assert.ok(got.every((a) => a.degraded));
    assert.equal(c.stats().direct, 0);
    assert.ok(c.stats().refreshFailures >= 1);
  };

  before(async () => {
    ip = makeCerts(dir, 'DNS:localhost,IP:127.0.0.1', 'ip');
    named = makeCerts(dir, `DNS:${NAME}`, 'named');
    other = makeCerts(dir, 'DNS:localhost,IP:127.0.0.1', 'other');
    cluster = await Cluster.start({ size: 2, tls: ip });
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    cluster?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('checks reach their owners over TLS from https:// seeds', async () => {
    assert.ok(cluster.seeds().every((s) => s.startsWith('https://')));
    const c = await client({ seeds: cluster.seeds(), tls: { ca: ip.ca } });
    await checksGoDirect(c, 'https');
    assert.ok(c.stats().streamsOpened >= 1);
  });

  test('a grpc:// seed, the CA as PEM', async () => {
    const c = await client({ seeds: [`grpc://${cluster.nodes[1]!.grpc}`], tls: { ca: readFileSync(ip.ca, 'utf8') } });
    await checksGoDirect(c, 'grpc');
  });

  test('a client that trusts another CA is degraded, not rejected', async () => {
    for (const seeds of [cluster.seeds(), [`grpc://${cluster.nodes[0]!.grpc}`]]) {
      await degraded(await client({ seeds, tls: { ca: other.ca }, discoveryTimeoutMs: GIVE_UP }));
    }
  });

  test('plaintext against TLS is degraded, not rejected', async () => {
    const n = cluster.nodes[0]!;
    for (const seed of [`http://${n.http}`, `grpc://${n.grpc}`]) await degraded(await client({ seeds: [seed], discoveryTimeoutMs: GIVE_UP }));
  });

  test('a name the certificate lacks is degraded', async () => {
    // The override is in force: the nodes' certificate names 127.0.0.1 and localhost only.
    await degraded(await client({ seeds: cluster.seeds(), tls: { ca: ip.ca, serverName: NAME }, discoveryTimeoutMs: GIVE_UP }));
  });

  test('the server name override, for certificates of a host dialed by IP', async () => {
    const one = await Cluster.start({ size: 1, tls: named });
    try {
      assert.match(one.seeds()[0]!, /^https:\/\/127\.0\.0\.1:/);
      // Refused without the override...
      await degraded(await client({ seeds: one.seeds(), tls: { ca: named.ca }, discoveryTimeoutMs: GIVE_UP }));
      // ...and every member (seed, topology addresses) checked against it with the override.
      const c = await client({ seeds: one.seeds(), tls: { ca: named.ca, serverName: NAME } });
      assert.deepEqual(c.members(), ['n0']);
      const got = [];
      for (let i = 0; i < 3; i++) got.push(await c.check({ key: 'tls:named', limit: 2, periodMs: HOUR }));
      assert.deepEqual(
        got.map((a) => a.allowed),
        [true, true, false],
      );
      assert.equal(c.stats().degraded, 0);
    } finally {
      one.stop();
    }
  });
});
