// @ringlimit/client: rate-limit a Node.js service's own requests with a ringlimit cluster.
//
//   import { Client } from '@ringlimit/client';
//   const client = new Client({ seeds: ['http://10.0.0.1:8080'], token: process.env.RINGLIMIT_CLIENT_TOKEN });
//   const a = await client.check({ key: 'user:42', rule: 'free-tier' });
//   if (!a.allowed) { /* 429, retry in a.retryAfterMs */ }
//
// Middleware: '@ringlimit/client/express' (rateLimit) and '@ringlimit/client/fastify'
// (rateLimitHook, rateLimitPlugin).
export { Client, binding, MAX_ALL } from './client.js';
export type { AllAnswer, Check, ClientOptions, ClientStats, Reservation } from './client.js';
export type { TlsOptions } from './tls.js';
export type { Answer } from './answer.js';
export { ConfigError, RinglimitError } from './errors.js';
export type { FallbackShare } from './fallback.js';
export { answersHeaders, ietfValues, rateLimitHeaders, retryAfterSecs } from './headers.js';
export type { Policy } from './headers.js';
export { limiter } from './middleware.js';
export type { Checker, LimitOptions, Outcome } from './middleware.js';
export { inlinePolicyName, resolveInline } from './rules.js';
export type { Algorithm, CalendarUnit, InlineRule } from './rules.js';
export { bucketId, namedSeed, Ring } from './hash.js';
