//! The peer protocol: frames exchanged on the peer TCP port between nodes (and by the SDK).
//!
//! A connection opens with a versioned handshake (`Hello` → `Challenge` → `Proof` → `Welcome`,
//! see [`crate::auth`] and [`crate::handshake`]), then carries `Checks` frames one way and
//! `Answers` frames the other, pipelined: each group has an id, answers may come back in any
//! order. A group of kind [`GroupKind::AllOrNothing`] is one request's checks at that owner;
//! `Refunds` frames give back what such groups held, on the same connection, answered like
//! checks. Connections of their
//! own carry `Handover` (ring changes) and `Reset` (an operator's reset of a key) frames, each
//! acknowledged; another carries `GlobalCounts` (and, ending a full set, `GlobalCountsOf`)
//! frames one way, unanswered. Frames are bincode 2 (standard config) inside a 4-byte
//! big-endian length prefix; both the prefix and the decoder enforce [`MAX_FRAME_BYTES`], so a
//! hostile length or count can never make a node allocate more than that.

use crate::auth::NONCE_LEN;
pub use crate::mark::Mark;
use crate::{CheckAnswer, RuleRef};
use serde::{Deserialize, Serialize};

/// First field of every `Hello`: a connection that does not start with it is not a peer.
pub const MAGIC: u32 = 0x524c_4d54; // "RLMT"
/// Version of this protocol: the highest this side speaks. A connection speaks the lower of
/// both sides' (see [`crate::handshake`]); a peer below [`OLDEST_PROTOCOL_VERSION`] is refused
/// with a clear reason.
///
/// - 2: a check group's kind rides in the top bits of its id ([`FlaggedGroup`],
///   [`Frame::FlaggedChecks`]).
/// - 3: a check group says its kind in a field of its own ([`CheckGroup`], [`Frame::Checks`]).
/// - 4: groups may go to an owner's replica ([`GroupKind::Replica`]); the frames are those of
///   version 3 (a version-3 connection just never carries those kinds).
/// - 5: a member that started lately recalls the buckets it owns from the member after it on
///   the ring ([`Frame::Recall`]); copies stream without acknowledgements
///   ([`Frame::ReplicateOneWay`]).
/// - 6: leases: a member (or an SDK) asks a bucket's owner for a slice of it ([`Frame::Lease`]).
/// - 7: reservations: a cost estimated now and settled later at the bucket's owner
///   ([`Frame::Reserve`], [`Frame::Settle`]).
/// - 8: operators: admin API rule changes at the member that owns the rule's name
///   ([`Frame::RuleChange`]), each member's most limited keys ([`Frame::TopKeys`]), and its
///   wall clock ([`Frame::Clock`]).
/// - 9: Envoy RLQS: a member serving quota streams asks a bucket's owner for its streams'
///   shares of the rule's rate ([`Frame::Quota`]).
/// - 10: inline rules with calendar windows ([`crate::RuleRef`]'s calendar variant); the
///   frames are those of version 9 (a version-9 connection just never carries such a rule).
/// - 11: global counts of calendar windows ([`GlobalCount`]'s `period_ms` carrying a
///   calendar's code, its top bit set); the frames are those of version 10 (a connection of
///   an older version just never carries such a count).
/// - 12: blocks: a member announces the blocks it decided or was asked for to every other
///   member ([`Frame::Blocks`]).
/// - 13: an owner answers a check it denied by a block as blocked ([`PeerAnswer::Blocked`]),
///   so that a forwarded check's answer says so where it arrived; an older peer is sent the
///   plain answer ([`PeerAnswer::for_version`]).
/// - 14: regions: a node of another region opens a region link ([`Frame::RegionHello`]) that
///   carries its reports on shared buckets ([`Frame::RegionAsks`], [`Frame::RegionGrants`]).
/// - 15: a region link also carries the counts of `mode: global`, `scope: regions` buckets
///   ([`Frame::RegionCounts`]), answered with the receiver's clock ([`Frame::RegionCountsAck`]).
/// - 16: a region's asks carry their tally beside them ([`Frame::RegionAsksTallied`],
///   [`Frame::RegionRelayTallied`]): its count of the bucket's checks, and what its lost asks
///   gave back and admitted ahead of their grants.
pub const PROTOCOL_VERSION: u16 = 16;
/// The first version whose check groups say their kind in a field ([`Frame::Checks`]); a
/// connection of an older version carries [`Frame::FlaggedChecks`] instead.
pub const GROUP_KIND_SINCE: u16 = 3;
/// The first version whose peers decide [`GroupKind::Replica`] and
/// [`GroupKind::ReplicaAllOrNothing`] groups (a sender never sends them to an older one).
pub const REPLICA_KINDS_SINCE: u16 = 4;
/// The first version whose peers answer [`Frame::Recall`] and take
/// [`Frame::ReplicateOneWay`] (a sender never sends them to an older one).
pub const RECALL_SINCE: u16 = 5;
/// The first version whose peers grant leases ([`Frame::Lease`]; a holder never asks an
/// older one, and decides those keys at their owner as before).
pub const LEASE_SINCE: u16 = 6;
/// The first version whose peers keep reservations ([`Frame::Reserve`], [`Frame::Settle`]; a
/// node never sends them to an older one, and answers that the owner cannot take them).
pub const RESERVE_SINCE: u16 = 7;
/// The first version whose peers take [`Frame::RuleChange`] and [`Frame::TopKeys`] (a node
/// never sends them to an older one: it changes the rule itself, as before, or reports the
/// member's top keys as unavailable).
pub const OPERATORS_SINCE: u16 = 8;
/// The first version whose peers split a bucket's rate among quota streams ([`Frame::Quota`];
/// a node never asks an older one, and keeps its streams' assignments as they are).
pub const QUOTA_SINCE: u16 = 9;
/// The first version whose peers know inline rules with calendar windows (a node never sends
/// one to an older peer, which could not decode it: it answers that the owner cannot take it).
pub const CALENDAR_SINCE: u16 = 10;
/// The first version whose peers merge global counts of calendar windows (a node never sends
/// them to an older peer, which would refuse them as malformed).
pub const GLOBAL_CALENDAR_SINCE: u16 = 11;
/// The first version whose peers keep announced blocks ([`Frame::Blocks`]; a node never
/// sends them to an older one, which answers blocked keys as it always did: by their buckets).
pub const BLOCKS_SINCE: u16 = 12;
/// The first version whose peers take [`PeerAnswer::Blocked`] (an older one is sent the
/// answer without its block: see [`PeerAnswer::for_version`]).
pub const BLOCKED_ANSWER_SINCE: u16 = 13;
/// The oldest version this side still speaks (its frames still decode, see [`FlaggedGroup`]).
pub const OLDEST_PROTOCOL_VERSION: u16 = 2;
/// Largest frame, either way: 1000 checks of 512-byte keys fit with room to spare.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
/// The first version whose peers take region links ([`Frame::RegionHello`]).
pub const REGIONS_SINCE: u16 = 14;
/// The first version whose region links take [`Frame::RegionCounts`] (a node never sends them
/// to an older one: that region just does not hear the global counts).
pub const REGION_COUNTS_SINCE: u16 = 15;
/// The first version whose region links and members take tallied asks
/// ([`Frame::RegionAsksTallied`], [`Frame::RegionRelayTallied`]; an older one is sent
/// `RegionAsks` and `RegionRelay`, the asks [`crate::region::RegionAsk::untallied`]).
pub const REGION_TALLY_SINCE: u16 = 16;

