// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { InlineRule as _ringlimit_v1_InlineRule, InlineRule__Output as _ringlimit_v1_InlineRule__Output } from '../../ringlimit/v1/InlineRule.js';
import type { Long } from '@grpc/proto-loader';

export interface CheckRequest {
  'key'?: (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule | null);
  'cost'?: (number | string | Long);
  'hold'?: (boolean);
  'ruleSpec'?: "rule"|"inline";
  '_cost'?: "cost";
}

export interface CheckRequest__Output {
  'key': (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule__Output | null);
  'cost'?: (string);
  'hold': (boolean);
  'ruleSpec'?: "rule"|"inline";
  '_cost'?: "cost";
}
