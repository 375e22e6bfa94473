// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { LeaseAsk as _ringlimit_v1_LeaseAsk, LeaseAsk__Output as _ringlimit_v1_LeaseAsk__Output } from '../../ringlimit/v1/LeaseAsk.js';

export interface LeaseRequest {
  'holder'?: (string);
  'asks'?: (_ringlimit_v1_LeaseAsk)[];
}

export interface LeaseRequest__Output {
  'holder': (string);
  'asks': (_ringlimit_v1_LeaseAsk__Output)[];
}
