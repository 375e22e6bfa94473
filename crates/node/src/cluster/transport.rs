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
//! Outgoing datagrams gain the sender's wall time (8 bytes, Unix ms) and a 16-byte HMAC-SHA256 tag
//! over both on their way out; incoming ones are verified and stripped, and dropped before chitchat
//! sees them when the tag is wrong, so a node without the secret can neither join nor inject state.
//! A captured datagram cannot be replayed either: one whose time is more than [`REPLAY_WINDOW`]
//! from the receiver's clock is dropped, and so is one whose tag was already seen within that
//! window ([`Replays`]; before, most replayed datagrams were answered, some with much larger
//! replies: the docs' benchmarks page, "Hardening findings"). A relay socket exists only for peers
//! that have sent a valid datagram or that chitchat gossips to, so its number stays the size of the
//! cluster. Without a secret the same path runs with no tag; a lone node (no secret,
//! unauthenticated peers not allowed) drops every datagram from others. (anyhow appears here only
//! because chitchat's `Transport` trait uses it.)

use crate::log_gate::LogGate;
use crate::metrics::GossipStats;
use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket as ChitchatUdp};
use parking_lot::Mutex;
use ringlimit_core::clock::unix_ms;
use ringlimit_proto::auth;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;
/// Length of what a secret adds to each datagram: the send time, then the tag.
const TIME_LEN: usize = 8;
const TAG_LEN: usize = TIME_LEN + auth::TAG_LEN;
/// A datagram sent longer ago than this (or this far in the future, by the receiver's clock) is
/// dropped as a replay. Wide, because nodes' clocks are only as good as their NTP: clocks that
/// disagree by more than this keep nodes apart, which the warning in the log names.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(120);
/// Most tags remembered for replay detection: gossip sends a few datagrams per round to a few
/// peers whatever the cluster's size (about 100 a second at 100 ms rounds), so 120 s of them
/// fit many times over; beyond, the oldest are forgotten first.
const MAX_SEEN: usize = 1 << 18;
/// Bytes of received datagrams waiting for chitchat at most. chitchat reads its socket from
/// the loop that also applies what it read, under its lock, so a burst of large deltas from
/// several peers at once overflowed the kernel's receive buffer (212 KB by default), and the
/// datagrams lost included heartbeats: live nodes were declared dead (`bench/scale.sh` with hot
/// global keys: `bench/notes/efficiency-and-scale.md`). A task of its own now drains the port
/// into this queue.
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
    members: bool,
}

impl PeerTransport {
    pub fn new(socket: UdpSocket, secret: Option<Arc<[u8]>>, stats: Arc<GossipStats>) -> Self {
        Self {
            socket: Mutex::new(Some(socket)),
            secret,
            stats,
            blocklist: None,
            members: true,
        }
    }

    /// `false`: a lone node, which drops every datagram from others.
    pub fn accepting_members(mut self, members: bool) -> Self {
        self.members = members;
        self
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
            members: self.members,
            replays: Replays::default(),
            skew_warning: LogGate::new(Duration::from_secs(60)),
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
    members: bool,
    replays: Replays,
    /// Warnings of datagrams too far from this node's clock, at most one a minute.
    skew_warning: LogGate,
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
                    Some(s) => seal(s, &mut buf, n, unix_ms()),
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
                    if !self.members {
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%from, "gossip from another node dropped: lone node");
                        continue;
                    }
                    let len = match &self.secret {
                        None => datagram.len(),
                        Some(secret) => match self.replays.open(secret, &datagram, unix_ms()) {
                            Ok(len) => len,
                            Err(why) => {
                                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                                let passed = (why == Dropped::Stale)
                                    .then(|| self.skew_warning.pass())
                                    .flatten();
                                if let Some(unlogged) = passed {
                                    tracing::warn!(%from, window_s = REPLAY_WINDOW.as_secs(),
                                        also_dropped = unlogged,
                                        "gossip datagram with the secret but a send time outside \
                                         the replay window dropped: a replay, or this node's and \
                                         that node's clocks disagree (check NTP)");
                                } else {
                                    tracing::debug!(%from, reason = ?why, "gossip datagram dropped");
                                }
                                continue;
                            }
                        },
                    };
                    let Ok(relay) = self.relay(from).await else { continue };
                    let _ = relay.send(&datagram[..len]).await;
                }
            }
        }
    }
}

/// Appends the send time and the tag to the `n`-byte datagram in `buf` (which has room for
/// [`TAG_LEN`] more); returns the sealed length.
pub fn seal(secret: &[u8], buf: &mut [u8], n: usize, sent_ms: u64) -> usize {
    let tag = auth::datagram_tag(secret, sent_ms, &buf[..n]);
    buf[n..n + TIME_LEN].copy_from_slice(&sent_ms.to_be_bytes());
    buf[n + TIME_LEN..n + TAG_LEN].copy_from_slice(&tag);
    n + TAG_LEN
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// No valid tag: not from a node with the secret, or altered.
    BadTag,
    /// Sent outside the replay window.
    Stale,
    /// Its tag was seen already: a replay.
    Replayed,
}

