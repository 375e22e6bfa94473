// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Long } from '@grpc/proto-loader';

export interface SettleRequest {
  'reservation'?: (string);
  'cost'?: (number | string | Long);
}

export interface SettleRequest__Output {
  'reservation': (string);
  'cost': (string);
}
