// Original file: proto/ringlimit/v1/ratelimiter.proto

import type * as grpc from '@grpc/grpc-js'
import type { MethodDefinition } from '@grpc/proto-loader'
import type { CheckAllRequest as _ringlimit_v1_CheckAllRequest, CheckAllRequest__Output as _ringlimit_v1_CheckAllRequest__Output } from '../../ringlimit/v1/CheckAllRequest.js';
import type { CheckAllResponse as _ringlimit_v1_CheckAllResponse, CheckAllResponse__Output as _ringlimit_v1_CheckAllResponse__Output } from '../../ringlimit/v1/CheckAllResponse.js';
import type { CheckBatchRequest as _ringlimit_v1_CheckBatchRequest, CheckBatchRequest__Output as _ringlimit_v1_CheckBatchRequest__Output } from '../../ringlimit/v1/CheckBatchRequest.js';
import type { CheckBatchResponse as _ringlimit_v1_CheckBatchResponse, CheckBatchResponse__Output as _ringlimit_v1_CheckBatchResponse__Output } from '../../ringlimit/v1/CheckBatchResponse.js';
import type { CheckRequest as _ringlimit_v1_CheckRequest, CheckRequest__Output as _ringlimit_v1_CheckRequest__Output } from '../../ringlimit/v1/CheckRequest.js';
import type { CheckResponse as _ringlimit_v1_CheckResponse, CheckResponse__Output as _ringlimit_v1_CheckResponse__Output } from '../../ringlimit/v1/CheckResponse.js';
import type { CheckStreamRequest as _ringlimit_v1_CheckStreamRequest, CheckStreamRequest__Output as _ringlimit_v1_CheckStreamRequest__Output } from '../../ringlimit/v1/CheckStreamRequest.js';
import type { CheckStreamResponse as _ringlimit_v1_CheckStreamResponse, CheckStreamResponse__Output as _ringlimit_v1_CheckStreamResponse__Output } from '../../ringlimit/v1/CheckStreamResponse.js';
import type { GiveBackRequest as _ringlimit_v1_GiveBackRequest, GiveBackRequest__Output as _ringlimit_v1_GiveBackRequest__Output } from '../../ringlimit/v1/GiveBackRequest.js';
import type { GiveBackResponse as _ringlimit_v1_GiveBackResponse, GiveBackResponse__Output as _ringlimit_v1_GiveBackResponse__Output } from '../../ringlimit/v1/GiveBackResponse.js';
import type { LeaseRequest as _ringlimit_v1_LeaseRequest, LeaseRequest__Output as _ringlimit_v1_LeaseRequest__Output } from '../../ringlimit/v1/LeaseRequest.js';
import type { LeaseResponse as _ringlimit_v1_LeaseResponse, LeaseResponse__Output as _ringlimit_v1_LeaseResponse__Output } from '../../ringlimit/v1/LeaseResponse.js';
import type { ReserveRequest as _ringlimit_v1_ReserveRequest, ReserveRequest__Output as _ringlimit_v1_ReserveRequest__Output } from '../../ringlimit/v1/ReserveRequest.js';
import type { ReserveResponse as _ringlimit_v1_ReserveResponse, ReserveResponse__Output as _ringlimit_v1_ReserveResponse__Output } from '../../ringlimit/v1/ReserveResponse.js';
import type { SettleRequest as _ringlimit_v1_SettleRequest, SettleRequest__Output as _ringlimit_v1_SettleRequest__Output } from '../../ringlimit/v1/SettleRequest.js';
import type { TopologyRequest as _ringlimit_v1_TopologyRequest, TopologyRequest__Output as _ringlimit_v1_TopologyRequest__Output } from '../../ringlimit/v1/TopologyRequest.js';
import type { TopologyResponse as _ringlimit_v1_TopologyResponse, TopologyResponse__Output as _ringlimit_v1_TopologyResponse__Output } from '../../ringlimit/v1/TopologyResponse.js';

