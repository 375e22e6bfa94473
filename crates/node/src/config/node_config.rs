//! What a node runs with: [`NodeConfig`] (whether from flags or built by a test), and the
//! parts of it that others read: the peer port's [`PeerSecurity`] and the servers'
//! [`ConnLimits`].

use super::error::ConfigError;
use super::files;
use crate::cluster::transport::GossipBlocklist;
use crate::forwarded::TrustedProxies;
use crate::rules::RuleSet;
use ringlimit_core::tls::{CertFiles, PeerTls, PeerTlsFiles, ReloadingCert};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How the peer port treats other processes (see [`NodeConfig::peer_security`]).
#[derive(Clone)]
pub enum PeerSecurity {
    /// Members prove the cluster secret; every frame and datagram after is authenticated.
    Secret(Arc<[u8]>),
    /// `--allow-unauthenticated-peers`: anyone who reaches the port is a member.
    Open,
    /// No secret and no permission: a lone node. Gossip from others is dropped, and peer
    /// connections may only send checks (as the SDK does), never member frames.
    LoneNode,
}

impl std::fmt::Debug for PeerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Secret(_) => "Secret",
            Self::Open => "Open",
            Self::LoneNode => "LoneNode",
        })
    }
}

impl PeerSecurity {
    /// The secret, when there is one.
    pub fn secret(&self) -> Option<Arc<[u8]>> {
        match self {
            Self::Secret(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Whether other nodes may be members.
    pub fn accepts_members(&self) -> bool {
        !matches!(self, Self::LoneNode)
    }
}

/// Limits on a server's connections: the HTTP port's (`--http-header-timeout-ms`,
/// `--http-body-timeout-ms`, `--http-idle-timeout-ms`, `--http-max-connections`) or the gRPC
/// port's ([`ConnLimits::grpc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// A request's header must be complete within this once its first byte arrived; a
    /// connection that sends nothing is the idle timeout's.
    pub header_timeout: Duration,
    /// A request's body must be complete within this once its header is.
    pub body_timeout: Duration,
    /// A connection with no request in flight and no bytes moved for this long is closed.
    pub idle_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
}

impl ConnLimits {
    /// The gRPC port's limits (`--grpc-idle-timeout-ms`, `--grpc-request-timeout-ms`,
    /// `--grpc-max-connections`): HTTP/2 has frames, not request heads, so no header timeout
    /// (the field is unused there); the request timeout bounds a whole call.
    pub fn grpc(idle_timeout: Duration, request_timeout: Duration, max_connections: usize) -> Self {
        Self {
            header_timeout: Duration::MAX,
            body_timeout: request_timeout,
            idle_timeout,
            max_connections,
        }
    }

    /// How long a TLS handshake may take: the time a request head has (HTTP), bounded by the
    /// request timeout (the gRPC port, which has no header timeout).
    pub fn handshake_timeout(&self) -> Duration {
        self.header_timeout.min(self.body_timeout)
    }
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}

/// Everything a node needs to run (see [`crate::run`]).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: String,
    pub http_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub advertise: String,
    pub seeds: Vec<String>,
    pub rules_path: Option<PathBuf>,
    /// The rules in force at start (from `rules_path`, or built in).
    pub rules: RuleSet,
    /// gRPC address (`--grpc`); `None`: no gRPC.
    pub grpc_addr: Option<SocketAddr>,
    /// envoyproxy/ratelimit configuration for `ShouldRateLimit` (empty without `--envoy-config`).
    pub envoy_config: crate::rules::envoy_config::EnvoyConfig,
    /// Where `envoy_config` came from, polled like the rules file (`None`: nothing to reload).
    pub envoy_path: Option<PathBuf>,
    /// The RLQS configuration (`--rlqs-config`; empty without: every bucket abandoned).
    pub rlqs_config: crate::rlqs::config::RlqsConfig,
    /// Where `rlqs_config` came from, polled like the rules file.
    pub rlqs_path: Option<PathBuf>,
    /// Where the admin API's rules are kept (`--data-dir`); `None`: memory and gossip only.
    pub data_dir: Option<PathBuf>,
    /// `--persist-min-period` in ns: with `data_dir`, rules of at least this period keep
    /// their buckets on disk.
    pub persist_min_period_ns: u64,
    /// `--persist-interval-ms`: the disk follower's group commit interval.
    pub persist_interval: Duration,
    /// `--members-wait-ms`: with `data_dir`, how long the members of the ring this node last
    /// saw are waited for at start (see `cluster::membership::Remembered`).
    pub members_wait: Duration,
    pub max_keys: u64,
    /// `--replicas`: copies of each bucket on the ring's next members (0: none).
    pub replicas: usize,
    /// `--replica-flush-ms`: how often changes go to the replicas.
    pub replica_flush: Duration,
    pub cluster_id: String,
    pub rules_poll: Duration,
    pub gossip_interval: Duration,
    pub forward_timeout: Duration,
    pub leave_delay: Duration,
    /// Bound on the wait for seed names to resolve at start.
    pub seed_wait: Duration,
    /// See [`super::ServeArgs::http_threads`]; in-process test nodes use 0 (threads would
    /// outlive an aborted node).
    pub http_threads: usize,
    /// See [`super::ServeArgs::grpc_threads`]; 0 in in-process test nodes, as `http_threads`.
    pub grpc_threads: usize,
    /// From `RINGLIMIT_CLUSTER_SECRET` only (never a flag: flags show in `ps`).
    pub cluster_secret: Option<String>,
    /// `--allow-unauthenticated-peers` (see [`PeerSecurity`]).
    pub allow_unauthenticated_peers: bool,
    /// From `RINGLIMIT_ADMIN_TOKEN` only (like the secret): a bearer token of `/v1/admin/*`
    /// (a write token named `admin`). Without it nor `admin_tokens` the admin API is off (its
    /// paths answer 404).
    pub admin_token: Option<String>,
    /// `--admin-tokens`: the file of named admin tokens (reloaded like the rules file).
    pub admin_tokens: Option<PathBuf>,
    /// From `RINGLIMIT_CLIENT_TOKEN` only (like the secret): a client credential named
    /// `client`, which SDKs prove on the peer port instead of the cluster secret.
    pub client_token: Option<String>,
    /// How often global-rule counts are published through gossip.
    pub global_publish: Duration,
    /// `--max-clock-offset-ms`.
    pub max_clock_offset: Duration,
    /// Most global-rule keys published at once by this node.
    pub global_max_published: usize,
    /// Global-counter updates a node receives per second at most (see `--global-gossip-budget`).
    pub global_gossip_budget: u64,
    /// Most global-rule window counters held by this node.
    pub global_max_counters: usize,
    /// `--max-reservation-ttl-ms`: the longest a reservation of this node's buckets may live.
    pub max_reservation_ttl_ms: u64,
    /// `--max-blocks`: the most blocks this node holds.
    pub max_blocks: usize,
    /// Test hook: drops gossip to and from listed peers (a simulated partition).
    #[doc(hidden)]
    pub gossip_blocklist: Option<Arc<GossipBlocklist>>,
    /// The HTTP server's connection limits.
    pub http_limits: ConnLimits,
    /// The gRPC port's connection limits.
    pub grpc_limits: ConnLimits,
    /// Forward auth's `--trusted-proxies`.
    pub trusted_proxies: TrustedProxies,
    /// `--tls-cert`, `--tls-key`: the HTTP and gRPC ports speak TLS (`None`: plain).
    pub tls: Option<CertFiles>,
    /// `--peer-tls-*`: mutual TLS on the peer port's TCP (`None`: plain).
    pub peer_tls: Option<PeerTlsFiles>,
    /// Test hook: the clock buckets are decided by (`None`: the system clock). A manual clock
    /// makes windows and refills exact in a test of whole nodes.
    #[doc(hidden)]
    pub clock: Option<EngineClock>,
    /// Test hook: the node's pause detector (`None`: one of its own), which a test of whole
    /// nodes in memory freezes to stop the node's ticks as SIGSTOP would.
    #[doc(hidden)]
    pub pauses: Option<Arc<crate::cluster::pause::Pauses>>,
    /// `--region` and `--region-peers`: the regions `scope: regions` rules share their limits
    /// with (`None`: one region, every rule `scope: region`).
    pub regions: Option<super::regions::RegionsConfig>,
}

/// A clock for [`NodeConfig::clock`] (a newtype only so that the config stays `Debug`).
#[derive(Clone)]
pub struct EngineClock(pub Arc<dyn ringlimit_core::clock::Clock>);

impl std::fmt::Debug for EngineClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineClock")
    }
}

