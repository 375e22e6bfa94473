// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';

export interface CheckAllResponse {
  'allowed'?: (boolean);
  'binding'?: (_ringlimit_v1_CheckResponse | null);
  'bindingIndex'?: (number);
  'degraded'?: (boolean);
  'results'?: (_ringlimit_v1_CheckResponse)[];
}

export interface CheckAllResponse__Output {
  'allowed': (boolean);
  'binding': (_ringlimit_v1_CheckResponse__Output | null);
  'bindingIndex': (number);
  'degraded': (boolean);
  'results': (_ringlimit_v1_CheckResponse__Output)[];
}
