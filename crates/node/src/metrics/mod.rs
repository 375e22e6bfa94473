//! Prometheus metrics, one registry per node (so in-process test clusters do not mix counts).
//!
//! Two kinds, each kept once:
//! - what every check updates (checks, durations, forwarded groups) is recorded here, sharded
//!   per thread ([`sharded`]);
//! - everything else is counted where it happens (store, routing, peers, gossip, reloads) and
//!   read at scrape time: each subsystem declares its families once, as a table of
//!   [`Family`] (name, help, type, labels, how to read each value; see [`scrape`]), which
//!   `node::collectors` registers with what it reads ([`Metrics::scrape`]).
//!
//! What `/metrics` shows (names, types, help, labels) is the contract's: `names.txt` lists it,
//! and a test in `node` compares a working node's `/metrics` with it.

pub mod scrape;
pub mod sharded;

pub use scrape::{Family, Series};
use sharded::{ShardedCounter as Counter, ShardedHistogram as Histogram};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;
use ringlimit_core::rule::Mode;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EdgeLabel {
    edge: &'static str,
}

/// Where checks arrive at this node: its edges, each counted apart
/// (`ringlimit_edge_checks_total{edge}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// `/v1/check`, `/v1/check/batch`, `/v1/check/all`, `/v1/reserve`.
    Http,
    /// `/v1/forward-auth`: a gateway's copy of a request.
    ForwardAuth,
    /// `ringlimit.v1.RateLimiter` over gRPC.
    Grpc,
    /// Envoy's `ShouldRateLimit` over gRPC.
    Rls,
    /// The peer port: an SDK's checks (a member's are counted where they arrived).
    Peer,
}

impl Edge {
    const ALL: [Edge; 5] = [
        Edge::Http,
        Edge::ForwardAuth,
        Edge::Grpc,
        Edge::Rls,
        Edge::Peer,
    ];

