//! Prometheus metrics, one registry per node (so in-process test clusters do not mix counts).
//!
//! What every check updates is sharded per thread ([`sharded`]).

pub mod sharded;

use sharded::{ShardedCounter as Counter, ShardedHistogram as Histogram};

use crate::http::AppState;
use crate::rules::Mode;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;

/// Latency buckets, in seconds: a check is decided in tens of microseconds, a forwarded one in
/// a few hundred, and nothing waits longer than the forward deadline (25 ms by default) times 4.
const LATENCY_BUCKETS: [f64; 12] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// What the router observes per forwarded group: handles into the node's registry, so that
/// observing is a lock of the histogram alone (no registry or label lookup per check).
#[derive(Debug, Clone)]
pub struct PeerRpcMetrics {
    /// From handing a group to the owner's connection to its answers (answered groups only:
    /// failures are counted as fail-open or fail-closed).
    pub duration: Histogram,
    /// Checks per forwarded group.
    pub checks: Histogram,
}

impl PeerRpcMetrics {
    /// Handles registered nowhere (for a router built outside a node).
    pub fn unregistered() -> Self {
        Self {
            duration: latency_histogram(),
            checks: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    result: &'static str,
    mode: &'static str,
}

/// The node's metrics. Hot-path counters are resolved once, at start.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub allowed: Counter,
    pub denied: Counter,
    /// Checks of global rules (`mode="global"`), decided from gossiped counters.
    pub global_allowed: Counter,
    pub global_denied: Counter,
    /// Handling time of `POST /v1/check` and of a whole `POST /v1/check/batch` (answered ones).
    pub check_duration: Histogram,
    pub batch_duration: Histogram,
    peer_rpc: PeerRpcMetrics,
    buckets: Gauge,
    evictions: Counter,
    evictions_limiting: Counter,
    forwarded: Counter,
    fail_open: Counter,
    fail_closed: Counter,
    peer_frames: Counter,
    peer_checks: Counter,
    members: Family<StateLabel, Gauge>,
    global_counters: Gauge,
    global_published: Gauge,
    global_unpublished: Counter,
    global_evicted: Counter,
    global_dropped_events: Counter,
    reloads_ok: Counter,
    reloads_error: Counter,
    rules_generation: Gauge,
    rules_loaded_at: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ringlimit");
        let checks = Family::<CheckLabels, Counter>::default();
        registry.register("checks", "Checks decided by this node", checks.clone());
        let child = |result, mode| -> Counter {
            checks.get_or_create(&CheckLabels { result, mode }).clone()
        };
        let (allowed, denied) = (child("allowed", "owner"), child("denied", "owner"));
        let (global_allowed, global_denied) =
            (child("allowed", "global"), child("denied", "global"));
        let durations = Family::<EndpointLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "check_duration_seconds",
            "Time to handle a check request at the HTTP edge (a batch counts once), answered ones",
            durations.clone(),
        );
        let check_duration = durations
            .get_or_create(&EndpointLabel { endpoint: "check" })
            .clone();
        let batch_duration = durations
            .get_or_create(&EndpointLabel { endpoint: "batch" })
            .clone();
        let peer_rpc = PeerRpcMetrics::unregistered();
        registry.register(
            "peer_rpc_duration_seconds",
            "Time from sending a group of checks to their owner to its answers (answered groups)",
            peer_rpc.duration.clone(),
        );
        registry.register(
            "peer_batch_checks",
            "Checks per group forwarded to an owner (groups are coalesced further into frames)",
            peer_rpc.checks.clone(),
        );
        let buckets = Gauge::default();
        registry.register(
            "buckets",
            "Buckets held in this node's store",
            buckets.clone(),
        );
        let evictions = Counter::default();
        registry.register(
            "evictions",
            "Buckets evicted to stay within --max-keys",
            evictions.clone(),
        );
        let evictions_limiting = Counter::default();
        registry.register(
            "evictions_limiting",
            "Evicted buckets that were still limiting (each may admit more than the rule)",
            evictions_limiting.clone(),
        );
        let forwarded = Counter::default();
        registry.register(
            "forwarded",
            "Checks forwarded to their owner",
            forwarded.clone(),
        );
        let fail_open = Counter::default();
        registry.register(
            "fail_open",
            "Checks answered from the local fallback share because the owner could not answer",
            fail_open.clone(),
        );
        let fail_closed = Counter::default();
        registry.register(
            "fail_closed",
            "Checks denied because the owner could not answer and the rule is on_owner_unreachable: closed",
            fail_closed.clone(),
        );
        let peer_frames = Counter::default();
        registry.register(
            "peer_frames",
            "Check frames sent to peers",
            peer_frames.clone(),
        );
        let peer_checks = Counter::default();
        registry.register(
            "peer_checks",
            "Checks sent to peers (checks per frame is the batching factor)",
            peer_checks.clone(),
        );
        let members = Family::<StateLabel, Gauge>::default();
        registry.register("members", "Cluster members by state", members.clone());
        let global_counters = Gauge::default();
        registry.register(
            "global_counters",
            "Global-rule window counters held by this node (own and merged)",
            global_counters.clone(),
        );
        let global_published = Gauge::default();
        registry.register(
            "global_published",
            "Global-rule keys this node publishes through gossip",
            global_published.clone(),
        );
        let global_unpublished = Counter::default();
        registry.register(
            "global_unpublished",
            "Publish rounds in which a global bucket with new hits was not published: per-node cap reached",
            global_unpublished.clone(),
        );
        let global_evicted = Counter::default();
        registry.register(
            "global_evicted",
            "Global-rule window counters evicted to stay within the cap while they still mattered",
            global_evicted.clone(),
        );
        let global_dropped_events = Counter::default();
        registry.register(
            "global_dropped_events",
            "Gossiped global counts dropped on a full merge queue (a full rescan follows)",
            global_dropped_events.clone(),
        );
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "rules_reload",
            "Rules file reloads: ok (new rules in force) or error (refused; the previous rules stay)",
            reloads.clone(),
        );
        let reloads_ok = reloads.get_or_create(&ResultLabel { result: "ok" }).clone();
        let reloads_error = reloads
            .get_or_create(&ResultLabel { result: "error" })
            .clone();
        let rules_generation = Gauge::default();
        registry.register(
            "rules_generation",
            "Rule sets put in force since start (1: the rules loaded at start)",
            rules_generation.clone(),
        );
        let rules_loaded_at = Gauge::default();
        registry.register(
            "rules_last_reload_timestamp_seconds",
            "Unix time at which the rules in force were loaded",
            rules_loaded_at.clone(),
        );
        Self {
            check_duration,
            batch_duration,
            peer_rpc,
            fail_closed,
            reloads_ok,
            reloads_error,
            rules_generation,
            rules_loaded_at,
            global_allowed,
            global_denied,
            global_counters,
            global_published,
            global_unpublished,
            global_evicted,
            global_dropped_events,
            forwarded,
            fail_open,
            peer_frames,
            peer_checks,
            members,
            registry,
            allowed,
            denied,
            buckets,
            evictions,
            evictions_limiting,
        }
    }

    /// Counts one decided check of a rule in `mode`.
    pub fn count(&self, allowed: bool, mode: Mode) {
        let c = match (mode, allowed) {
            (Mode::Owner, true) => &self.allowed,
            (Mode::Owner, false) => &self.denied,
            (Mode::Global, true) => &self.global_allowed,
            (Mode::Global, false) => &self.global_denied,
        };
        c.inc();
    }

    /// The router's handles (see [`PeerRpcMetrics`]).
    pub fn peer_rpc(&self) -> PeerRpcMetrics {
        self.peer_rpc.clone()
    }
}

