// Original file: proto/ringlimit/v1/ratelimiter.proto

export const Algorithm = {
  ALGORITHM_UNSPECIFIED: 'ALGORITHM_UNSPECIFIED',
  TOKEN_BUCKET: 'TOKEN_BUCKET',
  FIXED_WINDOW: 'FIXED_WINDOW',
  SLIDING_WINDOW: 'SLIDING_WINDOW',
  SLIDING_LOG: 'SLIDING_LOG',
  LEAKY_BUCKET: 'LEAKY_BUCKET',
} as const;

export type Algorithm =
  | 'ALGORITHM_UNSPECIFIED'
  | 0
  | 'TOKEN_BUCKET'
  | 1
  | 'FIXED_WINDOW'
  | 2
  | 'SLIDING_WINDOW'
  | 3
  | 'SLIDING_LOG'
  | 4
  | 'LEAKY_BUCKET'
  | 5

export type Algorithm__Output = typeof Algorithm[keyof typeof Algorithm]
