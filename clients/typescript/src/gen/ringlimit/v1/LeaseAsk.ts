// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { InlineRule as _ringlimit_v1_InlineRule, InlineRule__Output as _ringlimit_v1_InlineRule__Output } from '../../ringlimit/v1/InlineRule.js';
import type { Long } from '@grpc/proto-loader';

export interface LeaseAsk {
  'key'?: (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule | null);
  'want'?: (number | string | Long);
  'demandPerS'?: (number | string | Long);
  'ruleSpec'?: "rule"|"inline";
}

export interface LeaseAsk__Output {
  'key': (string);
  'rule'?: (string);
  'inline'?: (_ringlimit_v1_InlineRule__Output | null);
  'want': (string);
  'demandPerS': (string);
  'ruleSpec'?: "rule"|"inline";
}