/// Nanoseconds (two readings of the engine's clock) as the seconds a histogram takes.
pub fn seconds(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 * 1e-9
}

/// `GET /metrics`.
pub async fn render(State(state): State<AppState>) -> Response {
    let m = &state.metrics;
    let router = &state.router;
    let store = router.engine().store();
    m.buckets
        .set(i64::try_from(store.len()).unwrap_or(i64::MAX));
    // Store counters are the source of truth; mirror them into the registry at scrape time.
    let stats = store.stats();
    let global = router.global();
    for (counter, source) in [
        (&m.evictions, &stats.evictions),
        (&m.evictions_limiting, &stats.evictions_limiting),
        (&m.forwarded, &router.stats.forwarded),
        (&m.fail_open, &router.stats.fail_open),
        (&m.fail_closed, &router.stats.fail_closed),
        (&m.reloads_ok, &state.rules.reloads_ok),
        (&m.reloads_error, &state.rules.reloads_failed),
        (&m.peer_frames, &router.peer_stats.frames),
        (&m.peer_checks, &router.peer_stats.checks),
        (&m.global_unpublished, &global.stats.unpublished),
        (&m.global_evicted, &global.stats.evicted),
        (&m.global_dropped_events, &global.stats.dropped_events),
    ] {
        let (now, shown) = (source.load(Ordering::Relaxed), counter.get());
        if now > shown {
            counter.inc_by(now - shown);
        }
    }
    m.global_counters
        .set(i64::try_from(global.len()).unwrap_or(i64::MAX));
    m.global_published
        .set(i64::try_from(global.stats.published.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    m.rules_generation
        .set(i64::try_from(state.rules.generation.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    m.rules_loaded_at.set(
        i64::try_from(state.rules.loaded_at_ms.load(Ordering::Relaxed) / 1000).unwrap_or(i64::MAX),
    );
    let view = router.view();
    for (label, st) in [
        ("alive", crate::cluster::MemberState::Alive),
        ("leaving", crate::cluster::MemberState::Leaving),
        ("dead", crate::cluster::MemberState::Dead),
    ] {
        let n = view.members.iter().filter(|m| m.state == st).count();
        m.members
            .get_or_create(&StateLabel { state: label })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &m.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        out,
    )
        .into_response()
}
