// The Express and Fastify middleware, with real servers on 127.0.0.1:0 and a fake client: the
// rate-limit fields exactly as a node's edge writes them, 429 with Retry-After, no key no
// limit, 503 when fail-closed, 500 for a misconfigured limit; and the example service.
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import express from 'express';
import Fastify from 'fastify';
import type { Answer } from '../src/answer.js';
import type { Check } from '../src/client.js';
import { ConfigError, RinglimitError } from '../src/errors.js';
import { rateLimit } from '../src/express.js';
import { rateLimitHook, rateLimitPlugin } from '../src/fastify.js';
import type { Checker } from '../src/middleware.js';
import { guardedService } from '../examples/guarded-service.js';

/** A fake client: a fixed window of `limit` per key that resets at `resetAtMs`; answers on
 * its fast path when `fast` is set. */
class Fake implements Checker {
  seen: Check[] = [];
  used = new Map<string, number>();
  constructor(
    readonly limit: number,
    readonly opts: { fast?: boolean; fail?: RinglimitError; period?: number } = {},
  ) {}
  private decide(c: Check): Answer {
    this.seen.push(c);
    if (this.opts.fail) throw this.opts.fail;
    const used = this.used.get(c.key) ?? 0;
    const cost = c.cost ?? 1;
    const allowed = used + cost <= this.limit;
    if (allowed) this.used.set(c.key, used + cost);
    const resetAtMs = Date.now() + 9_500;
    return { allowed, limit: this.limit, remaining: this.limit - (allowed ? used + cost : used), resetAtMs, retryAfterMs: allowed ? 0 : 2_001, degraded: false, leased: !!this.opts.fast };
  }
  check(c: Check): Promise<Answer> {
    try {
      return Promise.resolve(this.decide(c));
    } catch (e) {
      return Promise.reject(e);
    }
  }
  tryCheck(c: Check): Answer | undefined {
    return this.opts.fast ? this.decide(c) : undefined;
  }
  periodMs(rule: string): number | undefined {
    return rule === 'api' ? this.opts.period ?? 60_000 : undefined;
  }
}

async function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; h: Headers; body: string }> {
  const res = await fetch(url, { headers });
  return { status: res.status, h: res.headers, body: await res.text() };
}

