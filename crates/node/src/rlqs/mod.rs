//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoys report how
//! many requests each of their buckets saw and enforce the assignments this node pushes.
//!
//! # Layout
//! - [`config`] — `--rlqs-config`: which bucket ids map to which rule, or to a blanket rule.
//! - [`service`] — the gRPC stream: reports in, assignments out (a thin edge over [`Rlqs`]).
//! - [`owner`] — the bucket owner's side: each member's streams' shares of a rule's rate.
//! - [`budget`] — what streams may hold, and which client gives way when the node is full.
//! - [`Rlqs`] (here) — this node's streams and their buckets, and the task that asks owners
//!   for shares and pushes them ([`Rlqs::run`]).
//!
//! A rule's bucket is split among every stream of every member at its owner, so the sum of
//! what all Envoys on all nodes admit stays within the rule's rate. A stream's assignment is a
//! token bucket filling at its share, rounded down to a grid ([`quota::STEP`]); it is pushed
//! again only when the share falls, or rises by [`RISE`] (an Envoy keeps its tokens when a
//! config is unchanged, and starts a new bucket when it changes), and refreshed before its TTL
//! lapses. A demand is taken at once when it moves by more than chance explains, and smoothed
//! otherwise ([`SMOOTHING`]), so that a stream whose demand changes gets its share in one
//! assignment and shares do not flap with one report's noise.
//!
//! A rule bucket whose key is blocked ([`crate::blocks`]) gets a deny-all instead of its share,
//! looked up at each round: it lives no longer than the block's rest (an Envoy that loses its
//! stream stops denying when the block ends), and the round after the block ends or is lifted
//! pushes the share again. Its owner is still asked, so the share is ready then.
//!
//! # Bounds
//! Envoys are not trusted to keep the node's memory small; what they send is bounded here:
//! - A bucket id has at most [`MAX_ID_ENTRIES`] pairs and [`MAX_ID_BYTES`] bytes (keys and
//!   values). A longer one is neither kept nor answered (Envoy matches answers by the whole id,
//!   so none can be made of part of it, and echoing it would send back what is refused):
//!   Envoy's bucket stays in its `no_assignment_behavior` and, unanswered, is given up by
//!   Envoy itself; counted in `ringlimit_rlqs_refused_buckets_total{reason="id_too_large"}`.
//! - Everything a stream holds is counted in bytes: [`STREAM_BYTES`] for the stream, each
//!   bucket's id and rule key plus [`BUCKET_BYTES`], each abandon waiting to be read its id
//!   plus [`ABANDON_BYTES`]. A stream holds at most [`DEFAULT_LIMITS`]`.stream_buckets`
//!   (10,000) buckets and `.stream_bytes` (16 MiB); the node `.node_buckets` (100,000) and
//!   `.node_bytes` (128 MiB). Past them new buckets are abandoned.
//! - The node's room is shared per client (a connection's source address): while the node is
//!   full, a client within its fair share (the node's limits over the clients holding anything)
//!   is still admitted, and the client holding the most gives way — its quietest bucket is
//!   abandoned, or its stream ended with RESOURCE_EXHAUSTED when it holds no bucket. A client at
//!   its share is refused.
//! - Answers are the latest action per bucket, kept until the Envoy reads them (never a queue
//!   of stale ones), sent in messages of at most [`MAX_ANSWER_BYTES`]; an Envoy that reads none
//!   for [`UNREAD_NS`] loses its stream.
//! - A usage report may count at most [`MAX_REPORTED_REQUESTS`] requests allowed (and as many
//!   denied) for a bucket; a larger count ends the stream with INVALID_ARGUMENT.

pub mod budget;
pub mod config;
pub mod metrics;
pub mod owner;
pub mod reload;
pub mod service;

