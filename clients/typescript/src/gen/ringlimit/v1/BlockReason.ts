// Original file: proto/ringlimit/v1/ratelimiter.proto

export const BlockReason = {
  BLOCK_REASON_UNSPECIFIED: 'BLOCK_REASON_UNSPECIFIED',
  AUTO: 'AUTO',
  MANAGED: 'MANAGED',
} as const;

export type BlockReason =
  | 'BLOCK_REASON_UNSPECIFIED'
  | 0
  | 'AUTO'
  | 1
  | 'MANAGED'
  | 2

export type BlockReason__Output = typeof BlockReason[keyof typeof BlockReason]
