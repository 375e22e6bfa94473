// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Algorithm as _ringlimit_v1_Algorithm, Algorithm__Output as _ringlimit_v1_Algorithm__Output } from '../../ringlimit/v1/Algorithm.js';
import type { Long } from '@grpc/proto-loader';

export interface InlineRule {
  'limit'?: (number | string | Long);
  'periodMs'?: (number | string | Long);
  'algorithm'?: (_ringlimit_v1_Algorithm);
  'burst'?: (number | string | Long);
  'period'?: (string);
  'calendar'?: (boolean);
  'timezone'?: (string);
  '_burst'?: "burst";
}

export interface InlineRule__Output {
  'limit': (string);
  'periodMs': (string);
  'algorithm': (_ringlimit_v1_Algorithm__Output);
  'burst'?: (string);
  'period': (string);
  'calendar': (boolean);
  'timezone': (string);
  '_burst'?: "burst";
}