use crate::cluster::View;
use crate::local::Local;
use crate::peers::Peers;
use crate::rules::RuleSpec;
use arc_swap::ArcSwap;
use budget::{Admit, Budget, Dim, Limits, Refusal, Use};
use config::{Blanket, Matched, RlqsConfig, Target};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::{
    BucketAction, bucket_action,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use owner::{QuotaOwner, from_milli, rate_of, to_milli};
use parking_lot::Mutex;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::quota;
use ringlimit_proto::RuleRef;
use ringlimit_proto::peer::{QuotaAnswer, QuotaAsk, QuotaStream};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;

/// How often this node asks owners for its streams' shares (sooner when a bucket is new or a
/// demand moved).
pub const ASK_EVERY: Duration = Duration::from_millis(250);
/// Shortest time between two rounds of asks.
const ROUND_GAP: Duration = Duration::from_millis(100);
/// How long an owner has to answer.
const ASK_WITHIN: Duration = Duration::from_millis(800);
/// A share that rose by this factor (two grid steps) is pushed; a fall always is.
pub const RISE: f64 = quota::STEP * quota::STEP;
/// How much a demand estimate moves towards a report that chance may explain (a move beyond
/// three standard deviations is taken whole).
const SMOOTHING: f64 = 0.3;
/// The burst of a stream that asks more than its share: its bucket is empty all the time, and
/// a longer burst would only add what a new assignment's full bucket lets through.
const SATURATED_BURST_NS: u64 = 100_000_000;
/// A demand that moved by more than this fraction asks the owner at once.
const MOVED: f64 = 0.20;
/// A bucket without a request for this long is abandoned (Envoy forgets it; a new request
/// makes it again).
const QUIET_NS: u64 = 60_000_000_000;
/// A new bucket's demand until its first periodic report: more than any share, so that it
/// gets an equal part of the rate (max-min fair) meanwhile.
const UNKNOWN_DEMAND: f64 = 1e12;
/// Shortest time a report's counts are taken to span, in seconds.
const MIN_ELAPSED_S: f64 = 0.1;
/// Most pairs in one bucket id: Envoy's `bucket_id_builder` names each, and a handful is usual.
pub const MAX_ID_ENTRIES: usize = 32;
/// Most bytes in one bucket id, keys and values: room for a tenant, a path or a token's
/// subject (Envoy takes values from request headers, which may be far longer).
pub const MAX_ID_BYTES: usize = 4096;
/// Most requests one usage report may count for one bucket, allowed or denied. A report counts
/// the requests of one reporting interval (Envoy reports each bucket every
/// `reporting_interval`, seconds as a rule); 2³²−1 is over an hour at a million requests a
/// second, more than one Envoy serves. A larger count is a broken or hostile client.
pub const MAX_REPORTED_REQUESTS: u64 = u32::MAX as u64;
/// Accounted bytes of an open stream, beside what it holds (its entry, answer state, task).
pub const STREAM_BYTES: usize = 2048;
/// Accounted bytes of a bucket beside its id's and rule key's strings (map entries, the
/// strings' headers and allocations, its state).
pub const BUCKET_BYTES: usize = 512;
/// Accounted bytes of an abandon waiting to be read, beside its id's strings.
pub const ABANDON_BYTES: usize = 64;
/// Largest answer message: Envoy's and most gRPC clients' receive limits are at least 4 MiB.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// A stream whose Envoy leaves its answers unread for this long is ended.
const UNREAD_NS: u64 = 30_000_000_000;
/// Buckets of a stream looked at to choose the one that gives way.
const EVICT_SAMPLE: usize = 16;
/// Streams of a client looked at to choose the one that gives way.
const EVICT_STREAMS: usize = 64;

/// The bounds in force unless [`Rlqs::with_limits`] says otherwise.
pub const DEFAULT_LIMITS: Limits = Limits {
    stream_buckets: 10_000,
    stream_bytes: 16 << 20,
    node_buckets: 100_000,
    node_bytes: 128 << 20,
};

/// A bucket id's pairs, sorted by key (keys are distinct: the id is a map): how a stream tells
/// its buckets apart (shared by the bucket and its answer waiting to be read). A slice, not a
/// tree: a few pairs in one allocation.
type IdKey = Box<[(String, String)]>;
type Id = Arc<IdKey>;

/// A rule's bucket: (rule, key).
type RuleBucket = (String, String);

/// One stream's bucket of a rule, as a round asks for it.
struct Want {
    stream: u64,
    id: Id,
    demand: f64,
    /// Assigned already.
    held: bool,
}

/// What was last pushed to a stream for a bucket.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    strategy: Strategy,
    /// The share it was made of (requests per second; 0 for blanket rules).
    rate: f64,
    at_ns: u64,
    /// The end (Unix ms) of the block this deny answers, when it answers one.
    block: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Strategy {
    Blanket(Blanket),
    /// `(max_tokens, tokens_per_fill, fill_interval_s)`.
    TokenBucket(u32, u32, u64),
}

/// An answer for one bucket, waiting for its Envoy to read it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    /// `(strategy, ttl_ns)`.
    Assign(Strategy, u64),
    Abandon,
}

#[derive(Debug)]
struct Bucket {
    matched: Option<Matched>,
    /// Accounted bytes ([`bucket_bytes`]).
    bytes: usize,
    /// Requests a second, as estimated from the reports after the first.
    demand: f64,
    /// Reports after the first.
    reports: u32,
    last_request_ns: u64,
    sent: Option<Sent>,
}

struct Stream {
    client: IpAddr,
    domain: Option<String>,
    buckets: HashMap<Id, Bucket>,
    /// What this stream holds, as charged to its client.
    used: Use,
    /// Answers not read yet: the latest per bucket.
    pending: HashMap<Id, Act>,
    /// Bytes of the pending abandons (in `used`).
    abandon_bytes: usize,
    /// Since when answers wait unread.
    unread_since: Option<u64>,
    /// Set when the stream is over: its answers end with this once the pending are read (an
    /// error at once).
    end: Option<Result<(), tonic::Status>>,
    waker: Option<Waker>,
}

/// The streams and what they hold, under one lock.
struct State {
    streams: HashMap<u64, Stream>,
    /// Each client's streams that are not over.
    by_client: HashMap<IpAddr, HashSet<u64>>,
    budget: Budget,
}

/// Counters, for metrics.
#[derive(Debug, Default)]
pub struct RlqsStats {
    pub assignments_token_bucket: AtomicU64,
    pub assignments_allow_all: AtomicU64,
    pub assignments_deny_all: AtomicU64,
    pub abandons: AtomicU64,
    pub expired_on_stop: AtomicU64,
    pub owner_unreachable: AtomicU64,
    pub dropped_streams: AtomicU64,
    /// New buckets refused: the id over [`MAX_ID_BYTES`] or [`MAX_ID_ENTRIES`].
    pub refused_id_too_large: AtomicU64,
    /// New buckets refused: their stream holds its most buckets or bytes.
    pub refused_stream_full: AtomicU64,
    /// New buckets refused: the node is full and their client holds its fair share.
    pub refused_client_share: AtomicU64,
    /// Buckets abandoned so that another client's could be admitted.
    pub evicted_buckets: AtomicU64,
    /// Streams ended (RESOURCE_EXHAUSTED) so that another client's could be admitted, or
    /// refused at their opening.
    pub evicted_streams: AtomicU64,
    pub refused_streams: AtomicU64,
    /// Reports that ended their stream (INVALID_ARGUMENT), by why.
    pub invalid_reports: AtomicU64,
    /// Per rule: requests reported allowed and denied, and the rule's rate per second.
    pub by_rule: Mutex<HashMap<String, RuleCounts>>,
}

/// One rule's reported requests.
#[derive(Debug, Default, Clone, Copy)]
pub struct RuleCounts {
    pub allowed: u64,
    pub denied: u64,
    pub rate: f64,
}