/// Everything that crosses the peer port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Client → server: who I am and my nonce.
    Hello(Hello),
    /// Server → client: my nonce, and my proof over both nonces (empty without a secret).
    Challenge {
        version: u16,
        nonce: [u8; NONCE_LEN],
        proof: Vec<u8>,
    },
    /// Client → server: my proof over both nonces (empty without a secret).
    Proof { proof: Vec<u8> },
    /// Server → client: accepted; checks may follow.
    Welcome { node_id: String },
    /// Either way: the connection is refused or closed, and why.
    Refused { reason: String },
    /// Client → server, version 2 only: groups of checks whose kind rides in their ids' top
    /// bits. Decoded still (translated into [`CheckGroup`]s) for peers that negotiated 2; sent
    /// only to them. Variants are only ever appended, so this keeps its tag (5).
    FlaggedChecks(Vec<FlaggedGroup>),
    /// Server → client: the answers, one group per `Checks` group.
    Answers(Vec<AnswerGroup>),
    /// Client → server: buckets whose ownership moved to the server (ring change), to be
    /// merged into its store so that a key's consumption survives the move.
    Handover(Vec<HandedBucket>),
    /// Server → client: how many handed-over buckets were merged.
    HandoverAck { merged: u64 },
    /// Client → server: drop these buckets (an operator's reset of a key, see the node's admin
    /// API). Variants are only ever appended, so older frames keep their encoding.
    Reset { ids: Vec<u64> },
    /// Server → client: how many of the buckets were held, and dropped.
    ResetAck { removed: u64 },
    /// Client → server: give back what all-or-nothing checks took (see
    /// [`GroupKind::AllOrNothing`]) because another check of their request denied it. Answered
    /// with an `Answers` frame: one [`PeerAnswer::Refunded`] (or an error) per refund.
    Refunds(Vec<RefundGroup>),
    /// Client → server: the sending node's own counts of global-rule buckets (`mode: global`),
    /// on a connection of their own: the buckets that changed since the last frame, or every
    /// bucket the sender publishes when the connection is new. Not answered (the counts are
    /// absolute and merged by maximum, so a lost frame is made good by the full set the next
    /// connection starts with). `generation` is the sender's incarnation (its gossip
    /// generation), so that a restarted node counts afresh.
    GlobalCounts {
        generation: u64,
        counts: Vec<GlobalCount>,
    },
    /// Client → server, on the `GlobalCounts` connection: the counts of global-rule buckets
    /// that the sender holds for nodes other than itself — live peers, and incarnations that
    /// are gone (a restarted node's previous life included). Sent only as the end of a full
    /// set, after the sender's own `GlobalCounts` (always at least one frame, possibly empty,
    /// so that the receiver knows the full set has come), so that a node that joins or
    /// restarts learns the whole cluster's counts. Merged by maximum per actor like
    /// `GlobalCounts`, so relaying never double-counts.
    GlobalCountsOf { counts: Vec<ActorCounts> },
    /// Client → server, version 3 on: groups of checks to decide where they land, each saying
    /// its kind (see [`GroupKind`]). Answered by an `Answers` frame.
    Checks(Vec<CheckGroup>),
    /// Client → server: copies of buckets the sender owns, for the server to keep as their
    /// replica (the next member after the owner on the ring): each bucket's state now, or
    /// `None` when the owner no longer holds it. Answered by `ReplicateAck`.
    Replicate { buckets: Vec<ReplicaBucket> },
    /// Server → client: how many copies were kept (or dropped, for `None` states).
    ReplicateAck { kept: u64 },
    /// Client → server, version 4: copies of buckets the server owns that the sender, their
    /// replica, decided on while the server did not answer (see [`GroupKind::Replica`]): the
    /// server merges each into its bucket as another reading of its history. Answered by
    /// `ReplicateAck`.
    HandBack { buckets: Vec<ReplicaBucket> },
    /// Client → server, version 5: buckets `ids` that the sender owns but does not hold, asked
    /// of the member after it on the ring (the member that kept them while the sender was
    /// away: as their owner then, or as their replica) before the sender decides their first
    /// checks after it started. Answered by `Recalled`.
    Recall { ids: Vec<u64> },
    /// Server → client: the live states of those of the buckets the server holds (its own or
    /// its copies), read, not taken: a handover may still move them, and the sender merges
    /// both as readings of one history.
    Recalled { buckets: Vec<HandedBucket> },
    /// Client → server, version 5: copies as in `Replicate`, not answered. An owner streams them on
    /// its replica connection without waiting for each acknowledgement: a frame and its ack cost
    /// each side a few syscalls and wake-ups whatever they carry (the docs' benchmarks page, "What
    /// `--replicas 1` costs"). A broken connection is the sender's error, after which it sends the
    /// whole store again.
    ReplicateOneWay { buckets: Vec<ReplicaBucket> },
    /// Client → server, version 6: slices of buckets the server owns, asked by a member (or an
    /// SDK) that decides their checks itself from then on (hot keys). Answered by `Leased`,
    /// one grant per ask, in order. Unused tokens come back as ordinary [`Frame::Refunds`]
    /// under the grant's mark.
    Lease { asks: Vec<LeaseAsk> },
    /// Server → client: the grants, in the order of the asks.
    Leased { grants: Vec<LeaseGrant> },
    /// Client → server, version 7: reservations of buckets the server owns: each estimate is
    /// taken like a check's cost and remembered under the sender's nonce until settled or
    /// expired. Answered by `Reserved`, one answer per ask, in order.
    Reserve { asks: Vec<PeerReserve> },
    /// Server → client: the check answer of each ask (admitted: reserved; denied: nothing
    /// remembered), or its error.
    Reserved { answers: Vec<PeerAnswer> },
    /// Client → server, version 7: the actual costs of reservations the server keeps: the
    /// difference from each estimate is given back or taken (into debt beyond what the bucket
    /// admits). Answered by `Settled`, in order.
    Settle { settles: Vec<PeerSettle> },
    /// Server → client: one answer per settle, in order.
    Settled { answers: Vec<SettleAnswer> },
    /// Client → server, version 8: an admin API change (or read) of the API rule `name`, sent
    /// to the member that owns the name on the ring, so that changes of one name made through
    /// any member are decided in one place, in order (read-your-writes). Answered by
    /// `RuleChanged`.
    RuleChange(RuleChange),
    /// Server → client: the outcome of a `RuleChange`.
    RuleChanged(RuleChanged),
    /// Client → server, version 8: this member's most denied (or most checked) keys of a rule,
    /// from its bounded top-K. Answered by `TopKeysAre`.
    TopKeys { rule: String, by: TopBy, n: u32 },
    /// Server → client: the keys, most counted first.
    TopKeysAre { keys: Vec<TopKey> },
    /// Client → server, version 8: the sender's wall time (ns since the Unix epoch), asking for
    /// the server's: clock offsets between members. Answered by `ClockIs`.
    Clock { sent_ns: u64 },
    /// Server → client: `sent_ns` echoed, and the server's wall time as it answered.
    ClockIs { sent_ns: u64, now_ns: u64 },
    /// Client → server, version 9: the sender's RLQS streams of buckets the server owns, with
    /// their demands, asking for each stream's share of the rule's rate. Answered by
    /// `Quotas`, one answer per ask, in order.
    Quota { asks: Vec<QuotaAsk> },
    /// Server → client: the answers, in the order of the asks.
    Quotas { answers: Vec<QuotaAnswer> },
    /// Client → server, instead of `Hello`: a client (an SDK) that proves a client credential
    /// (a token with the `check` role) rather than the cluster secret (see
    /// [`crate::handshake`]). A server that predates it cannot decode it and closes.
    ClientHello(Hello),
    /// Server → client, ending a `ClientHello`'s handshake: the server's id and its proof that
    /// it knows the credential the client proved (checked by the client before any frame).
    ClientWelcome { node_id: String, proof: Vec<u8> },
    /// Client → server, version 10: blocks the sender decided (a key's owner, after its
    /// denials) or was asked for (the admin API), and the ends of blocks lifted early, for
    /// every member to answer where a request lands. Answered by `BlocksAck`.
    Blocks { changes: Vec<BlockChange> },
    /// Server → client: how many changes were kept.
    BlocksAck { kept: u64 },
    /// Client → server, version 14: a node of another region opens a region link, proving
    /// the region secret (`RINGLIMIT_REGION_SECRET`) instead of the cluster secret; its
    /// `cluster_id` is [`crate::region::REGION_CONTEXT`]. A region link may only carry
    /// `RegionAsks` (see [`crate::handshake`]).
    RegionHello(Hello),
    /// Client → server on a region link: region `region`'s reports on buckets whose home is
    /// the server's region, one interval's in one frame (at most
    /// [`crate::region::MAX_ASKS_PER_FRAME`]). Answered by `RegionGrants`, one per ask.
    RegionAsks {
        region: String,
        asks: Vec<crate::region::RegionAskEntry>,
    },
    /// Server → client: the grants, each naming its ask's `seq`.
    RegionGrants {
        grants: Vec<crate::region::RegionGrantEntry>,
    },
    /// Member → member, version 14: the asks of a `RegionAsks` frame for buckets the
    /// receiver owns, relayed by the member of its region the other region's link reached.
    /// Answered by `RegionGrants`.
    RegionRelay {
        region: String,
        asks: Vec<crate::region::RegionAskEntry>,
    },
    /// Client → server on a region link, version 15: counts of `mode: global`,
    /// `scope: regions` buckets admitted in region `region` (absolute, merged by maximum), of
    /// the actors `node_id@generation` of that region, windows numbered on the server's clock
    /// (the sender translated them by the offset it measured). `sent_ns` is the sender's
    /// cluster clock when it sent the frame, echoed in the answer. At most
    /// [`crate::region::MAX_COUNTS_PER_FRAME`] counts; possibly none (a clock sample).
    RegionCounts {
        region: String,
        sent_ns: u64,
        counts: Vec<ActorCounts>,
    },
    /// Server → client: `sent_ns` echoed, the server's cluster clock when it answered, and how
    /// many of the counts were refused (malformed, or of a window the server does not hold).
    RegionCountsAck {
        sent_ns: u64,
        now_ns: u64,
        refused: u64,
    },
    /// Client → server on a region link, version 16: `RegionAsks` with each ask's tally
    /// ([`crate::region::TalliedAsk`]). Answered by `RegionGrants`.
    RegionAsksTallied {
        region: String,
        asks: Vec<crate::region::TalliedAsk>,
    },
    /// Member → member, version 16: `RegionRelay` with each ask's tally. Answered by
    /// `RegionGrants`.
    RegionRelayTallied {
        region: String,
        asks: Vec<crate::region::TalliedAsk>,
    },
}

