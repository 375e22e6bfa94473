//! Prometheus metrics, one registry per node (so in-process test clusters do not mix counts).
//!
//! Two kinds, each kept once:
//! - what every check updates (checks, durations, forwarded groups) is recorded here, sharded
//!   per thread ([`sharded`]);
//! - everything else is counted where it happens (store, routing, gossip, reloads) and read at
//!   scrape time from a [`Snapshot`] through the table [`SNAPSHOT_METRICS`].

pub mod sharded;

#[cfg(test)]
mod names;

use sharded::{ShardedCounter as Counter, ShardedHistogram as Histogram};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;
use ringlimit_core::rule::Mode;
use std::sync::Arc;

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

/// A server's connections (`listen::conns`; one set for the HTTP port, one for gRPC), counted
/// where they happen and read at scrape time: here so that the service reads them without
/// knowing the edges.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Open now.
    pub open: std::sync::atomic::AtomicU64,
    /// Closed by the server: idle for the idle timeout; a request head not complete within
    /// the header timeout; closed to make room at the cap.
    pub closed_idle: std::sync::atomic::AtomicU64,
    pub closed_header_timeout: std::sync::atomic::AtomicU64,
    pub evicted: std::sync::atomic::AtomicU64,
    /// Refused at the cap with every connection busy.
    pub refused: std::sync::atomic::AtomicU64,
    /// Requests cut off at the request timeout (gRPC).
    pub timed_out: std::sync::atomic::AtomicU64,
}

/// Gossip traffic on the public peer port (`cluster::transport`), counted where it happens and
/// read at scrape time: what each node's share of the cluster's gossip costs grows with the
/// cluster and with global rules' counters.
#[derive(Debug, Default)]
pub struct GossipStats {
    pub sent_bytes: std::sync::atomic::AtomicU64,
    pub sent_datagrams: std::sync::atomic::AtomicU64,
    pub received_bytes: std::sync::atomic::AtomicU64,
    pub received_datagrams: std::sync::atomic::AtomicU64,
    /// Datagrams dropped for a missing or wrong tag.
    pub rejected: std::sync::atomic::AtomicU64,
    /// Datagrams dropped because chitchat had fallen too far behind (queue full).
    pub dropped: std::sync::atomic::AtomicU64,
}

/// What the node has counted elsewhere, read at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub buckets: u64,
    pub evictions: u64,
    pub evictions_limiting: u64,
    pub forwarded: u64,
    pub fail_open: u64,
    pub fail_closed: u64,
    pub minority: u64,
    pub quorate: u64,
    pub http_open: u64,
    pub http_closed_idle: u64,
    pub http_closed_header_timeout: u64,
    pub http_evicted: u64,
    pub http_refused: u64,
    pub grpc_open: u64,
    pub grpc_closed_idle: u64,
    pub grpc_evicted: u64,
    pub grpc_refused: u64,
    pub grpc_timed_out: u64,
    pub gossip_sent_bytes: u64,
    pub gossip_sent_datagrams: u64,
    pub gossip_received_bytes: u64,
    pub gossip_received_datagrams: u64,
    pub gossip_rejected: u64,
    pub gossip_dropped: u64,
    pub api_rule_puts: u64,
    pub api_rule_deletes: u64,
    pub api_rule_merged: u64,
    pub api_rule_save_failed: u64,
    pub peer_frames: u64,
    pub peer_checks: u64,
    pub members_alive: u64,
    pub members_leaving: u64,
    pub members_dead: u64,
    pub global_counters: u64,
    pub global_published: u64,
    pub global_backlog: u64,
    pub global_unpublished: u64,
    pub global_evicted: u64,
    pub global_dropped_events: u64,
    pub global_sent_frames: u64,
    pub global_sent_bytes: u64,
    pub global_received_bytes: u64,
    pub global_resyncs: u64,
    pub global_unrelayed: u64,
    pub global_push_failed: u64,
    pub global_malformed: u64,
    pub reloads_ok: u64,
    pub reloads_error: u64,
    pub rules_generation: u64,
    pub rules_loaded_at_s: u64,
    pub envoy_reloads_ok: u64,
    pub envoy_reloads_error: u64,
    pub envoy_generation: u64,
}

/// One series read from a [`Snapshot`]. Consecutive rows of one name are one family, told
/// apart by their label.
pub struct SnapshotMetric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// `(label, value)` of this series, for a family.
    pub label: Option<(&'static str, &'static str)>,
    pub value: fn(&Snapshot) -> u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

