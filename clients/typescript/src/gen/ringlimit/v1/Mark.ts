// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Long } from '@grpc/proto-loader';

export interface Mark {
  'resetNs'?: (number | string | Long);
  'atNs'?: (number | string | Long);
}

export interface Mark__Output {
  'resetNs': (string);
  'atNs': (string);
}
