from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Algorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALGORITHM_UNSPECIFIED: _ClassVar[Algorithm]
    TOKEN_BUCKET: _ClassVar[Algorithm]
    FIXED_WINDOW: _ClassVar[Algorithm]
    SLIDING_WINDOW: _ClassVar[Algorithm]
    SLIDING_LOG: _ClassVar[Algorithm]
    LEAKY_BUCKET: _ClassVar[Algorithm]

class BlockReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCK_REASON_UNSPECIFIED: _ClassVar[BlockReason]
    AUTO: _ClassVar[BlockReason]
    MANAGED: _ClassVar[BlockReason]

class RuleMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RULE_MODE_UNSPECIFIED: _ClassVar[RuleMode]
    OWNER: _ClassVar[RuleMode]
    GLOBAL: _ClassVar[RuleMode]
ALGORITHM_UNSPECIFIED: Algorithm
TOKEN_BUCKET: Algorithm
FIXED_WINDOW: Algorithm
SLIDING_WINDOW: Algorithm
SLIDING_LOG: Algorithm
LEAKY_BUCKET: Algorithm
BLOCK_REASON_UNSPECIFIED: BlockReason
AUTO: BlockReason
MANAGED: BlockReason
RULE_MODE_UNSPECIFIED: RuleMode
OWNER: RuleMode
GLOBAL: RuleMode