macro_rules! series {
    ($name:literal, $kind:ident, $field:ident, $help:literal) => {
        SnapshotMetric {
            name: $name,
            help: concat!($help, "."),
            kind: Kind::$kind,
            label: None,
            value: |s| s.$field,
        }
    };
    ($name:literal, $kind:ident, $field:ident, $help:literal, $label:literal = $value:literal) => {
        SnapshotMetric {
            name: $name,
            help: concat!($help, "."),
            kind: Kind::$kind,
            label: Some(($label, $value)),
            value: |s| s.$field,
        }
    };
}

/// The metrics read from a [`Snapshot`] (names get the `ringlimit_` prefix, counters `_total`).
pub const SNAPSHOT_METRICS: &[SnapshotMetric] = &[
    series!(
        "buckets",
        Gauge,
        buckets,
        "Buckets held in this node's store"
    ),
    series!(
        "evictions",
        Counter,
        evictions,
        "Buckets evicted to stay within --max-keys"
    ),
    series!(
        "evictions_limiting",
        Counter,
        evictions_limiting,
        "Evicted buckets that were still limiting (each may admit more than the rule)"
    ),
    series!(
        "forwarded",
        Counter,
        forwarded,
        "Checks forwarded to their owner"
    ),
    series!(
        "fail_open",
        Counter,
        fail_open,
        "Checks answered from the local fallback share because the owner could not answer"
    ),
    series!(
        "fail_closed",
        Counter,
        fail_closed,
        "Checks denied because the owner could not answer and the rule is on_owner_unreachable: closed"
    ),
    series!(
        "minority_checks",
        Counter,
        minority,
        "Owner-mode checks answered without an owner because this node saw fewer than a majority of the cluster"
    ),
    series!(
        "quorate",
        Gauge,
        quorate,
        "1 while this node sees a majority of the members it last knew (and owns keys), else 0"
    ),
    series!(
        "rules_api_changes",
        Counter,
        api_rule_puts,
        "Rules changed through this node's admin API, and changes learnt from peers",
        "op" = "put"
    ),
    series!(
        "rules_api_changes",
        Counter,
        api_rule_deletes,
        "Rules changed through this node's admin API, and changes learnt from peers",
        "op" = "delete"
    ),
    series!(
        "rules_api_changes",
        Counter,
        api_rule_merged,
        "Rules changed through this node's admin API, and changes learnt from peers",
        "op" = "merged"
    ),
    series!(
        "rules_api_save_failed",
        Counter,
        api_rule_save_failed,
        "API rule changes in force but not saved under --data-dir"
    ),
    series!(
        "http_connections",
        Gauge,
        http_open,
        "Open HTTP connections"
    ),
    series!(
        "http_connections_closed",
        Counter,
        http_closed_idle,
        "HTTP connections the server closed",
        "reason" = "idle"
    ),
    series!(
        "http_connections_closed",
        Counter,
        http_closed_header_timeout,
        "HTTP connections the server closed",
        "reason" = "header_timeout"
    ),
    series!(
        "http_connections_closed",
        Counter,
        http_evicted,
        "HTTP connections the server closed",
        "reason" = "evicted"
    ),
    series!(
        "http_connections_refused",
        Counter,
        http_refused,
        "HTTP connections refused at --http-max-connections with every connection busy"
    ),
    series!(
        "grpc_connections",
        Gauge,
        grpc_open,
        "Open gRPC connections"
    ),
    series!(
        "grpc_connections_closed",
        Counter,
        grpc_closed_idle,
        "gRPC connections the server closed (GOAWAY)",
        "reason" = "idle"
    ),
    series!(
        "grpc_connections_closed",
        Counter,
        grpc_evicted,
        "gRPC connections the server closed (GOAWAY)",
        "reason" = "evicted"
    ),
    series!(
        "grpc_connections_refused",
        Counter,
        grpc_refused,
        "gRPC connections refused at --grpc-max-connections with every connection busy"
    ),
    series!(
        "grpc_requests_timed_out",
        Counter,
        grpc_timed_out,
        "gRPC calls answered DEADLINE_EXCEEDED at --grpc-request-timeout-ms"
    ),
    series!(
        "peer_frames",
        Counter,
        peer_frames,
        "Check frames sent to peers"
    ),
    series!(
        "peer_checks",
        Counter,
        peer_checks,
        "Checks sent to peers (checks per frame is the batching factor)"
    ),
    series!(
        "members",
        Gauge,
        members_alive,
        "Cluster members by state",
        "state" = "alive"
    ),
    series!(
        "members",
        Gauge,
        members_leaving,
        "Cluster members by state",
        "state" = "leaving"
    ),
    series!(
        "members",
        Gauge,
        members_dead,
        "Cluster members by state",
        "state" = "dead"
    ),
    series!(
        "gossip_bytes",
        Counter,
        gossip_sent_bytes,
        "Gossip bytes on the peer UDP port (with the MAC tag)",
        "direction" = "sent"
    ),
    series!(
        "gossip_bytes",
        Counter,
        gossip_received_bytes,
        "Gossip bytes on the peer UDP port (with the MAC tag)",
        "direction" = "received"
    ),
    series!(
        "gossip_datagrams",
        Counter,
        gossip_sent_datagrams,
        "Gossip datagrams on the peer UDP port",
        "direction" = "sent"
    ),
    series!(
        "gossip_datagrams",
        Counter,
        gossip_received_datagrams,
        "Gossip datagrams on the peer UDP port",
        "direction" = "received"
    ),
    series!(
        "gossip_rejected",
        Counter,
        gossip_rejected,
        "Gossip datagrams dropped for a missing or wrong cluster-secret tag"
    ),
    series!(
        "gossip_dropped",
        Counter,
        gossip_dropped,
        "Gossip datagrams dropped because chitchat fell behind (receive queue full)"
    ),
    series!(
        "global_counters",
        Gauge,
        global_counters,
        "Global-rule window counters held by this node (own and merged)"
    ),
    series!(
        "global_published",
        Gauge,
        global_published,
        "Global-rule buckets this node publishes to its peers"
    ),
    series!(
        "global_backlog",
        Gauge,
        global_backlog,
        "Changed global-rule buckets waiting for this node's share of --global-gossip-budget"
    ),
    series!(
        "global_unpublished",
        Counter,
        global_unpublished,
        "Publish rounds in which a global bucket with new hits was not published: per-node cap reached"
    ),
    series!(
        "global_evicted",
        Counter,
        global_evicted,
        "Global-rule window counters evicted to stay within the cap while they still mattered"
    ),
    series!(
        "global_dropped_events",
        Counter,
        global_dropped_events,
        "Own global-rule updates not queued for a slow or unreachable peer (it is sent the full set later)"
    ),
    series!(
        "global_sent_frames",
        Counter,
        global_sent_frames,
        "GlobalCounts frames written to peers"
    ),
    series!(
        "global_sent_bytes",
        Counter,
        global_sent_bytes,
        "Bytes of GlobalCounts frames written to peers (length prefixes included)"
    ),
    series!(
        "global_received_bytes",
        Counter,
        global_received_bytes,
        "Bytes of GlobalCounts frames received from peers (length prefixes included)"
    ),
    series!(
        "global_resyncs",
        Counter,
        global_resyncs,
        "Full sets of this node's global counts queued for a peer (new connection, or a possible loss)"
    ),
    series!(
        "global_unrelayed",
        Counter,
        global_unrelayed,
        "Buckets whose other nodes' global counts were left out of a full set (over --global-max-published)"
    ),
    series!(
        "global_push_failed",
        Counter,
        global_push_failed,
        "Connections pushing global counts to a peer that failed (retried with a full set)"
    ),
    series!(
        "global_malformed",
        Counter,
        global_malformed,
        "Global counts received from peers and refused (period or window out of range)"
    ),
    series!(
        "rules_reload",
        Counter,
        reloads_ok,
        "Rules file reloads: ok (new rules in force) or error (refused; the previous rules stay)",
        "result" = "ok"
    ),
    series!(
        "rules_reload",
        Counter,
        reloads_error,
        "Rules file reloads: ok (new rules in force) or error (refused; the previous rules stay)",
        "result" = "error"
    ),
    series!(
        "rules_generation",
        Gauge,
        rules_generation,
        "Rule sets put in force since start (1: the rules loaded at start)"
    ),
    series!(
        "rules_last_reload_timestamp_seconds",
        Gauge,
        rules_loaded_at_s,
        "Unix time at which the rules in force were loaded"
    ),
    series!(
        "envoy_config_reload",
        Counter,
        envoy_reloads_ok,
        "envoyproxy/ratelimit configuration reloads (--envoy-config): ok or error (refused; the previous stays)",
        "result" = "ok"
    ),
    series!(
        "envoy_config_reload",
        Counter,
        envoy_reloads_error,
        "envoyproxy/ratelimit configuration reloads (--envoy-config): ok or error (refused; the previous stays)",
        "result" = "error"
    ),
    series!(
        "envoy_config_generation",
        Gauge,
        envoy_generation,
        "envoyproxy/ratelimit configurations put in force since start (1: loaded at start; 0: none)"
    ),
];