/// Where a block came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockSource {
    /// Decided by a key's owner from a rule's `block` policy.
    Auto,
    /// Asked for through the admin API.
    Managed,
}

impl BlockSource {
    /// As answers and metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockSource::Auto => "auto",
            BlockSource::Managed => "managed",
        }
    }
}

/// One block, as it travels between members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockChange {
    /// What is blocked: a key, or `cidr:ADDRESS/LEN`.
    pub target: String,
    /// The rule it is blocked under; `None`: every rule.
    pub rule: Option<String>,
    pub source: BlockSource,
    /// Unix ms the block was made (or lifted): a later change of one target wins.
    pub since_ms: u64,
    /// Unix ms the block ends (a lift: the end of the block it lifted, until when the lift
    /// is remembered; 0: lifted, not remembered).
    pub until_ms: u64,
    pub reason: String,
    /// Who asked for it: an admin token's name, or the deciding node's id.
    pub by: String,
    /// A lift (a tombstone): it wins over a block of its target made at or before `since_ms`,
    /// and loses to a later one, so that members that missed it converge on the next sync.
    #[serde(default)]
    pub lifted: bool,
}

impl BlockChange {
    /// Whether this change lifts its target's block.
    pub fn is_lift(&self) -> bool {
        self.lifted || self.until_ms == 0
    }
}

/// One stream's demand, in thousandths of a request per second (the frame stays `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaStream {
    pub id: u64,
    pub demand_milli: u64,
}

