//! Gossip transport: chitchat on the node's UDP peer port, with an optional per-datagram MAC.
//!
//! chitchat has no authentication (only a magic number and the cluster id in SYN), and its
//! envelope serialization is private to the crate, so the MAC cannot be added around chitchat's
//! own encoding in place. Instead chitchat's stock UDP socket runs on a private loopback port
//! and this transport relays between it and the public peer port:
//!
//! ```text
//! chitchat ⇄ inner socket (127.0.0.1:x) ⇄ relay socket per peer R ⇄ public port ⇄ peer R
//! ```
//! Outgoing datagrams gain a 16-byte HMAC-SHA256 tag on their way out; incoming ones are
//! verified and stripped, and dropped before chitchat sees them when the tag is wrong, so a node
//! without the secret can neither join nor inject state. A relay socket exists only for peers
//! that have sent a valid datagram or that chitchat gossips to, so its number stays the size of
//! the cluster. Without a secret the same path runs with no tag. (anyhow appears here only
//! because chitchat's `Transport` trait uses it.)

use crate::metrics::GossipStats;
use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket as ChitchatUdp};
use parking_lot::Mutex;
use ringlimit_proto::auth;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;
/// Length of the tag appended to each datagram when a secret is set.
const TAG_LEN: usize = 16;
/// Bytes of received datagrams waiting for chitchat at most. chitchat reads its socket from
/// the loop that also applies what it read, under its lock, so a burst of large deltas from
/// several peers at once overflowed the kernel's receive buffer (212 KB by default), and the
/// datagrams lost included heartbeats: live nodes were declared dead (`bench/scale.sh`, 9 nodes
/// with 10,000 hot global keys). A task of its own now drains the port into this queue.
const MAX_QUEUED_BYTES: usize = 16 << 20;
/// Receive buffer asked of the kernel for the peer port (it grants at most `net.core.rmem_max`).
const RECV_BUFFER: usize = 4 << 20;
/// Most relays (distinct peer addresses) kept at once, far above any real cluster's size; beyond,
/// the least recently used relay is closed (a peer that comes back simply gets a new one).
const MAX_RELAYS: usize = 1024;

/// A test hook that simulates a network partition on the gossip path: datagrams to or from the
/// listed peer addresses are dropped, both ways, before chitchat or the MAC sees them. Peer RPC
/// (TCP) is untouched, so owner-mode forwarding still works across the "partition"; membership
/// is cut, and so are global counts (their pusher skips blocked peers). Settable at run time
/// through the `Arc` the test keeps (see `NodeConfig::gossip_blocklist`). Not part of the
/// product.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct GossipBlocklist(parking_lot::RwLock<std::collections::HashSet<SocketAddr>>);

impl GossipBlocklist {
    /// Drops gossip to and from `peer` from now on.
    pub fn block(&self, peer: SocketAddr) {
        self.0.write().insert(peer);
    }

    /// Lets all gossip through again.
    pub fn clear(&self) {
        self.0.write().clear();
    }

    /// Whether gossip (and global counts) to and from `peer` is dropped.
    pub fn blocks(&self, peer: &SocketAddr) -> bool {
        let set = self.0.read();
        !set.is_empty() && set.contains(peer)
    }
}

/// Hands chitchat the UDP peer socket the node bound (so tests can use port 0 and share the port
/// number with the peer TCP listener).
pub struct PeerTransport {
    socket: Mutex<Option<UdpSocket>>,
    secret: Option<Arc<[u8]>>,
    stats: Arc<GossipStats>,
    blocklist: Option<Arc<GossipBlocklist>>,
}

impl PeerTransport {
    pub fn new(socket: UdpSocket, secret: Option<Arc<[u8]>>, stats: Arc<GossipStats>) -> Self {
        Self {
            socket: Mutex::new(Some(socket)),
            secret,
            stats,
            blocklist: None,
        }
    }

