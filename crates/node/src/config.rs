//! Command line and environment: `ringlimit serve` flags, each also read from
//! `RINGLIMIT_<FLAG>` (flags win), turned into a [`NodeConfig`].

use crate::cluster::transport::GossipBlocklist;
use crate::forwarded::TrustedProxies;
use crate::rules::{RuleSet, RulesError};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ringlimit_core::tls::{CertFiles, PeerTls, PeerTlsFiles, ReloadingCert, TlsError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The `ringlimit` command line.
#[derive(Debug, Parser)]
#[command(
    name = "ringlimit",
    version,
    about = "A distributed rate limiter: equal nodes, no Redis"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one limiter node.
    Serve(ServeArgs),
    /// The admin CLI: `rules`, `top`, `cluster`, `keys` (an HTTP client of a node's admin API).
    #[command(flatten)]
    Admin(crate::cli::AdminCommand),
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Flags of `ringlimit serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Unique, stable name of this node (default: the host name).
    #[arg(long, env = "RINGLIMIT_NODE_ID", value_name = "ID")]
    pub node_id: Option<String>,
    /// HTTP API address (checks, admin, health, metrics).
    #[arg(
        long,
        env = "RINGLIMIT_HTTP",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub http: SocketAddr,
    /// Node-to-node port: gossip over UDP and peer RPC over TCP.
    #[arg(
        long,
        env = "RINGLIMIT_PEER",
        value_name = "ADDR",
        default_value = "127.0.0.1:7946"
    )]
    pub peer: SocketAddr,
    /// What other nodes dial to reach this one (default: the --peer address).
    #[arg(long, env = "RINGLIMIT_ADVERTISE", value_name = "ADDR")]
    pub advertise: Option<String>,
    /// Gossip seed addresses, host:port, comma-separated.
    #[arg(
        long,
        env = "RINGLIMIT_SEEDS",
        value_name = "A,B,...",
        value_delimiter = ','
    )]
    pub seeds: Vec<String>,
    /// YAML rules file, reloaded when it changes (default: built-in rules).
    #[arg(long, env = "RINGLIMIT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// gRPC address: Envoy's rate limit service and grpc.health.v1 (default: off).
    #[arg(long, env = "RINGLIMIT_GRPC", value_name = "ADDR")]
    pub grpc: Option<SocketAddr>,
    /// envoyproxy/ratelimit configuration: a YAML file or a directory of them, one domain each.
    #[arg(long, env = "RINGLIMIT_ENVOY_CONFIG", value_name = "PATH")]
    pub envoy_config: Option<PathBuf>,
    /// Envoy Rate Limit Quota Service configuration (on --grpc): a YAML file mapping bucket ids
    /// to rules per domain (hot reloaded).
    #[arg(long, env = "RINGLIMIT_RLQS_CONFIG", value_name = "PATH")]
    pub rlqs_config: Option<PathBuf>,
    /// Directory where this node keeps the rules written through the admin API (created if
    /// missing; default: none, the API rules live in memory and gossip only).
    #[arg(long, env = "RINGLIMIT_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// YAML file of named tokens with roles (read, write; check: a client credential for SDKs on
    /// the peer port), reloaded when it changes; beside RINGLIMIT_ADMIN_TOKEN (a write token
    /// named admin) and RINGLIMIT_CLIENT_TOKEN (a client credential named client).
    #[arg(long, env = "RINGLIMIT_ADMIN_TOKENS", value_name = "FILE")]
    pub admin_tokens: Option<PathBuf>,
    /// Most buckets held in memory by this node (least recently used evicted beyond it).
    #[arg(long, env = "RINGLIMIT_MAX_KEYS", value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_keys: u64,
    /// Members after each bucket's owner on the ring that keep a copy of it (its changes are
    /// sent there, off the check path); the first of them takes over from the copy when the
    /// owner leaves the ring. 0: no replicas.
    #[arg(
        long,
        env = "RINGLIMIT_REPLICAS",
        value_name = "N",
        default_value_t = 1
    )]
    pub replicas: u32,
    /// How often an owner sends its buckets' changes to their replicas, in ms: the longest a
    /// change waits before it is on the wire (what a SIGKILLed owner's copies can miss), and at
    /// most one frame per replica member per interval. Longer costs less CPU under load (fewer,
    /// larger frames); shorter loses less when an owner dies.
    #[arg(long, env = "RINGLIMIT_REPLICA_FLUSH_MS", value_name = "MS",
          default_value_t = crate::replicas::sender::FLUSH_EVERY.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub replica_flush_ms: u64,
    /// Let other nodes join and talk to this one without `RINGLIMIT_CLUSTER_SECRET`. Anyone who
    /// can reach the peer port can then join the ring, rewrite rules, reset and replace buckets:
    /// only for a trusted, isolated network. Without a secret and without this flag a node
    /// refuses `--seeds` and accepts no other member (a lone node, and the SDK, still work).
    #[arg(long, env = "RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS")]
    pub allow_unauthenticated_peers: bool,
    /// Nodes with another cluster id are ignored.
    #[arg(
        long,
        env = "RINGLIMIT_CLUSTER_ID",
        value_name = "ID",
        default_value = "ringlimit"
    )]
    pub cluster_id: String,
    /// How often the rules file is checked for changes, in milliseconds.
    #[arg(long, env = "RINGLIMIT_CONFIG_POLL_MS", value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub config_poll_ms: u64,
    /// Gossip round interval in milliseconds (a killed node is declared dead after ~13 rounds).
    #[arg(long, env = "RINGLIMIT_GOSSIP_INTERVAL_MS", value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub gossip_interval_ms: u64,
    /// How long a forwarded check waits for its owner before failing open, in milliseconds.
    #[arg(long, env = "RINGLIMIT_FORWARD_TIMEOUT_MS", value_name = "MS", default_value_t = 25,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub forward_timeout_ms: u64,
    /// On SIGTERM, how long to keep serving after announcing `leaving`, in milliseconds.
    #[arg(long, env = "RINGLIMIT_LEAVE_DELAY_MS", value_name = "MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub leave_delay_ms: u64,
    /// At start, how long to wait for seed host names to resolve before gossip starts (pods of
    /// a StatefulSet start before their DNS records exist), in milliseconds.
    #[arg(long, env = "RINGLIMIT_SEED_WAIT_MS", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(0..=300_000))]
    pub seed_wait_ms: u64,
    /// Time a client has to send a request's whole header (slow-header clients are closed).
    #[arg(long, env = "RINGLIMIT_HTTP_HEADER_TIMEOUT_MS", value_name = "MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,
    /// A keep-alive connection with no request in flight and no traffic for this long is closed.
    #[arg(long, env = "RINGLIMIT_HTTP_IDLE_TIMEOUT_MS", value_name = "MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,
    /// Time a client has, once a request's header is complete, to send its whole body (a
    /// stalled body is answered 408 and its connection closed).
    #[arg(long, env = "RINGLIMIT_HTTP_BODY_TIMEOUT_MS", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_ms: u64,
    /// Most open HTTP connections; at the cap a new one closes the longest-idle connection
    /// (refused when all are busy).
    #[arg(long, env = "RINGLIMIT_HTTP_MAX_CONNECTIONS", value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: u64,
    /// A gRPC connection with no call in flight for this long is sent GOAWAY and closed
    /// (gRPC's `MAX_CONNECTION_IDLE`: pings and other frames do not count as use).
    #[arg(long, env = "RINGLIMIT_GRPC_IDLE_TIMEOUT_MS", value_name = "MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_idle_timeout_ms: u64,
    /// Longest a gRPC call may take, its request message included (answered DEADLINE_EXCEEDED).
    #[arg(long, env = "RINGLIMIT_GRPC_REQUEST_TIMEOUT_MS", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_request_timeout_ms: u64,
    /// Most open gRPC connections; at the cap a new one closes the longest-idle connections
    /// (refused when all are busy).
    #[arg(long, env = "RINGLIMIT_GRPC_MAX_CONNECTIONS", value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_max_connections: u64,
    /// Threads serving the HTTP API, each with its own single-threaded runtime (default: one per
    /// CPU); 0 serves it on the main runtime with peer RPC and gossip.
    #[arg(long, env = "RINGLIMIT_HTTP_THREADS", value_name = "N", default_value_t = default_http_threads(),
          value_parser = clap::value_parser!(u64).range(0..=256))]
    pub http_threads: u64,
    /// How far (ms) a member's clock may be off before it is logged as wrong (its offset is
    /// measured over the peer link every second; /v1/cluster and ringlimit_clock_offset_seconds
    /// show it).
    #[arg(long, env = "RINGLIMIT_MAX_CLOCK_OFFSET_MS", value_name = "MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_clock_offset_ms: u64,
    /// How often this node sends its changed global-rule counts to the other live members
    /// (over the peer port), in milliseconds (the main term of global rules' over-admission).
    #[arg(long, env = "RINGLIMIT_GLOBAL_PUBLISH_MS", value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub global_publish_ms: u64,
    /// Most global-rule keys this node publishes at once; beyond it new hot keys are decided
    /// without telling peers (counted in ringlimit_global_unpublished_total).
    #[arg(long, env = "RINGLIMIT_GLOBAL_MAX_PUBLISHED", value_name = "N",
          default_value_t = crate::global::DEFAULT_MAX_PUBLISHED as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub global_max_published: u64,
    /// Global-counter updates each node may receive per second from all its peers together;
    /// each node publishes at most its share (this divided by the other live members), oldest
    /// changes first, so the traffic stays bounded however many nodes and hot keys there are.
    #[arg(long, env = "RINGLIMIT_GLOBAL_GOSSIP_BUDGET", value_name = "N",
          default_value_t = crate::global::DEFAULT_GOSSIP_BUDGET,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub global_gossip_budget: u64,
    /// Most global-rule window counters (own and merged) held by this node; the oldest windows
    /// are evicted beyond it.
    #[arg(long, env = "RINGLIMIT_GLOBAL_MAX_COUNTERS", value_name = "N",
          default_value_t = crate::global::DEFAULT_MAX_WINDOWS as u64,
          value_parser = clap::value_parser!(u64).range(16..=100_000_000))]
    pub global_max_counters: u64,
    /// Proxies in front of the gateways whose X-Forwarded-For entries are believed, as address
    /// blocks or addresses (10.0.0.0/8,2001:db8::/32,192.0.2.7): forward auth's {client_ip} is
    /// the rightmost X-Forwarded-For address not among them (default: none, so the rightmost
    /// address, the one the gateway itself appended).
    #[arg(long, env = "RINGLIMIT_TRUSTED_PROXIES", value_name = "CIDR,CIDR,...")]
    pub trusted_proxies: Option<TrustedProxies>,
    /// TLS certificate chain (PEM, the server's certificate first) of the HTTP and gRPC ports,
    /// which then speak only TLS (HTTP/2 or HTTP/1.1 by ALPN). Reloaded when it or the key
    /// changes (checked every --config-poll-ms); a pair that does not load is refused and the
    /// previous one stays.
    #[arg(
        long,
        env = "RINGLIMIT_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM: PKCS#8, RSA or EC) of --tls-cert.
    #[arg(
        long,
        env = "RINGLIMIT_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Cluster CA (PEM) for mutual TLS on the peer port's TCP: peer RPC then speaks only TLS
    /// 1.3, and each end's certificate must chain to this CA (names are not checked). Needs
    /// --peer-tls-cert and --peer-tls-key. Gossip (UDP) is not TLS: it still needs
    /// RINGLIMIT_CLUSTER_SECRET.
    #[arg(long, env = "RINGLIMIT_PEER_TLS_CA", value_name = "FILE",
          requires_all = ["peer_tls_cert", "peer_tls_key"])]
    pub peer_tls_ca: Option<PathBuf>,
    /// This node's certificate on the peer port, presented both when it answers and when it
    /// dials (signed by --peer-tls-ca; reloaded like --tls-cert).
    #[arg(long, env = "RINGLIMIT_PEER_TLS_CERT", value_name = "FILE",
          requires_all = ["peer_tls_ca", "peer_tls_key"])]
    pub peer_tls_cert: Option<PathBuf>,
    /// Private key of --peer-tls-cert.
    #[arg(long, env = "RINGLIMIT_PEER_TLS_KEY", value_name = "FILE",
          requires_all = ["peer_tls_ca", "peer_tls_cert"])]
    pub peer_tls_key: Option<PathBuf>,
    /// The longest a reservation may live (`ttl_ms` of /v1/reserve and the SDK), in ms: a
    /// longer one is refused (400 invalid_request). A live reservation holds a slot of its
    /// owner's table until it is settled or expires (the table is shared fairly between rules;
    /// a reservation of cost 0 holds none), so this bounds how long a client can hold slots it
    /// never settles. At most an hour.
    #[arg(long, env = "RINGLIMIT_MAX_RESERVATION_TTL_MS", value_name = "MS",
          default_value_t = ringlimit_core::reserve::DEFAULT_MAX_TTL_MS,
          value_parser = clap::value_parser!(u64).range(1..=ringlimit_core::reserve::MAX_TTL_MS))]
    pub max_reservation_ttl_ms: u64,
    /// Log format on stderr.
    #[arg(long, env = "RINGLIMIT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Why a node cannot start with the configuration it was given.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read rules file {path}: {source}")]
    ReadRules {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rules file {path}: {source}")]
    InvalidRules { path: PathBuf, source: RulesError },
    #[error("--node-id must not be empty")]
    EmptyNodeId,
    #[error("RINGLIMIT_CLIENT_TOKEN must be at least 16 characters (as every token)")]
    ShortClientToken,
    #[error("cannot read envoy config {path}: {source}")]
    ReadEnvoy {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("envoy config {0}")]
    InvalidEnvoy(#[from] crate::rules::envoy_config::EnvoyConfigError),
    #[error("rlqs config {0}")]
    InvalidRlqs(#[from] crate::rlqs::config::RlqsConfigError),
    #[error(
        "--seeds given but RINGLIMIT_CLUSTER_SECRET is not set: without a secret anyone who can \
         reach the peer port can join the cluster and change its rules and buckets; set the same \
         secret on every node (or --allow-unauthenticated-peers on a trusted, isolated network)"
    )]
    NoClusterSecret,
    #[error(
        "--seeds given but RINGLIMIT_CLUSTER_SECRET is not set: --peer-tls-* authenticates peer \
         RPC (TCP) only, and gossip (UDP, which carries membership) cannot be TLS: set the same \
         secret on every node as well (or --allow-unauthenticated-peers to leave gossip open on \
         a trusted, isolated network)"
    )]
    NoClusterSecretForGossip,
    #[error("{flags}: {source}")]
    Tls {
        flags: &'static str,
        source: TlsError,
    },
}

/// The flags of the HTTP and gRPC ports' TLS files, in messages.
pub const TLS_FLAGS: &str = "--tls-cert/--tls-key";
/// The flags of the peer port's TLS files, in messages.
pub const PEER_TLS_FLAGS: &str = "--peer-tls-ca/--peer-tls-cert/--peer-tls-key";

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
    /// See [`ServeArgs::http_threads`]; in-process test nodes use 0 (threads would outlive an
    /// aborted node).
    pub http_threads: usize,
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
        self.tls
            .clone()
            .map(ReloadingCert::load)
            .transpose()
            .map_err(|source| ConfigError::Tls {
                flags: TLS_FLAGS,
                source,
            })
    }

    /// The peer port's mutual TLS, loaded now (`None`: no TLS).
    pub fn load_peer_tls(&self) -> Result<Option<PeerTls>, ConfigError> {
        self.peer_tls
            .as_ref()
            .map(PeerTls::load)
            .transpose()
            .map_err(|source| ConfigError::Tls {
                flags: PEER_TLS_FLAGS,
                source,
            })
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
            max_reservation_ttl_ms: ringlimit_core::reserve::DEFAULT_MAX_TTL_MS,
            gossip_blocklist: None,
            http_limits: ConnLimits::default(),
            grpc_limits: ConnLimits::grpc(Duration::from_secs(60), Duration::from_secs(10), 10_000),
            trusted_proxies: TrustedProxies::default(),
            tls: None,
            peer_tls: None,
            clock: None,
            pauses: None,
        }
    }
}

/// Reads and validates a rules file.
pub fn load_rules(path: &std::path::Path) -> Result<RuleSet, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadRules {
        path: path.to_owned(),
        source,
    })?;
    RuleSet::from_yaml(&text).map_err(|source| ConfigError::InvalidRules {
        path: path.to_owned(),
        source,
    })
}

/// Reads and validates envoyproxy/ratelimit configuration (see [`crate::rules::envoy_config::read_files`]).
pub fn load_envoy(
    path: &std::path::Path,
) -> Result<crate::rules::envoy_config::EnvoyConfig, ConfigError> {
    let files =
        crate::rules::envoy_config::read_files(path).map_err(|e| ConfigError::ReadEnvoy {
            path: e.path,
            source: e.source,
        })?;
    Ok(crate::rules::envoy_config::EnvoyConfig::from_files(
        files.iter().map(|(n, t)| (n.as_str(), t.as_str())),
    )?)
}

impl ServeArgs {
    /// Resolves defaults and loads the rules file.
    pub fn into_config(self) -> Result<NodeConfig, ConfigError> {
        let node_id = match self.node_id {
            Some(id) if id.trim().is_empty() => return Err(ConfigError::EmptyNodeId),
            Some(id) => id,
            None => gethostname::gethostname().to_string_lossy().into_owned(),
        };
        let cluster_secret = std::env::var("RINGLIMIT_CLUSTER_SECRET")
            .ok()
            .filter(|s| !s.is_empty());
        // Before anything is read: a node that must not start says so first.
        if cluster_secret.is_none()
            && !self.allow_unauthenticated_peers
            && self.seeds.iter().any(|s| !s.trim().is_empty())
        {
            return Err(if self.peer_tls_ca.is_some() {
                ConfigError::NoClusterSecretForGossip
            } else {
                ConfigError::NoClusterSecret
            });
        }
        let client_token = std::env::var("RINGLIMIT_CLIENT_TOKEN")
            .ok()
            .filter(|s| !s.is_empty());
        if client_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(ConfigError::ShortClientToken);
        }
        let rules = match &self.config {
            Some(path) => load_rules(path)?,
            None => RuleSet::builtin(),
        };
        // clap has made sure that these come together.
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
            _ => None,
        };
        let peer_tls = match (self.peer_tls_ca, self.peer_tls_cert, self.peer_tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(PeerTlsFiles { ca, cert, key }),
            _ => None,
        };
        let config = NodeConfig {
            node_id,
            http_addr: self.http,
            peer_addr: self.peer,
            advertise: self.advertise.unwrap_or_else(|| self.peer.to_string()),
            seeds: self
                .seeds
                .into_iter()
                .filter(|s| !s.trim().is_empty())
                .collect(),
            rules_path: self.config,
            rules,
            grpc_addr: self.grpc,
            envoy_config: match &self.envoy_config {
                Some(path) => load_envoy(path)?,
                None => crate::rules::envoy_config::EnvoyConfig::default(),
            },
            envoy_path: self.envoy_config,
            rlqs_config: match &self.rlqs_config {
                Some(path) => crate::rlqs::config::RlqsConfig::load(path)?,
                None => crate::rlqs::config::RlqsConfig::default(),
            },
            rlqs_path: self.rlqs_config,
            data_dir: self.data_dir,
            max_keys: self.max_keys,
            replicas: self.replicas as usize,
            replica_flush: Duration::from_millis(self.replica_flush_ms),
            cluster_id: self.cluster_id,
            rules_poll: Duration::from_millis(self.config_poll_ms),
            gossip_interval: Duration::from_millis(self.gossip_interval_ms),
            forward_timeout: Duration::from_millis(self.forward_timeout_ms),
            leave_delay: Duration::from_millis(self.leave_delay_ms),
            seed_wait: Duration::from_millis(self.seed_wait_ms),
            http_threads: usize::try_from(self.http_threads).unwrap_or(1),
            cluster_secret,
            allow_unauthenticated_peers: self.allow_unauthenticated_peers,
            admin_token: std::env::var("RINGLIMIT_ADMIN_TOKEN")
                .ok()
                .filter(|s| !s.is_empty()),
            admin_tokens: self.admin_tokens,
            client_token,
            global_publish: Duration::from_millis(self.global_publish_ms),
            max_clock_offset: Duration::from_millis(self.max_clock_offset_ms),
            global_max_published: usize::try_from(self.global_max_published).unwrap_or(usize::MAX),
            global_gossip_budget: self.global_gossip_budget,
            global_max_counters: usize::try_from(self.global_max_counters).unwrap_or(usize::MAX),
            max_reservation_ttl_ms: self.max_reservation_ttl_ms,
            gossip_blocklist: None,
            http_limits: ConnLimits {
                header_timeout: Duration::from_millis(self.http_header_timeout_ms),
                body_timeout: Duration::from_millis(self.http_body_timeout_ms),
                idle_timeout: Duration::from_millis(self.http_idle_timeout_ms),
                max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
            },
            grpc_limits: ConnLimits::grpc(
                Duration::from_millis(self.grpc_idle_timeout_ms),
                Duration::from_millis(self.grpc_request_timeout_ms),
                usize::try_from(self.grpc_max_connections).unwrap_or(usize::MAX),
            ),
            trusted_proxies: self.trusted_proxies.unwrap_or_default(),
            tls,
            peer_tls,
            clock: None,
            pauses: None,
        };
        // Certificates that do not load stop the node here, with the file at fault named.
        config.load_tls()?;
        config.load_peer_tls()?;
        Ok(config)
    }
}

/// One HTTP thread per CPU this process may use.
fn default_http_threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_proxies_are_a_list_of_address_blocks() {
        let parse =
            |args: &[&str]| serve_args(args).map(|serve| serve.trusted_proxies.unwrap_or_default());
        let trusted = parse(&["--trusted-proxies", "10.0.0.0/8, 2001:db8::/32,192.0.2.7"])
            .expect("three blocks");
        for ip in ["10.9.8.7", "2001:db8::1", "192.0.2.7"] {
            assert!(trusted.contains(ip.parse().expect("ip")), "{ip}");
        }
        assert!(!trusted.contains("192.0.2.8".parse().expect("ip")));
        // None, and an empty list (an unset variable in a manifest): nothing trusted.
        for args in [&[][..], &["--trusted-proxies", ""]] {
            assert_eq!(parse(args).expect("none"), TrustedProxies::default());
        }
        let e = parse(&["--trusted-proxies", "10.0.0.0/8,nope"]).expect_err("not a block");
        assert!(e.to_string().contains("address block"), "{e}");
    }

    fn serve_args(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let cli = Cli::try_parse_from(["ringlimit", "serve"].iter().chain(args))?;
        let Command::Serve(serve) = cli.command else {
            unreachable!("parsed as serve")
        };
        Ok(serve)
    }

    #[test]
    fn tls_flags_come_in_pairs_and_threes() {
        for args in [
            &["--tls-cert", "c.pem"][..],
            &["--tls-key", "k.pem"],
            &["--peer-tls-ca", "ca.pem"],
            &["--peer-tls-ca", "ca.pem", "--peer-tls-cert", "c.pem"],
            &["--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"],
        ] {
            let e = serve_args(args).expect_err("incomplete");
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{args:?}"
            );
        }
        let a = serve_args(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]).expect("a pair");
        assert_eq!(a.tls_cert, Some(PathBuf::from("c.pem")));
    }

    #[test]
    fn a_certificate_that_cannot_be_read_stops_the_node_naming_the_file_and_flags() {
        let missing = std::env::temp_dir().join("ringlimit-no-such-cert.pem");
        let path = missing.display().to_string();
        let args = serve_args(&["--tls-cert", &path, "--tls-key", &path]).expect("flags");
        let e = args.into_config().expect_err("no such file");
        let line = e.to_string();
        assert!(matches!(e, ConfigError::Tls { .. }), "{line}");
        assert!(
            line.starts_with("--tls-cert/--tls-key: cannot read certificate "),
            "{line}"
        );
        assert!(line.contains(&path) && !line.contains('\n'), "{line}");

        let args = serve_args(&[
            "--peer-tls-ca",
            &path,
            "--peer-tls-cert",
            &path,
            "--peer-tls-key",
            &path,
        ])
        .expect("flags");
        let line = args.into_config().expect_err("no such file").to_string();
        assert!(
            line.starts_with("--peer-tls-ca/--peer-tls-cert/--peer-tls-key: cannot read CA "),
            "{line}"
        );
    }

    #[test]
    fn peer_tls_without_the_secret_still_refuses_seeds_because_gossip_needs_it() {
        let mut config = NodeConfig::local("n");
        config.allow_unauthenticated_peers = false;
        config.seeds = vec!["127.0.0.1:7946".into()];
        config.peer_tls = Some(PeerTlsFiles {
            ca: "ca.pem".into(),
            cert: "c.pem".into(),
            key: "k.pem".into(),
        });
        let e = config.peer_security().expect_err("seeds without a secret");
        assert!(matches!(e, ConfigError::NoClusterSecretForGossip), "{e}");
        assert!(e.to_string().contains("gossip"), "{e}");
        // With the secret, or with gossip left open on purpose: a cluster.
        config.cluster_secret = Some("s".into());
        assert!(matches!(
            config.peer_security(),
            Ok(PeerSecurity::Secret(_))
        ));
        config.cluster_secret = None;
        config.allow_unauthenticated_peers = true;
        assert!(matches!(config.peer_security(), Ok(PeerSecurity::Open)));
    }

    #[test]
    fn replicas_default_to_one_and_zero_turns_them_off() {
        let parse = |args: &[&str]| serve_args(args).map(|serve| serve.replicas);
        assert_eq!(parse(&[]).expect("default"), 1);
        assert_eq!(parse(&["--replicas", "0"]).expect("off"), 0);
        assert_eq!(parse(&["--replicas", "2"]).expect("two"), 2);
        assert!(parse(&["--replicas", "-1"]).is_err());
    }

    #[test]
    fn a_reservations_life_is_bounded_by_ten_minutes_unless_raised_to_at_most_an_hour() {
        let parse = |args: &[&str]| serve_args(args).map(|serve| serve.max_reservation_ttl_ms);
        assert_eq!(parse(&[]).expect("default"), 600_000);
        assert_eq!(
            parse(&["--max-reservation-ttl-ms", "3600000"]).expect("an hour"),
            3_600_000
        );
        for bad in ["0", "3600001", "-1", "long"] {
            assert!(parse(&["--max-reservation-ttl-ms", bad]).is_err(), "{bad}");
        }
        let config = serve_args(&["--max-reservation-ttl-ms", "120000"])
            .expect("two minutes")
            .into_config()
            .expect("a config");
        assert_eq!(config.max_reservation_ttl_ms, 120_000);
    }

    #[test]
    fn the_replica_flush_interval_defaults_to_8_ms_and_stays_within_a_second() {
        let parse = |args: &[&str]| serve_args(args).map(|serve| serve.replica_flush_ms);
        assert_eq!(parse(&[]).expect("default"), 8);
        assert_eq!(parse(&["--replica-flush-ms", "20"]).expect("20"), 20);
        for bad in ["0", "1001", "-5", "soon"] {
            assert!(parse(&["--replica-flush-ms", bad]).is_err(), "{bad}");
        }
    }
}
