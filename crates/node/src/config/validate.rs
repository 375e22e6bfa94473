//! The command line's values into a [`NodeConfig`]: defaults resolved, settings read only
//! from the environment (secrets and tokens, never flags: flags show in `ps`), combinations
//! refused before anything is read, and the files the flags name loaded.

use super::error::ConfigError;
use super::files;
use super::flags::ServeArgs;
use super::node_config::{ConnLimits, NodeConfig};
use crate::rules::RuleSet;
use ringlimit_core::tls::{CertFiles, PeerTlsFiles};
use std::time::Duration;

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
            Some(path) => files::load_rules(path)?,
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
                Some(path) => files::load_envoy(path)?,
                None => crate::rules::envoy_config::EnvoyConfig::default(),
            },
            envoy_path: self.envoy_config,
            rlqs_config: match &self.rlqs_config {
                Some(path) => files::load_rlqs(path)?,
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