/// A member's streams of the bucket (`key`, `rule`); `held`: it holds shares of it already
/// (from this owner or an earlier one: a new owner then waits to hear from every member).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaAsk {
    pub key: String,
    pub rule: RuleRef,
    pub held: bool,
    pub streams: Vec<QuotaStream>,
}

/// The owner's answer to one [`QuotaAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaAnswer {
    /// Each stream's share, thousandths of a request per second, in the order asked.
    Shares { milli: Vec<u64> },
    /// The owner took the bucket over lately: keep the shares you have.
    Warming,
    /// The ask was invalid at the owner (a rule it does not know); the contract's code.
    Error { code: String, message: String },
}

/// What a [`RuleChange`] does with the rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleOp {
    /// Create or replace the rule: its fields as the admin API's JSON body.
    Put {
        spec_json: String,
    },
    Delete,
    /// Read the owner's entry only.
    Get,
}

/// An admin API rule change, made by the token `by` through another member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleChange {
    pub name: String,
    pub op: RuleOp,
    /// The `If-Match` header as given (a version, a list of them, or `*`).
    pub if_match: Option<String>,
    pub by: String,
}

/// What the owner of a rule's name did: its entry for the name afterwards (JSON, as gossiped;
/// `None` when it has none), and the refusal's error code and message when it refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleChanged {
    pub entry_json: Option<String>,
    pub refused: Option<(String, String)>,
}

/// Which count ranks the keys of [`Frame::TopKeys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TopBy {
    Denied,
    Checks,
}

/// One key's count (an estimate: Space-Saving's) and how far over it may be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopKey {
    pub key: String,
    pub count: u64,
    pub error: u64,
}

/// Reserve `cost` (an estimate) of the bucket of (`key`, `rule`) for `ttl_ms`, remembered under
/// `nonce` (random, chosen by the sender, which builds the reservation's id from it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReserve {
    pub key: String,
    pub rule: RuleRef,
    pub cost: u64,
    pub ttl_ms: u64,
    pub nonce: u128,
}

/// Settle the reservation `nonce` of the bucket of (`key`, `rule`) at its actual `cost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerSettle {
    pub key: String,
    pub rule: RuleRef,
    pub nonce: u128,
    pub cost: u64,
}

/// The owner's answer to one [`PeerSettle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettleAnswer {
    /// Settled: the bucket's answer after the difference was given back or taken.
    Answer(CheckAnswer),
    /// No such reservation here: expired, settled already, or never issued.
    Unknown,
    /// The settle was invalid at the owner; the contract's code.
    Error { code: String, message: String },
}

/// A holder asks the owner of (`key`, `rule`) for `want` tokens of its bucket, having spent
/// `demand_per_s` a second of its leases lately (the owner sizes slices from it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAsk {
    pub key: String,
    pub rule: RuleRef,
    pub want: u64,
    pub demand_per_s: u64,
}

/// The owner's answer to one [`LeaseAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseGrant {
    /// `tokens` taken from the bucket for the holder (the bucket's answer to that take is
    /// `answer`), to spend within `valid_ns` of its ask (a window's slice ends with its
    /// window); what it does not spend it gives back under `mark`.
    Granted {
        tokens: u64,
        mark: Mark,
        valid_ns: u64,
        answer: CheckAnswer,
    },
    /// Nothing to lease: the bucket denies a check of cost 1 (`answer` says until when: the
    /// holder may deny such checks itself until then), or the owner keeps it to itself
    /// (`answer.allowed`: the rule opts out, too many holders, too little left).
    Refused { answer: CheckAnswer },
    /// The ask was invalid at the owner (a rule it does not know); the contract's code.
    Error { code: String, message: String },
}

/// One node incarnation's counts, as relayed by another node in a
/// [`Frame::GlobalCountsOf`]: the actor `node_id@generation` of the global counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorCounts {
    pub node_id: String,
    pub generation: u64,
    pub counts: Vec<GlobalCount>,
}

/// One node's own admitted hits of one global bucket, in the window `window` (numbered
/// `unix_ms / period_ms`, alike on every node) and in the window before it (carried so that a
/// node that hears of the bucket only after the window turned still learns the final count).
/// From version [`GLOBAL_CALENDAR_SINCE`], a `period_ms` with its top bit set names a calendar
/// instead (its unit and its zone's tag), and `window` counts that calendar's windows since
/// 1970 (local dates, Mondays, months).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalCount {
    pub id: u64,
    pub period_ms: u64,
    pub window: u64,
    pub current: u64,
    pub previous: u64,
}

/// Refunds that travel together and are answered together (like a [`CheckGroup`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundGroup {
    pub id: u64,
    pub refunds: Vec<PeerRefund>,
}

/// Give back `cost` to the bucket of (`key`, `rule`), taken by the admission that `mark`
/// names (the [`PeerAnswer::Held`] answer's mark).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRefund {
    pub key: String,
    pub rule: RuleRef,
    pub cost: u64,
    pub mark: Mark,
}

/// One bucket handed to its new owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedBucket {
    /// The bucket's identity (see [`crate::identity`]).
    pub id: u64,
    pub state: WireState,
}

/// One bucket's copy sent to its replica: its state at the owner, or `None` when the owner
/// no longer holds it (reset, handed over, evicted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaBucket {
    pub id: u64,
    pub state: Option<WireState>,
}

/// A bucket's state on the wire (times are ns since the Unix epoch on the sender's clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireState {
    Gcra {
        tat: u64,
    },
    Fixed {
        end: u64,
        count: u32,
    },
    Sliding {
        until: u64,
        current: u32,
        previous: u32,
    },
    Log {
        entries: Vec<(u64, u32)>,
        max_entries: u64,
    },
}

/// The opening frame of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: u32,
    pub version: u16,
    pub cluster_id: String,
    /// The dialing node's id (an SDK uses its own name).
    pub node_id: String,
    pub nonce: [u8; NONCE_LEN],
}

/// What a check group asks of the node it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum GroupKind {
    /// Sent to the node the sender takes for the owner: decided there, or relayed once to the
    /// owner when that node handed the buckets over (see [`GroupKind::Relayed`]).
    #[default]
    Owned,
    /// Relayed by a node that no longer owns its buckets (it handed them to their new owner)
    /// to that new owner, and decided where it lands: so a check crosses at most two hops. A
    /// node that predates relaying ignores the kind and decides every group, as before.
    Relayed,
    /// One request's checks at this owner, decided all-or-nothing: when any non-shadow check of
    /// the group denies, the owner gives back what the others took before answering; when all
    /// admit, every check that took its cost is answered [`PeerAnswer::Held`], so that the
    /// sender can refund it should a check at another owner deny. Decided where it lands
    /// (never relayed).
    AllOrNothing,
    /// Sent to the owner's first replica because the owner did not answer: decided on the
    /// replica's copy of each bucket (kept for the owner, handed back to it when it answers
    /// again), or as the owner's when the ring now names the replica the owner. Version 4.
    Replica,
    /// [`GroupKind::AllOrNothing`] at the owner's replica ([`GroupKind::Replica`]). Version 4.
    ReplicaAllOrNothing,
}

