// An Express service whose `GET /hello` is limited per `x-api-key` header at 5 requests per
// 10 s (token bucket), through a ringlimit cluster.
//
//   node dist/examples/guarded-service.js --listen 127.0.0.1:3000 --seeds http://127.0.0.1:8080
//   curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/hello
//
// The client credential, if the nodes ask for one, comes from RINGLIMIT_CLIENT_TOKEN.
import express, { type Express } from 'express';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Client } from '../src/index.js';
import { rateLimit } from '../src/express.js';
import type { Checker } from '../src/middleware.js';

/** 5 requests per 10 s per API key. */
export const HELLO_LIMIT = { limit: 5, periodMs: 10_000 };

export function guardedService(client: Checker): Express {
  const app = express();
  const apiKey = (req: express.Request) => req.get('x-api-key') || undefined;
  app.get('/hello', rateLimit({ client, rule: HELLO_LIMIT, key: apiKey }), (req, res) => {
    const key = apiKey(req);
    if (!key) res.status(401).send('an x-api-key header is required\n');
    else res.send(`hello, ${key}\n`);
  });
  return app;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({ options: { listen: { type: 'string', default: '127.0.0.1:3000' }, seeds: { type: 'string' } } });
  if (!values.seeds) {
    console.error('usage: guarded-service --seeds http://host:8080[,...] [--listen 127.0.0.1:3000]');
    process.exit(2);
  }
  const client = new Client({ seeds: values.seeds.split(','), token: process.env.RINGLIMIT_CLIENT_TOKEN });
  const [host, port] = [values.listen.slice(0, values.listen.lastIndexOf(':')), Number(values.listen.slice(values.listen.lastIndexOf(':') + 1))];
  const server = guardedService(client).listen(port, host, () => console.log(`guarded-service serving GET /hello on ${values.listen}`));
  process.on('SIGINT', () => server.close(() => void client.close()));
}