for (const fast of [false, true]) {
  test(`express: within the limit the fields are set, past it 429 (fast path ${fast})`, async () => {
    const fake = new Fake(2, { fast });
    const app = express();
    app.use(rateLimit({ client: fake, rule: 'api', key: (req) => req.get('x-user') }));
    app.get('/things', (_req, res) => res.send('served'));
    const server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      for (const left of ['1', '0']) {
        const r = await get(`${base}/things`, { 'x-user': 'u1' });
        assert.equal(r.status, 200);
        assert.equal(r.body, 'served');
        assert.equal(r.h.get('x-ratelimit-limit'), '2');
        assert.equal(r.h.get('x-ratelimit-remaining'), left);
        assert.equal(r.h.get('ratelimit-policy'), '"api";q=2;w=60');
        assert.equal(r.h.get('ratelimit'), `"api";r=${left};t=10`);
        assert.equal(r.h.get('retry-after'), null);
      }
      const denied = await get(`${base}/things`, { 'x-user': 'u1' });
      assert.equal(denied.status, 429);
      assert.equal(denied.h.get('retry-after'), '3', '2001 ms rounds up');
      assert.equal(denied.h.get('ratelimit'), '"api";r=0;t=10');
      assert.equal(denied.h.get('content-type')?.startsWith('application/json'), true);
      assert.deepEqual(JSON.parse(denied.body), { error: 'rate_limited', message: 'Too many requests; retry after 3 s.' });
      const nokey = await get(`${base}/things`);
      assert.equal(nokey.status, 200, 'no key, no limit');
      assert.equal(nokey.h.get('ratelimit'), null);
      assert.equal(fake.seen.length, 3);
    } finally {
      server.close();
    }
  });

  test(`fastify: the same fields and 429, hook and plugin (fast path ${fast})`, async () => {
    const fake = new Fake(1, { fast });
    const app = Fastify();
    app.get('/hook', { onRequest: rateLimitHook({ client: fake, limit: 1, periodMs: 1_500, key: (req) => req.headers['x-user'] as string | undefined }) }, async () => 'served');
    await app.register(async (scoped) => {
      await scoped.register(rateLimitPlugin, { client: fake, rule: 'api', cost: 1 });
      scoped.get('/plugin', async () => 'served');
    });
    const base = await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const ok = await get(`${base}/hook`, { 'x-user': 'a' });
      assert.equal(ok.status, 200);
      assert.equal(ok.body, 'served');
      assert.equal(ok.h.get('ratelimit-policy'), '"1-per-1500ms";q=1;w=2', 'an inline rule by its policy name');
      assert.equal(ok.h.get('ratelimit'), '"1-per-1500ms";r=0;t=10');
      const denied = await get(`${base}/hook`, { 'x-user': 'a' });
      assert.equal(denied.status, 429);
      assert.equal(denied.h.get('retry-after'), '3');
      assert.equal(JSON.parse(denied.body).error, 'rate_limited');
      assert.equal((await get(`${base}/hook`)).status, 200, 'no key, no limit');
      // The plugin limits by the client's IP by default.
      const p1 = await get(`${base}/plugin`);
      assert.equal(p1.status, 200);
      assert.equal(p1.h.get('x-ratelimit-limit'), '1');
      assert.equal((await get(`${base}/plugin`)).status, 429);
      assert.equal(fake.seen.at(-1)!.key, '127.0.0.1');
    } finally {
      await app.close();
    }
  });
}

test('a fail-closed client is 503 with Retry-After 1, a refused check 500', async () => {
  const closed = new Fake(1, { fail: new RinglimitError('unavailable', 'no cluster member answered') });
  const broken = new Fake(1, { fail: new RinglimitError('unknown_rule', 'no rule named "nope" is configured') });
  const app = express();
  app.get('/closed', rateLimit({ client: closed, rule: 'api' }), (_q, r) => r.send('served'));
  app.get('/broken', rateLimit({ client: broken, rule: 'nope' }), (_q, r) => r.send('served'));
  const server = app.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    const c = await get(`${base}/closed`);
    assert.equal(c.status, 503);
    assert.equal(c.h.get('retry-after'), '1');
    assert.equal(JSON.parse(c.body).error, 'unavailable');
    const b = await get(`${base}/broken`);
    assert.equal(b.status, 500);
    assert.equal(JSON.parse(b.body).error, 'rate_limit_misconfigured');
  } finally {
    server.close();
  }
  assert.throws(() => rateLimit({ client: closed, limit: 0, periodMs: 1000 }), ConfigError, 'a broken inline rule is said at start');
  assert.throws(() => rateLimit({ client: closed }), ConfigError);
});

test('the example service: /hello at 5 per 10 s per API key', async () => {
  const fake = new Fake(5);
  const server = guardedService(fake).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    for (let i = 0; i < 5; i++) {
      const r = await get(`${base}/hello`, { 'x-api-key': 'alice' });
      assert.equal(r.status, 200);
      assert.equal(r.body, 'hello, alice\n');
      assert.equal(r.h.get('ratelimit-policy'), '"5-per-10000ms";q=5;w=10');
    }
    const denied = await get(`${base}/hello`, { 'x-api-key': 'alice' });
    assert.equal(denied.status, 429);
    assert.ok(denied.h.get('retry-after'));
    assert.equal((await get(`${base}/hello`, { 'x-api-key': 'bob' })).status, 200, 'another key');
    assert.equal((await get(`${base}/hello`)).status, 401, 'no key: not limited, refused by the route');
    assert.deepEqual(fake.seen[0]!.rule, { limit: 5, periodMs: 10_000 });
  } finally {
    server.close();
  }
});
