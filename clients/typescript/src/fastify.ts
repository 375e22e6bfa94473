// Fastify: an `onRequest` hook (`app.addHook('onRequest', rateLimitHook({ client, rule }))`,
// or a route's `onRequest`), and a plugin that adds it to every route of the instance it is
// registered on (`app.register(rateLimitPlugin, { client, rule })`).
import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import { limiter, type LimitOptions, type Outcome } from './middleware.js';

export type { LimitOptions, Checker, Outcome } from './middleware.js';

/** An onRequest hook: 429 (with `Retry-After` and the rate-limit fields) past the limit;
 * admitted requests go on with the fields set. The key defaults to `request.ip`. */
export function rateLimitHook(opts: LimitOptions<FastifyRequest>): (request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction) => void {
  const decide = limiter(opts);
  const keyOf = opts.key ?? ((req: FastifyRequest) => req.ip);
  return (request, reply, done) => {
    let key: string | undefined;
    try {
      key = keyOf(request);
    } catch (e) {
      done(e as Error);
      return;
    }
    if (!key) {
      done();
      return;
    }
    const apply = (o: Outcome) => {
      for (const [name, value] of o.headers) reply.header(name, value);
      if (o.allowed) {
        done();
      } else {
        // Answered here: the route's handler is not run (done is not called).
        reply.code(o.status).type('application/json').send(o.body);
      }
    };
    const o = decide(key);
    if (o instanceof Promise) o.then(apply, (e: Error) => done(e));
    else apply(o);
  };
}

/** A plugin adding `rateLimitHook(opts)` to every route of the instance it is registered on
 * (and, not being encapsulated, of its parent). */
export async function rateLimitPlugin(app: FastifyInstance, opts: LimitOptions<FastifyRequest>): Promise<void> {
  app.addHook('onRequest', rateLimitHook(opts));
}
(rateLimitPlugin as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true;
