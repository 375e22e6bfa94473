// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckRequest as _ringlimit_v1_CheckRequest, CheckRequest__Output as _ringlimit_v1_CheckRequest__Output } from '../../ringlimit/v1/CheckRequest.js';
import type { Long } from '@grpc/proto-loader';

export interface ReserveRequest {
  'check'?: (_ringlimit_v1_CheckRequest | null);
  'ttlMs'?: (number | string | Long);
  '_ttlMs'?: "ttlMs";
}

export interface ReserveRequest__Output {
  'check': (_ringlimit_v1_CheckRequest__Output | null);
  'ttlMs'?: (string);
  '_ttlMs'?: "ttlMs";
}
