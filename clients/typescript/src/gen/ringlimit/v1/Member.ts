// Original file: proto/ringlimit/v1/ratelimiter.proto


export interface Member {
  'nodeId'?: (string);
  'grpcAddr'?: (string);
  'httpAddr'?: (string);
  'peerAddr'?: (string);
}

export interface Member__Output {
  'nodeId': (string);
  'grpcAddr': (string);
  'httpAddr': (string);
  'peerAddr': (string);
}
