//! Why a node cannot start with the configuration it was given: one error for flags, their
//! values and the files they name.

use crate::rules::RulesError;
use ringlimit_core::tls::TlsError;
use std::path::PathBuf;

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
    #[error("--region-peers given without --region: name this node's region too")]
    RegionPeersWithoutRegion,
    #[error("--region {0:?} must be 1 to 64 letters, digits, '-', '_' or '.'")]
    BadRegionName(String),
    #[error(
        "--region-peers entry {0:?} is not NAME=HOST:PORT (a region's name and the --peer \
         address of a node in it)"
    )]
    BadRegionPeer(String),
    #[error("--region-peers names {0:?}, this node's own region (--region): list only the others")]
    RegionPeerIsUs(String),
    #[error("--region-peers names region {0:?} twice")]
    DuplicateRegion(String),
    #[error(
        "--region-peers given but RINGLIMIT_REGION_SECRET is not set (and no --peer-tls-*): \
         links between regions must be authenticated; set the same secret in every region"
    )]
    NoRegionSecret,
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
