//! The command line: `ringlimit serve`'s flags (each also read from `RINGLIMIT_<FLAG>`; flags
//! win) and the admin CLI's subcommands beside it. Their values are checked apart
//! ([`ServeArgs::into_config`]).

use crate::forwarded::TrustedProxies;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// With --data-dir, the shortest rule period whose buckets are kept on disk (rules may say
    /// `persist: always | never` instead); a restarted node starts from them.
    #[arg(long, env = "RINGLIMIT_PERSIST_MIN_PERIOD", value_name = "DURATION",
          default_value = "1m", value_parser = crate::rules::parse_period)]
    pub persist_min_period: u64,
    /// With --data-dir, how often the changed buckets worth keeping are written to disk, in
    /// one commit (ms): what a SIGKILL can lose at most.
    #[arg(long, env = "RINGLIMIT_PERSIST_INTERVAL_MS", value_name = "MS",
          default_value_t = crate::durable::INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub persist_interval_ms: u64,
    /// With --data-dir, how long after its start a node waits for the members of the ring it
    /// last saw (kept there) before their keys are no longer theirs (ms): until each is seen
    /// alive, its keys are asked of it, and while it does not answer, of its replica, then
    /// answered from the fallback share (so the first node of a whole-cluster restart does not
    /// decide the others' keys from fresh buckets). 0: not waited for.
    #[arg(long, env = "RINGLIMIT_MEMBERS_WAIT_MS", value_name = "MS",
          default_value_t = crate::durable::MEMBERS_WAIT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub members_wait_ms: u64,
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
    /// Threads serving the gRPC port, each with its own single-threaded runtime (default: one
    /// per CPU); 0 serves it on the main runtime with peer RPC and gossip.
    #[arg(long, env = "RINGLIMIT_GRPC_THREADS", value_name = "N", default_value_t = default_http_threads(),
          value_parser = clap::value_parser!(u64).range(0..=256))]
    pub grpc_threads: u64,
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
          default_value_t = ringlimit_core::reservations::DEFAULT_MAX_TTL_MS,
          value_parser = clap::value_parser!(u64).range(1..=ringlimit_core::reservations::MAX_TTL_MS))]
    pub max_reservation_ttl_ms: u64,
    /// The most blocks this node holds (automatic and managed together; see the blocks
    /// guide for the bytes each takes). A full node refuses new managed blocks (409
    /// too_many_blocks) and gives up the automatic block nearest its end for a new one.
    #[arg(long, env = "RINGLIMIT_MAX_BLOCKS", value_name = "N",
          default_value_t = crate::blocks::DEFAULT_MAX_BLOCKS as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_blocks: u64,
    /// This node's region (default: none, one region). Rules with `scope: regions` share
    /// their limit with the regions of --region-peers.
    #[arg(long, env = "RINGLIMIT_REGION", value_name = "NAME")]
    pub region: Option<String>,
    /// The other regions, NAME=HOST:PORT each (the --peer address of a node in that region;
    /// names are resolved again on every connection), comma-separated. Links between regions
    /// prove RINGLIMIT_REGION_SECRET (the same in every region) or peer mTLS.
    #[arg(
        long,
        env = "RINGLIMIT_REGION_PEERS",
        value_name = "NAME=HOST:PORT,...",
        value_delimiter = ','
    )]
    pub region_peers: Vec<String>,
    /// How often regions exchange demand and allowances, in ms: an allowance lasts three of
    /// these past its ask.
    #[arg(long, env = "RINGLIMIT_REGION_INTERVAL_MS", value_name = "MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub region_interval_ms: u64,
    /// Log format on stderr.
    #[arg(long, env = "RINGLIMIT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// One HTTP thread per CPU this process may use.
fn default_http_threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}