impl GroupKind {
    /// The bits of a version-2 group id that say this kind (see [`FlaggedGroup`]).
    pub fn flag_bits(self) -> u64 {
        match self {
            GroupKind::Owned => 0,
            GroupKind::Relayed => RELAYED_GROUP,
            GroupKind::AllOrNothing => ALL_OR_NOTHING_GROUP,
            // Never sent to a version-2 peer (see [`REPLICA_KINDS_SINCE`]).
            GroupKind::Replica => 0,
            GroupKind::ReplicaAllOrNothing => ALL_OR_NOTHING_GROUP,
        }
    }

    /// The oldest protocol version that knows this kind.
    pub fn since(self) -> u16 {
        match self {
            GroupKind::Owned | GroupKind::Relayed | GroupKind::AllOrNothing => {
                OLDEST_PROTOCOL_VERSION
            }
            GroupKind::Replica | GroupKind::ReplicaAllOrNothing => REPLICA_KINDS_SINCE,
        }
    }

    /// Whether the group is decided all-or-nothing.
    pub fn all_or_nothing(self) -> bool {
        matches!(
            self,
            GroupKind::AllOrNothing | GroupKind::ReplicaAllOrNothing
        )
    }

    /// The kind a version-2 group id's bits say (all-or-nothing first: such a group is never
    /// relayed).
    pub fn of_flags(id: u64) -> Self {
        if id & ALL_OR_NOTHING_GROUP != 0 {
            GroupKind::AllOrNothing
        } else if id & RELAYED_GROUP != 0 {
            GroupKind::Relayed
        } else {
            GroupKind::Owned
        }
    }
}

/// Version 2: top bit of a [`FlaggedGroup`] id, [`GroupKind::Relayed`].
pub const RELAYED_GROUP: u64 = 1 << 63;
/// Version 2: second bit from the top of a [`FlaggedGroup`] id, [`GroupKind::AllOrNothing`].
pub const ALL_OR_NOTHING_GROUP: u64 = 1 << 62;
/// Version 2: the bits of a [`FlaggedGroup`] id that say its kind; the rest is the sender's
/// counter (a sender keeps its counter below them whatever the version).
pub const GROUP_FLAGS: u64 = RELAYED_GROUP | ALL_OR_NOTHING_GROUP;

/// Checks that travel together and are answered together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckGroup {
    /// Chosen by the sender, echoed in the answer.
    pub id: u64,
    pub kind: GroupKind,
    pub checks: Vec<PeerCheck>,
}

/// A check group as version 2 encodes it: its kind in the top bits of its id
/// ([`GroupKind::flag_bits`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlaggedGroup {
    /// Echoed in the answer whole, flag bits included.
    pub id: u64,
    pub checks: Vec<PeerCheck>,
}

impl From<FlaggedGroup> for CheckGroup {
    /// The id stays whole, so that the answer echoes what the version-2 sender waits for.
    fn from(g: FlaggedGroup) -> Self {
        Self {
            id: g.id,
            kind: GroupKind::of_flags(g.id),
            checks: g.checks,
        }
    }
}

impl From<CheckGroup> for FlaggedGroup {
    /// The kind's bits are set in the id (whose own bits there must be clear).
    fn from(g: CheckGroup) -> Self {
        Self {
            id: (g.id & !GROUP_FLAGS) | g.kind.flag_bits(),
            checks: g.checks,
        }
    }
}

/// One forwarded check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCheck {
    pub key: String,
    pub rule: RuleRef,
    pub cost: u64,
}

/// The answers to one [`CheckGroup`], in its order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerGroup {
    pub id: u64,
    pub answers: Vec<PeerAnswer>,
}

/// The owner's answer to one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerAnswer {
    Answer(CheckAnswer),
    /// The check was invalid at the owner (e.g. a rule it does not know); the contract's code.
    Error {
        code: String,
        message: String,
    },
    /// In a [`GroupKind::AllOrNothing`] group: admitted, and its cost is held until the sender refunds
    /// it (or never does). `mark` names the admission for [`PeerRefund`].
    Held {
        answer: CheckAnswer,
        mark: Mark,
    },
    /// A [`PeerRefund`] was applied (or there was nothing left to give back).
    Refunded,
    /// Denied by a block of `source` the owner knows (from [`BLOCKED_ANSWER_SINCE`]; last, so
    /// that the earlier variants keep their encoding).
    Blocked {
        answer: CheckAnswer,
        source: BlockSource,
    },
}

impl PeerAnswer {
    /// This answer as a peer of protocol `version` decodes it: a block's answer without its
    /// block below [`BLOCKED_ANSWER_SINCE`].
    pub fn for_version(self, version: u16) -> Self {
        match self {
            PeerAnswer::Blocked { answer, .. } if version < BLOCKED_ANSWER_SINCE => {
                PeerAnswer::Answer(answer)
            }
            other => other,
        }
    }

    /// The check's answer, whether held, blocked or plain; `None` for an error or a refund.
    pub fn answer(&self) -> Option<&CheckAnswer> {
        match self {
            PeerAnswer::Answer(a)
            | PeerAnswer::Held { answer: a, .. }
            | PeerAnswer::Blocked { answer: a, .. } => Some(a),
            PeerAnswer::Error { .. } | PeerAnswer::Refunded => None,
        }
    }
}

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("undecodable frame: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("unencodable frame: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("frame has {0} trailing bytes")]
    Trailing(usize),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

