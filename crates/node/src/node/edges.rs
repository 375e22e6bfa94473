//! The edges stage: the check service and the admin side behind every edge, and the edges
//! served: HTTP (the API and forward auth), gRPC (Envoy's RLS and RLQS, ringlimit.v1,
//! health), and the peer port's connections.

use super::LOG;
use super::NodeError;
use super::listeners::{Endpoints, PeerListener};
use super::local::LocalState;
use super::membership::Members;
use super::peers::Peering;
use super::trust::Trust;
use crate::admin::{self, Admin};
use crate::config::NodeConfig;
use crate::http::{self, AppState};
use crate::lifecycle::Lifecycle;
use crate::listen::conns::ConnTable;
use crate::listen::stream::Listener;
use crate::listen::tls::ServerTls;
use crate::metrics::{ConnStats, Metrics};
use crate::peers::PeerServer;
use crate::rules::envoy_config::EnvoyConfig;
use crate::rules::reload::RulesStatus;
use crate::service::CheckService;
use arc_swap::ArcSwap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;

/// The edges' listeners and TLS, their connections' counts, and the gRPC port's files (the
/// Envoy ratelimit configuration, and the RLQS one's reloads).
pub(super) struct Edges {
    http: Listener,
    http_addr: SocketAddr,
    http_tls: Option<ServerTls>,
    /// `--grpc`: its listener and address, when configured.
    grpc: Option<(Listener, Option<SocketAddr>)>,
    grpc_tls: Option<ServerTls>,
    /// The peer port's address (its listener is the peer server's).
    peer_addr: SocketAddr,
    pub(super) conns: Arc<ConnStats>,
    pub(super) grpc_conns: Arc<ConnStats>,
    envoy: Arc<ArcSwap<EnvoyConfig>>,
    pub(super) envoy_status: Arc<RulesStatus>,
    pub(super) rlqs_status: Arc<RulesStatus>,
}

impl Edges {
    /// Takes the HTTP and gRPC listeners of `endpoints` (the peer port's is the peer
    /// server's: [`serve_peer_port`]).
    pub(super) fn new(
        config: &NodeConfig,
        trust: &Trust,
        endpoints: Endpoints,
    ) -> (Self, PeerListener) {
        // Generation 0: no file, nothing loaded.
        let status = |path: &Option<std::path::PathBuf>| {
            let status = Arc::new(RulesStatus::new(path.clone()));
            if path.is_none() {
                status.generation.store(0, Ordering::Relaxed);
            }
            status
        };
        let edges = Self {
            http: endpoints.http,
            http_addr: endpoints.http_addr,
            http_tls: trust.http_tls.clone(),
            grpc: endpoints.grpc.map(|l| (l, endpoints.grpc_addr)),
            grpc_tls: trust.grpc_tls.clone(),
            peer_addr: endpoints.peer_addr,
            conns: Arc::new(ConnStats::default()),
            grpc_conns: Arc::new(ConnStats::default()),
            envoy: Arc::new(ArcSwap::from_pointee(config.envoy_config.clone())),
            envoy_status: status(&config.envoy_path),
            rlqs_status: status(&config.rlqs_path),
        };
        (edges, endpoints.peer)
    }

    /// Reloads the gRPC port's files when they change (with no gRPC port, nothing reads them).
    pub(super) fn watch(&self, config: &NodeConfig, local: &LocalState, tasks: &mut JoinSet<()>) {
        if self.rlqs_status.source.is_some() && self.grpc.is_some() {
            tasks.spawn(crate::rlqs::reload::watch_rlqs(
                local.rlqs.config.clone(),
                self.rlqs_status.clone(),
                config.rules_poll,
            ));
        }
        if self.envoy_status.source.is_some() && self.grpc.is_some() {
            tasks.spawn(crate::rules::reload::watch_envoy(
                self.envoy.clone(),
                self.envoy_status.clone(),
                config.rules_poll,
            ));
        }
    }

    /// The line operators (and process tests) read the node's addresses from.
    pub(super) fn say_serving(&self, config: &NodeConfig, trust: &Trust, members: &Members) {
        tracing::info!(
            target: LOG,
            node_id = %config.node_id,
            http = %self.http_addr,
            peer = %self.peer_addr,
            advertise = %members.advertise,
            seeds = ?config.seeds,
            rules = config.rules.len(),
            max_keys = config.max_keys,
            admin_api = trust.tokens.enabled(),
            client_credentials = trust.tokens.tokens().client_keys().len(),
            tls = trust.http_cert.is_some(),
            peer_tls = trust.peer_tls.is_some(),
            "ringlimit node serving"
        );
    }