    /// The `edge` label's value.
    pub fn label(self) -> &'static str {
        match self {
            Edge::Http => "http",
            Edge::ForwardAuth => "forward_auth",
            Edge::Grpc => "grpc",
            Edge::Rls => "rls",
            Edge::Peer => "peer",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BlockedLabels {
    rule: String,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleCheckLabels {
    rule: String,
    result: &'static str,
}

/// Most rule names counted apart in `ringlimit_rule_checks_total`; checks of further names
/// are counted as `rule="other"` (rules are the operator's, but API rules come and go, and a
/// deleted rule's series stays until the node restarts).
pub const MAX_COUNTED_RULES: usize = 256;

/// A rule's counters, by result: allowed, denied, shadow_denied.
type RuleCounters = Arc<[Counter; 3]>;

/// Checks by rule (`ringlimit_rule_checks_total{rule,result}`): named rules by name, inline
/// rules all as `inline` (their parameters are the client's: unbounded). A check finds its
/// rule's counters in a map swapped whole when a name is first counted (a read without a lock,
/// then one hash of the name); the counters are sharded like the others.
#[derive(Debug)]
struct RuleChecks {
    family: family::Family<RuleCheckLabels, Counter>,
    by_name: arc_swap::ArcSwap<HashMap<Box<str>, RuleCounters>>,
    inline: RuleCounters,
    other: std::sync::OnceLock<RuleCounters>,
    grow: parking_lot::Mutex<()>,
}

impl RuleChecks {
    fn new(family: family::Family<RuleCheckLabels, Counter>) -> Self {
        let inline = Self::counters(&family, "inline");
        Self {
            family,
            by_name: arc_swap::ArcSwap::from_pointee(HashMap::new()),
            inline,
            other: std::sync::OnceLock::new(),
            grow: parking_lot::Mutex::new(()),
        }
    }

    fn counters(family: &family::Family<RuleCheckLabels, Counter>, rule: &str) -> RuleCounters {
        let one = |result| {
            family
                .get_or_create(&RuleCheckLabels {
                    rule: rule.to_owned(),
                    result,
                })
                .clone()
        };
        Arc::new([one("allowed"), one("denied"), one("shadow_denied")])
    }

    fn inc(&self, rule: Option<&str>, result: usize) {
        let Some(name) = rule else {
            self.inline[result].inc();
            return;
        };
        if let Some(c) = self.by_name.load().get(name) {
            c[result].inc();
            return;
        }
        self.add(name)[result].inc();
    }

    /// The counters of a name not counted yet (or of `other`, past the cap).
    fn add(&self, name: &str) -> RuleCounters {
        let _one_at_a_time = self.grow.lock();
        let map = self.by_name.load_full();
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        if map.len() >= MAX_COUNTED_RULES {
            return self
                .other
                .get_or_init(|| Self::counters(&self.family, "other"))
                .clone();
        }
        let c = Self::counters(&self.family, name);
        let mut grown = (*map).clone();
        grown.insert(name.into(), c.clone());
        self.by_name.store(Arc::new(grown));
        c
    }
}

/// A server's connections (`listen::conns`; one set for the HTTP port, one for gRPC), counted
/// where they happen and read at scrape time ([`HTTP_CONNECTIONS`], [`GRPC_CONNECTIONS`]):
/// here, below the edges, so that neither the listener nor the metrics know the edges.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Open now.
    pub open: std::sync::atomic::AtomicU64,
    /// Closed by the server: idle for the idle timeout; a request head not complete within
    /// the header timeout; closed to make room at the cap.
    pub closed_idle: std::sync::atomic::AtomicU64,
    pub closed_header_timeout: std::sync::atomic::AtomicU64,
    pub evicted: std::sync::atomic::AtomicU64,
    /// Closed in their TLS handshake: failed, too slow (`ConnLimits::handshake_timeout`), or
    /// evicted meanwhile (`crate::listen::tls`; a metric of [`TLS`]).
    pub closed_tls: std::sync::atomic::AtomicU64,
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

/// A server's connections as metrics: `HTTP_CONNECTIONS` for the HTTP port's [`ConnStats`],
/// `GRPC_CONNECTIONS` for the gRPC port's.
pub const HTTP_CONNECTIONS: &[Family<ConnStats>] = &[
    Family::gauge("http_connections", "Open HTTP connections.", |s| {
        load(&s.open)
    }),
    Family::counter_by(
        "http_connections_closed",
        "HTTP connections the server closed.",
        "reason",
        &[
            ("idle", |s| load(&s.closed_idle)),
            ("header_timeout", |s| load(&s.closed_header_timeout)),
            ("evicted", |s| load(&s.evicted)),
        ],
    ),
    Family::counter(
        "http_connections_refused",
        "HTTP connections refused at --http-max-connections with every connection busy.",
        |s| load(&s.refused),
    ),
];

/// See [`HTTP_CONNECTIONS`].
pub const GRPC_CONNECTIONS: &[Family<ConnStats>] = &[
    Family::gauge("grpc_connections", "Open gRPC connections.", |s| {
        load(&s.open)
    }),
    Family::counter_by(
        "grpc_connections_closed",
        "gRPC connections the server closed (GOAWAY).",
        "reason",
        &[
            ("idle", |s| load(&s.closed_idle)),
            ("evicted", |s| load(&s.evicted)),
        ],
    ),
    Family::counter(
        "grpc_connections_refused",
        "gRPC connections refused at --grpc-max-connections with every connection busy.",
        |s| load(&s.refused),
    ),
    Family::counter(
        "grpc_requests_timed_out",
        "gRPC calls answered DEADLINE_EXCEEDED at --grpc-request-timeout-ms.",
        |s| load(&s.timed_out),
    ),
];

/// What TLS's metrics read: handshakes that failed on the HTTP and gRPC ports
/// (`ConnStats::closed_tls`), and every certificate the node watches (`--tls-cert`,
/// `--peer-tls-cert`).
pub struct TlsCounts {
    pub http: Arc<ConnStats>,
    pub grpc: Arc<ConnStats>,
    /// Each watched certificate, by the `cert` label of its expiry: `http` (`--tls-cert`, the
    /// HTTP and gRPC ports) or `peer` (`--peer-tls-cert`).
    pub certs: Vec<(&'static str, Arc<ringlimit_core::tls::ReloadingCert>)>,
}

impl TlsCounts {
    /// One of each certificate's counters, summed over the certificates.
    fn sum(&self, counter: fn(&ringlimit_core::tls::ReloadingCert) -> &AtomicU64) -> u64 {
        self.certs.iter().map(|(_, c)| load(counter(c))).sum()
    }
}

/// TLS: failed handshakes, and reloads and expiry of every certificate the node watches.
pub const TLS: &[Family<TlsCounts>] = &[
    Family::counter_by(
        "tls_handshake_failures",
        "Connections closed in their TLS handshake on the HTTP or gRPC port (failed, not done within the header timeout, or evicted at the cap meanwhile).",
        "server",
        &[
            ("http", |t| load(&t.http.closed_tls)),
            ("grpc", |t| load(&t.grpc.closed_tls)),
        ],
    ),
    Family::counter_by(
        "tls_reload",
        "TLS certificate reloads (--tls-cert, --peer-tls-cert): ok (new handshakes use it) or error (refused; the previous stays).",
        "result",
        &[
            ("ok", |t| t.sum(|c| &c.reloads_ok)),
            ("error", |t| t.sum(|c| &c.reloads_failed)),
        ],
    ),
    Family::gauge_each(
        "tls_cert_expiry_seconds",
        "Seconds until the TLS certificate chain in force expires, negative once it has (clients then refuse it): cert=http for --tls-cert (the HTTP and gRPC ports), cert=peer for --peer-tls-cert.",
        &["cert"],
        |t| {
            let now = i64::try_from(ringlimit_core::clock::unix_ms() / 1_000).unwrap_or(i64::MAX);
            t.certs
                .iter()
                .map(|(label, cert)| Series::new([*label], cert.expires_in(now)))
                .collect()
        },
    ),
];

/// [`GossipStats`] as metrics.
pub const GOSSIP: &[Family<GossipStats>] = &[
    Family::counter_by(
        "gossip_bytes",
        "Gossip bytes on the peer UDP port (with the MAC tag).",
        "direction",
        &[
            ("sent", |s| load(&s.sent_bytes)),
            ("received", |s| load(&s.received_bytes)),
        ],
    ),
    Family::counter_by(
        "gossip_datagrams",
        "Gossip datagrams on the peer UDP port.",
        "direction",
        &[
            ("sent", |s| load(&s.sent_datagrams)),
            ("received", |s| load(&s.received_datagrams)),
        ],
    ),
    Family::counter(
        "gossip_rejected",
        "Gossip datagrams dropped for a missing or wrong cluster-secret tag.",
        |s| load(&s.rejected),
    ),
    Family::counter(
        "gossip_dropped",
        "Gossip datagrams dropped because chitchat fell behind (receive queue full).",
        |s| load(&s.dropped),
    ),
];

/// Reads an atomic counter for a scrape.
pub fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The node's metrics. Hot-path handles are resolved once, at start.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
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
    /// ones), and a frame of an SDK's checks on the peer port.
    pub check_duration: Histogram,
    pub batch_duration: Histogram,
    pub all_duration: Histogram,
    pub peer_duration: Histogram,
    /// Checks by the edge they arrived at, in [`Edge::ALL`]'s order.
    edge_checks: [Counter; Edge::ALL.len()],
    peer_rpc: PeerRpcMetrics,
    rule_checks: RuleChecks,
    /// Checks answered by a block, by rule and the block's source.
    blocked: family::Family<BlockedLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ringlimit");
        let checks = family::Family::<CheckLabels, Counter>::default();
        registry.register("checks", "Checks decided by this node", checks.clone());
        let child = |result, mode| -> Counter {
            checks.get_or_create(&CheckLabels { result, mode }).clone()
        };
        let durations =
            family::Family::<EndpointLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "check_duration_seconds",
            "Time to handle a check request (a batch counts once), answered ones",
            durations.clone(),
        );
        let duration = |endpoint| durations.get_or_create(&EndpointLabel { endpoint }).clone();
        let edges = family::Family::<EdgeLabel, Counter>::default();
        registry.register(
            "edge_checks",
            "Checks decided by this node, by the edge they arrived at (peer: an SDK's, on the peer port)",
            edges.clone(),
        );
        let edge_checks = Edge::ALL.map(|e| {
            let edge = e.label();
            edges.get_or_create(&EdgeLabel { edge }).clone()
        });
        let rule_checks = family::Family::<RuleCheckLabels, Counter>::default();
        registry.register(
            "rule_checks",
            "Checks decided by this node by rule (inline rules as one, inline; past 256 names, other)",
            rule_checks.clone(),
        );
        let blocked = family::Family::<BlockedLabels, Counter>::default();
        registry.register(
            "blocked_checks",
            "Checks answered by a block (denied where they arrived, no bucket touched), by rule (inline rules as inline) and the block's source (auto, managed)",
            blocked.clone(),
        );
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
            peer_duration: duration("peer"),
            edge_checks,
            peer_rpc,
            rule_checks: RuleChecks::new(rule_checks),
            blocked,
            registry,
        }
    }