impl Frame {
    /// Encodes this frame (without the length prefix).
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let bytes = bincode::serde::encode_to_vec(self, config())?;
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(bytes.len()));
        }
        Ok(bytes)
    }

    /// Decodes one frame from exactly `bytes` (untrusted: limited, trailing bytes refused).
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(bytes.len()));
        }
        let (frame, used) = bincode::serde::decode_from_slice(bytes, config())?;
        if used != bytes.len() {
            return Err(FrameError::Trailing(bytes.len() - used));
        }
        Ok(frame)
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "hello",
            Frame::Challenge { .. } => "challenge",
            Frame::Proof { .. } => "proof",
            Frame::Welcome { .. } => "welcome",
            Frame::Refused { .. } => "refused",
            Frame::FlaggedChecks(_) => "flagged_checks",
            Frame::Checks(_) => "checks",
            Frame::Answers(_) => "answers",
            Frame::Handover(_) => "handover",
            Frame::HandoverAck { .. } => "handover_ack",
            Frame::Reset { .. } => "reset",
            Frame::ResetAck { .. } => "reset_ack",
            Frame::Refunds(_) => "refunds",
            Frame::GlobalCounts { .. } => "global_counts",
            Frame::GlobalCountsOf { .. } => "global_counts_of",
            Frame::Replicate { .. } => "replicate",
            Frame::ReplicateAck { .. } => "replicate_ack",
            Frame::HandBack { .. } => "hand_back",
            Frame::Recall { .. } => "recall",
            Frame::Recalled { .. } => "recalled",
            Frame::ReplicateOneWay { .. } => "replicate_one_way",
            Frame::Lease { .. } => "lease",
            Frame::Leased { .. } => "leased",
            Frame::Reserve { .. } => "reserve",
            Frame::Reserved { .. } => "reserved",
            Frame::Settle { .. } => "settle",
            Frame::Settled { .. } => "settled",
            Frame::RuleChange(_) => "rule_change",
            Frame::RuleChanged(_) => "rule_changed",
            Frame::TopKeys { .. } => "top_keys",
            Frame::TopKeysAre { .. } => "top_keys_are",
            Frame::Clock { .. } => "clock",
            Frame::ClockIs { .. } => "clock_is",
            Frame::Quota { .. } => "quota",
            Frame::Quotas { .. } => "quotas",
            Frame::ClientHello(_) => "client_hello",
            Frame::ClientWelcome { .. } => "client_welcome",
            Frame::Blocks { .. } => "blocks",
            Frame::BlocksAck { .. } => "blocks_ack",
            Frame::RegionHello(_) => "region_hello",
            Frame::RegionAsks { .. } => "region_asks",
            Frame::RegionGrants { .. } => "region_grants",
            Frame::RegionRelay { .. } => "region_relay",
            Frame::RegionCounts { .. } => "region_counts",
            Frame::RegionCountsAck { .. } => "region_counts_ack",
            Frame::RegionAsksTallied { .. } => "region_asks_tallied",
            Frame::RegionRelayTallied { .. } => "region_relay_tallied",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, InlineRule};

    fn sample() -> Frame {
        Frame::Checks(vec![CheckGroup {
            id: 7,
            kind: GroupKind::Owned,
            checks: vec![PeerCheck {
                key: "user:42".into(),
                rule: RuleRef::Inline(InlineRule {
                    limit: 5,
                    period_ms: 1000,
                    algorithm: Algorithm::SlidingWindow,
                    burst: None,
                    calendar: None,
                }),
                cost: 1,
            }],
        }])
    }

    #[test]
    fn frames_round_trip() {
        let f = sample();
        let bytes = f.encode().expect("encode");
        assert_eq!(Frame::decode(&bytes).expect("decode"), f);
    }

    /// Version 8's frames round-trip and come after `Settled` (tag 26).
    #[test]
    fn operator_frames_round_trip_after_the_older_ones() {
        let change = Frame::RuleChange(RuleChange {
            name: "silver".into(),
            op: RuleOp::Put {
                spec_json: r#"{"limit":5,"period":"1m"}"#.into(),
            },
            if_match: Some("\"1.0.n1\"".into()),
            by: "ops".into(),
        });
        let changed = Frame::RuleChanged(RuleChanged {
            entry_json: None,
            refused: Some(("unknown_rule".into(), "no rule".into())),
        });
        let top = Frame::TopKeys {
            rule: "per-ip".into(),
            by: TopBy::Denied,
            n: 10,
        };
        let are = Frame::TopKeysAre {
            keys: vec![TopKey {
                key: "ip:203.0.113.7".into(),
                count: 9,
                error: 1,
            }],
        };
        let clock = Frame::Clock { sent_ns: 7 };
        let clock_is = Frame::ClockIs {
            sent_ns: 7,
            now_ns: u64::MAX,
        };
        for (tag, f) in [
            (27, change),
            (28, changed),
            (29, top),
            (30, are),
            (31, clock),
            (32, clock_is),
        ] {
            let bytes = f.encode().expect("encode");
            assert_eq!(bytes[0], tag, "{f:?}");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
        let settled = Frame::Settled { answers: vec![] };
        assert_eq!(settled.encode().expect("encode")[0], 26);
    }

    /// Version 9's frames round-trip and come after `ClockIs` (tag 32).
    #[test]
    fn quota_frames_round_trip_after_the_older_ones() {
        let ask = Frame::Quota {
            asks: vec![QuotaAsk {
                key: "acme".into(),
                rule: RuleRef::Named("api".into()),
                held: true,
                streams: vec![QuotaStream {
                    id: 3,
                    demand_milli: 80_000,
                }],
            }],
        };
        let answers = Frame::Quotas {
            answers: vec![
                QuotaAnswer::Shares {
                    milli: vec![75_000],
                },
                QuotaAnswer::Warming,
                QuotaAnswer::Error {
                    code: "unknown_rule".into(),
                    message: "no rule api".into(),
                },
            ],
        };
        for (tag, f) in [(33, ask), (34, answers)] {
            let bytes = f.encode().expect("encode");
            assert_eq!(bytes[0], tag, "{f:?}");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
    }

    /// A client's hello and welcome come after every older frame, so older frames keep their
    /// tags (and a server that predates them refuses the hello as undecodable).
    #[test]
    fn client_handshake_frames_round_trip_after_the_older_ones() {
        let hello = Frame::ClientHello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            cluster_id: "c".into(),
            node_id: "sdk".into(),
            nonce: [7; NONCE_LEN],
        });
        let welcome = Frame::ClientWelcome {
            node_id: "n1".into(),
            proof: vec![1; 32],
        };
        for (tag, f) in [(35, hello), (36, welcome)] {
            let bytes = f.encode().expect("encode");
            assert_eq!(bytes[0], tag, "{f:?}");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
    }

    /// Global counts across regions: appended after `RegionRelay` (tag 42), which keeps its
    /// tag.
    #[test]
    fn region_counts_frames_round_trip_after_the_older_ones() {
        let counts = Frame::RegionCounts {
            region: "eu".into(),
            sent_ns: 1_767_225_600_000_000_000,
            counts: vec![ActorCounts {
                node_id: "n1".into(),
                generation: 4,
                counts: vec![GlobalCount {
                    id: 7,
                    period_ms: 60_000,
                    window: 29_453_760,
                    current: 12,
                    previous: 3,
                }],
            }],
        };
        let ack = Frame::RegionCountsAck {
            sent_ns: 1,
            now_ns: 2,
            refused: 0,
        };
        let relay = Frame::RegionRelay {
            region: "eu".into(),
            asks: Vec::new(),
        };
        for (tag, f) in [(42, relay), (43, counts), (44, ack)] {
            let bytes = f.encode().expect("encode");
            assert_eq!(bytes[0], tag, "{f:?}");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
    }

    /// Tallied asks: appended after `RegionCountsAck` (tag 44); the tally rides beside the
    /// ask, whose own encoding (an older link's) is unchanged.
    #[test]
    fn tallied_region_frames_round_trip_after_the_older_ones() {
        use crate::region::{AskAgain, AskTally, RegionAsk, RegionAskEntry, SliceBack, TalliedAsk};
        let ask = RegionAsk {
            key: "k".into(),
            rule: crate::RuleRef::Named("shared".into()),
            demand_milli: 3_300,
            back: vec![],
            advance: 1,
            early: false,
            leaving: false,
            held: 2,
            unanswered: vec![4],
            tally: None,
        };
        let tally = AskTally {
            asked_total: 99,
            fallback_total: 0,
            asked_at_turn: 0,
            again: vec![AskAgain {
                seq: 4,
                back: vec![SliceBack {
                    tokens: 3,
                    mark: Mark {
                        reset_ns: 60,
                        at_ns: 1,
                    },
                }],
                advance: 2,
            }],
        };
        let plain = Frame::RegionAsks {
            region: "eu".into(),
            asks: vec![RegionAskEntry {
                seq: 5,
                ask: ask.clone(),
            }],
        };
        let with = Frame::RegionAsks {
            region: "eu".into(),
            asks: vec![RegionAskEntry {
                seq: 5,
                ask: RegionAsk {
                    tally: Some(tally.clone()),
                    ..ask.clone()
                },
            }],
        };
        assert_eq!(
            plain.encode().expect("encode"),
            with.encode().expect("encode")
        );
        let entry = RegionAskEntry {
            seq: 5,
            ask: RegionAsk {
                tally: Some(tally.clone()),
                ..ask.clone()
            },
        };
        let tallied = TalliedAsk::from(entry.clone());
        assert_eq!(tallied.tally, tally);
        assert_eq!(RegionAskEntry::from(tallied.clone()), entry);
        let asks = Frame::RegionAsksTallied {
            region: "eu".into(),
            asks: vec![tallied.clone()],
        };
        let relay = Frame::RegionRelayTallied {
            region: "eu".into(),
            asks: vec![tallied],
        };
        for (tag, f) in [(45, asks), (46, relay)] {
            let bytes = f.encode().expect("encode");
            assert_eq!(bytes[0], tag, "{f:?}");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
    }

    #[test]
    fn reset_frames_round_trip_and_keep_older_encodings() {
        for f in [
            Frame::Reset {
                ids: vec![1, u64::MAX],
            },
            Frame::ResetAck { removed: 2 },
        ] {
            let bytes = f.encode().expect("encode");
            assert_eq!(Frame::decode(&bytes).expect("decode"), f);
        }
        let counts = Frame::GlobalCounts {
            generation: 3,
            counts: vec![GlobalCount {
                id: u64::MAX,
                period_ms: 1000,
                window: 1_700_000_000,
                current: 5,
                previous: 0,
            }],
        };
        let bytes = counts.encode().expect("encode");
        assert_eq!(Frame::decode(&bytes).expect("decode"), counts);
        let relayed = Frame::GlobalCountsOf {
            counts: vec![ActorCounts {
                node_id: "node-1".into(),
                generation: 7,
                counts: vec![GlobalCount {
                    id: 9,
                    period_ms: 86_400_000,
                    window: 19_700,
                    current: 30,
                    previous: 2,
                }],
            }],
        };
        let bytes = relayed.encode().expect("encode");
        assert_eq!(Frame::decode(&bytes).expect("decode"), relayed);
        // Appended after `GlobalCounts` (tag 12), which keeps its tag.
        assert_eq!(bytes[0], 13);
        assert_eq!(counts.encode().expect("encode")[0], 12);
        // Appended variants: an existing frame's tag is unchanged.
        let ack = Frame::HandoverAck { merged: 1 }.encode().expect("encode");
        assert_eq!(ack[0], 8);
        let replicate = Frame::Replicate {
            buckets: vec![
                ReplicaBucket {
                    id: 3,
                    state: Some(WireState::Fixed { end: 9, count: 2 }),
                },
                ReplicaBucket { id: 4, state: None },
            ],
        };
        let bytes = replicate.encode().expect("encode");
        assert_eq!(Frame::decode(&bytes).expect("decode"), replicate);
        assert_eq!(bytes[0], 15, "appended after Checks (14)");
        let ack = Frame::ReplicateAck { kept: 2 };
        let bytes = ack.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (ack, 16)
        );
        let back = Frame::HandBack {
            buckets: vec![ReplicaBucket {
                id: 5,
                state: Some(WireState::Fixed { end: 9, count: 7 }),
            }],
        };
        let bytes = back.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (back, 17)
        );
        let recall = Frame::Recall { ids: vec![5, 6] };
        let bytes = recall.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (recall, 18)
        );
        let recalled = Frame::Recalled {
            buckets: vec![HandedBucket {
                id: 5,
                state: WireState::Fixed { end: 9, count: 7 },
            }],
        };
        let bytes = recalled.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (recalled, 19)
        );
        let one_way = Frame::ReplicateOneWay {
            buckets: vec![ReplicaBucket { id: 4, state: None }],
        };
        let bytes = one_way.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (one_way, 20)
        );
        let Frame::Checks(groups) = sample() else {
            unreachable!("sample is a checks frame")
        };
        let check = groups[0].checks[0].clone();
        let lease = Frame::Lease {
            asks: vec![LeaseAsk {
                key: check.key,
                rule: check.rule,
                want: 250,
                demand_per_s: 1_000,
            }],
        };
        let bytes = lease.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (lease, 21)
        );
        let answer = CheckAnswer {
            allowed: true,
            limit: 5,
            remaining: 2,
            reset_at_ms: 9,
            retry_after_ms: 0,
            degraded: false,
            replica: false,
            leased: false,
        };
        let leased = Frame::Leased {
            grants: vec![
                LeaseGrant::Granted {
                    tokens: 3,
                    mark: Mark {
                        reset_ns: 5,
                        at_ns: 6,
                    },
                    valid_ns: 7,
                    answer,
                },
                LeaseGrant::Refused { answer },
                LeaseGrant::Error {
                    code: "unknown_rule".into(),
                    message: "no".into(),
                },
            ],
        };
        let bytes = leased.encode().expect("encode");
        assert_eq!(
            (Frame::decode(&bytes).expect("decode"), bytes[0]),
            (leased, 22)
        );
    }

    /// Version 7's reservation frames round-trip, appended after `Leased` (22): every older
    /// frame keeps its tag.
    #[test]
    fn reservation_frames_round_trip_after_the_older_tags() {
        let Frame::Checks(groups) = sample() else {
            unreachable!("sample is a checks frame")
        };
        let check = groups[0].checks[0].clone();
        let answer = CheckAnswer {
            allowed: true,
            limit: 5,
            remaining: 2,
            reset_at_ms: 9,
            retry_after_ms: 0,
            degraded: false,
            replica: false,
            leased: false,
        };
        let frames = [
            Frame::Reserve {
                asks: vec![PeerReserve {
                    key: check.key.clone(),
                    rule: check.rule.clone(),
                    cost: 3,
                    ttl_ms: 60_000,
                    nonce: u128::MAX - 1,
                }],
            },
            Frame::Reserved {
                answers: vec![
                    PeerAnswer::Answer(answer),
                    PeerAnswer::Error {
                        code: "not_owner".into(),
                        message: "no".into(),
                    },
                ],
            },
            Frame::Settle {
                settles: vec![PeerSettle {
                    key: check.key,
                    rule: check.rule,
                    nonce: 1 << 100,
                    cost: 7,
                }],
            },
            Frame::Settled {
                answers: vec![
                    SettleAnswer::Answer(answer),
                    SettleAnswer::Unknown,
                    SettleAnswer::Error {
                        code: "invalid_cost".into(),
                        message: "no".into(),
                    },
                ],
            },
        ];
        for (f, tag) in frames.into_iter().zip(23u8..) {
            let bytes = f.encode().expect("encode");
            assert_eq!((Frame::decode(&bytes).expect("decode"), bytes[0]), (f, tag));
        }
        let leased = Frame::Leased { grants: vec![] };
        assert_eq!(leased.encode().expect("encode")[0], 22, "unmoved");
    }

    /// A blocked answer travels whole from [`BLOCKED_ANSWER_SINCE`]; an older peer is sent the
    /// plain answer, whose bytes are those it always decoded (the earlier variants keep their
    /// tags).
    #[test]
    fn a_blocked_answer_decodes_and_older_peers_get_the_plain_answer() {
        let answer = CheckAnswer {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_at_ms: 9_000,
            retry_after_ms: 8_000,
            degraded: false,
            replica: false,
            leased: false,
        };
        let frame = |a: PeerAnswer| {
            Frame::Answers(vec![AnswerGroup {
                id: 3,
                answers: vec![a],
            }])
        };
        let blocked = PeerAnswer::Blocked {
            answer,
            source: BlockSource::Auto,
        };
        let bytes = frame(blocked.clone()).encode().expect("encode");
        assert_eq!(
            Frame::decode(&bytes).expect("decode"),
            frame(blocked.clone())
        );
        assert_eq!(blocked.answer(), Some(&answer));
        assert_eq!(blocked.clone().for_version(PROTOCOL_VERSION), blocked);
        let old = blocked.for_version(BLOCKED_ANSWER_SINCE - 1);
        assert_eq!(old, PeerAnswer::Answer(answer));
        let plain = frame(old).encode().expect("encode");
        // Answers' tag, one group, its id, one answer, `Answer`'s tag 0.
        assert_eq!(plain[1..5], [1, 3, 1, 0], "{plain:?}");
    }

    /// Version 3 says a group's kind in a field; version 2's frame (tag 5, kind in the id's
    /// top bits) still decodes, and translates both ways with the id the sender waits for.
    #[test]
    fn check_groups_say_their_kind_and_version_2_groups_still_decode() {
        let Frame::Checks(groups) = sample() else {
            unreachable!("sample is a checks frame")
        };
        let check = groups[0].checks[0].clone();
        for kind in [
            GroupKind::Owned,
            GroupKind::Relayed,
            GroupKind::AllOrNothing,
        ] {
            let group = CheckGroup {
                id: 41,
                kind,
                checks: vec![check.clone()],
            };
            let new = Frame::Checks(vec![group.clone()]);
            let bytes = new.encode().expect("encode");
            assert_eq!(bytes[0], 14, "appended after GlobalCountsOf");
            assert_eq!(Frame::decode(&bytes).expect("decode"), new);

            // What a version-2 sender writes: the kind in the id's bits, at tag 5.
            let flagged = FlaggedGroup::from(group.clone());
            assert_eq!(flagged.id, 41 | kind.flag_bits());
            let old = Frame::FlaggedChecks(vec![flagged.clone()]);
            let bytes = old.encode().expect("encode");
            assert_eq!(bytes[0], 5, "version 2's checks keep their tag");
            // Version 2's own layout: (tag, groups, id, checks...) with no kind field.
            let v2 = bincode::serde::encode_to_vec(
                (5u8, vec![(flagged.id, vec![check.clone()])]),
                config(),
            )
            .expect("encode");
            assert_eq!(bytes, v2);
            let Frame::FlaggedChecks(decoded) = Frame::decode(&bytes).expect("decode") else {
                panic!("not a flagged checks frame");
            };
            let translated = CheckGroup::from(decoded[0].clone());
            assert_eq!(translated.kind, kind);
            assert_eq!(translated.id, flagged.id, "the answer echoes the id whole");
            assert_eq!(translated.checks, group.checks);
        }
        assert_eq!(
            GroupKind::of_flags(RELAYED_GROUP | ALL_OR_NOTHING_GROUP),
            GroupKind::AllOrNothing
        );
    }

    #[test]
    fn hostile_bytes_are_refused_without_allocating() {
        // A Checks frame claiming 2^60 groups, and a string claiming 2^40 bytes.
        let mut bytes = sample().encode().expect("encode");
        bytes.truncate(1);
        bytes.extend_from_slice(&[0xff, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        assert!(Frame::decode(&bytes).is_err());
        assert!(Frame::decode(&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(Frame::decode(&[]).is_err());
        assert!(Frame::decode(&[200]).is_err());
        let mut trailing = sample().encode().expect("encode");
        trailing.push(0);
        assert!(matches!(
            Frame::decode(&trailing),
            Err(FrameError::Trailing(1))
        ));
    }
}