/// This node's RLQS streams.
pub struct Rlqs {
    pub config: Arc<ArcSwap<RlqsConfig>>,
    pub owner: Arc<QuotaOwner>,
    pub stats: Arc<RlqsStats>,
    local: Arc<Local>,
    state: Mutex<State>,
    next_id: AtomicU64,
    wake: Notify,
    stopping: AtomicBool,
    /// The rule buckets asked for in the last round: one no stream here reports any more is
    /// given up at its owner (an ask with no streams) instead of holding its share until the
    /// owner forgets this node.
    asked: Mutex<HashSet<RuleBucket>>,
}

/// Why a report ended its stream.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("the first report of a stream names no domain")]
    NoDomain,
    #[error("the stream's domain is {0:?}; close it and open another for {1:?}")]
    OtherDomain(String, String),
    #[error("a usage report has no bucket_id, or an empty one")]
    NoBucketId,
    #[error(
        "a usage report counts {count} requests {what} for one bucket: more than any Envoy \
         counts in one reporting interval (at most {MAX_REPORTED_REQUESTS})"
    )]
    TooManyRequests { what: &'static str, count: u64 },
    #[error("the node is stopping: connect to another")]
    Stopping,
    #[error("the stream is over")]
    Ended,
}

/// Why a stream was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the node is stopping: connect to another")]
    Stopping,
    #[error(
        "this node holds all the RLQS state it may, and this client (its source address) its \
         fair share: close a stream, or connect to another node"
    )]
    Full,
}

/// The bytes of an id's keys and values.
fn id_bytes<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    pairs
        .into_iter()
        .map(|(k, v)| k.len().saturating_add(v.len()))
        .fold(0, usize::saturating_add)
}

/// [`id_bytes`] of a kept id.
fn key_bytes(id: &IdKey) -> usize {
    id_bytes(id.iter().map(|(k, v)| (k, v)))
}

/// What a bucket of `id` matched as `matched` is charged.
fn bucket_bytes(id: &IdKey, matched: Option<&Matched>) -> usize {
    let rule = match matched.map(|m| &m.target) {
        Some(Target::Rule { rule, key }) => rule.len() + key.len(),
        _ => 0,
    };
    BUCKET_BYTES + key_bytes(id) + rule
}

/// What an abandon of `id` waiting to be read is charged.
fn abandon_bytes(id: &IdKey) -> usize {
    ABANDON_BYTES + key_bytes(id)
}

impl Stream {
    /// Keeps `act` for `id` until the Envoy reads it (replacing what was waiting for it).
    fn queue(&mut self, id: Id, act: Act, now: u64) {
        self.pending.insert(id, act);
        self.unread_since.get_or_insert(now);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

impl State {
    /// Forgets an abandon of `id` waiting on `stream` (the Envoy subscribes to it again, or it
    /// gives way), its bytes given back.
    fn unqueue_abandon(&mut self, stream: u64, id: &IdKey) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.pending.get(id) == Some(&Act::Abandon) {
            s.pending.remove(id);
            let b = abandon_bytes(id);
            s.abandon_bytes = s.abandon_bytes.saturating_sub(b);
            s.used = s.used.minus(Use::bytes(b));
            self.budget.sub(s.client, Use::bytes(b));
        }
    }

    /// Tells `stream`'s Envoy to abandon `id`, if there is room for it to wait (else whatever
    /// waited for `id` is dropped: the Envoy reports the bucket again, or its assignment lapses).
    /// Nobody gives way for an abandon.
    fn abandon(&mut self, stream: u64, id: Id, now: u64) -> bool {
        let Some(s) = self.streams.get_mut(&stream) else {
            return false;
        };
        if s.pending.get(&*id) == Some(&Act::Abandon) {
            return true;
        }
        let cost = Use::bytes(abandon_bytes(&id));
        if s.end.is_some() || !self.budget.fits(s.used, cost) {
            s.pending.remove(&*id);
            return false;
        }
        s.used = s.used.plus(cost);
        s.abandon_bytes += cost.bytes;
        self.budget.add(s.client, cost);
        s.queue(id, Act::Abandon, now);
        true
    }

    /// Removes `stream`'s bucket `id`, its bytes given back (no answer).
    fn remove_bucket(&mut self, stream: u64, id: &IdKey) -> Option<Bucket> {
        let s = self.streams.get_mut(&stream)?;
        let b = s.buckets.remove(id)?;
        let cost = Use {
            buckets: 1,
            bytes: b.bytes,
        };
        s.used = s.used.minus(cost);
        self.budget.sub(s.client, cost);
        Some(b)
    }

    /// Ends `stream`: everything it holds given back, its answers ended with `end` (pending
    /// ones first when it is `Ok`).
    fn end(&mut self, stream: u64, end: Result<(), tonic::Status>, keep_pending: bool) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.end.is_none() {
            s.end = Some(end);
        }
        s.buckets = HashMap::new();
        if !keep_pending {
            s.pending = HashMap::new();
        }
        s.abandon_bytes = 0;
        self.budget.sub(s.client, s.used);
        s.used = Use::default();
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        let client = s.client;
        if let Some(set) = self.by_client.get_mut(&client) {
            set.remove(&stream);
            if set.is_empty() {
                self.by_client.remove(&client);
            }
        }
    }

    /// Forgets `stream` (its answers are over).
    fn forget(&mut self, stream: u64) {
        self.end(stream, Ok(()), false);
        self.streams.remove(&stream);
    }

