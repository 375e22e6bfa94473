//! Where a node serves: sockets bound before [`run`](super::run) ([`Listeners`]), or an
//! in-memory network ([`MemoryNet`]), turned into the same [`Endpoints`] either way.

use super::NodeError;
use crate::cluster::transport::PeerTransport;
use crate::config::NodeConfig;
use crate::listen::stream::Listener;
use crate::metrics::GossipStats;
use chitchat::transport::{ChannelTransport, Transport};
use ringlimit_core::link::dial::Dial;
use ringlimit_core::link::memnet::{MemListener, MemNet};
use ringlimit_core::tls::PeerTls;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, UdpSocket};

/// The sockets a node serves on, bound before [`run`](super::run) so that tests can use port 0.
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
pub(super) enum PeerListener {
    Tcp(TcpListener),
    Memory(MemListener),
}

/// What [`run`](super::run) serves on, whichever the network.
pub(super) struct Endpoints {
    pub(super) http: Listener,
    pub(super) http_addr: SocketAddr,
    pub(super) peer: PeerListener,
    pub(super) peer_addr: SocketAddr,
    pub(super) grpc: Option<Listener>,
    pub(super) grpc_addr: Option<SocketAddr>,
    pub(super) gossip: Box<dyn Transport>,
    /// The gossip socket's counts (none in memory).
    pub(super) gossip_stats: Arc<GossipStats>,
    pub(super) dialer: Arc<dyn Dial>,
}

impl Endpoints {
    /// `peer_tls`: the peer link's streams are dialled inside mutual TLS.
    pub(super) fn new(
        bound: Bound,
        config: &NodeConfig,
        peer_tls: Option<&PeerTls>,
    ) -> Result<Self, NodeError> {
        let gossip_stats = Arc::new(GossipStats::default());
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
                    gossip_stats,
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
                gossip_stats,
                dialer: m.net.links.dialer(&m.peer_addr.to_string()),
            },
        };
        if let Some(tls) = peer_tls {
            endpoints.dialer = tls.dialer(endpoints.dialer);
        }
        Ok(endpoints)
    }
}
