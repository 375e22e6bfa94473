// Express middleware: `app.use(rateLimit({ client, rule: 'per-ip' }))`, or on one route.
import type { NextFunction, Request, Response } from 'express';
import { limiter, type LimitOptions, type Outcome } from './middleware.js';

export type { LimitOptions, Checker, Outcome } from './middleware.js';

/** Limits the requests it sees: 429 (with `Retry-After` and the rate-limit fields) past the
 * limit; admitted requests go on with the fields set. The key defaults to `req.ip`. */
export function rateLimit(opts: LimitOptions<Request>): (req: Request, res: Response, next: NextFunction) => void {
  const decide = limiter(opts);
  const keyOf = opts.key ?? ((req: Request) => req.ip);
  return (req, res, next) => {
    let key: string | undefined;
    try {
      key = keyOf(req);
    } catch (e) {
      next(e);
      return;
    }
    if (!key) {
      next();
      return;
    }
    const apply = (o: Outcome) => {
      for (const [name, value] of o.headers) res.setHeader(name, value);
      if (o.allowed) {
        next();
      } else {
        res.status(o.status).type('application/json').send(o.body);
      }
    };
    const o = decide(key);
    if (o instanceof Promise) o.then(apply, next);
    else apply(o);
  };
}