/// Encodes [`SNAPSHOT_METRICS`] from the snapshot of the scrape under way.
#[derive(Debug, Default)]
struct SnapshotCollector {
    current: Mutex<Snapshot>,
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = *self.current.lock();
        for family in SNAPSHOT_METRICS.chunk_by(|a, b| a.name == b.name) {
            let first = &family[0];
            let kind = match first.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric = encoder.encode_descriptor(first.name, first.help, None, kind)?;
            match family {
                // A series without a label is its family's only one.
                [one] if one.label.is_none() => encode_value(one, &snap, metric)?,
                _ => {
                    for series in family {
                        let label = [series.label.unwrap_or(("", ""))];
                        encode_value(series, &snap, metric.encode_family(&label)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn encode_value(
    series: &SnapshotMetric,
    snap: &Snapshot,
    e: prometheus_client::encoding::MetricEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let v = (series.value)(snap);
    match series.kind {
        Kind::Counter => ConstCounter::new(v).encode(e),
        Kind::Gauge => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(e),
    }
}

/// The node's metrics. Hot-path handles are resolved once, at start.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Encodes are one at a time: the snapshot is set, then read by the collector.
    scrape: Mutex<()>,
    snapshot: Arc<SnapshotCollector>,
    pub allowed: Counter,
    pub denied: Counter,
    /// Checks of global rules (`mode="global"`), decided from gossiped counters.
    pub global_allowed: Counter,
    pub global_denied: Counter,
    /// Checks of shadow rules that would have denied (`result="shadow_denied"`; answered as
    /// allowed).
    pub shadow_denied: Counter,
    pub global_shadow_denied: Counter,
    /// Time to decide a check request, a whole batch and an all-or-nothing request (answered
    /// ones).
    pub check_duration: Histogram,
    pub batch_duration: Histogram,
    pub all_duration: Histogram,
    peer_rpc: PeerRpcMetrics,
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
        let durations = Family::<EndpointLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "check_duration_seconds",
            "Time to handle a check request (a batch counts once), answered ones",
            durations.clone(),
        );
        let duration = |endpoint| durations.get_or_create(&EndpointLabel { endpoint }).clone();
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
        let snapshot = Arc::new(SnapshotCollector::default());
        registry.register_collector(Box::new(snapshot.clone()));
        Self {
            allowed: child("allowed", "owner"),
            denied: child("denied", "owner"),
            global_allowed: child("allowed", "global"),
            global_denied: child("denied", "global"),
            shadow_denied: child("shadow_denied", "owner"),
            global_shadow_denied: child("shadow_denied", "global"),
            check_duration: duration("check"),
            batch_duration: duration("batch"),
            all_duration: duration("all"),
            peer_rpc,
            snapshot,
            scrape: Mutex::new(()),
            registry,
        }
    }

    /// Counts one decided check of a rule in `mode`.
    pub fn count(&self, allowed: bool, shadow_denied: bool, mode: Mode) {
        let c = match (mode, allowed, shadow_denied) {
            (Mode::Owner, _, true) => &self.shadow_denied,
            (Mode::Global, _, true) => &self.global_shadow_denied,
            (Mode::Owner, true, false) => &self.allowed,
            (Mode::Owner, false, false) => &self.denied,
            (Mode::Global, true, false) => &self.global_allowed,
            (Mode::Global, false, false) => &self.global_denied,
        };
        c.inc();
    }

    /// The router's handles (see [`PeerRpcMetrics`]).
    pub fn peer_rpc(&self) -> PeerRpcMetrics {
        self.peer_rpc.clone()
    }

    /// The OpenMetrics text of every metric, those of the snapshot read from `snapshot`.
    pub fn encode(&self, snapshot: Snapshot) -> Result<String, std::fmt::Error> {
        let _one_at_a_time = self.scrape.lock();
        *self.snapshot.current.lock() = snapshot;
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Nanoseconds (two readings of the engine's clock) as the seconds a histogram takes.
pub fn seconds(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 * 1e-9
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
