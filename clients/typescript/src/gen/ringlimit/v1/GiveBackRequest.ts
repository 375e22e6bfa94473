// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { GiveBackItem as _ringlimit_v1_GiveBackItem, GiveBackItem__Output as _ringlimit_v1_GiveBackItem__Output } from '../../ringlimit/v1/GiveBackItem.js';

export interface GiveBackRequest {
  'items'?: (_ringlimit_v1_GiveBackItem)[];
}

export interface GiveBackRequest__Output {
  'items': (_ringlimit_v1_GiveBackItem__Output)[];
}