    /// Makes `victim` give way in `dim`: from its stream holding the most, its abandons
    /// waiting to be read are dropped (bytes), or its quietest (buckets) or largest (bytes)
    /// bucket is abandoned, or, holding neither, the stream is ended. `false`: nothing to take.
    fn evict(&mut self, victim: IpAddr, dim: Dim, stats: &RlqsStats, now: u64) -> bool {
        let measure = |s: &Stream| match dim {
            Dim::Buckets => s.used.buckets,
            Dim::Bytes => s.used.bytes,
        };
        let Some(stream) = self.by_client.get(&victim).and_then(|set| {
            set.iter()
                .take(EVICT_STREAMS)
                .filter_map(|id| Some((*id, measure(self.streams.get(id)?))))
                .max_by_key(|(_, m)| *m)
                .map(|(id, _)| id)
        }) else {
            return false;
        };
        let Some(s) = self.streams.get_mut(&stream) else {
            return false;
        };
        if dim == Dim::Bytes && s.abandon_bytes > 0 {
            s.pending.retain(|_, act| *act != Act::Abandon);
            let freed = Use::bytes(s.abandon_bytes);
            s.abandon_bytes = 0;
            s.used = s.used.minus(freed);
            self.budget.sub(victim, freed);
            return true;
        }
        let chosen = s
            .buckets
            .iter()
            .take(EVICT_SAMPLE)
            .max_by_key(|(_, b)| match dim {
                // The quietest.
                Dim::Buckets => u64::MAX - b.last_request_ns,
                Dim::Bytes => b.bytes as u64,
            })
            .map(|(id, _)| id.clone());
        match chosen {
            Some(id) => {
                self.remove_bucket(stream, &id);
                self.abandon(stream, id, now);
                stats.evicted_buckets.fetch_add(1, Ordering::Relaxed);
                stats.abandons.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.end(
                    stream,
                    Err(tonic::Status::resource_exhausted(
                        "this node's RLQS state is full and this client (its source address) \
                         holds more than its fair share: this stream gives way to another \
                         client's",
                    )),
                    false,
                );
                stats.evicted_streams.fetch_add(1, Ordering::Relaxed);
            }
        }
        true
    }

    /// Room for `cost` on `client`'s `stream` (`None`: a new stream), clients over their share
    /// giving way when the node is full.
    fn admit(
        &mut self,
        client: IpAddr,
        stream: Option<u64>,
        cost: Use,
        stats: &RlqsStats,
        now: u64,
    ) -> Result<(), Refusal> {
        // Each round takes at least a bucket or bytes from a client over its share; the bound
        // only guards against a mistake here.
        for _ in 0..1_000 {
            let held = match stream {
                Some(id) => Some(self.streams.get(&id).map_or_else(Use::default, |s| s.used)),
                None => None,
            };
            match self.budget.admit(client, held, cost) {
                Admit::Yes => return Ok(()),
                Admit::Refused(r) => return Err(r),
                Admit::Evict(victim, dim) => {
                    if !self.evict(victim, dim, stats, now) {
                        return Err(Refusal::Share);
                    }
                }
            }
        }
        Err(Refusal::Share)
    }
}

impl Rlqs {
    pub fn new(config: Arc<ArcSwap<RlqsConfig>>, local: Arc<Local>) -> Self {
        Self::with_limits(config, local, DEFAULT_LIMITS)
    }

    /// [`Rlqs::new`] with other bounds than [`DEFAULT_LIMITS`].
    pub fn with_limits(
        config: Arc<ArcSwap<RlqsConfig>>,
        local: Arc<Local>,
        limits: Limits,
    ) -> Self {
        Self {
            config,
            owner: Arc::new(QuotaOwner::new(local.clone())),
            stats: Arc::new(RlqsStats::default()),
            local,
            state: Mutex::new(State {
                streams: HashMap::new(),
                by_client: HashMap::new(),
                budget: Budget::new(limits),
            }),
            next_id: AtomicU64::new(1),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            asked: Mutex::new(HashSet::new()),
        }
    }

    /// Streams open here (not over).
    pub fn streams(&self) -> usize {
        self.state
            .lock()
            .streams
            .values()
            .filter(|s| s.end.is_none())
            .count()
    }

    /// Buckets held by the streams open here.
    pub fn buckets(&self) -> usize {
        self.state.lock().budget.total().buckets
    }

    /// Accounted bytes held by the streams open here (streams, buckets, abandons not read).
    pub fn bytes(&self) -> usize {
        self.state.lock().budget.total().bytes
    }

    /// Clients (source addresses) holding a stream here.
    pub fn clients(&self) -> usize {
        self.state.lock().budget.clients()
    }

