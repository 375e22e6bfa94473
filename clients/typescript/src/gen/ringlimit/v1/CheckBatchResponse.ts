// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckBatchResult as _ringlimit_v1_CheckBatchResult, CheckBatchResult__Output as _ringlimit_v1_CheckBatchResult__Output } from '../../ringlimit/v1/CheckBatchResult.js';

export interface CheckBatchResponse {
  'results'?: (_ringlimit_v1_CheckBatchResult)[];
}

export interface CheckBatchResponse__Output {
  'results': (_ringlimit_v1_CheckBatchResult__Output)[];
}
