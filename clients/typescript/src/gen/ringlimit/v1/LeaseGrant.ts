// Original file: proto/ringlimit/v1/ratelimiter.proto

import type { Granted as _ringlimit_v1_Granted, Granted__Output as _ringlimit_v1_Granted__Output } from '../../ringlimit/v1/Granted.js';
import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';
import type { Error as _ringlimit_v1_Error, Error__Output as _ringlimit_v1_Error__Output } from '../../ringlimit/v1/Error.js';

export interface LeaseGrant {
  'granted'?: (_ringlimit_v1_Granted | null);
  'refused'?: (_ringlimit_v1_CheckResponse | null);
  'error'?: (_ringlimit_v1_Error | null);
  'result'?: "granted"|"refused"|"error";
}

export interface LeaseGrant__Output {
  'granted'?: (_ringlimit_v1_Granted__Output | null);
  'refused'?: (_ringlimit_v1_CheckResponse__Output | null);
  'error'?: (_ringlimit_v1_Error__Output | null);
  'result'?: "granted"|"refused"|"error";
}