    /// A new stream of `client` (the connection's source address).
    pub fn open(&self, client: IpAddr) -> Result<u64, OpenError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(OpenError::Stopping);
        }
        let now = self.local.now();
        let cost = Use::bytes(STREAM_BYTES);
        let mut st = self.state.lock();
        if st.admit(client, None, cost, &self.stats, now).is_err() {
            self.stats.refused_streams.fetch_add(1, Ordering::Relaxed);
            return Err(OpenError::Full);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        st.streams.insert(
            id,
            Stream {
                client,
                domain: None,
                buckets: HashMap::new(),
                used: cost,
                pending: HashMap::new(),
                abandon_bytes: 0,
                unread_since: None,
                end: None,
                waker: None,
            },
        );
        st.budget.add(client, cost);
        st.by_client.entry(client).or_default().insert(id);
        Ok(id)
    }

    /// The Envoy closed its side of the stream: its answers end.
    pub fn close(&self, stream: u64) {
        self.state.lock().end(stream, Ok(()), false);
    }

    /// Ends the stream with `status` (an invalid report).
    pub fn fail(&self, stream: u64, status: tonic::Status) {
        self.state.lock().end(stream, Err(status), false);
    }

    /// The stream's answers are no longer read (the call is over): forgotten.
    pub fn forget(&self, stream: u64) {
        self.state.lock().forget(stream);
    }

    /// The next answer of `stream`: its waiting actions (at most [`MAX_ANSWER_BYTES`]), its
    /// end, or `Pending` (`waker` woken when there is more).
    pub fn poll_answer(
        &self,
        stream: u64,
        waker: &Waker,
    ) -> Poll<Option<Result<RateLimitQuotaResponse, tonic::Status>>> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(s) = st.streams.get_mut(&stream) else {
            return Poll::Ready(None);
        };
        if matches!(s.end, Some(Err(_))) {
            // Ended with an error: nothing it held is charged any more; the status is the last
            // answer.
            let status = match st.streams.remove(&stream).and_then(|s| s.end) {
                Some(Err(status)) => status,
                _ => tonic::Status::internal("the stream ended"),
            };
            return Poll::Ready(Some(Err(status)));
        }
        if s.pending.is_empty() {
            if s.end.is_some() {
                st.forget(stream);
                return Poll::Ready(None);
            }
            s.waker = Some(waker.clone());
            return Poll::Pending;
        }
        let mut size = 0;
        let mut taken = Vec::new();
        for (id, act) in &s.pending {
            let action = action(id, *act);
            let len = prost::Message::encoded_len(&action) + 8;
            if !taken.is_empty() && size + len > MAX_ANSWER_BYTES {
                break;
            }
            size += len;
            taken.push((id.clone(), action));
        }
        let mut freed = 0;
        let mut bucket_action = Vec::with_capacity(taken.len());
        for (id, action) in taken {
            if s.pending.remove(&id) == Some(Act::Abandon) {
                freed += abandon_bytes(&id);
            }
            bucket_action.push(action);
        }
        // Only what is still charged (a stream that ended gave everything back).
        let freed = freed.min(s.abandon_bytes);
        s.abandon_bytes -= freed;
        s.used = s.used.minus(Use::bytes(freed));
        s.unread_since = if s.pending.is_empty() {
            None
        } else {
            Some(self.local.now())
        };
        let client = s.client;
        st.budget.sub(client, Use::bytes(freed));
        Poll::Ready(Some(Ok(RateLimitQuotaResponse { bucket_action })))
    }

    /// Takes one report of `stream`: new buckets are matched, blanket and unmatched ones are
    /// answered at once, and the owners are asked for new rule buckets' shares. A report with
    /// an error changes nothing.
    pub fn report(&self, stream: u64, r: RateLimitQuotaUsageReports) -> Result<(), ReportError> {
        let result = self.take(stream, r);
        if let Err(
            ReportError::NoDomain
            | ReportError::OtherDomain(..)
            | ReportError::NoBucketId
            | ReportError::TooManyRequests { .. },
        ) = &result
        {
            self.stats.invalid_reports.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn take(&self, stream: u64, r: RateLimitQuotaUsageReports) -> Result<(), ReportError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ReportError::Stopping);
        }
        check(&r)?;
        let now = self.local.now();
        let config = self.config.load();
        let mut wake = false;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(s) = st.streams.get_mut(&stream).filter(|s| s.end.is_none()) else {
            return Err(ReportError::Ended);
        };
        let client = s.client;
        let domain = match (&s.domain, r.domain.as_str()) {
            (None, "") => return Err(ReportError::NoDomain),
            (None, d) => {
                s.domain = Some(d.to_owned());
                d.to_owned()
            }
            (Some(have), d) if !d.is_empty() && d != have => {
                return Err(ReportError::OtherDomain(have.clone(), d.to_owned()));
            }
            (Some(have), _) => have.clone(),
        };
        let mut by_rule = self.stats.by_rule.lock();
        for usage in r.bucket_quota_usages {
            let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
            let Some(id) = usage.bucket_id else {
                continue;
            };
            if id.bucket.len() > MAX_ID_ENTRIES || id_bytes(&id.bucket) > MAX_ID_BYTES {
                // Not kept, not answered: see the module's doc.
                self.stats
                    .refused_id_too_large
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let mut key: Vec<(String, String)> = id.bucket.into_iter().collect();
            key.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let key: IdKey = key.into_boxed_slice();
            let requests = allowed.saturating_add(denied);
            let elapsed_s = usage
                .time_elapsed
                .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
                .filter(|s| *s > 0.0)
                // A new bucket's first report comes at its first request, a moment after it
                // was made: not a rate to go by.
                .map(|s| s.max(MIN_ELAPSED_S))
                .unwrap_or(1.0);
            let demand = requests as f64 / elapsed_s;
            let Some(s) = st.streams.get_mut(&stream) else {
                break;
            };
            if let Some(b) = s.buckets.get_mut(&key) {
                if requests > 0 {
                    b.last_request_ns = now;
                }
                let moved = (demand - b.demand).abs() > MOVED * b.demand.max(1.0);
                // A move beyond what chance explains (three standard deviations of a
                // Poisson count) is a change of demand: taken whole. Within it, noise:
                // smoothed (taking each rise whole held quiet streams' shares above their
                // use, lost to the others).
                let expected = b.demand * elapsed_s;
                let changed = (requests as f64 - expected).abs() > 3.0 * expected.max(1.0).sqrt();
                if b.reports == 0 || changed {
                    b.demand = demand;
                } else {
                    b.demand += SMOOTHING * (demand - b.demand);
                }
                b.reports = b.reports.saturating_add(1);
                if let Some(Matched {
                    target: Target::Rule { rule, .. },
                    ..
                }) = &b.matched
                {
                    by_rule
                        .entry(rule.clone())
                        .or_default()
                        .add(allowed, denied);
                    wake |= moved;
                }
                continue;
            }
            let id: Id = Arc::new(key);
            // An abandon not read yet is stale: the Envoy subscribes to the bucket again.
            st.unqueue_abandon(stream, &id);
            let Some(matched) = config.matched(&domain, &id) else {
                st.abandon(stream, id, now);
                self.stats.abandons.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let bytes = bucket_bytes(&id, Some(&matched));
            let cost = Use { buckets: 1, bytes };
            if let Err(refusal) = st.admit(client, Some(stream), cost, &self.stats, now) {
                let counter = match refusal {
                    Refusal::Stream => &self.stats.refused_stream_full,
                    Refusal::Share => &self.stats.refused_client_share,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                st.abandon(stream, id, now);
                self.stats.abandons.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some(s) = st.streams.get_mut(&stream) else {
                break;
            };
            let mut b = Bucket {
                matched: Some(matched),
                bytes,
                // Unknown: a new bucket's first report comes with its first request.
                // Until its first periodic report it asks for an equal part (with
                // none, an Envoy that reconnected got a trickle for a second).
                demand: UNKNOWN_DEMAND,
                reports: 0,
                last_request_ns: now,
                sent: None,
            };
            match b.matched.as_ref().map(|m| &m.target) {
                Some(Target::Blanket(blanket)) => {
                    let strategy = Strategy::Blanket(*blanket);
                    let act = self.assign(&mut b, strategy, 0.0, now);
                    s.queue(id.clone(), act, now);
                }
                Some(Target::Rule { rule, .. }) => {
                    by_rule
                        .entry(rule.clone())
                        .or_default()
                        .add(allowed, denied);
                    wake = true;
                }
                None => {}
            }
            s.buckets.insert(id, b);
            s.used = s.used.plus(cost);
            st.budget.add(client, cost);
        }
        drop(by_rule);
        drop(guard);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// An assignment of `strategy` for `b`, remembered as sent, counted.
    fn assign(&self, b: &mut Bucket, strategy: Strategy, rate: f64, now: u64) -> Act {
        let ttl_ns = b
            .matched
            .as_ref()
            .map_or(config::DEFAULT_TTL_NS, |m| m.ttl_ns);
        let counter = match strategy {
            Strategy::Blanket(Blanket::AllowAll) => &self.stats.assignments_allow_all,
            Strategy::Blanket(Blanket::DenyAll) => &self.stats.assignments_deny_all,
            Strategy::TokenBucket(..) => &self.stats.assignments_token_bucket,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        b.sent = Some(Sent {
            strategy,
            rate,
            at_ns: now,
            block: None,
        });
        Act::Assign(strategy, ttl_ns)
    }

    /// A deny-all assignment for `b`, whose rule bucket is blocked until `until_ms` (Unix ms),
    /// at `now` (ns): it lives no longer than the block's rest, so that the Envoy does not
    /// deny past the block's end whatever happens to this stream. Remembered as sent, counted.
    fn deny_blocked(&self, b: &mut Bucket, until_ms: u64, now: u64) -> Act {
        let ttl_ns = b
            .matched
            .as_ref()
            .map_or(config::DEFAULT_TTL_NS, |m| m.ttl_ns);
        let rest_ns = until_ms.saturating_mul(NANOS_PER_MS).saturating_sub(now);
        self.stats
            .assignments_deny_all
            .fetch_add(1, Ordering::Relaxed);
        let strategy = Strategy::Blanket(Blanket::DenyAll);
        b.sent = Some(Sent {
            strategy,
            rate: 0.0,
            at_ns: now,
            block: Some(until_ms),
        });
        Act::Assign(strategy, ttl_ns.min(rest_ns))
    }

    /// Asks owners for shares and pushes assignments, every [`ASK_EVERY`] and whenever a
    /// report brings a new bucket or a moved demand, until dropped.
    pub async fn run(self: Arc<Self>, peers: Arc<Peers>, view: Arc<ArcSwap<View>>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(ASK_EVERY) => {}
                () = self.wake.notified() => {}
            }
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            self.round(&peers, &view.load_full()).await;
            tokio::time::sleep(ROUND_GAP).await;
        }
    }

    /// Each stream's buckets looked over: quiet ones and those no entry matches any more are
    /// abandoned, blanket ones refreshed, streams whose Envoy reads nothing ended; returns the
    /// rule buckets and their streams, to ask their owners for.
    fn sweep(&self, now: u64) -> HashMap<RuleBucket, Vec<Want>> {
        let config = self.config.load();
        let mut wanted: HashMap<RuleBucket, Vec<Want>> = HashMap::new();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let ids: Vec<u64> = st.streams.keys().copied().collect();
        for sid in ids {
            let Some(s) = st.streams.get_mut(&sid) else {
                continue;
            };
            if s.end.is_some() {
                continue;
            }
            if s.unread_since
                .is_some_and(|t| now.saturating_sub(t) > UNREAD_NS)
            {
                st.end(
                    sid,
                    Err(tonic::Status::resource_exhausted(
                        "the Envoy read none of this stream's answers for 30 s",
                    )),
                    false,
                );
                self.stats.dropped_streams.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let domain = s.domain.clone().unwrap_or_default();
            let mut gone: Vec<Id> = Vec::new();
            let mut acts: Vec<(Id, Act)> = Vec::new();
            let (mut grew, mut shrank) = (0usize, 0usize);
            for (id, b) in &mut s.buckets {
                if now.saturating_sub(b.last_request_ns) > QUIET_NS {
                    gone.push(id.clone());
                    continue;
                }
                // The configuration may have changed since the bucket was matched.
                let matched = config.matched(&domain, id);
                if matched != b.matched {
                    let bytes = bucket_bytes(id, matched.as_ref());
                    grew += bytes.saturating_sub(b.bytes);
                    shrank += b.bytes.saturating_sub(bytes);
                    b.bytes = bytes;
                    b.matched = matched;
                    b.sent = None;
                }
                match b.matched.as_ref().map(|m| (&m.target, m.ttl_ns)) {
                    None => gone.push(id.clone()),
                    Some((Target::Blanket(blanket), ttl_ns)) => {
                        let due = b
                            .sent
                            .as_ref()
                            .is_none_or(|sent| now.saturating_sub(sent.at_ns) > ttl_ns / 2);
                        if due {
                            let strategy = Strategy::Blanket(*blanket);
                            acts.push((id.clone(), self.assign(b, strategy, 0.0, now)));
                        }
                    }
                    Some((
                        Target::Rule {
                            rule,
                            key: rule_key,
                        },
                        _,
                    )) => {
                        wanted
                            .entry((rule.clone(), rule_key.clone()))
                            .or_default()
                            .push(Want {
                                stream: sid,
                                id: id.clone(),
                                demand: b.demand,
                                // A block's deny is no share: the owner need not wait for
                                // it, and its streams get the fallback share meanwhile.
                                held: b.sent.as_ref().is_some_and(|s| s.block.is_none()),
                            });
                    }
                }
            }
            // A reload may make keys longer: charged as they are (new buckets wait for room).
            s.used.bytes = (s.used.bytes + grew).saturating_sub(shrank);
            let client = s.client;
            for (id, act) in acts {
                s.queue(id, act, now);
            }
            st.budget.add(client, Use::bytes(grew));
            st.budget.sub(client, Use::bytes(shrank));
            for id in gone {
                st.remove_bucket(sid, &id);
                st.abandon(sid, id, now);
                self.stats.abandons.fetch_add(1, Ordering::Relaxed);
            }
        }
        wanted
    }

    /// One round: every rule bucket's streams asked of its owner, the answers pushed.
    async fn round(&self, peers: &Peers, view: &View) {
        let now = self.local.now();
        let wanted = self.sweep(now);
        // Asks grouped by owner; this node's own answered here.
        let mut by_owner: HashMap<Option<Arc<str>>, Vec<(RuleBucket, QuotaAsk)>> = HashMap::new();
        // Each rule bucket's rate, for streams no owner answers.
        let mut rates: HashMap<RuleBucket, f64> = HashMap::new();
        // Each rule bucket's identity, to look its blocks up.
        let mut bucket_ids: HashMap<RuleBucket, u64> = HashMap::new();
        let gone: Vec<RuleBucket> = {
            let mut asked = self.asked.lock();
            let gone = asked
                .iter()
                .filter(|b| !wanted.contains_key(*b))
                .cloned()
                .collect();
            *asked = wanted.keys().cloned().collect();
            gone
        };
        let nothing = Vec::new();
        let all = wanted.iter().chain(gone.iter().map(|b| (b, &nothing)));
        for ((rule, key), streams) in all {
            let (resolved, id) = match self.local.rules().prepare(key, RuleSpec::Named(rule), 1) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(%rule, %key, error = %e, "RLQS bucket's rule refused");
                    continue;
                }
            };
            let rate = rate_of(&resolved.rule);
            // A shadow rule's checks are not denied by blocks: neither are its buckets.
            if !resolved.shadow {
                bucket_ids.insert((rule.clone(), key.clone()), id);
            }
            self.stats
                .by_rule
                .lock()
                .entry(rule.clone())
                .or_default()
                .rate = rate;
            let ask = QuotaAsk {
                key: key.clone(),
                rule: RuleRef::Named(rule.clone()),
                held: streams.iter().any(|s| s.held),
                streams: streams
                    .iter()
                    .map(|s| QuotaStream {
                        id: s.stream,
                        demand_milli: to_milli(s.demand),
                    })
                    .collect(),
            };
            // `None`: this node owns the bucket (or knows no ring yet).
            let owner: Option<Arc<str>> = view
                .ring
                .owner(id)
                .filter(|o| *o != &*view.self_id)
                .map(Arc::from);
            by_owner
                .entry(owner)
                .or_default()
                .push(((rule.clone(), key.clone()), ask));
            rates.insert((rule.clone(), key.clone()), rate);
        }
        let members = view.ring.members().len().max(1) as f64;
        let mut answers: Vec<(RuleBucket, Option<QuotaAnswer>)> = Vec::new();
        for (owner, asks) in by_owner {
            let (names, asks): (Vec<_>, Vec<_>) = asks.into_iter().unzip();
            let got = match owner {
                None => Some(self.owner.answer(&view.self_id, &asks)),
                Some(owner) => match view.peer_addrs.get(owner.as_ref()) {
                    Some(addr) => match peers.quota(addr, asks, ASK_WITHIN).await {
                        Ok(Some(a)) => Some(a),
                        Ok(None) | Err(_) => None,
                    },
                    None => None,
                },
            };
            match got {
                Some(got) if got.len() == names.len() => {
                    answers.extend(names.into_iter().zip(got.into_iter().map(Some)));
                }
                _ => {
                    self.stats.owner_unreachable.fetch_add(1, Ordering::Relaxed);
                    answers.extend(names.into_iter().map(|n| (n, None)));
                }
            }
        }
        // Push what changed.
        let now = self.local.now();
        let blocks = &self.local.blocks().table;
        let mut guard = self.state.lock();
        let streams = &mut guard.streams;
        for (name, answer) in answers {
            let Some(members_streams) = wanted.get(&name) else {
                continue;
            };
            // A blocked key's buckets deny all until the block ends, whatever the owner said
            // (asked all the same, so that its shares are ready when the block ends).
            let hit = bucket_ids
                .get(&name)
                .and_then(|id| blocks.find(&name.1, *id, now / NANOS_PER_MS));
            if let Some(hit) = hit {
                self.push_blocked(streams, members_streams, hit.until_ms, now);
                continue;
            }
            let rates: Vec<Option<f64>> = match answer {
                Some(QuotaAnswer::Shares { milli }) => {
                    milli.into_iter().map(|m| Some(from_milli(m))).collect()
                }
                Some(QuotaAnswer::Error { code, message }) => {
                    tracing::debug!(rule = %name.0, %code, %message, "RLQS ask refused");
                    continue;
                }
                // Warming, or no owner answered: keep what is assigned; a stream with nothing
                // yet gets its part of this node's fallback share (the rate over the members).
                Some(QuotaAnswer::Warming) | None => {
                    let share = rates.get(&name).copied().unwrap_or(0.0) / members;
                    let demands: Vec<f64> = members_streams.iter().map(|s| s.demand).collect();
                    quota::shares(share, &demands)
                        .into_iter()
                        .zip(members_streams)
                        .map(|(r, s)| (!s.held).then_some(r))
                        .collect()
                }
            };
            for (want, rate) in members_streams.iter().zip(rates) {
                let Some(rate) = rate else { continue };
                let sid = &want.stream;
                let Some(s) = streams.get_mut(sid).filter(|s| s.end.is_none()) else {
                    continue;
                };
                let Some(b) = s.buckets.get_mut(&want.id) else {
                    continue;
                };
                let (ttl_ns, burst_ns) = b
                    .matched
                    .as_ref()
                    .map_or((config::DEFAULT_TTL_NS, config::DEFAULT_BURST_NS), |m| {
                        (m.ttl_ns, m.burst_ns)
                    });
                let rate = quota::on_grid(rate);
                let burst_ns = if want.demand > rate {
                    burst_ns.min(SATURATED_BURST_NS)
                } else {
                    burst_ns
                };
                let strategy = match quota::token_bucket(rate, burst_ns) {
                    Some((max, per_fill, fill_s)) => Strategy::TokenBucket(max, per_fill, fill_s),
                    None => Strategy::Blanket(Blanket::DenyAll),
                };
                let action = match &b.sent {
                    None => Some((strategy, rate)),
                    Some(sent) => {
                        // Any fall (the sum must stay within the rate), a rise of two steps.
                        let fell = rate < sent.rate;
                        let rose = rate >= sent.rate * RISE * (1.0 - 1e-9);
                        let was_blanket = matches!(sent.strategy, Strategy::Blanket(_));
                        // A block's deny is replaced when the block ends, whatever comes.
                        let was_blocked = sent.block.is_some();
                        if was_blocked
                            || ((fell || rose || was_blanket) && sent.strategy != strategy)
                        {
                            Some((strategy, rate))
                        } else if now.saturating_sub(sent.at_ns) > ttl_ns / 2 {
                            // Refreshed unchanged: the Envoy keeps its tokens.
                            Some((sent.strategy, sent.rate))
                        } else {
                            None
                        }
                    }
                };
                if let Some((strategy, rate)) = action {
                    let act = self.assign(b, strategy, rate, now);
                    s.queue(want.id.clone(), act, now);
                }
            }
        }
    }

    /// Pushes a deny-all to each of `wants` (a blocked rule bucket's streams) until the
    /// block's end `until_ms`: at once when the block is new to the bucket (or changed), then
    /// refreshed as other assignments are.
    fn push_blocked(
        &self,
        streams: &mut HashMap<u64, Stream>,
        wants: &[Want],
        until_ms: u64,
        now: u64,
    ) {
        for want in wants {
            let Some(s) = streams.get_mut(&want.stream).filter(|s| s.end.is_none()) else {
                continue;
            };
            let Some(b) = s.buckets.get_mut(&want.id) else {
                continue;
            };
            let ttl_ns = b
                .matched
                .as_ref()
                .map_or(config::DEFAULT_TTL_NS, |m| m.ttl_ns);
            let due = match &b.sent {
                Some(sent) if sent.block == Some(until_ms) => {
                    now.saturating_sub(sent.at_ns) > ttl_ns / 2
                }
                _ => true,
            };
            if due {
                let act = self.deny_blocked(b, until_ms, now);
                s.queue(want.id.clone(), act, now);
            }
        }
    }

    /// Before the node stops: every assignment ended (TTL 0) on every stream, and the streams
    /// closed once their Envoys read that, so that Envoys fall back and connect to another node.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let now = self.local.now();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let ids: Vec<u64> = st.streams.keys().copied().collect();
        for sid in ids {
            let Some(s) = st.streams.get_mut(&sid).filter(|s| s.end.is_none()) else {
                continue;
            };
            s.pending.clear();
            let ended: Vec<(Id, Act)> = s
                .buckets
                .iter()
                .filter_map(|(id, b)| Some((id.clone(), Act::Assign(b.sent.as_ref()?.strategy, 0))))
                .collect();
            self.stats
                .expired_on_stop
                .fetch_add(ended.len() as u64, Ordering::Relaxed);
            for (id, act) in ended {
                s.queue(id, act, now);
            }
            st.end(sid, Ok(()), true);
        }
    }
}

