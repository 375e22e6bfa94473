import type * as grpc from '@grpc/grpc-js';
import type { EnumTypeDefinition, MessageTypeDefinition } from '@grpc/proto-loader';

import type { CheckAllRequest as _ringlimit_v1_CheckAllRequest, CheckAllRequest__Output as _ringlimit_v1_CheckAllRequest__Output } from './ringlimit/v1/CheckAllRequest.js';
import type { CheckAllResponse as _ringlimit_v1_CheckAllResponse, CheckAllResponse__Output as _ringlimit_v1_CheckAllResponse__Output } from './ringlimit/v1/CheckAllResponse.js';
import type { CheckBatchRequest as _ringlimit_v1_CheckBatchRequest, CheckBatchRequest__Output as _ringlimit_v1_CheckBatchRequest__Output } from './ringlimit/v1/CheckBatchRequest.js';
import type { CheckBatchResponse as _ringlimit_v1_CheckBatchResponse, CheckBatchResponse__Output as _ringlimit_v1_CheckBatchResponse__Output } from './ringlimit/v1/CheckBatchResponse.js';
import type { CheckBatchResult as _ringlimit_v1_CheckBatchResult, CheckBatchResult__Output as _ringlimit_v1_CheckBatchResult__Output } from './ringlimit/v1/CheckBatchResult.js';
import type { CheckRequest as _ringlimit_v1_CheckRequest, CheckRequest__Output as _ringlimit_v1_CheckRequest__Output } from './ringlimit/v1/CheckRequest.js';
import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from './ringlimit/v1/CheckResponse.js';
import type { CheckStreamRequest as _ringlimit_v1_CheckStreamRequest, CheckStreamRequest__Output as _ringlimit_v1_CheckStreamRequest__Output } from './ringlimit/v1/CheckStreamRequest.js';
import type { CheckStreamResponse as _ringlimit_v1_CheckStreamResponse, CheckStreamResponse__Output as _ringlimit_v1_CheckStreamResponse__Output } from './ringlimit/v1/CheckStreamResponse.js';
import type { Error as _ringlimit_v1_Error, Error__Output as _ringlimit_v1_Error__Output } from './ringlimit/v1/Error.js';
import type { GiveBackItem as _ringlimit_v1_GiveBackItem, GiveBackItem__Output as _ringlimit_v1_GiveBackItem__Output } from './ringlimit/v1/GiveBackItem.js';
import type { GiveBackRequest as _ringlimit_v1_GiveBackRequest, GiveBackRequest__Output as _ringlimit_v1_GiveBackRequest__Output } from './ringlimit/v1/GiveBackRequest.js';
import type { GiveBackResponse as _ringlimit_v1_GiveBackResponse, GiveBackResponse__Output as _ringlimit_v1_GiveBackResponse__Output } from './ringlimit/v1/GiveBackResponse.js';
import type { Granted as _ringlimit_v1_Granted, Granted__Output as _ringlimit_v1_Granted__Output } from './ringlimit/v1/Granted.js';
import type { InlineRule as _ringlimit_v1_InlineRule, InlineRule__Output as _ringlimit_v1_InlineRule__Output } from './ringlimit/v1/InlineRule.js';
import type { LeaseAsk as _ringlimit_v1_LeaseAsk, LeaseAsk__Output as _ringlimit_v1_LeaseAsk__Output } from './ringlimit/v1/LeaseAsk.js';
import type { LeaseGrant as _ringlimit_v1_LeaseGrant, LeaseGrant__Output as _ringlimit_v1_LeaseGrant__Output } from './ringlimit/v1/LeaseGrant.js';
import type { LeaseRequest as _ringlimit_v1_LeaseRequest, LeaseRequest__Output as _ringlimit_v1_LeaseRequest__Output } from './ringlimit/v1/LeaseRequest.js';
import type { LeaseResponse as _ringlimit_v1_LeaseResponse, LeaseResponse__Output as _ringlimit_v1_LeaseResponse__Output } from './ringlimit/v1/LeaseResponse.js';
import type { Mark as _ringlimit_v1_Mark, Mark__Output as _ringlimit_v1_Mark__Output } from './ringlimit/v1/Mark.js';
import type { Member as _ringlimit_v1_Member, Member__Output as _ringlimit_v1_Member__Output } from './ringlimit/v1/Member.js';
import type { RateLimiterClient as _ringlimit_v1_RateLimiterClient, RateLimiterDefinition as _ringlimit_v1_RateLimiterDefinition } from './ringlimit/v1/RateLimiter.js';
import type { ReserveRequest as _ringlimit_v1_ReserveRequest, ReserveRequest__Output as _ringlimit_v1_ReserveRequest__Output } from './ringlimit/v1/ReserveRequest.js';
import type { ReserveResponse as _ringlimit_v1_ReserveResponse, ReserveResponse__Output as _ringlimit_v1_ReserveResponse__Output } from './ringlimit/v1/ReserveResponse.js';
import type { RingParams as _ringlimit_v1_RingParams, RingParams__Output as _ringlimit_v1_RingParams__Output } from './ringlimit/v1/RingParams.js';
import type { RuleInfo as _ringlimit_v1_RuleInfo, RuleInfo__Output as _ringlimit_v1_RuleInfo__Output } from './ringlimit/v1/RuleInfo.js';
import type { SettleRequest as _ringlimit_v1_SettleRequest, SettleRequest__Output as _ringlimit_v1_SettleRequest__Output } from './ringlimit/v1/SettleRequest.js';
import type { TopologyRequest as _ringlimit_v1_TopologyRequest, TopologyRequest__Output as _ringlimit_v1_TopologyRequest__Output } from './ringlimit/v1/TopologyRequest.js';
import type { TopologyResponse as _ringlimit_v1_TopologyResponse, TopologyResponse__Output as _ringlimit_v1_TopologyResponse__Output } from './ringlimit/v1/TopologyResponse.js';

