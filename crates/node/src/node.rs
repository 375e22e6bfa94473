//! Wiring: one node is an engine, gossip membership, its peers (facade and server), the check
//! service and its HTTP edge, run until shutdown — on sockets it bound ([`Listeners`]) or on
//! an in-memory network ([`MemoryNet`], for whole nodes in tests).

use crate::admin::tokens::TokenBook;
use crate::admin::{self, Admin};
use crate::cluster::membership::{GossipError, GossipSettings};
use crate::cluster::transport::PeerTransport;
use crate::cluster::{MemberState, Membership};
use crate::config::{NodeConfig, PeerSecurity};
use crate::global::{self, GlobalCounters, PublishSettings};
use crate::http::{self, AppState};
use crate::lifecycle::Lifecycle;
use crate::listen::stream::Listener;
use crate::listen::tls::ServerTls;
use crate::local::Local;
use crate::metrics::{ConnCollector, GossipCollector, Metrics, Server};
use crate::peers::{Cluster, PeerServer, Peers, Recall, ServerSettings};
use crate::routing::Router;
use crate::rules::book::RuleBook;
use crate::rules::reload::{ReloadCollector, Reloaded, RulesStatus};
use crate::rules::sync::Synced;
use crate::service::CheckService;
use chitchat::transport::{ChannelTransport, Transport};
use ringlimit_core::clock::SystemClock;
use ringlimit_core::link::PeerSettings;
use ringlimit_core::link::dial::Dial;
use ringlimit_core::link::memnet::{MemListener, MemNet};
use ringlimit_core::tls::PeerTls;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;

/// The sockets a node serves on, bound before [`run`] so that tests can use port 0.
#[derive(Debug)]
pub struct Listeners {
    pub http: TcpListener,
    /// Peer RPC (TCP) and gossip (UDP) share one port number.
    pub peer: TcpListener,
    pub gossip: UdpSocket,
    /// gRPC (`--grpc`), when configured.
    pub grpc: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses of `config`. With peer port 0, picks a port free for TCP and UDP.
    pub async fn bind(config: &NodeConfig) -> Result<Self, NodeError> {
        let bind_err = |what, addr, source| NodeError::Bind { what, addr, source };
        let http = TcpListener::bind(config.http_addr)
            .await
            .map_err(|e| bind_err("HTTP", config.http_addr, e))?;
        let mut attempts = 0;
        let (peer, gossip) = loop {
            let peer = TcpListener::bind(config.peer_addr)
                .await
                .map_err(|e| bind_err("peer (TCP)", config.peer_addr, e))?;
            let addr = peer
                .local_addr()
                .map_err(|e| bind_err("peer (TCP)", config.peer_addr, e))?;
            match UdpSocket::bind(addr).await {
                Ok(udp) => break (peer, udp),
                // Port 0 gave a TCP port whose UDP twin is taken: try another.
                Err(_) if config.peer_addr.port() == 0 && attempts < 50 => attempts += 1,
                Err(e) => return Err(bind_err("peer (UDP)", addr, e)),
            }
        };
        let grpc = match config.grpc_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| bind_err("gRPC", addr, e))?,
            ),
            None => None,
        };
        Ok(Self {
            http,
            peer,
            gossip,
            grpc,
        })
    }

    /// The HTTP address actually bound.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }

    /// The gRPC address actually bound, if any.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The peer address actually bound.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.local_addr().ok()
    }
}

/// An in-memory network whole nodes run on (tests): gossip over chitchat's `ChannelTransport`
/// (which can cut links: `remove_link`/`add_link`), peer RPC, HTTP and gRPC over memnet (cut,
/// stall, drop). Addresses are the configured ones, as text. Clones share the network.
///
/// chitchat 0.13 keeps its envelope encoding to itself and `ChannelTransport` carries decoded
/// envelopes, so the gossip MAC ([`crate::cluster::transport`]) has no bytes to seal here: in
/// memory, gossip runs without it (and without the lone-node refusal); peer RPC's handshake
/// and its MAC run as on sockets.
#[derive(Clone, Default)]
pub struct MemoryNet {
    pub gossip: ChannelTransport,
    pub links: MemNet,
}

