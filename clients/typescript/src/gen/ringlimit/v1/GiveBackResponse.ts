// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Long } from '@grpc/proto-loader';

export interface GiveBackResponse {
  'honoured'?: (number | string | Long)[];
}

export interface GiveBackResponse__Output {
  'honoured': (string)[];
}
