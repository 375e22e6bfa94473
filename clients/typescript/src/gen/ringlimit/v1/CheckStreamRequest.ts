// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { CheckRequest as _ringlimit_v1_CheckRequest, CheckRequest__Output as _ringlimit_v1_CheckRequest__Output } from '../../ringlimit/v1/CheckRequest.js';
import type { Long } from '@grpc/proto-loader';

export interface CheckStreamRequest {
  'id'?: (number | string | Long);
  'checks'?: (_ringlimit_v1_CheckRequest)[];
}

export interface CheckStreamRequest__Output {
  'id': (string);
  'checks': (_ringlimit_v1_CheckRequest__Output)[];
}
