//! The command line's values into a [`NodeConfig`]: defaults resolved, settings read only
//! from the environment (secrets and tokens, never flags: flags show in `ps`), combinations
//! refused before anything is read, and the files the flags name loaded.

use super::error::ConfigError;
use super::files;
use super::flags::ServeArgs;
use super::node_config::{ConnLimits, NodeConfig};
use crate::rlqs::config::RlqsConfig;
use crate::rules::RuleSet;
use crate::rules::envoy_config::EnvoyConfig;
use ringlimit_core::tls::{CertFiles, PeerTlsFiles};
use std::path::PathBuf;
use std::time::Duration;

impl ServeArgs {
    /// Resolves defaults, reads the settings only the environment gives, refuses what must
    /// not start (before anything is read), and loads the files the flags name.
    pub fn into_config(self) -> Result<NodeConfig, ConfigError> {
        let node_id = match &self.node_id {
            Some(id) if id.trim().is_empty() => return Err(ConfigError::EmptyNodeId),
            Some(id) => id.clone(),
            None => gethostname::gethostname().to_string_lossy().into_owned(),
        };
        let env = FromEnv::read(&self)?;
        let files = Files::load(&self)?;
        let config = self.resolve(node_id, env, files);
        // Certificates that do not load stop the node here, with the file at fault named.
        config.load_tls()?;
        config.load_peer_tls()?;
        Ok(config)
    }

    /// The configuration the flags say, with what the environment and the files gave.
    fn resolve(self, node_id: String, env: FromEnv, files: Files) -> NodeConfig {
        NodeConfig {
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
            rules: files.rules,
            grpc_addr: self.grpc,
            envoy_config: files.envoy,
            envoy_path: self.envoy_config,
            rlqs_config: files.rlqs,
            rlqs_path: self.rlqs_config,
            data_dir: self.data_dir,
            persist_min_period_ns: self.persist_min_period,
            persist_interval: Duration::from_millis(self.persist_interval_ms),
            members_wait: Duration::from_millis(self.members_wait_ms),
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
            grpc_threads: usize::try_from(self.grpc_threads).unwrap_or(1),
            cluster_secret: env.cluster_secret,
            allow_unauthenticated_peers: self.allow_unauthenticated_peers,
            admin_token: env.admin_token,
            admin_tokens: self.admin_tokens,
            client_token: env.client_token,
            global_publish: Duration::from_millis(self.global_publish_ms),
            max_clock_offset: Duration::from_millis(self.max_clock_offset_ms),
            global_max_published: usize::try_from(self.global_max_published).unwrap_or(usize::MAX),
            global_gossip_budget: self.global_gossip_budget,
            global_max_counters: usize::try_from(self.global_max_counters).unwrap_or(usize::MAX),
            max_reservation_ttl_ms: self.max_reservation_ttl_ms,
            max_blocks: usize::try_from(self.max_blocks).unwrap_or(usize::MAX),
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
            tls: tls_files(self.tls_cert, self.tls_key),
            peer_tls: peer_tls_files(self.peer_tls_ca, self.peer_tls_cert, self.peer_tls_key),
            regions: env.regions,
            clock: None,
            pauses: None,
        }
    }
}

/// What only the environment gives: secrets and tokens (never flags: flags show in `ps`),
/// and the regions, whose links prove the region secret.
struct FromEnv {
    cluster_secret: Option<String>,
    admin_token: Option<String>,
    client_token: Option<String>,
    regions: Option<super::regions::RegionsConfig>,
}

impl FromEnv {
    /// Reads the environment; refuses seeds without the cluster secret (unless peers may be
    /// unauthenticated) and a short client token.
    fn read(args: &ServeArgs) -> Result<Self, ConfigError> {
        let var = |name| std::env::var(name).ok().filter(|s: &String| !s.is_empty());
        let cluster_secret = var("RINGLIMIT_CLUSTER_SECRET");
        // Before anything is read: a node that must not start says so first.
        if cluster_secret.is_none()
            && !args.allow_unauthenticated_peers
            && args.seeds.iter().any(|s| !s.trim().is_empty())
        {
            return Err(if args.peer_tls_ca.is_some() {
                ConfigError::NoClusterSecretForGossip
            } else {
                ConfigError::NoClusterSecret
            });
        }
        let regions = super::regions::parse(
            args.region.as_deref(),
            &args.region_peers,
            args.region_interval_ms,
            var("RINGLIMIT_REGION_SECRET"),
            args.peer_tls_ca.is_some(),
        )?;
        let client_token = var("RINGLIMIT_CLIENT_TOKEN");
        if client_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(ConfigError::ShortClientToken);
        }
        Ok(Self {
            cluster_secret,
            admin_token: var("RINGLIMIT_ADMIN_TOKEN"),
            client_token,
            regions,
        })
    }
}

/// The files the flags name, read and checked (the built-in rules and empty Envoy and RLQS
/// configurations without them).
struct Files {
    rules: RuleSet,
    envoy: EnvoyConfig,
    rlqs: RlqsConfig,
}

impl Files {
    fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        Ok(Self {
            rules: match &args.config {
                Some(path) => files::load_rules(path)?,
                None => RuleSet::builtin(),
            },
            envoy: match &args.envoy_config {
                Some(path) => files::load_envoy(path)?,
                None => EnvoyConfig::default(),
            },
            rlqs: match &args.rlqs_config {
                Some(path) => files::load_rlqs(path)?,
                None => RlqsConfig::default(),
            },
        })
    }
}

/// `--tls-cert` and `--tls-key` (clap has made sure that they come together).
fn tls_files(cert: Option<PathBuf>, key: Option<PathBuf>) -> Option<CertFiles> {
    Some(CertFiles {
        cert: cert?,
        key: key?,
    })
}

/// `--peer-tls-ca`, `--peer-tls-cert` and `--peer-tls-key` (which clap makes come together).
fn peer_tls_files(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Option<PeerTlsFiles> {
    Some(PeerTlsFiles {
        ca: ca?,
        cert: cert?,
        key: key?,
    })
}
