// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Member as _ringlimit_v1_Member, Member__Output as _ringlimit_v1_Member__Output } from '../../ringlimit/v1/Member.js';
import type { RingParams as _ringlimit_v1_RingParams, RingParams__Output as _ringlimit_v1_RingParams__Output } from '../../ringlimit/v1/RingParams.js';
import type { RuleInfo as _ringlimit_v1_RuleInfo, RuleInfo__Output as _ringlimit_v1_RuleInfo__Output } from '../../ringlimit/v1/RuleInfo.js';
import type { Long } from '@grpc/proto-loader';

export interface TopologyResponse {
  'nodeId'?: (string);
  'clusterId'?: (string);
  'version'?: (number | string | Long);
  'members'?: (_ringlimit_v1_Member)[];
  'ring'?: (_ringlimit_v1_RingParams | null);
  'rules'?: (_ringlimit_v1_RuleInfo)[];
}

export interface TopologyResponse__Output {
  'nodeId': (string);
  'clusterId': (string);
  'version': (string);
  'members': (_ringlimit_v1_Member__Output)[];
  'ring': (_ringlimit_v1_RingParams__Output | null);
  'rules': (_ringlimit_v1_RuleInfo__Output)[];
}
