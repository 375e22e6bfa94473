//! The first stage: whom the node trusts. The peer port's security (secret, open, or a lone
//! node), the certificates of the HTTP and gRPC ports and of the peer port, and the admin and
//! client tokens, all loaded before anything is served.

use super::{LOG, NodeError};
use crate::admin::tokens::TokenBook;
use crate::config::{ConfigError, ConnLimits, NodeConfig, PeerSecurity, TLS_FLAGS};
use crate::listen::tls::ServerTls;
use ringlimit_core::tls::http::{GRPC_ALPN, HTTP_ALPN};
use ringlimit_core::tls::{PeerTls, ReloadingCert};
use std::sync::Arc;
use tokio::task::JoinSet;

/// Whom the node trusts, and how its ports prove who they are.
pub(super) struct Trust {
    pub(super) security: PeerSecurity,
    /// The HTTP and gRPC ports' certificate (`--tls-cert`).
    pub(super) http_cert: Option<Arc<ReloadingCert>>,
    /// Mutual TLS on the peer port (`--peer-tls-*`).
    pub(super) peer_tls: Option<PeerTls>,
    pub(super) http_tls: Option<ServerTls>,
    pub(super) grpc_tls: Option<ServerTls>,
    /// Admin tokens and client credentials (`--admin-tokens` and the environment's).
    pub(super) tokens: Arc<TokenBook>,
}

impl Trust {
    /// Loads the certificates (again: `into_config` checked them) and the tokens, and says
    /// what the peer port accepts.
    pub(super) fn load(config: &NodeConfig) -> Result<Self, NodeError> {
        let security = config.peer_security()?;
        let http_cert = config.load_tls()?.map(Arc::new);
        let peer_tls = config.load_peer_tls()?;
        let server_tls = |alpn, limits: &ConnLimits| {
            http_cert
                .clone()
                .map(|cert| ServerTls::new(cert, alpn, limits))
                .transpose()
                .map_err(|source| ConfigError::Tls {
                    flags: TLS_FLAGS,
                    source,
                })
        };
        let http_tls = server_tls(HTTP_ALPN, &config.http_limits)?;
        let grpc_tls = server_tls(GRPC_ALPN, &config.grpc_limits)?;
        warn_of_open_peers(&security, peer_tls.as_ref());
        let tokens = Arc::new(
            TokenBook::open(config.admin_tokens.clone(), config.admin_token.clone())
                .map_err(|e| NodeError::AdminTokens(e.to_string()))?
                .with_client_token(config.client_token.clone()),
        );
        Ok(Self {
            security,
            http_cert,
            peer_tls,
            http_tls,
            grpc_tls,
            tokens,
        })
    }

    /// The certificates watched for renewal, by the port they serve.
    pub(super) fn certificates(&self) -> Vec<(&'static str, Arc<ReloadingCert>)> {
        self.http_cert
            .iter()
            .map(|c| ("http", c.clone()))
            .chain(self.peer_tls.iter().map(|t| ("peer", t.cert().clone())))
            .collect()
    }

    /// Reloads the tokens file and the certificates when they change.
    pub(super) fn watch(&self, config: &NodeConfig, tasks: &mut JoinSet<()>) {
        if config.admin_tokens.is_some() {
            tasks.spawn(self.tokens.clone().watch(config.rules_poll));
        }
        for (_, cert) in self.certificates() {
            tasks.spawn(cert.watch(config.rules_poll));
        }
    }
}

/// Says, once at start, who can reach this node's peer port without the cluster secret.
fn warn_of_open_peers(security: &PeerSecurity, peer_tls: Option<&PeerTls>) {
    match (security, peer_tls) {
        (PeerSecurity::Secret(_), _) => {}
        (PeerSecurity::Open, None) => tracing::warn!(
            target: LOG,
            "--allow-unauthenticated-peers without RINGLIMIT_CLUSTER_SECRET: anyone who can \
             reach the peer port can join the cluster and change its rules and buckets"
        ),
        (PeerSecurity::Open, Some(_)) => tracing::warn!(
            target: LOG,
            "--allow-unauthenticated-peers without RINGLIMIT_CLUSTER_SECRET: peer RPC takes only \
             certificates of --peer-tls-ca, but gossip is open: anyone who can reach the peer \
             port can announce members (whose keys then fail open, as no one can reach them)"
        ),
        (PeerSecurity::LoneNode, None) => tracing::info!(
            target: LOG,
            "RINGLIMIT_CLUSTER_SECRET is not set: running as a lone node that accepts no other \
             members (set the same secret on every node to form a cluster)"
        ),
        (PeerSecurity::LoneNode, Some(_)) => tracing::info!(
            target: LOG,
            "RINGLIMIT_CLUSTER_SECRET is not set: peer RPC takes certificates of --peer-tls-ca, \
             but gossip from other nodes is dropped, so this node stays alone (set the same \
             secret on every node to form a cluster)"
        ),
    }
}