    /// Test hook: see [`GossipBlocklist`].
    #[doc(hidden)]
    pub fn with_blocklist(mut self, blocklist: Option<Arc<GossipBlocklist>>) -> Self {
        self.blocklist = blocklist;
        self
    }
}

#[async_trait]
impl Transport for PeerTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let public = self
            .socket
            .lock()
            .take()
            .ok_or_else(|| anyhow::anyhow!("the gossip socket was already opened"))?;
        if let Err(e) = socket2::SockRef::from(&public).set_recv_buffer_size(RECV_BUFFER) {
            tracing::debug!(error = %e, "gossip receive buffer not enlarged");
        }
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let inner = ChitchatUdp::open(loopback).await?;
        let inner_addr = inner.local_addr()?;
        let public = Arc::new(public);
        let (tx, incoming) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        tasks.spawn(drain(
            public.clone(),
            tx,
            queued.clone(),
            self.stats.clone(),
        ));
        Ok(Box::new(RelaySocket {
            public,
            incoming,
            queued,
            inner,
            inner_addr,
            secret: self.secret.clone(),
            relays: HashMap::new(),
            by_relay_addr: HashMap::new(),
            tasks,
            clock: 0,
            stats: self.stats.clone(),
            blocklist: self.blocklist.clone(),
        }))
    }
}

struct Relay {
    socket: Arc<UdpSocket>,
    addr: SocketAddr,
    last_used: u64,
    task: tokio::task::AbortHandle,
}

/// Reads the public port as fast as datagrams come, queueing them for [`RelaySocket::recv`]
/// within [`MAX_QUEUED_BYTES`] (beyond, a datagram is dropped and counted, as the kernel would).
async fn drain(
    public: Arc<UdpSocket>,
    tx: tokio::sync::mpsc::UnboundedSender<(Vec<u8>, SocketAddr)>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    stats: Arc<GossipStats>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, from) = match public.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) if transient(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "gossip port unreadable");
                return;
            }
        };
        stats.received_bytes.fetch_add(n as u64, Ordering::Relaxed);
        stats.received_datagrams.fetch_add(1, Ordering::Relaxed);
        if queued.fetch_add(n, Ordering::AcqRel) + n > MAX_QUEUED_BYTES {
            queued.fetch_sub(n, Ordering::AcqRel);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if tx.send((buf[..n].to_vec(), from)).is_err() {
            return;
        }
    }
}

struct RelaySocket {
    public: Arc<UdpSocket>,
    /// Datagrams read from the public port by [`drain`], and their bytes.
    incoming: tokio::sync::mpsc::UnboundedReceiver<(Vec<u8>, SocketAddr)>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    inner: ChitchatUdp,
    inner_addr: SocketAddr,
    secret: Option<Arc<[u8]>>,
    /// Peer address → its relay (which chitchat sees as that peer).
    relays: HashMap<SocketAddr, Relay>,
    /// Relay socket address → peer address.
    by_relay_addr: HashMap<SocketAddr, SocketAddr>,
    /// Relay tasks (relay → public, tagging); dropped with the socket.
    tasks: JoinSet<()>,
    /// Uses so far: orders relays by recency for eviction.
    clock: u64,
    stats: Arc<GossipStats>,
    blocklist: Option<Arc<GossipBlocklist>>,
}

impl RelaySocket {
    fn blocked(&self, peer: &SocketAddr) -> bool {
        self.blocklist.as_ref().is_some_and(|b| b.blocks(peer))
    }

