// Original file: proto/ringlimit/v1/ratelimiter.proto

export const RuleMode = {
  RULE_MODE_UNSPECIFIED: 'RULE_MODE_UNSPECIFIED',
  OWNER: 'OWNER',
  GLOBAL: 'GLOBAL',
} as const;

export type RuleMode =
  | 'RULE_MODE_UNSPECIFIED'
  | 0
  | 'OWNER'
  | 1
  | 'GLOBAL'
  | 2

export type RuleMode__Output = typeof RuleMode[keyof typeof RuleMode]