impl NodeConfig {
    /// How the peer port treats other processes; refuses seeds without a secret unless
    /// unauthenticated peers are allowed (peer TLS or not: gossip needs the secret).
    pub fn peer_security(&self) -> Result<PeerSecurity, ConfigError> {
        match (&self.cluster_secret, self.allow_unauthenticated_peers) {
            (Some(secret), _) => Ok(PeerSecurity::Secret(Arc::from(secret.as_bytes()))),
            (None, true) => Ok(PeerSecurity::Open),
            (None, false) if self.seeds.is_empty() => Ok(PeerSecurity::LoneNode),
            (None, false) if self.peer_tls.is_some() => Err(ConfigError::NoClusterSecretForGossip),
            (None, false) => Err(ConfigError::NoClusterSecret),
        }
    }

    /// The HTTP and gRPC ports' certificate, loaded now (`None`: no TLS).
    pub fn load_tls(&self) -> Result<Option<ReloadingCert>, ConfigError> {
        files::load_tls(self.tls.as_ref())
    }

    /// The peer port's mutual TLS, loaded now (`None`: no TLS).
    pub fn load_peer_tls(&self) -> Result<Option<PeerTls>, ConfigError> {
        files::load_peer_tls(self.peer_tls.as_ref())
    }

    /// A single node on loopback ephemeral ports with built-in rules: for tests.
    pub fn local(node_id: &str) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            node_id: node_id.to_owned(),
            http_addr: any,
            peer_addr: any,
            advertise: any.to_string(),
            seeds: Vec::new(),
            rules_path: None,
            rules: RuleSet::builtin(),
            grpc_addr: None,
            envoy_config: crate::rules::envoy_config::EnvoyConfig::default(),
            envoy_path: None,
            rlqs_config: crate::rlqs::config::RlqsConfig::default(),
            rlqs_path: None,
            data_dir: None,
            persist_min_period_ns: crate::durable::MIN_PERIOD.as_nanos() as u64,
            persist_interval: crate::durable::INTERVAL,
            members_wait: crate::durable::MEMBERS_WAIT,
            max_keys: 100_000,
            replicas: 1,
            replica_flush: crate::replicas::sender::FLUSH_EVERY,
            cluster_id: "ringlimit".into(),
            rules_poll: Duration::from_millis(100),
            gossip_interval: Duration::from_millis(50),
            forward_timeout: Duration::from_millis(25),
            leave_delay: Duration::from_millis(200),
            seed_wait: Duration::from_secs(2),
            http_threads: 0,
            grpc_threads: 0,
            cluster_secret: None,
            // Test clusters on loopback opt in; the binary's default is the safe one.
            allow_unauthenticated_peers: true,
            admin_token: None,
            admin_tokens: None,
            client_token: None,
            global_publish: Duration::from_millis(50),
            max_clock_offset: Duration::from_millis(250),
            global_max_published: crate::global::DEFAULT_MAX_PUBLISHED,
            global_gossip_budget: crate::global::DEFAULT_GOSSIP_BUDGET,
            global_max_counters: crate::global::DEFAULT_MAX_WINDOWS,
            max_reservation_ttl_ms: ringlimit_core::reservations::DEFAULT_MAX_TTL_MS,
            max_blocks: crate::blocks::DEFAULT_MAX_BLOCKS,
            gossip_blocklist: None,
            http_limits: ConnLimits::default(),
            grpc_limits: ConnLimits::grpc(Duration::from_secs(60), Duration::from_secs(10), 10_000),
            trusted_proxies: TrustedProxies::default(),
            tls: None,
            peer_tls: None,
            clock: None,
            pauses: None,
            regions: None,
        }
    }
}