impl MemoryNet {
    /// Listens on `config`'s addresses, which must be given (no port 0 in memory).
    pub fn listen(&self, config: &NodeConfig) -> MemoryListeners {
        MemoryListeners {
            net: self.clone(),
            http: self.links.listen(&config.http_addr.to_string()),
            peer: self.links.listen(&config.peer_addr.to_string()),
            grpc: config
                .grpc_addr
                .map(|addr| self.links.listen(&addr.to_string())),
            http_addr: config.http_addr,
            peer_addr: config.peer_addr,
        }
    }
}

/// A node's listeners on a [`MemoryNet`].
pub struct MemoryListeners {
    net: MemoryNet,
    http: MemListener,
    peer: MemListener,
    grpc: Option<MemListener>,
    http_addr: SocketAddr,
    peer_addr: SocketAddr,
}

/// Where a node serves: sockets it bound, or an in-memory network.
pub enum Bound {
    Sockets(Listeners),
    Memory(MemoryListeners),
}

impl From<Listeners> for Bound {
    fn from(l: Listeners) -> Self {
        Bound::Sockets(l)
    }
}

impl From<MemoryListeners> for Bound {
    fn from(l: MemoryListeners) -> Self {
        Bound::Memory(l)
    }
}

/// The peer port's listener.
enum PeerListener {
    Tcp(TcpListener),
    Memory(MemListener),
}

/// What [`run`] serves on, whichever the network.
struct Endpoints {
    http: Listener,
    http_addr: SocketAddr,
    peer: PeerListener,
    peer_addr: SocketAddr,
    grpc: Option<Listener>,
    grpc_addr: Option<SocketAddr>,
    gossip: Box<dyn Transport>,
    dialer: Arc<dyn Dial>,
}

impl Endpoints {
    /// `peer_tls`: the peer link's streams are dialled inside mutual TLS.
    fn new(
        bound: Bound,
        config: &NodeConfig,
        gossip_stats: &Arc<crate::metrics::GossipStats>,
        peer_tls: Option<&PeerTls>,
    ) -> Result<Self, NodeError> {
        let mut endpoints = match bound {
            Bound::Sockets(l) => {
                let security = config.peer_security()?;
                Endpoints {
                    http_addr: l.http_addr().unwrap_or(config.http_addr),
                    peer_addr: l.peer_addr().unwrap_or(config.peer_addr),
                    grpc_addr: l.grpc_addr(),
                    http: Listener::Tcp(l.http),
                    peer: PeerListener::Tcp(l.peer),
                    grpc: l.grpc.map(Listener::Tcp),
                    gossip: Box::new(
                        PeerTransport::new(l.gossip, security.secret(), gossip_stats.clone())
                            .accepting_members(security.accepts_members())
                            .with_blocklist(config.gossip_blocklist.clone()),
                    ),
                    dialer: ringlimit_core::link::dial::tcp(),
                }
            }
            Bound::Memory(m) => Endpoints {
                http: Listener::Memory(m.http),
                http_addr: m.http_addr,
                peer: PeerListener::Memory(m.peer),
                peer_addr: m.peer_addr,
                grpc_addr: m.grpc.as_ref().and(config.grpc_addr),
                grpc: m.grpc.map(Listener::Memory),
                gossip: Box::new(m.net.gossip.clone()),
                dialer: m.net.links.dialer(&m.peer_addr.to_string()),
            },
        };
        if let Some(tls) = peer_tls {
            endpoints.dialer = tls.dialer(endpoints.dialer);
        }
        Ok(endpoints)
    }
}