    /// Serves gRPC, when configured: stopped with the node's other tasks once HTTP has drained.
    pub(super) fn serve_grpc(
        &mut self,
        config: &NodeConfig,
        trust: &Trust,
        state: &AppState,
        local: &LocalState,
        lifecycle: &Arc<Lifecycle>,
        tasks: &mut JoinSet<()>,
    ) {
        let Some((listener, grpc_addr)) = self.grpc.take() else {
            return;
        };
        let (service, lifecycle) = (state.service.clone(), lifecycle.clone());
        let envoy = crate::grpc::EnvoyServices {
            rls: self.envoy.clone(),
            rlqs: local.rlqs.clone(),
        };
        tracing::info!(
            target: LOG,
            grpc = ?grpc_addr,
            "gRPC serving (Envoy rate limit and quota services, health)"
        );
        let v1 = crate::grpc::V1Services {
            service,
            admin: state.admin.clone(),
            auth: crate::grpc::credentials::ClientAuth {
                tokens: trust.tokens.clone(),
                secret: trust.security.secret().is_some(),
            },
        };
        let table = Arc::new(ConnTable::new(config.grpc_limits, self.grpc_conns.clone()));
        let tls = self.grpc_tls.clone();
        let threads = config.grpc_threads;
        tasks.spawn(async move {
            let serving = crate::grpc::serve(
                listener,
                lifecycle,
                envoy,
                v1,
                crate::grpc::Port {
                    table,
                    tls,
                    threads,
                },
                std::future::pending(),
            );
            if let Err(e) = serving.await {
                tracing::error!(target: LOG, error = %e, "gRPC server failed");
            }
        });
    }

    /// Serves HTTP until `leave` completes and in-flight requests have drained.
    pub(super) async fn serve_http(
        self,
        config: &NodeConfig,
        state: AppState,
        leave: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        crate::listen::serve(
            "HTTP",
            self.http,
            move || http::serve::HttpConnections(http::service(state.for_runtime())),
            config.http_threads,
            Arc::new(ConnTable::new(config.http_limits, self.conns)),
            self.http_tls,
            leave,
        )
        .await
        .map_err(NodeError::Serve)
    }
}

/// The one check service and the admin side, as the HTTP edge's state.
pub(super) fn front_door(
    config: &NodeConfig,
    trust: &Trust,
    local: &LocalState,
    members: &Members,
    peers: &Peering,
    lifecycle: &Arc<Lifecycle>,
    metrics: Arc<Metrics>,
) -> AppState {
    let service = Arc::new(CheckService::new(
        local.local.clone(),
        peers.router.clone(),
        metrics.clone(),
        local.top.clone(),
    ));
    // Checks on the peer port go through the same front door as every edge's.
    peers.server.send_checks_to(service.clone());
    let admin = Arc::new(Admin::new(admin::Parts {
        local: local.local.clone(),
        router: peers.router.clone(),
        pool: peers.pool.clone(),
        metrics,
        rules: local.rules.clone(),
        cluster_id: Arc::from(config.cluster_id.as_str()),
        book: local.book.clone(),
        handed_over: peers.handed_over.clone(),
        top: local.top.clone(),
        durable: local.durable_stats.clone(),
        view_updates: members.membership.updates(),
        regions: local.regions.clone(),
    }));
    AppState::new(http::Shared {
        service,
        admin,
        lifecycle: lifecycle.clone(),
        admin_tokens: Some(trust.tokens.clone()),
        body_timeout: config.http_limits.body_timeout,
        trusted_proxies: Arc::new(config.trusted_proxies.clone()),
    })
}

/// Serves the peer port: members' frames, relayed checks and SDK checks.
pub(super) fn serve_peer_port(
    server: &Arc<PeerServer>,
    peer: PeerListener,
    tasks: &mut JoinSet<()>,
) {
    match peer {
        PeerListener::Tcp(l) => tasks.spawn(server.clone().run(l)),
        PeerListener::Memory(l) => tasks.spawn(server.clone().run(l)),
    };
}

/// Descriptors beyond the HTTP connections: peers, gossip relays, listeners, files.
const SPARE_FILES: u64 = 1_024;

/// Raises the open-files limit to what the HTTP connection cap needs (up to the hard limit): with
/// the usual soft limit of 1024, a node capped at 10,000 connections ran out of descriptors long
/// before the cap, and then could not accept even its peers. Says so when the hard limit is lower.
pub(super) fn raise_open_files(config: &NodeConfig) {
    let grpc = match config.grpc_addr {
        Some(_) => config.grpc_limits.max_connections,
        None => 0,
    };
    let max_connections = config.http_limits.max_connections.saturating_add(grpc);
    let wanted = (max_connections as u64).saturating_add(SPARE_FILES);
    match rlimit::increase_nofile_limit(wanted) {
        Ok(got) if got < wanted => tracing::warn!(
            target: LOG,
            open_files = got,
            wanted,
            "the open-files limit is below --http-max-connections (plus --grpc-max-connections) plus spare: connections beyond it are refused by the system; raise `ulimit -n` (or the pod's limit) or lower the cap"
        ),
        Ok(got) => tracing::debug!(target: LOG, open_files = got, "open-files limit"),
        Err(e) => {
            tracing::warn!(target: LOG, error = %e, "cannot read or raise the open-files limit")
        }
    }
}