export interface RateLimiterClient extends grpc.Client {
  Check(argument: _ringlimit_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _ringlimit_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _ringlimit_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _ringlimit_v1_CheckRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _ringlimit_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _ringlimit_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _ringlimit_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _ringlimit_v1_CheckRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  
  CheckAll(argument: _ringlimit_v1_CheckAllRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  CheckAll(argument: _ringlimit_v1_CheckAllRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  CheckAll(argument: _ringlimit_v1_CheckAllRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  CheckAll(argument: _ringlimit_v1_CheckAllRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  checkAll(argument: _ringlimit_v1_CheckAllRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  checkAll(argument: _ringlimit_v1_CheckAllRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  checkAll(argument: _ringlimit_v1_CheckAllRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  checkAll(argument: _ringlimit_v1_CheckAllRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckAllResponse__Output>): grpc.ClientUnaryCall;
  
  CheckBatch(argument: _ringlimit_v1_CheckBatchRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  CheckBatch(argument: _ringlimit_v1_CheckBatchRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  CheckBatch(argument: _ringlimit_v1_CheckBatchRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  CheckBatch(argument: _ringlimit_v1_CheckBatchRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  checkBatch(argument: _ringlimit_v1_CheckBatchRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  checkBatch(argument: _ringlimit_v1_CheckBatchRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  checkBatch(argument: _ringlimit_v1_CheckBatchRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  checkBatch(argument: _ringlimit_v1_CheckBatchRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckBatchResponse__Output>): grpc.ClientUnaryCall;
  
  CheckStream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamResponse__Output>;
  CheckStream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamResponse__Output>;
  checkStream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamResponse__Output>;
  checkStream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamResponse__Output>;
  
  GiveBack(argument: _ringlimit_v1_GiveBackRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  GiveBack(argument: _ringlimit_v1_GiveBackRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  GiveBack(argument: _ringlimit_v1_GiveBackRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  GiveBack(argument: _ringlimit_v1_GiveBackRequest, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  giveBack(argument: _ringlimit_v1_GiveBackRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  giveBack(argument: _ringlimit_v1_GiveBackRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  giveBack(argument: _ringlimit_v1_GiveBackRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  giveBack(argument: _ringlimit_v1_GiveBackRequest, callback: grpc.requestCallback<_ringlimit_v1_GiveBackResponse__Output>): grpc.ClientUnaryCall;
  
  Lease(argument: _ringlimit_v1_LeaseRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  Lease(argument: _ringlimit_v1_LeaseRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  Lease(argument: _ringlimit_v1_LeaseRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  Lease(argument: _ringlimit_v1_LeaseRequest, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  lease(argument: _ringlimit_v1_LeaseRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  lease(argument: _ringlimit_v1_LeaseRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  lease(argument: _ringlimit_v1_LeaseRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  lease(argument: _ringlimit_v1_LeaseRequest, callback: grpc.requestCallback<_ringlimit_v1_LeaseResponse__Output>): grpc.ClientUnaryCall;
  
  Reserve(argument: _ringlimit_v1_ReserveRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  Reserve(argument: _ringlimit_v1_ReserveRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  Reserve(argument: _ringlimit_v1_ReserveRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  Reserve(argument: _ringlimit_v1_ReserveRequest, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  reserve(argument: _ringlimit_v1_ReserveRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  reserve(argument: _ringlimit_v1_ReserveRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  reserve(argument: _ringlimit_v1_ReserveRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  reserve(argument: _ringlimit_v1_ReserveRequest, callback: grpc.requestCallback<_ringlimit_v1_ReserveResponse__Output>): grpc.ClientUnaryCall;
  
  Settle(argument: _ringlimit_v1_SettleRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Settle(argument: _ringlimit_v1_SettleRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Settle(argument: _ringlimit_v1_SettleRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Settle(argument: _ringlimit_v1_SettleRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  settle(argument: _ringlimit_v1_SettleRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  settle(argument: _ringlimit_v1_SettleRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  settle(argument: _ringlimit_v1_SettleRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  settle(argument: _ringlimit_v1_SettleRequest, callback: grpc.requestCallback<_ringlimit_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  
  Topology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  Topology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  Topology(argument: _ringlimit_v1_TopologyRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  Topology(argument: _ringlimit_v1_TopologyRequest, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  topology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  topology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  topology(argument: _ringlimit_v1_TopologyRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  topology(argument: _ringlimit_v1_TopologyRequest, callback: grpc.requestCallback<_ringlimit_v1_TopologyResponse__Output>): grpc.ClientUnaryCall;
  
  WatchTopology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_ringlimit_v1_TopologyResponse__Output>;
  WatchTopology(argument: _ringlimit_v1_TopologyRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_ringlimit_v1_TopologyResponse__Output>;
  watchTopology(argument: _ringlimit_v1_TopologyRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_ringlimit_v1_TopologyResponse__Output>;
  watchTopology(argument: _ringlimit_v1_TopologyRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_ringlimit_v1_TopologyResponse__Output>;
  
}

export interface RateLimiterHandlers extends grpc.UntypedServiceImplementation {
  Check: grpc.handleUnaryCall<_ringlimit_v1_CheckRequest__Output, _ringlimit_v1_CheckResponse>;
  
  CheckAll: grpc.handleUnaryCall<_ringlimit_v1_CheckAllRequest__Output, _ringlimit_v1_CheckAllResponse>;
  
  CheckBatch: grpc.handleUnaryCall<_ringlimit_v1_CheckBatchRequest__Output, _ringlimit_v1_CheckBatchResponse>;
  
  CheckStream: grpc.handleBidiStreamingCall<_ringlimit_v1_CheckStreamRequest__Output, _ringlimit_v1_CheckStreamResponse>;
  
  GiveBack: grpc.handleUnaryCall<_ringlimit_v1_GiveBackRequest__Output, _ringlimit_v1_GiveBackResponse>;
  
  Lease: grpc.handleUnaryCall<_ringlimit_v1_LeaseRequest__Output, _ringlimit_v1_LeaseResponse>;
  
  Reserve: grpc.handleUnaryCall<_ringlimit_v1_ReserveRequest__Output, _ringlimit_v1_ReserveResponse>;
  
  Settle: grpc.handleUnaryCall<_ringlimit_v1_SettleRequest__Output, _ringlimit_v1_CheckResponse>;
  
  Topology: grpc.handleUnaryCall<_ringlimit_v1_TopologyRequest__Output, _ringlimit_v1_TopologyResponse>;
  
  WatchTopology: grpc.handleServerStreamingCall<_ringlimit_v1_TopologyRequest__Output, _ringlimit_v1_TopologyResponse>;
  
}

export interface RateLimiterDefinition extends grpc.ServiceDefinition {
  Check: MethodDefinition<_ringlimit_v1_CheckRequest, _ringlimit_v1_CheckResponse, _ringlimit_v1_CheckRequest__Output, _ringlimit_v1_CheckResponse__Output>
  CheckAll: MethodDefinition<_ringlimit_v1_CheckAllRequest, _ringlimit_v1_CheckAllResponse, _ringlimit_v1_CheckAllRequest__Output, _ringlimit_v1_CheckAllResponse__Output>
  CheckBatch: MethodDefinition<_ringlimit_v1_CheckBatchRequest, _ringlimit_v1_CheckBatchResponse, _ringlimit_v1_CheckBatchRequest__Output, _ringlimit_v1_CheckBatchResponse__Output>
  CheckStream: MethodDefinition<_ringlimit_v1_CheckStreamRequest, _ringlimit_v1_CheckStreamResponse, _ringlimit_v1_CheckStreamRequest__Output, _ringlimit_v1_CheckStreamResponse__Output>
  GiveBack: MethodDefinition<_ringlimit_v1_GiveBackRequest, _ringlimit_v1_GiveBackResponse, _ringlimit_v1_GiveBackRequest__Output, _ringlimit_v1_GiveBackResponse__Output>
  Lease: MethodDefinition<_ringlimit_v1_LeaseRequest, _ringlimit_v1_LeaseResponse, _ringlimit_v1_LeaseRequest__Output, _ringlimit_v1_LeaseResponse__Output>
  Reserve: MethodDefinition<_ringlimit_v1_ReserveRequest, _ringlimit_v1_ReserveResponse, _ringlimit_v1_ReserveRequest__Output, _ringlimit_v1_ReserveResponse__Output>
  Settle: MethodDefinition<_ringlimit_v1_SettleRequest, _ringlimit_v1_CheckResponse, _ringlimit_v1_SettleRequest__Output, _ringlimit_v1_CheckResponse__Output>
  Topology: MethodDefinition<_ringlimit_v1_TopologyRequest, _ringlimit_v1_TopologyResponse, _ringlimit_v1_TopologyRequest__Output, _ringlimit_v1_TopologyResponse__Output>
  WatchTopology: MethodDefinition<_ringlimit_v1_TopologyRequest, _ringlimit_v1_TopologyResponse, _ringlimit_v1_TopologyRequest__Output, _ringlimit_v1_TopologyResponse__Output>
}
