// Original file: proto/ringlimit/v1/ratelimiter.proto


export interface Error {
  'error'?: (string);
  'message'?: (string);
}

export interface Error__Output {
  'error': (string);
  'message': (string);
}
