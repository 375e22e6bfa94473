// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';
import type { Long } from '@grpc/proto-loader';

export interface ReserveResponse {
  'reservation'?: (string);
  'cost'?: (number | string | Long);
  'answer'?: (_ringlimit_v1_CheckResponse | null);
}

export interface ReserveResponse__Output {
  'reservation': (string);
  'cost': (string);
  'answer': (_ringlimit_v1_CheckResponse__Output | null);
}