/// Why a node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot bind the {what} address {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot resolve the advertise address {addr:?}: {reason}")]
    Advertise { addr: String, reason: String },
    #[error(transparent)]
    Gossip(#[from] GossipError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("--data-dir: {0}")]
    DataDir(String),
    #[error("--admin-tokens: {0}")]
    AdminTokens(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Runs a node until `shutdown` completes: then announces `leaving`, keeps serving for the
/// leave delay, drains in-flight requests and returns. Dropping the returned future instead
/// stops every task it started except HTTP connections already accepted.
pub async fn run(
    config: NodeConfig,
    listeners: impl Into<Bound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let clock: Arc<dyn ringlimit_core::clock::Clock> = config
        .clock
        .as_ref()
        .map_or_else(|| Arc::new(SystemClock::new()) as _, |c| c.0.clone());
    let in_force = Arc::new(crate::rules::InForce::new(config.rules.clone()));
    let security = config.peer_security()?;
    let secret = security.secret();
    // Certificates are loaded (again: `into_config` checked them) before anything is served.
    let http_cert = config.load_tls()?.map(Arc::new);
    let peer_tls = config.load_peer_tls()?;
    let server_tls = |alpn, limits: &crate::config::ConnLimits| {
        http_cert
            .clone()
            .map(|cert| ServerTls::new(cert, alpn, limits))
            .transpose()
            .map_err(|source| crate::config::ConfigError::Tls {
                flags: crate::config::TLS_FLAGS,
                source,
            })
    };
    let http_tls = server_tls(ringlimit_core::tls::http::HTTP_ALPN, &config.http_limits)?;
    let grpc_tls = server_tls(ringlimit_core::tls::http::GRPC_ALPN, &config.grpc_limits)?;
    match (&security, &peer_tls) {
        (PeerSecurity::Secret(_), _) => {}
        (PeerSecurity::Open, None) => tracing::warn!(
            "--allow-unauthenticated-peers without RINGLIMIT_CLUSTER_SECRET: anyone who can \
             reach the peer port can join the cluster and change its rules and buckets"
        ),
        (PeerSecurity::Open, Some(_)) => tracing::warn!(
            "--allow-unauthenticated-peers without RINGLIMIT_CLUSTER_SECRET: peer RPC takes only \
             certificates of --peer-tls-ca, but gossip is open: anyone who can reach the peer \
             port can announce members (whose keys then fail open, as no one can reach them)"
        ),
        (PeerSecurity::LoneNode, None) => tracing::info!(
            "RINGLIMIT_CLUSTER_SECRET is not set: running as a lone node that accepts no other \
             members (set the same secret on every node to form a cluster)"
        ),
        (PeerSecurity::LoneNode, Some(_)) => tracing::info!(
            "RINGLIMIT_CLUSTER_SECRET is not set: peer RPC takes certificates of --peer-tls-ca, \
             but gossip from other nodes is dropped, so this node stays alone (set the same \
             secret on every node to form a cluster)"
        ),
    }
    raise_open_files(config.http_limits.max_connections.saturating_add(
        if config.grpc_addr.is_some() {
            config.grpc_limits.max_connections
        } else {
            0
        },
    ));
    if let Some(dir) = &config.data_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| NodeError::DataDir(format!("cannot create {}: {e}", dir.display())))?;
    }
    // The file's rules and the admin API's (those kept under --data-dir go in force now).
    let book = Arc::new(
        RuleBook::open(in_force.clone(), &config.node_id, config.data_dir.clone())
            .map_err(|e| NodeError::DataDir(e.to_string()))?,
    );
    let admin_tokens = Arc::new(
        TokenBook::open(config.admin_tokens.clone(), config.admin_token.clone())
            .map_err(|e| NodeError::AdminTokens(e.to_string()))?
            .with_client_token(config.client_token.clone()),
    );
    let gossip_stats = Arc::new(crate::metrics::GossipStats::default());
    let listeners = Endpoints::new(listeners.into(), &config, &gossip_stats, peer_tls.as_ref())?;
    let (http_addr, peer_addr) = (listeners.http_addr, listeners.peer_addr);
    let advertise_text =
        if config.advertise.is_empty() || config.advertise == config.peer_addr.to_string() {
            peer_addr.to_string()
        } else {
            config.advertise.clone()
        };
    let advertise = resolve(&advertise_text).await?;
    let http_advertise = if http_addr.ip().is_unspecified() {
        SocketAddr::new(advertise.ip(), http_addr.port()).to_string()
    } else {
        http_addr.to_string()
    };

    crate::cluster::seeds::wait_for_names(&config.seeds, config.seed_wait).await;
    let membership = Membership::start(
        GossipSettings {
            node_id: config.node_id.clone(),
            cluster_id: config.cluster_id.clone(),
            advertise,
            http_advertise: http_advertise.clone(),
            seeds: config.seeds.clone(),
            interval: config.gossip_interval,
            joining: needs_peers(&config.seeds, &advertise_text, advertise),
        },
        listeners.gossip.as_ref(),
        config.pauses.clone().unwrap_or_else(|| {
            Arc::new(crate::cluster::pause::Pauses::new(config.gossip_interval))
        }),
    )
    .await?;
    let membership = Arc::new(membership);
    // Global rules: counters keyed by this incarnation, fed by what peers push.
    let self_gossip_id = membership.chitchat_id();
    // Every member's clock offset, and the cluster clock global windows are numbered on.
    let clocks = Arc::new(crate::cluster::clock::Clocks::new(config.max_clock_offset));
    let global = Arc::new(
        GlobalCounters::new(
            global::actor(&self_gossip_id.node_id, self_gossip_id.generation_id),
            config.global_max_counters,
        )
        .with_clocks(clocks.clone()),
    );
    let mut metrics = Metrics::new();
    let local = Arc::new(
        Local::new(in_force, clock, config.max_keys, global.clone())
            .with_max_reservation_ttl_ms(config.max_reservation_ttl_ms),
    );
    let peer_settings = PeerSettings {
        dialer: listeners.dialer.clone(),
        node_id: config.node_id.clone(),
        cluster_id: config.cluster_id.clone(),
        secret: secret.clone(),
        client_token: None,
        deadline: config.forward_timeout,
        connect_timeout: Duration::from_millis(500),
        open_for: Duration::from_secs(1),
        queue: 8192,
    };
    let pool = Arc::new(Peers::new(peer_settings));
    let pusher = global::push::Pusher::new(
        pool.sessions(),
        self_gossip_id.generation_id,
        global.clone(),
    )
    .with_blocklist(config.gossip_blocklist.clone());
    let view = membership.view_cell();
    let probe = crate::peers::reach::probe(pool.clone(), view.clone(), membership.pauses().clone());
    let recall = Recall::spawn(local.clone(), view.clone(), pool.clone(), config.replicas);
    // The keys checks limited most, counted by the check service, asked by the admin API.
    let top = Arc::new(ringlimit_core::top::TopKeys::default());
    // Envoy RLQS streams served here, and the shares of the buckets this node owns.
    let rlqs_status = Arc::new(RulesStatus::new(config.rlqs_path.clone()));
    if config.rlqs_path.is_none() {
        rlqs_status.generation.store(0, Ordering::Relaxed);
    }
    let rlqs = Arc::new(crate::rlqs::Rlqs::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(config.rlqs_config.clone())),
        local.clone(),
    ));
    let server = PeerServer::new(
        local.clone(),
        ServerSettings {
            node_id: config.node_id.clone(),
            cluster_id: config.cluster_id.clone(),
            secret,
            // A certificate of the cluster CA makes a member, as the secret does.
            accept_members: security.accepts_members() || peer_tls.is_some(),
            handshake_timeout: Duration::from_secs(2),
            tls: peer_tls.clone(),
            clients: admin_tokens.clone(),
        },
        Some(Cluster {
            view: view.clone(),
            recall: recall.clone(),
        }),
    )
    .with_operators(crate::peers::server::Operators {
        book: book.clone(),
        top: top.clone(),
        quota: Some(rlqs.owner.clone()),
    });
    let conns = Arc::new(crate::metrics::ConnStats::default());
    let grpc_conns = Arc::new(crate::metrics::ConnStats::default());
    let rules = Arc::new(RulesStatus::new(config.rules_path.clone()));
    let envoy_status = Arc::new(RulesStatus::new(config.envoy_path.clone()));
    if config.envoy_path.is_none() {
        envoy_status.generation.store(0, Ordering::Relaxed);
    }
    let envoy = Arc::new(arc_swap::ArcSwap::from_pointee(config.envoy_config.clone()));
    let router = Arc::new(
        Router::new(
            local.clone(),
            view.clone(),
            pool.shared(),
            metrics.peer_rpc(),
        )
        .with_replicas(config.replicas)
        .with_recall(recall.clone()),
    );
    let hot_keys = router.stats.hot.clone();
    let handed_over = Arc::new(AtomicU64::new(0));
    // Each subsystem's counters, read at scrape time.
    metrics.register(crate::local::owned::OwnedCollector(local.owned().clone()));
    metrics.register(crate::local::copies::CopiesCollector(
        local.copies().clone(),
    ));
    metrics.register(crate::routing::metrics::RoutingCollector(router.clone()));
    metrics.register(crate::peers::metrics::PeersCollector {
        peers: pool.clone(),
        server: server.stats.clone(),
        handed_over: handed_over.clone(),
        recall: recall.stats.clone(),
    });
    let view_cell = view.clone();
    metrics.register(crate::cluster::metrics::MembersCollector(view.clone()));
    metrics.register(crate::cluster::metrics::PausesCollector(
        membership.pauses().clone(),
    ));
    let replica_stats = Arc::new(crate::replicas::ReplicaStats::default());
    metrics.register(crate::replicas::ReplicaCollector {
        stats: replica_stats.clone(),
    });
    let lease_stats = Arc::new(ringlimit_core::lease::asking::LeaseStats::default());
    metrics.register(crate::local::leases::LeaseCollector {
        leases: local.leases().clone(),
        clock: local.clock().clone(),
        stats: lease_stats.clone(),
    });
    metrics.register(crate::local::reservations::ReservationCollector(
        local.reservations().clone(),
    ));
    metrics.register(crate::global::metrics::GlobalCollector(global.clone()));
    metrics.register(GossipCollector(gossip_stats));
    metrics.register(ConnCollector {
        stats: conns.clone(),
        server: Server::Http,
    });
    metrics.register(ConnCollector {
        stats: grpc_conns.clone(),
        server: Server::Grpc,
    });
    metrics.register(crate::rules::book::BookCollector(book.clone()));
    let watched: Vec<_> = http_cert
        .iter()
        .map(|c| ("http", c.clone()))
        .chain(peer_tls.iter().map(|t| ("peer", t.cert().clone())))
        .collect();
    metrics.register(crate::metrics::TlsCollector {
        http: conns.clone(),
        grpc: grpc_conns.clone(),
        certs: watched.clone(),
    });
    metrics.register(ReloadCollector {
        status: rules.clone(),
        of: Reloaded::Rules,
    });
    metrics.register(ReloadCollector {
        status: envoy_status.clone(),
        of: Reloaded::Envoy,
    });
    metrics.register(ReloadCollector {
        status: rlqs_status.clone(),
        of: Reloaded::Rlqs,
    });
    metrics.register(crate::rlqs::metrics::RlqsCollector(rlqs.clone()));
    metrics.register(crate::cluster::clock::ClockCollector(clocks.clone()));
    metrics.register(crate::admin::top_keys::TopCollector {
        top: top.clone(),
        local: local.clone(),
    });
    let lifecycle = Arc::new(Lifecycle::new(
        local.clone(),
        pool.clone(),
        handed_over.clone(),
        config.replicas,
    ));
    metrics.register(crate::lifecycle::ReadyCollector(lifecycle.clone()));
    let metrics = Arc::new(metrics);
    let service = Arc::new(CheckService::new(
        local.clone(),
        router.clone(),
        metrics.clone(),
        top.clone(),
    ));
    // Checks on the peer port go through the same front door as every edge's.
    let server = Arc::new(server.with_checks(service.clone()));
    let admin = Arc::new(Admin::new(admin::Parts {
        local: local.clone(),
        router,
        pool: pool.clone(),
        metrics,
        rules: rules.clone(),
        cluster_id: Arc::from(config.cluster_id.as_str()),
        book: book.clone(),
        handed_over,
        top,
    }));
    let mut tasks = JoinSet::new();
    tasks.spawn(probe);
    tasks.spawn(crate::peers::clocks::measure(
        crate::peers::clocks::Measure {
            peers: pool.clone(),
            view: view.clone(),
            clocks: clocks.clone(),
            clock: local.clock().clone(),
        },
    ));
    tasks.spawn(hot_keys.run(local.leases().held().clone()));
    tasks.spawn(rlqs.clone().run(pool.clone(), view_cell.clone()));
    tasks.spawn(crate::local::reservations::upkeep(
        local.reservations().clone(),
        local.clock().clone(),
    ));
    tasks.spawn(
        crate::leases::Asking {
            local: local.clone(),
            peers: pool.clone(),
            view: view_cell.clone(),
            stats: lease_stats,
        }
        .run(),
    );
    tasks.spawn(
        crate::replicas::handback::HandBack {
            copies: local.copies().clone(),
            peers: pool.clone(),
            view: view_cell.clone(),
        }
        .run(),
    );
    tasks.spawn(
        crate::replicas::sender::Sender {
            owned: local.owned().clone(),
            peers: pool,
            view: view_cell.clone(),
            replicas: config.replicas,
            flush: config.replica_flush,
            stats: replica_stats,
        }
        .run(),
    );
    match listeners.peer {
        PeerListener::Tcp(l) => tasks.spawn(server.run(l)),
        PeerListener::Memory(l) => tasks.spawn(server.run(l)),
    };
    // Stopped apart from the other tasks: once HTTP has drained, it sends peers the last counts.
    // (A set of its own, so that it too is aborted if this future is dropped.)
    let (stop_publishing, publishing_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut publishing = JoinSet::new();
    publishing.spawn(global::publish::publish_loop(
        membership.view_cell(),
        global.clone(),
        local.clock().clone(),
        PublishSettings {
            interval: config.global_publish,
            max_published: config.global_max_published,
            gossip_budget: config.global_gossip_budget,
        },
        pusher,
        async move {
            let _ = publishing_stopped.await;
        },
    ));
    let rules_synced = Arc::new(Synced::default());
    tasks.spawn(crate::rules::sync::run(
        membership.chitchat(),
        membership.chitchat_id(),
        book.clone(),
        rules_synced.clone(),
        config.gossip_interval,
    ));
    tasks.spawn(track_view(
        membership.clone(),
        lifecycle.clone(),
        recall,
        needs_peers(&config.seeds, &advertise_text, advertise),
        Readiness {
            grace: config.gossip_interval * 20,
            settle: config.gossip_interval * 3,
            rules: rules_synced,
            global,
        },
    ));
    if config.admin_tokens.is_some() {
        tasks.spawn(admin_tokens.clone().watch(config.rules_poll));
    }
    for (_, cert) in watched {
        tasks.spawn(cert.watch(config.rules_poll));
    }
    if rules.source.is_some() {
        tasks.spawn(crate::rules::reload::watch(
            book.clone(),
            rules.clone(),
            config.rules_poll,
        ));
    }
    if rlqs_status.source.is_some() && listeners.grpc.is_some() {
        tasks.spawn(crate::rlqs::reload::watch_rlqs(
            rlqs.config.clone(),
            rlqs_status,
            config.rules_poll,
        ));
    }
    if envoy_status.source.is_some() && listeners.grpc.is_some() {
        tasks.spawn(crate::rules::reload::watch_envoy(
            envoy.clone(),
            envoy_status,
            config.rules_poll,
        ));
    }

    let state = AppState::new(http::Shared {
        service,
        admin,
        lifecycle: lifecycle.clone(),
        admin_tokens: Some(admin_tokens.clone()),
        body_timeout: config.http_limits.body_timeout,
        trusted_proxies: Arc::new(config.trusted_proxies.clone()),
    });
    tracing::info!(
        node_id = %config.node_id,
        http = %http_addr,
        peer = %peer_addr,
        advertise = %advertise_text,
        seeds = ?config.seeds,
        rules = config.rules.len(),
        max_keys = config.max_keys,
        admin_api = admin_tokens.enabled(),
        client_credentials = admin_tokens.tokens().client_keys().len(),
        tls = http_cert.is_some(),
        peer_tls = peer_tls.is_some(),
        "ringlimit node serving"
    );
    if let Some(listener) = listeners.grpc {
        let grpc_addr = listeners.grpc_addr;
        let (service, lifecycle, rlqs) = (state.service.clone(), lifecycle.clone(), rlqs.clone());
        tracing::info!(grpc = ?grpc_addr, "gRPC serving (Envoy rate limit and quota services, health)");
        let table = Arc::new(crate::listen::conns::ConnTable::new(
            config.grpc_limits,
            grpc_conns,
        ));
        // Stopped with the node's other tasks once HTTP has drained.
        tasks.spawn(async move {
            if let Err(e) = crate::grpc::serve(
                listener,
                service,
                lifecycle,
                crate::grpc::EnvoyServices { rls: envoy, rlqs },
                table,
                grpc_tls,
                std::future::pending(),
            )
            .await
            {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
    }
    let leaving = membership.clone();
    let leave_delay = config.leave_delay;
    let result = crate::listen::serve(
        "HTTP",
        listeners.http,
        move || http::serve::HttpConnections(http::service(state.for_runtime())),
        config.http_threads,
        std::sync::Arc::new(crate::listen::conns::ConnTable::new(
            config.http_limits,
            conns,
        )),
        http_tls,
        async move {
            shutdown.await;
            // Envoys fall back and find another node before this one leaves.
            rlqs.stop();
            lifecycle.set_ready(false);
            tracing::info!(delay = ?leave_delay, "leaving the cluster: peers stop routing here");
            leaving.leave().await;
            // Keep answering while peers learn that we leave and move our keys.
            tokio::time::sleep(leave_delay).await;
            tracing::info!("draining in-flight requests");
        },
    )
    .await
    .map_err(NodeError::Serve);
    let _ = stop_publishing.send(());
    let flush_within = global::publish::FLUSH_WITHIN + Duration::from_millis(100);
    if tokio::time::timeout(flush_within, publishing.join_next())
        .await
        .is_err()
    {
        tracing::warn!("last global counts not sent in time");
    }
    tasks.abort_all();
    membership.shutdown();
    tracing::info!("ringlimit node stopped");
    result
}

/// Whether this node must hear from another member before it is ready: it was given seeds
/// other than itself.
fn needs_peers(seeds: &[String], advertise_text: &str, advertise: SocketAddr) -> bool {
    seeds
        .iter()
        .any(|s| s != advertise_text && s.parse::<SocketAddr>().ok() != Some(advertise))
}

/// How long a node with seeds waits before it is ready.
struct Readiness {
    /// With no other member seen by then, this node forms the cluster alone (as the first pod
    /// of a fresh StatefulSet must).
    grace: Duration,
    /// Once another member is seen, how long membership must stay unchanged: a node that has
    /// heard from one peer may not know the others yet, and until it does it would decide their
    /// keys itself (seen in the rolling-restart test as over-admission).
    settle: Duration,
    /// Set once the admin API's rules were merged from peers: a node that joins has every rule
    /// before it answers checks.
    rules: Arc<Synced>,
    /// A node that joins waits for the full set of global counts of every alive peer, so that
    /// once ready it counts what the cluster admitted before it came (its own previous life's
    /// included): a rolling restart that waits for readiness loses no global counts.
    global: Arc<GlobalCounters>,
}

/// Keeps the peer clients in step with membership, hands buckets over when the ring changes,
/// and sets readiness: at once for a lone node; with seeds, once another member is
/// seen and membership has settled, or after the grace period.
async fn track_view(
    membership: Arc<Membership>,
    lifecycle: Arc<Lifecycle>,
    recall: Arc<Recall>,
    needs_peers: bool,
    readiness: Readiness,
) {
    let mut updates = membership.updates();
    let deadline = tokio::time::Instant::now() + readiness.grace;
    let mut changed_at = tokio::time::Instant::now();
    let mut ring_members: Vec<Arc<str>> = Vec::new();
    // Readiness is granted once; only shutdown takes it back, and a later view change (such as
    // this node's own `leaving`) must not grant it again.
    let mut became_ready = false;
    loop {
        let view = updates.borrow_and_update().clone();
        lifecycle.follow_members(&view);
        let now = tokio::time::Instant::now();
        if view.ring.members() != ring_members.as_slice() {
            let joined: Vec<Arc<str>> = view
                .ring
                .members()
                .iter()
                .filter(|m| !ring_members.contains(m))
                .cloned()
                .collect();
            ring_members = view.ring.members().to_vec();
            changed_at = now;
            // Ownership moved: copies of buckets this node now owns become its own (at once,
            // before anything else here waits), then the buckets that moved away go to their
            // new owners.
            lifecycle.promote(&view);
            let (lifecycle, view) = (lifecycle.clone(), view.clone());
            tokio::spawn(async move { lifecycle.hand_over(&view, &joined).await });
        }
        let settled_at = changed_at + readiness.settle;
        // Members that are joining count: at a cluster's start every member joins at once.
        let has_peers = view.members.iter().any(|m| {
            *m.node_id != *view.self_id
                && matches!(m.state, MemberState::Alive | MemberState::Joining)
        });
        let counts_heard = view.members.iter().all(|m| {
            *m.node_id == *view.self_id
                || m.state != MemberState::Alive
                || readiness.global.has_full_set(&m.node_id)
        });
        let settled = has_peers && now >= settled_at && readiness.rules.get() && counts_heard;
        if !became_ready && (!needs_peers || settled || now >= deadline) {
            tracing::info!(members = view.ring.len(), "node ready");
            lifecycle.set_ready(true);
            recall.ready();
            membership.announce_ready().await;
            became_ready = true;
        }
        let wait = if became_ready {
            updates.changed().await.map_err(|_| ())
        } else {
            let wake = if has_peers {
                // Settled, waiting for the rules or peers' counts: look again shortly.
                settled_at
                    .max(now + Duration::from_millis(20))
                    .min(deadline)
            } else {
                deadline
            };
            match tokio::time::timeout_at(wake, updates.changed()).await {
                Ok(r) => r.map_err(|_| ()),
                Err(_) => Ok(()),
            }
        };
        if wait.is_err() {
            return;
        }
    }
}

/// Descriptors beyond the HTTP connections: peers, gossip relays, listeners, files.
const SPARE_FILES: u64 = 1_024;

/// Raises the open-files limit to what the HTTP connection cap needs (up to the hard limit): with
/// the usual soft limit of 1024, a node capped at 10,000 connections ran out of descriptors long
/// before the cap, and then could not accept even its peers. Says so when the hard limit is lower.
fn raise_open_files(max_connections: usize) {
    let wanted = (max_connections as u64).saturating_add(SPARE_FILES);
    match rlimit::increase_nofile_limit(wanted) {
        Ok(got) if got < wanted => tracing::warn!(
            open_files = got,
            wanted,
            "the open-files limit is below --http-max-connections (plus --grpc-max-connections) plus spare: connections beyond it are refused by the system; raise `ulimit -n` (or the pod's limit) or lower the cap"
        ),
        Ok(got) => tracing::debug!(open_files = got, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-files limit"),
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, NodeError> {
    let err = |reason: String| NodeError::Advertise {
        addr: addr.to_owned(),
        reason,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("no address".into()))
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// The `/metrics` contract as a test: every family's `# HELP` and `# TYPE` line and every
/// series' name and labels, from a node that has done some work, must be those listed in
/// `metrics/names.txt` (a metric added is a line added there; none may change or go).
#[cfg(test)]
mod tests {
    use crate::testing::Cluster;
    use serde_json::json;
    use std::collections::BTreeSet;

    /// What the contract fixes of a `/metrics` text: descriptor lines whole, sample lines without
    /// their value.
    fn shape(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| *l != "# EOF")
            .map(|l| match l.strip_prefix('#') {
                Some(_) => l.to_owned(),
                None => l
                    .rsplit_once(' ')
                    .map_or(l, |(series, _)| series)
                    .to_owned(),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_names_types_and_help_stay_those_of_the_contract() {
        let c = Cluster::start(2, |_| {}).await;
        c.wait("n0 sees two", || async { c.alive("n0").await.len() == 2 })
            .await;
        c.wait("n0 measured n1's clock", || async {
            c.view("n0").await["clock"]["peers"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
        })
        .await;
        // Checks decided here and forwarded, single and batched, and one all-or-nothing request.
        for i in 0..8 {
            let key = format!("m:{i}");
            let r = c
                .check(
                    "n0",
                    &json!({ "key": key, "limit": 1, "period_ms": 60_000 }),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
        let batch = json!({ "checks": [
            { "key": "m:0", "limit": 1, "period_ms": 60_000 },
            { "key": "m:1", "limit": 1, "period_ms": 60_000 },
        ] });
        let r = c
            .http("n0", "POST", "/v1/check/batch", &batch.to_string())
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let r = c
            .http("n0", "POST", "/v1/check/all", &batch.to_string())
            .await;
        assert!(r.status == 200 || r.status == 429, "{}", r.body);

        let r = c.http("n0", "GET", "/metrics", "").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let got = shape(&r.body);
        let want: BTreeSet<String> = include_str!("metrics/names.txt")
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "missing from /metrics: {missing:#?}\nnot in names.txt: {extra:#?}"
        );
    }
}
