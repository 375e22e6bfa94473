//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoys report how
//! many requests each of their buckets saw and enforce the assignments this node pushes.
//!
//! # Layout
//! - [`config`] — `--rlqs-config`: which bucket ids map to which rule, or to a blanket rule.
//! - [`service`] — the gRPC stream: reports in, assignments out (a thin edge over [`Rlqs`]).
//! - [`owner`] — the bucket owner's side: each member's streams' shares of a rule's rate.
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

pub mod config;
pub mod metrics;
pub mod owner;
pub mod reload;
pub mod service;

use crate::cluster::View;
use crate::engine::Engine;
use crate::peers::Peers;
use crate::rules::RuleSpec;
use arc_swap::ArcSwap;
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
use ringlimit_core::quota;
use ringlimit_proto::RuleRef;
use ringlimit_proto::peer::{QuotaAnswer, QuotaAsk, QuotaStream};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

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
/// Most buckets one stream may report; beyond them new buckets are abandoned.
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Most buckets on all the streams of this node; beyond them new buckets are abandoned (the
/// node's memory stays bounded whatever Envoys report).
pub const MAX_BUCKETS: usize = 100_000;
/// Assignments and abandons queued for one stream; an Envoy that reads none is dropped.
const QUEUE: usize = 256;

/// A bucket id's pairs, ordered: how a stream tells its buckets apart.
type IdKey = BTreeMap<String, String>;

/// A rule's bucket: (rule, key).
type RuleBucket = (String, String);

/// One stream's bucket of a rule, as a round asks for it.
struct Want {
    stream: u64,
    id: IdKey,
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
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Strategy {
    Blanket(Blanket),
    /// `(max_tokens, tokens_per_fill, fill_interval_s)`.
    TokenBucket(u32, u32, u64),
}

#[derive(Debug)]
struct Bucket {
    id: BucketId,
    matched: Option<Matched>,
    /// Requests a second, as estimated from the reports after the first.
    demand: f64,
    /// Reports after the first.
    reports: u32,
    last_request_ns: u64,
    sent: Option<Sent>,
}

struct Stream {
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    domain: Option<String>,
    buckets: HashMap<IdKey, Bucket>,
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
    engine: Arc<Engine>,
    streams: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
    wake: Notify,
    stopping: AtomicBool,
    /// The rule buckets asked for in the last round: one no stream here reports any more is
    /// given up at its owner (an ask with no streams) instead of holding its share until the
    /// owner forgets this node.
    asked: Mutex<std::collections::HashSet<RuleBucket>>,
    /// Buckets on all streams (kept with every insert and removal, checked against
    /// [`MAX_BUCKETS`]).
    bucket_count: std::sync::atomic::AtomicUsize,
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
    #[error("the node is stopping: connect to another")]
    Stopping,
}

impl Rlqs {
    pub fn new(config: Arc<ArcSwap<RlqsConfig>>, engine: Arc<Engine>) -> Self {
        Self {
            config,
            owner: Arc::new(QuotaOwner::new(engine.clone())),
            stats: Arc::new(RlqsStats::default()),
            engine,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            asked: Mutex::new(std::collections::HashSet::new()),
            bucket_count: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Streams open here.
    pub fn streams(&self) -> usize {
        self.streams.lock().len()
    }

    /// Buckets reported on the streams open here.
    pub fn buckets(&self) -> usize {
        self.bucket_count.load(Ordering::Relaxed)
    }

    /// Removes a stream (its sender dropped: its answers end), its buckets uncounted.
    fn remove(&self, streams: &mut HashMap<u64, Stream>, stream: u64) -> Option<Stream> {
        let s = streams.remove(&stream)?;
        self.bucket_count
            .fetch_sub(s.buckets.len(), Ordering::Relaxed);
        Some(s)
    }

    /// A new stream, answered on `tx`; `None` while the node stops.
    pub fn open(
        &self,
        tx: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    ) -> Option<u64> {
        if self.stopping.load(Ordering::Relaxed) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(
            id,
            Stream {
                tx,
                domain: None,
                buckets: HashMap::new(),
            },
        );
        Some(id)
    }

    /// The stream ended (its Envoy went away).
    pub fn close(&self, stream: u64) {
        self.remove(&mut self.streams.lock(), stream);
    }

    /// Ends the stream with `status` (an invalid report).
    pub fn fail(&self, stream: u64, status: tonic::Status) {
        if let Some(s) = self.remove(&mut self.streams.lock(), stream) {
            let _ = s.tx.try_send(Err(status));
        }
    }

    /// Takes one report of `stream`: new buckets are matched, blanket and unmatched ones are
    /// answered at once, and the owners are asked for new rule buckets' shares.
    pub fn report(&self, stream: u64, r: RateLimitQuotaUsageReports) -> Result<(), ReportError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ReportError::Stopping);
        }
        let now = self.engine.clock().now();
        let config = self.config.load();
        let mut wake = false;
        let mut actions = Vec::new();
        let mut streams = self.streams.lock();
        let Some(s) = streams.get_mut(&stream) else {
            return Ok(());
        };
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
            let Some(id) = usage.bucket_id.filter(|b| !b.bucket.is_empty()) else {
                return Err(ReportError::NoBucketId);
            };
            let key: IdKey = id
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let elapsed_s = usage
                .time_elapsed
                .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
                .filter(|s| *s > 0.0)
                // A new bucket's first report comes at its first request, a moment after it
                // was made: not a rate to go by.
                .map(|s| s.max(MIN_ELAPSED_S))
                .unwrap_or(1.0);
            let demand = requests as f64 / elapsed_s;
            match s.buckets.get_mut(&key) {
                Some(b) => {
                    if requests > 0 {
                        b.last_request_ns = now;
                    }
                    let moved = (demand - b.demand).abs() > MOVED * b.demand.max(1.0);
                    // A move beyond what chance explains (three standard deviations of a
                    // Poisson count) is a change of demand: taken whole. Within it, noise:
                    // smoothed (taking each rise whole held quiet streams' shares above their
                    // use, lost to the others).
                    let expected = b.demand * elapsed_s;
                    let changed =
                        (requests as f64 - expected).abs() > 3.0 * expected.max(1.0).sqrt();
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
                        let c = by_rule.entry(rule.clone()).or_default();
                        c.allowed += usage.num_requests_allowed;
                        c.denied += usage.num_requests_denied;
                        wake |= moved;
                    }
                }
                None => {
                    let matched = config.matched(&domain, &id.bucket);
                    let full = s.buckets.len() >= MAX_BUCKETS_PER_STREAM
                        || self.bucket_count.load(Ordering::Relaxed) >= MAX_BUCKETS;
                    if full || matched.is_none() {
                        actions.push(abandon(id));
                        self.stats.abandons.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let mut b = Bucket {
                        id,
                        matched,
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
                            actions.push(self.assign(&mut b, strategy, 0.0, now));
                        }
                        Some(Target::Rule { rule, .. }) => {
                            let c = by_rule.entry(rule.clone()).or_default();
                            c.allowed += usage.num_requests_allowed;
                            c.denied += usage.num_requests_denied;
                            wake = true;
                        }
                        None => {}
                    }
                    s.buckets.insert(key, b);
                    self.bucket_count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        drop(by_rule);
        if !actions.is_empty() && !push(s, actions) {
            self.remove(&mut streams, stream);
            self.stats.dropped_streams.fetch_add(1, Ordering::Relaxed);
        }
        drop(streams);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// An assignment of `strategy` for `b`, remembered as sent, counted.
    fn assign(&self, b: &mut Bucket, strategy: Strategy, rate: f64, now: u64) -> BucketAction {
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
        });
        assignment(b.id.clone(), strategy, ttl_ns)
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

    /// One round: every rule bucket's streams asked of its owner, the answers pushed.
    async fn round(&self, peers: &Peers, view: &View) {
        let now = self.engine.clock().now();
        let config = self.config.load();
        // (rule, key) → its streams: (stream, id key, demand, held).
        let mut wanted: HashMap<RuleBucket, Vec<Want>> = HashMap::new();
        {
            let mut streams = self.streams.lock();
            let mut dropped = Vec::new();
            for (sid, s) in streams.iter_mut() {
                let mut actions = Vec::new();
                let domain = s.domain.clone().unwrap_or_default();
                let before = s.buckets.len();
                s.buckets.retain(|_, b| {
                    if now.saturating_sub(b.last_request_ns) > QUIET_NS {
                        actions.push(abandon(b.id.clone()));
                        self.stats.abandons.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                    // The configuration may have changed since the bucket was matched.
                    let matched = config.matched(&domain, &b.id.bucket);
                    if matched != b.matched {
                        b.matched = matched;
                        b.sent = None;
                    }
                    match b.matched.as_ref().map(|m| (&m.target, m.ttl_ns)) {
                        None => {
                            actions.push(abandon(b.id.clone()));
                            self.stats.abandons.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                        Some((Target::Blanket(blanket), ttl_ns)) => {
                            let due = b
                                .sent
                                .as_ref()
                                .is_none_or(|sent| now.saturating_sub(sent.at_ns) > ttl_ns / 2);
                            if due {
                                let strategy = Strategy::Blanket(*blanket);
                                actions.push(self.assign(b, strategy, 0.0, now));
                            }
                            true
                        }
                        Some((Target::Rule { .. }, _)) => true,
                    }
                });
                self.bucket_count
                    .fetch_sub(before - s.buckets.len(), Ordering::Relaxed);
                for (key, b) in &s.buckets {
                    if let Some(Matched {
                        target:
                            Target::Rule {
                                rule,
                                key: rule_key,
                            },
                        ..
                    }) = &b.matched
                    {
                        wanted
                            .entry((rule.clone(), rule_key.clone()))
                            .or_default()
                            .push(Want {
                                stream: *sid,
                                id: key.clone(),
                                demand: b.demand,
                                held: b.sent.is_some(),
                            });
                    }
                }
                if !actions.is_empty() && !push(s, actions) {
                    dropped.push(*sid);
                }
            }
            for sid in dropped {
                self.remove(&mut streams, sid);
                self.stats.dropped_streams.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Asks grouped by owner; this node's own answered here.
        let mut by_owner: HashMap<Option<Arc<str>>, Vec<(RuleBucket, QuotaAsk)>> = HashMap::new();
        // Each rule bucket's rate, for streams no owner answers.
        let mut rates: HashMap<RuleBucket, f64> = HashMap::new();
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
            let (resolved, id) = match self.engine.prepare(key, RuleSpec::Named(rule), 1) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(%rule, %key, error = %e, "RLQS bucket's rule refused");
                    continue;
                }
            };
            let rate = rate_of(&resolved.rule);
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
        let now = self.engine.clock().now();
        let mut streams = self.streams.lock();
        let mut per_stream: HashMap<u64, Vec<BucketAction>> = HashMap::new();
        for (name, answer) in answers {
            let Some(members_streams) = wanted.get(&name) else {
                continue;
            };
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
                let Some(b) = streams
                    .get_mut(sid)
                    .and_then(|s| s.buckets.get_mut(&want.id))
                else {
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
                        if (fell || rose || was_blanket) && sent.strategy != strategy {
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
                    let a = self.assign(b, strategy, rate, now);
                    per_stream.entry(*sid).or_default().push(a);
                }
            }
        }
        for (sid, actions) in per_stream {
            let ok = streams.get_mut(&sid).is_none_or(|s| push(s, actions));
            if !ok {
                self.remove(&mut streams, sid);
                self.stats.dropped_streams.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Before the node stops: every assignment ended (TTL 0) on every stream, and the streams
    /// closed, so that Envoys fall back and connect to another node.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let mut streams = self.streams.lock();
        self.bucket_count.store(0, Ordering::Relaxed);
        for (_, s) in streams.drain() {
            let actions: Vec<BucketAction> = s
                .buckets
                .values()
                .filter_map(|b| {
                    let sent = b.sent.as_ref()?;
                    Some(assignment(b.id.clone(), sent.strategy, 0))
                })
                .collect();
            self.stats
                .expired_on_stop
                .fetch_add(actions.len() as u64, Ordering::Relaxed);
            if !actions.is_empty() {
                let _ = s.tx.try_send(Ok(RateLimitQuotaResponse {
                    bucket_action: actions,
                }));
            }
            // Dropping the sender ends the response stream (status OK).
        }
    }
}

/// Queues `actions` for the stream; `false` when its Envoy reads nothing (queue full) or is
/// gone.
fn push(s: &Stream, actions: Vec<BucketAction>) -> bool {
    s.tx.try_send(Ok(RateLimitQuotaResponse {
        bucket_action: actions,
    }))
    .is_ok()
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