/// The length of the gossip message in a datagram that carries a valid tag (the send time is
/// not checked here; see [`Replays::open`]).
pub fn payload_len(secret: &[u8], datagram: &[u8]) -> Option<(usize, u64)> {
    let len = datagram.len().checked_sub(TAG_LEN)?;
    let (payload, trailer) = datagram.split_at(len);
    let (time, tag) = trailer.split_at(TIME_LEN);
    let sent_ms = u64::from_be_bytes(time.try_into().ok()?);
    auth::verify_datagram(secret, sent_ms, payload, tag).then_some((len, sent_ms))
}

/// The tags of datagrams accepted within [`REPLAY_WINDOW`], to drop their replays: only tags
/// that verified are kept (no one without the secret can fill this), at most [`MAX_SEEN`].
#[derive(Debug, Default)]
pub struct Replays {
    seen: std::collections::HashSet<[u8; auth::TAG_LEN]>,
    /// (send time ms, tag), in arrival order, for forgetting.
    order: std::collections::VecDeque<(u64, [u8; auth::TAG_LEN])>,
}

impl Replays {
    /// Checks a datagram received at `now_ms`: its payload's length, or why it is dropped.
    pub fn open(&mut self, secret: &[u8], datagram: &[u8], now_ms: u64) -> Result<usize, Dropped> {
        let (len, sent_ms) = payload_len(secret, datagram).ok_or(Dropped::BadTag)?;
        let window = REPLAY_WINDOW.as_millis() as u64;
        if sent_ms.abs_diff(now_ms) > window {
            return Err(Dropped::Stale);
        }
        // Forget what its time alone now refuses (times are roughly in arrival order; an early
        // one left behind a later one only stays a little longer).
        while let Some(&(t, tag)) = self.order.front() {
            if t.saturating_add(window) >= now_ms && self.order.len() < MAX_SEEN {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&tag);
        }
        let mut tag = [0u8; auth::TAG_LEN];
        tag.copy_from_slice(&datagram[datagram.len() - auth::TAG_LEN..]);
        if !self.seen.insert(tag) {
            return Err(Dropped::Replayed);
        }
        self.order.push_back((sent_ms, tag));
        Ok(len)
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_767_225_600_000;

    fn sealed(secret: &[u8], payload: &[u8], sent_ms: u64) -> Vec<u8> {
        let mut d = payload.to_vec();
        d.resize(payload.len() + TAG_LEN, 0);
        let n = seal(secret, &mut d, payload.len(), sent_ms);
        d.truncate(n);
        d
    }

    /// A captured datagram is accepted once: its replay, now or after a while, is dropped
    /// (37 of 40 replayed datagrams used to be answered).
    #[test]
    fn replayed_or_stale_datagrams_are_dropped() {
        let mut r = Replays::default();
        let d = sealed(b"s", b"gossip", NOW);
        assert_eq!(r.open(b"s", &d, NOW + 5), Ok(6));
        assert_eq!(r.open(b"s", &d, NOW + 10), Err(Dropped::Replayed));
        let window = REPLAY_WINDOW.as_millis() as u64;
        assert_eq!(r.open(b"s", &d, NOW + window + 1), Err(Dropped::Stale));
        // The same payload sent again later is a new datagram.
        let again = sealed(b"s", b"gossip", NOW + 100);
        assert_eq!(r.open(b"s", &again, NOW + 100), Ok(6));
        // Changing the time to dodge the window breaks the tag.
        let mut forged = d.clone();
        forged[6..14].copy_from_slice(&(NOW + 200).to_be_bytes());
        assert_eq!(r.open(b"s", &forged, NOW + 200), Err(Dropped::BadTag));
        assert_eq!(r.open(b"other", &again, NOW + 100), Err(Dropped::BadTag));
        assert_eq!(r.open(b"s", b"short", NOW), Err(Dropped::BadTag));
        // Ahead of this node's clock by more than the window: dropped too.
        let ahead = sealed(b"s", b"x", NOW + window + 1_000);
        assert_eq!(r.open(b"s", &ahead, NOW), Err(Dropped::Stale));
    }

    #[test]
    fn remembered_tags_are_forgotten_once_their_time_refuses_them() {
        let mut r = Replays::default();
        let window = REPLAY_WINDOW.as_millis() as u64;
        for i in 0..100u64 {
            let d = sealed(b"s", &i.to_be_bytes(), NOW + i);
            assert!(r.open(b"s", &d, NOW + i).is_ok());
        }
        assert_eq!(r.seen.len(), 100);
        let late = sealed(b"s", b"late", NOW + window + 50);
        assert!(r.open(b"s", &late, NOW + window + 50).is_ok());
        assert_eq!(
            r.seen.len(),
            51,
            "the 50 oldest are past the window; 50 and the late one stay"
        );
        assert_eq!(r.order.len(), r.seen.len());
    }
}
