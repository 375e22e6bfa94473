// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckRequest as _ringlimit_v1_CheckRequest, CheckRequest__Output as _ringlimit_v1_CheckRequest__Output } from '../../ringlimit/v1/CheckRequest.js';

export interface CheckBatchRequest {
  'checks'?: (_ringlimit_v1_CheckRequest)[];
}

export interface CheckBatchRequest__Output {
  'checks': (_ringlimit_v1_CheckRequest__Output)[];
}
