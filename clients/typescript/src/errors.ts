/** Why a call has no answer. `code` is the nodes' snake_case error code (the HTTP API's and
 * ringlimit.v1's): `invalid_key`, `unknown_rule`, `invalid_limit`, `invalid_period`,
 * `invalid_burst`, `invalid_rule`, `invalid_cost`, `invalid_batch`, `duplicate_check`,
 * `unknown_reservation`, `invalid_ttl`, `unavailable`, `unauthenticated`, ...
 *
 * A check never fails for an unreachable cluster (it answers from the local fallback, marked
 * `degraded`): these errors are mistakes in the request itself, or, for reservations (which
 * live at the bucket's owner), `unavailable`. */
export class RinglimitError extends Error {
  override readonly name = 'RinglimitError';
  constructor(
    readonly code: string,
    message: string,
    /** For a batch or an all-or-nothing request: the index of the check at fault. */
    readonly index?: number,
  ) {
    super(message);
  }
}

/** The client's settings cannot work (no seeds, a malformed seed, a zero deadline...). */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/** A gRPC status message is "<code>: <sentence>"; its code, or `fallback` when there is none. */
export function splitStatus(details: string, fallback: string): RinglimitError {
  const m = /^([a-z_]+): (.*)$/s.exec(details);
  return m ? new RinglimitError(m[1]!, m[2]!) : new RinglimitError(fallback, details);
}
