// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { BlockReason as _ringlimit_v1_BlockReason, BlockReason__Output as _ringlimit_v1_BlockReason__Output } from '../../ringlimit/v1/BlockReason.js';
import type { Mark as _ringlimit_v1_Mark, Mark__Output as _ringlimit_v1_Mark__Output } from '../../ringlimit/v1/Mark.js';
import type { Long } from '@grpc/proto-loader';

export interface CheckResponse {
  'allowed'?: (boolean);
  'limit'?: (number | string | Long);
  'remaining'?: (number | string | Long);
  'resetAtMs'?: (number | string | Long);
  'retryAfterMs'?: (number | string | Long);
  'degraded'?: (boolean);
  'shadowDenied'?: (boolean);
  'replica'?: (boolean);
  'leased'?: (boolean);
  'blocked'?: (boolean);
  'blockReason'?: (_ringlimit_v1_BlockReason);
  'hold'?: (_ringlimit_v1_Mark | null);
  '_shadowDenied'?: "shadowDenied";
}

export interface CheckResponse__Output {
  'allowed': (boolean);
  'limit': (string);
  'remaining': (string);
  'resetAtMs': (string);
  'retryAfterMs': (string);
  'degraded': (boolean);
  'shadowDenied'?: (boolean);
  'replica': (boolean);
  'leased': (boolean);
  'blocked': (boolean);
  'blockReason': (_ringlimit_v1_BlockReason__Output);
  'hold': (_ringlimit_v1_Mark__Output | null);
  '_shadowDenied'?: "shadowDenied";
}
