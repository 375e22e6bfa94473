// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckBatchResult as _ringlimit_v1_CheckBatchResult, CheckBatchResult__Output as _ringlimit_v1_CheckBatchResult__Output } from '../../ringlimit/v1/CheckBatchResult.js';
import type { Error as _ringlimit_v1_Error, Error__Output as _ringlimit_v1_Error__Output } from '../../ringlimit/v1/Error.js';
import type { Long } from '@grpc/proto-loader';

export interface CheckStreamResponse {
  'id'?: (number | string | Long);
  'results'?: (_ringlimit_v1_CheckBatchResult)[];
  'error'?: (_ringlimit_v1_Error | null);
}

export interface CheckStreamResponse__Output {
  'id': (string);
  'results': (_ringlimit_v1_CheckBatchResult__Output)[];
  'error': (_ringlimit_v1_Error__Output | null);
}
