// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';
import type { Error as _ringlimit_v1_Error, Error__Output as _ringlimit_v1_Error__Output } from '../../ringlimit/v1/Error.js';

export interface CheckBatchResult {
  'answer'?: (_ringlimit_v1_CheckResponse | null);
  'error'?: (_ringlimit_v1_Error | null);
  'result'?: "answer"|"error";
}

export interface CheckBatchResult__Output {
  'answer'?: (_ringlimit_v1_CheckResponse__Output | null);
  'error'?: (_ringlimit_v1_Error__Output | null);
  'result'?: "answer"|"error";
}