    /// Counts a check of `rule` (`None`: inline) answered by a block of `source` (`auto`,
    /// `managed`).
    pub fn count_blocked(&self, rule: Option<&str>, source: &'static str) {
        let labels = BlockedLabels {
            rule: rule.unwrap_or("inline").to_owned(),
            source,
        };
        self.blocked.get_or_create(&labels).inc();
    }

    /// Counts one decided check of a rule in `mode`, named `rule` (`None`: inline).
    pub fn count(&self, allowed: bool, shadow_denied: bool, mode: Mode, rule: Option<&str>) {
        let result = match (allowed, shadow_denied) {
            (_, true) => 2,
            (true, false) => 0,
            (false, false) => 1,
        };
        self.rule_checks.inc(rule, result);
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

    /// Counts `n` decided checks that arrived at `edge`.
    #[inline]
    pub fn count_edge(&self, edge: Edge, n: u64) {
        self.edge_checks[edge as usize].inc_by(n);
    }

    /// The router's handles (see [`PeerRpcMetrics`]).
    pub fn peer_rpc(&self) -> PeerRpcMetrics {
        self.peer_rpc.clone()
    }

    /// Adds a subsystem's metrics, `families` read from `source` at each scrape (before the
    /// node serves: the registry is then shared).
    pub fn scrape<T: Send + Sync + 'static>(
        &mut self,
        families: &'static [Family<T>],
        source: Arc<T>,
    ) {
        self.registry
            .register_collector(Box::new(scrape::Scrape { families, source }));
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Nanoseconds (two readings of this node's clock) as the seconds a histogram takes.
pub fn seconds(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 * 1e-9
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str, line: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn checks_are_counted_by_rule_inline_ones_as_one_and_past_the_cap_as_other() {
        let m = Metrics::new();
        m.count(true, false, Mode::Owner, Some("gold"));
        m.count(false, false, Mode::Owner, Some("gold"));
        m.count(false, false, Mode::Owner, Some("gold"));
        m.count(true, true, Mode::Global, Some("trial"));
        m.count(true, false, Mode::Owner, None);
        for i in 0..MAX_COUNTED_RULES + 5 {
            m.count(true, false, Mode::Owner, Some(&format!("r{i}")));
        }
        let text = m.encode().expect("encoded");
        let rule = |rule: &str, result: &str| {
            series(
                &text,
                &format!("ringlimit_rule_checks_total{{rule=\"{rule}\",result=\"{result}\"}}"),
            )
        };
        assert_eq!(rule("gold", "allowed"), Some(1));
        assert_eq!(rule("gold", "denied"), Some(2));
        assert_eq!(rule("gold", "shadow_denied"), Some(0));
        assert_eq!(rule("trial", "shadow_denied"), Some(1));
        assert_eq!(rule("inline", "allowed"), Some(1));
        // "gold" and "trial" took two places of the cap.
        assert_eq!(rule("other", "allowed"), Some(7));
        let names: std::collections::BTreeSet<_> = text
            .lines()
            .filter_map(|l| l.strip_prefix("ringlimit_rule_checks_total{rule=\""))
            .filter_map(|l| l.split('"').next())
            .collect();
        assert_eq!(
            names.len(),
            MAX_COUNTED_RULES + 2,
            "the cap, inline and other"
        );
        assert_eq!(
            series(
                &text,
                "ringlimit_checks_total{result=\"allowed\",mode=\"owner\"}"
            ),
            Some(2 + MAX_COUNTED_RULES as u64 + 5)
        );
    }
}