    /// The relay socket standing for `peer`, created on first use.
    async fn relay(&mut self, peer: SocketAddr) -> anyhow::Result<Arc<UdpSocket>> {
        self.clock += 1;
        if let Some(r) = self.relays.get_mut(&peer) {
            r.last_used = self.clock;
            return Ok(r.socket.clone());
        }
        if self.relays.len() >= MAX_RELAYS {
            self.evict_least_recent();
        }
        let relay = Arc::new(UdpSocket::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await?);
        relay.connect(self.inner_addr).await?;
        let relay_addr = relay.local_addr()?;
        // What chitchat sends to this relay goes out to the peer, tagged.
        let (public, secret, out) = (self.public.clone(), self.secret.clone(), relay.clone());
        let stats = self.stats.clone();
        let task = self.tasks.spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM + TAG_LEN];
            loop {
                let Ok(n) = out.recv(&mut buf[..MAX_DATAGRAM]).await else {
                    return;
                };
                let len = match &secret {
                    Some(s) => {
                        let tag = auth::datagram_tag(s, &buf[..n]);
                        buf[n..n + TAG_LEN].copy_from_slice(&tag);
                        n + TAG_LEN
                    }
                    None => n,
                };
                match public.send_to(&buf[..len], peer).await {
                    Ok(sent) => {
                        stats.sent_bytes.fetch_add(sent as u64, Ordering::Relaxed);
                        stats.sent_datagrams.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::trace!(%peer, error = %e, "gossip send failed"),
                }
            }
        });
        self.relays.insert(
            peer,
            Relay {
                socket: relay.clone(),
                addr: relay_addr,
                last_used: self.clock,
                task,
            },
        );
        self.by_relay_addr.insert(relay_addr, peer);
        // Reap finished tasks so the set does not grow with evictions.
        while self.tasks.try_join_next().is_some() {}
        Ok(relay)
    }

    /// Closes the relay used least recently (an O(n) scan, run only when the table is full).
    fn evict_least_recent(&mut self) {
        let Some(peer) = self
            .relays
            .iter()
            .min_by_key(|(_, r)| r.last_used)
            .map(|(p, _)| *p)
        else {
            return;
        };
        if let Some(r) = self.relays.remove(&peer) {
            r.task.abort();
            self.by_relay_addr.remove(&r.addr);
        }
    }
}

#[async_trait]
impl Socket for RelaySocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.public.local_addr()?)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if self.blocked(&to) {
            // Lost on the way, as in a real partition.
            return Ok(SendOutcome { num_bytes_sent: 0 });
        }
        let relay = self.relay(to).await?;
        let relay_addr = relay.local_addr()?;
        self.inner.send(relay_addr, envelope).await
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            // Hand chitchat what already passed the relay first (a cancelled recv may have left
            // one there), then read the public port.
            tokio::select! {
                biased;
                got = self.inner.recv() => {
                    let mut got = got?;
                    match self.by_relay_addr.get(&got.from_addr) {
                        Some(peer) => {
                            got.from_addr = *peer;
                            return Ok(got);
                        }
                        None => continue,
                    }
                }
                got = self.incoming.recv() => {
                    let Some((datagram, from)) = got else {
                        return Err(anyhow::anyhow!("the gossip port is closed"));
                    };
                    self.queued.fetch_sub(datagram.len(), Ordering::AcqRel);
                    if self.blocked(&from) {
                        continue;
                    }
                    let Some(len) = payload_len(self.secret.as_deref(), &datagram) else {
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%from, "gossip datagram without a valid tag dropped");
                        continue;
                    };
                    let Ok(relay) = self.relay(from).await else { continue };
                    let _ = relay.send(&datagram[..len]).await;
                }
            }
        }
    }
}

/// The length of the gossip message in `datagram` as it came off the wire: all of it without a
/// secret; with one, what precedes a valid tag, or `None` (dropped) when the tag is missing or
/// wrong.
pub fn payload_len(secret: Option<&[u8]>, datagram: &[u8]) -> Option<usize> {
    match secret {
        None => Some(datagram.len()),
        Some(secret) => {
            let len = datagram.len().checked_sub(TAG_LEN)?;
            let (payload, tag) = datagram.split_at(len);
            auth::verify_datagram(secret, payload, tag).then_some(len)
        }
    }
}

fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::OutOfMemory
    )
}
