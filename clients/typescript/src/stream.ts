// ringlimit.v1's CheckStream: one long-lived duplex stream of checks per member's channel,
// which spares the node a call's setup (HTTP/2 stream, headers, trailers) per batch. Each
// request carries an id and its response the same id, so answers may come in any order. A
// stream that breaks fails every request in flight on it with its error, as a failed call
// fails its checks; the client opens a new one for its next request.
import * as grpc from '@grpc/grpc-js';
import type { CheckRequest } from './gen/ringlimit/v1/CheckRequest.js';
import type { CheckStreamRequest } from './gen/ringlimit/v1/CheckStreamRequest.js';
import type { CheckStreamResponse__Output } from './gen/ringlimit/v1/CheckStreamResponse.js';
import type { RateLimiterClient } from './grpc.js';

/** A request's outcome: its response, or the error that broke the stream. */
export type StreamCallback = (err: grpc.ServiceError | null, res?: CheckStreamResponse__Output) => void;

/** Whether `code` is a node's refusal of the stream itself (an older node: UNIMPLEMENTED; no
 * client credential where one is needed): its requests were never decided, and unary calls
 * are answered there. */
export function refusesStream(code: grpc.status): boolean {
  return code === grpc.status.UNIMPLEMENTED || code === grpc.status.UNAUTHENTICATED || code === grpc.status.PERMISSION_DENIED;
}

export class CheckStream {
  private readonly call: grpc.ClientDuplexStream<CheckStreamRequest, CheckStreamResponse__Output>;
  private readonly pending = new Map<string, StreamCallback>();
  private nextId = 0;
  broken = false;

  constructor(client: RateLimiterClient, md: grpc.Metadata) {
    this.call = client.CheckStream(md);
    this.call.on('data', (r: CheckStreamResponse__Output) => {
      const cb = this.pending.get(r.id);
      if (cb === undefined) return;
      this.pending.delete(r.id);
      cb(null, r);
    });
    this.call.on('error', (e: grpc.ServiceError) => this.fail(e));
    this.call.on('end', () => this.fail({ code: grpc.status.UNAVAILABLE, details: 'the node ended the check stream' } as grpc.ServiceError));
  }

  /** Sends one request of `checks`; `cb` gets its response or the stream's error, once.
   * False when the stream is broken already (`cb` is then never called). */
  send(checks: CheckRequest[], cb: StreamCallback): boolean {
    if (this.broken) return false;
    const id = String(++this.nextId);
    this.pending.set(id, cb);
    this.call.write({ id, checks });
    return true;
  }

  /** Breaks the stream: its requests in flight fail (CANCELLED). */
  abort(): void {
    this.call.cancel();
  }

  private fail(err: grpc.ServiceError): void {
    if (this.broken) return;
    this.broken = true;
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const cb of pending) cb(err);
  }
}
