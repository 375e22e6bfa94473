// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Algorithm as _ringlimit_v1_Algorithm, Algorithm__Output as _ringlimit_v1_Algorithm__Output } from '../../ringlimit/v1/Algorithm.js';
import type { RuleMode as _ringlimit_v1_RuleMode, RuleMode__Output as _ringlimit_v1_RuleMode__Output } from '../../ringlimit/v1/RuleMode.js';
import type { Long } from '@grpc/proto-loader';

export interface RuleInfo {
  'name'?: (string);
  'algorithm'?: (_ringlimit_v1_Algorithm);
  'limit'?: (number | string | Long);
  'periodMs'?: (number | string | Long);
  'period'?: (string);
  'burst'?: (number | string | Long);
  'mode'?: (_ringlimit_v1_RuleMode);
  'failClosed'?: (boolean);
  'shadow'?: (boolean);
  'leasable'?: (boolean);
  'calendar'?: (boolean);
  'timezone'?: (string);
  'seed'?: (number | string | Long);
  '_burst'?: "burst";
}

export interface RuleInfo__Output {
  'name': (string);
  'algorithm': (_ringlimit_v1_Algorithm__Output);
  'limit': (string);
  'periodMs': (string);
  'period': (string);
  'burst'?: (string);
  'mode': (_ringlimit_v1_RuleMode__Output);
  'failClosed': (boolean);
  'shadow': (boolean);
  'leasable': (boolean);
  'calendar': (boolean);
  'timezone': (string);
  'seed': (string);
  '_burst'?: "burst";
}
