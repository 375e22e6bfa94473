// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Long } from '@grpc/proto-loader';

export interface TopologyRequest {
  'heartbeatMs'?: (number | string | Long);
  '_heartbeatMs'?: "heartbeatMs";
}

export interface TopologyRequest__Output {
  'heartbeatMs'?: (string);
  '_heartbeatMs'?: "heartbeatMs";
}
