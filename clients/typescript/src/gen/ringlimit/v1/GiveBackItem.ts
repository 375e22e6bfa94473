// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { InlineRule as _ringlimit_v1_InlineRule, InlineRule__Output as _ringlimit_v1_InlineRule__Output } from '../../ringlimit/v1/InlineRule.js';
import type { Mark as _ringlimit_v1_Mark, Mark__Output as _ringlimit_v1_Mark__Output } from '../../ringlimit/v1/Mark.js';
import type { Long } from '@grpc/proto-loader';

export interface GiveBackItem {
  'key'?: (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule | null);
  'tokens'?: (number | string | Long);
  'mark'?: (_ringlimit_v1_Mark | null);
  'ruleSpec'?: "rule"|"inline";
}

export interface GiveBackItem__Output {
  'key': (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule__Output | null);
  'tokens': (string);
  'mark': (_ringlimit_v1_Mark__Output | null);
  'ruleSpec'?: "rule"|"inline";
}
