// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { LeaseGrant as _ringlimit_v1_LeaseGrant, LeaseGrant__Output as _ringlimit_v1_LeaseGrant__Output } from '../../ringlimit/v1/LeaseGrant.js';

export interface LeaseResponse {
  'grants'?: (_ringlimit_v1_LeaseGrant)[];
}

export interface LeaseResponse__Output {
  'grants': (_ringlimit_v1_LeaseGrant__Output)[];
}
