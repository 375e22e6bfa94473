//! The files a node's flags name, read and checked at start: the rules file, the
//! envoyproxy/ratelimit and RLQS configurations, and the TLS certificates (whose reloads are
//! the node's: [`crate::rules::reload`], [`ringlimit_core::tls::ReloadingCert`]).

use super::error::{ConfigError, PEER_TLS_FLAGS, TLS_FLAGS};
use crate::rlqs::config::RlqsConfig;
use crate::rules::RuleSet;
use crate::rules::envoy_config::{self, EnvoyConfig};
use ringlimit_core::tls::{CertFiles, PeerTls, PeerTlsFiles, ReloadingCert};
use std::path::Path;

/// Reads and validates a rules file.
pub fn load_rules(path: &Path) -> Result<RuleSet, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadRules {
        path: path.to_owned(),
        source,
    })?;
    RuleSet::from_yaml(&text).map_err(|source| ConfigError::InvalidRules {
        path: path.to_owned(),
        source,
    })
}

/// Reads and validates envoyproxy/ratelimit configuration (see [`envoy_config::read_files`]).
pub fn load_envoy(path: &Path) -> Result<EnvoyConfig, ConfigError> {
    let files = envoy_config::read_files(path).map_err(|e| ConfigError::ReadEnvoy {
        path: e.path,
        source: e.source,
    })?;
    Ok(EnvoyConfig::from_files(
        files.iter().map(|(n, t)| (n.as_str(), t.as_str())),
    )?)
}

/// Reads and validates the RLQS configuration.
pub fn load_rlqs(path: &Path) -> Result<RlqsConfig, ConfigError> {
    Ok(RlqsConfig::load(path)?)
}

/// The HTTP and gRPC ports' certificate and key, loaded now (`None`: no TLS).
pub fn load_tls(files: Option<&CertFiles>) -> Result<Option<ReloadingCert>, ConfigError> {
    files
        .cloned()
        .map(ReloadingCert::load)
        .transpose()
        .map_err(|source| ConfigError::Tls {
            flags: TLS_FLAGS,
            source,
        })
}

/// The peer port's CA, certificate and key, loaded now (`None`: no TLS).
pub fn load_peer_tls(files: Option<&PeerTlsFiles>) -> Result<Option<PeerTls>, ConfigError> {
    files
        .map(PeerTls::load)
        .transpose()
        .map_err(|source| ConfigError::Tls {
            flags: PEER_TLS_FLAGS,
            source,
        })
}
