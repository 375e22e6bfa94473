// Original file: proto/ringlimit/v1/ratelimiter.proto


export interface RingParams {
  'scheme'?: (string);
  'vnodesPerMember'?: (number);
}

export interface RingParams__Output {
  'scheme': (string);
  'vnodesPerMember': (number);
}
