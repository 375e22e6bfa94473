// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Mark as _ringlimit_v1_Mark, Mark__Output as _ringlimit_v1_Mark__Output } from '../../ringlimit/v1/Mark.js';
import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';
import type { Long } from '@grpc/proto-loader';

export interface Granted {
  'tokens'?: (number | string | Long);
  'validNs'?: (number | string | Long);
  'mark'?: (_ringlimit_v1_Mark | null);
  'answer'?: (_ringlimit_v1_CheckResponse | null);
}

export interface Granted__Output {
  'tokens': (string);
  'validNs': (string);
  'mark': (_ringlimit_v1_Mark__Output | null);
  'answer': (_ringlimit_v1_CheckResponse__Output | null);
}