class InlineRule(_message.Message):
    __slots__ = ("limit", "period_ms", "algorithm", "burst", "period", "calendar", "timezone")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    CALENDAR_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    limit: int
    period_ms: int
    algorithm: Algorithm
    burst: int
    period: str
    calendar: bool
    timezone: str
    def __init__(self, limit: _Optional[int] = ..., period_ms: _Optional[int] = ..., algorithm: _Optional[_Union[Algorithm, str]] = ..., burst: _Optional[int] = ..., period: _Optional[str] = ..., calendar: bool = ..., timezone: _Optional[str] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("key", "rule", "inline", "cost", "hold")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    key: str
    rule: str
    inline: InlineRule
    cost: int
    hold: bool
    def __init__(self, key: _Optional[str] = ..., rule: _Optional[str] = ..., inline: _Optional[_Union[InlineRule, _Mapping]] = ..., cost: _Optional[int] = ..., hold: bool = ...) -> None: ...

class Mark(_message.Message):
    __slots__ = ("reset_ns", "at_ns")
    RESET_NS_FIELD_NUMBER: _ClassVar[int]
    AT_NS_FIELD_NUMBER: _ClassVar[int]
    reset_ns: int
    at_ns: int
    def __init__(self, reset_ns: _Optional[int] = ..., at_ns: _Optional[int] = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("allowed", "limit", "remaining", "reset_at_ms", "retry_after_ms", "degraded", "shadow_denied", "replica", "leased", "blocked", "block_reason", "hold")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DENIED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_REASON_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    limit: int
    remaining: int
    reset_at_ms: int
    retry_after_ms: int
    degraded: bool
    shadow_denied: bool
    replica: bool
    leased: bool
    blocked: bool
    block_reason: BlockReason
    hold: Mark
    def __init__(self, allowed: bool = ..., limit: _Optional[int] = ..., remaining: _Optional[int] = ..., reset_at_ms: _Optional[int] = ..., retry_after_ms: _Optional[int] = ..., degraded: bool = ..., shadow_denied: bool = ..., replica: bool = ..., leased: bool = ..., blocked: bool = ..., block_reason: _Optional[_Union[BlockReason, str]] = ..., hold: _Optional[_Union[Mark, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("error", "message")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error: str
    message: str
    def __init__(self, error: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CheckBatchRequest(_message.Message):
    __slots__ = ("checks",)
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[CheckRequest]
    def __init__(self, checks: _Optional[_Iterable[_Union[CheckRequest, _Mapping]]] = ...) -> None: ...

class CheckBatchResult(_message.Message):
    __slots__ = ("answer", "error")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    answer: CheckResponse
    error: Error
    def __init__(self, answer: _Optional[_Union[CheckResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class CheckBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CheckBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CheckBatchResult, _Mapping]]] = ...) -> None: ...

class CheckAllRequest(_message.Message):
    __slots__ = ("checks",)
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[CheckRequest]
    def __init__(self, checks: _Optional[_Iterable[_Union[CheckRequest, _Mapping]]] = ...) -> None: ...

class CheckAllResponse(_message.Message):
    __slots__ = ("allowed", "binding", "binding_index", "degraded", "results")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    BINDING_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    binding: CheckResponse
    binding_index: int
    degraded: bool
    results: _containers.RepeatedCompositeFieldContainer[CheckResponse]
    def __init__(self, allowed: bool = ..., binding: _Optional[_Union[CheckResponse, _Mapping]] = ..., binding_index: _Optional[int] = ..., degraded: bool = ..., results: _Optional[_Iterable[_Union[CheckResponse, _Mapping]]] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("check", "ttl_ms")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    check: CheckRequest
    ttl_ms: int
    def __init__(self, check: _Optional[_Union[CheckRequest, _Mapping]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("reservation", "cost", "answer")
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    reservation: str
    cost: int
    answer: CheckResponse
    def __init__(self, reservation: _Optional[str] = ..., cost: _Optional[int] = ..., answer: _Optional[_Union[CheckResponse, _Mapping]] = ...) -> None: ...

class SettleRequest(_message.Message):
    __slots__ = ("reservation", "cost")
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    reservation: str
    cost: int
    def __init__(self, reservation: _Optional[str] = ..., cost: _Optional[int] = ...) -> None: ...

class TopologyRequest(_message.Message):
    __slots__ = ("heartbeat_ms",)
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_ms: int
    def __init__(self, heartbeat_ms: _Optional[int] = ...) -> None: ...

class TopologyResponse(_message.Message):
    __slots__ = ("node_id", "cluster_id", "version", "members", "ring", "rules")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_id: str
    version: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    ring: RingParams
    rules: _containers.RepeatedCompositeFieldContainer[RuleInfo]
    def __init__(self, node_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., ring: _Optional[_Union[RingParams, _Mapping]] = ..., rules: _Optional[_Iterable[_Union[RuleInfo, _Mapping]]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "grpc_addr", "http_addr", "peer_addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_addr: str
    http_addr: str
    peer_addr: str
    def __init__(self, node_id: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ..., peer_addr: _Optional[str] = ...) -> None: ...

class RingParams(_message.Message):
    __slots__ = ("scheme", "vnodes_per_member")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    VNODES_PER_MEMBER_FIELD_NUMBER: _ClassVar[int]
    scheme: str
    vnodes_per_member: int
    def __init__(self, scheme: _Optional[str] = ..., vnodes_per_member: _Optional[int] = ...) -> None: ...

class RuleInfo(_message.Message):
    __slots__ = ("name", "algorithm", "limit", "period_ms", "period", "burst", "mode", "fail_closed", "shadow", "leasable", "calendar", "timezone", "seed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FAIL_CLOSED_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    LEASABLE_FIELD_NUMBER: _ClassVar[int]
    CALENDAR_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    name: str
    algorithm: Algorithm
    limit: int
    period_ms: int
    period: str
    burst: int
    mode: RuleMode
    fail_closed: bool
    shadow: bool
    leasable: bool
    calendar: bool
    timezone: str
    seed: int
    def __init__(self, name: _Optional[str] = ..., algorithm: _Optional[_Union[Algorithm, str]] = ..., limit: _Optional[int] = ..., period_ms: _Optional[int] = ..., period: _Optional[str] = ..., burst: _Optional[int] = ..., mode: _Optional[_Union[RuleMode, str]] = ..., fail_closed: bool = ..., shadow: bool = ..., leasable: bool = ..., calendar: bool = ..., timezone: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("holder", "asks")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ASKS_FIELD_NUMBER: _ClassVar[int]
    holder: str
    asks: _containers.RepeatedCompositeFieldContainer[LeaseAsk]
    def __init__(self, holder: _Optional[str] = ..., asks: _Optional[_Iterable[_Union[LeaseAsk, _Mapping]]] = ...) -> None: ...

class LeaseAsk(_message.Message):
    __slots__ = ("key", "rule", "inline", "want", "demand_per_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    DEMAND_PER_S_FIELD_NUMBER: _ClassVar[int]
    key: str
    rule: str
    inline: InlineRule
    want: int
    demand_per_s: int
    def __init__(self, key: _Optional[str] = ..., rule: _Optional[str] = ..., inline: _Optional[_Union[InlineRule, _Mapping]] = ..., want: _Optional[int] = ..., demand_per_s: _Optional[int] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("grants",)
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[LeaseGrant]
    def __init__(self, grants: _Optional[_Iterable[_Union[LeaseGrant, _Mapping]]] = ...) -> None: ...

class LeaseGrant(_message.Message):
    __slots__ = ("granted", "refused", "error")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    granted: Granted
    refused: CheckResponse
    error: Error
    def __init__(self, granted: _Optional[_Union[Granted, _Mapping]] = ..., refused: _Optional[_Union[CheckResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Granted(_message.Message):
    __slots__ = ("tokens", "valid_ns", "mark", "answer")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    VALID_NS_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    valid_ns: int
    mark: Mark
    answer: CheckResponse
    def __init__(self, tokens: _Optional[int] = ..., valid_ns: _Optional[int] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ..., answer: _Optional[_Union[CheckResponse, _Mapping]] = ...) -> None: ...

class GiveBackRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[GiveBackItem]
    def __init__(self, items: _Optional[_Iterable[_Union[GiveBackItem, _Mapping]]] = ...) -> None: ...

class GiveBackItem(_message.Message):
    __slots__ = ("key", "rule", "inline", "tokens", "mark")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    key: str
    rule: str
    inline: InlineRule
    tokens: int
    mark: Mark
    def __init__(self, key: _Optional[str] = ..., rule: _Optional[str] = ..., inline: _Optional[_Union[InlineRule, _Mapping]] = ..., tokens: _Optional[int] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ...) -> None: ...

class GiveBackResponse(_message.Message):
    __slots__ = ("honoured",)
    HONOURED_FIELD_NUMBER: _ClassVar[int]
    honoured: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, honoured: _Optional[_Iterable[int]] = ...) -> None: ...

class CheckStreamRequest(_message.Message):
    __slots__ = ("id", "checks")
    ID_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    id: int
    checks: _containers.RepeatedCompositeFieldContainer[CheckRequest]
    def __init__(self, id: _Optional[int] = ..., checks: _Optional[_Iterable[_Union[CheckRequest, _Mapping]]] = ...) -> None: ...

class CheckStreamResponse(_message.Message):
    __slots__ = ("id", "results", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    results: _containers.RepeatedCompositeFieldContainer[CheckBatchResult]
    error: Error
    def __init__(self, id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[CheckBatchResult, _Mapping]]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...