impl RuleCounts {
    /// Adds a report's counts (bounded by [`MAX_REPORTED_REQUESTS`]; saturating all the same).
    fn add(&mut self, allowed: u64, denied: u64) {
        self.allowed = self.allowed.saturating_add(allowed);
        self.denied = self.denied.saturating_add(denied);
    }
}

/// A report's faults, found before any of it is taken.
fn check(r: &RateLimitQuotaUsageReports) -> Result<(), ReportError> {
    for usage in &r.bucket_quota_usages {
        if usage.bucket_id.as_ref().is_none_or(|b| b.bucket.is_empty()) {
            return Err(ReportError::NoBucketId);
        }
        for (what, count) in [
            ("allowed", usage.num_requests_allowed),
            ("denied", usage.num_requests_denied),
        ] {
            if count > MAX_REPORTED_REQUESTS {
                return Err(ReportError::TooManyRequests { what, count });
            }
        }
    }
    Ok(())
}

/// The answer `act` for `id`.
fn action(id: &IdKey, act: Act) -> BucketAction {
    let bucket_id = BucketId {
        bucket: id.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    };
    match act {
        Act::Abandon => abandon(bucket_id),
        Act::Assign(strategy, ttl_ns) => assignment(bucket_id, strategy, ttl_ns),
    }
}

fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(
            bucket_action::AbandonAction {},
        )),
    }
}

fn duration(ns: u64) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

fn assignment(id: BucketId, strategy: Strategy, ttl_ns: u64) -> BucketAction {
    let strategy = match strategy {
        Strategy::Blanket(b) => rate_limit_strategy::Strategy::BlanketRule(match b {
            Blanket::AllowAll => rate_limit_strategy::BlanketRule::AllowAll as i32,
            Blanket::DenyAll => rate_limit_strategy::BlanketRule::DenyAll as i32,
        }),
        Strategy::TokenBucket(max, per_fill, fill_s) => {
            rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
                max_tokens: max,
                tokens_per_fill: Some(envoy_types::pb::google::protobuf::UInt32Value {
                    value: per_fill,
                }),
                fill_interval: Some(duration(fill_s.saturating_mul(1_000_000_000))),
            })
        }
    };
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            bucket_action::QuotaAssignmentAction {
                assignment_time_to_live: Some(duration(ttl_ns)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}

#[cfg(test)]
mod tests;