type SubtypeConstructor<Constructor extends new (...args: any) => any, Subtype> = {
  new(...args: ConstructorParameters<Constructor>): Subtype;
};

export interface ProtoGrpcType {
  ringlimit: {
    v1: {
      Algorithm: EnumTypeDefinition
      BlockReason: EnumTypeDefinition
      CheckAllRequest: MessageTypeDefinition<_ringlimit_v1_CheckAllRequest, _ringlimit_v1_CheckAllRequest__Output>
      CheckAllResponse: MessageTypeDefinition<_ringlimit_v1_CheckAllResponse, _ringlimit_v1_CheckAllResponse__Output>
      CheckBatchRequest: MessageTypeDefinition<_ringlimit_v1_CheckBatchRequest, _ringlimit_v1_CheckBatchRequest__Output>
      CheckBatchResponse: MessageTypeDefinition<_ringlimit_v1_CheckBatchResponse, _ringlimit_v1_CheckBatchResponse__Output>
      CheckBatchResult: MessageTypeDefinition<_ringlimit_v1_CheckBatchResult, _ringlimit_v1_CheckBatchResult__Output>
      CheckRequest: MessageTypeDefinition<_ringlimit_v1_CheckRequest, _ringlimit_v1_CheckRequest__Output>
      CheckResponse: MessageTypeDefinition<_ringlimit_v1_CheckResponse, _ringlimit_v1_CheckResponse__Output>
      CheckStreamRequest: MessageTypeDefinition<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamRequest__Output>
      CheckStreamResponse: MessageTypeDefinition<_ringlimit_v1_CheckStreamResponse, _ringlimit_v1_CheckStreamResponse__Output>
      Error: MessageTypeDefinition<_ringlimit_v1_Error, _ringlimit_v1_Error__Output>
      GiveBackItem: MessageTypeDefinition<_ringlimit_v1_GiveBackItem, _ringlimit_v1_GiveBackItem__Output>
      GiveBackRequest: MessageTypeDefinition<_ringlimit_v1_GiveBackRequest, _ringlimit_v1_GiveBackRequest__Output>
      GiveBackResponse: MessageTypeDefinition<_ringlimit_v1_GiveBackResponse, _ringlimit_v1_GiveBackResponse__Output>
      Granted: MessageTypeDefinition<_ringlimit_v1_Granted, _ringlimit_v1_Granted__Output>
      InlineRule: MessageTypeDefinition<_ringlimit_v1_InlineRule, _ringlimit_v1_InlineRule__Output>
      LeaseAsk: MessageTypeDefinition<_ringlimit_v1_LeaseAsk, _ringlimit_v1_LeaseAsk__Output>
      LeaseGrant: MessageTypeDefinition<_ringlimit_v1_LeaseGrant, _ringlimit_v1_LeaseGrant__Output>
      LeaseRequest: MessageTypeDefinition<_ringlimit_v1_LeaseRequest, _ringlimit_v1_LeaseRequest__Output>
      LeaseResponse: MessageTypeDefinition<_ringlimit_v1_LeaseResponse, _ringlimit_v1_LeaseResponse__Output>
      Mark: MessageTypeDefinition<_ringlimit_v1_Mark, _ringlimit_v1_Mark__Output>
      Member: MessageTypeDefinition<_ringlimit_v1_Member, _ringlimit_v1_Member__Output>
      RateLimiter: SubtypeConstructor<typeof grpc.Client, _ringlimit_v1_RateLimiterClient> & { service: _ringlimit_v1_RateLimiterDefinition }
      ReserveRequest: MessageTypeDefinition<_ringlimit_v1_ReserveRequest, _ringlimit_v1_ReserveRequest__Output>
      ReserveResponse: MessageTypeDefinition<_ringlimit_v1_ReserveResponse, _ringlimit_v1_ReserveResponse__Output>
      RingParams: MessageTypeDefinition<_ringlimit_v1_RingParams, _ringlimit_v1_RingParams__Output>
      RuleInfo: MessageTypeDefinition<_ringlimit_v1_RuleInfo, _ringlimit_v1_RuleInfo__Output>
      RuleMode: EnumTypeDefinition
      SettleRequest: MessageTypeDefinition<_ringlimit_v1_SettleRequest, _ringlimit_v1_SettleRequest__Output>
      TopologyRequest: MessageTypeDefinition<_ringlimit_v1_TopologyRequest, _ringlimit_v1_TopologyRequest__Output>
      TopologyResponse: MessageTypeDefinition<_ringlimit_v1_TopologyResponse, _ringlimit_v1_TopologyResponse__Output>
    }
  }
}

