//! Pushing this node's global counts to every other live member, over the peer protocol.
//!
//! Counts used to travel in chitchat's replicated key-values. That costs every node a copy of
//! every other node's hot keys, and chitchat's live-node watcher clones that whole state on
//! every change: with 10,000 hot keys on 9 nodes it took about 65% of a node's CPU, and live
//! members were declared dead (`bench/scale.sh`). Gossip now carries membership only; counts go
//! straight to each live member on a peer connection of their own, authenticated like every
//! peer connection, one `GlobalCounts` frame per publish round.
//!
//! # Never lost for good, never blocking
//! Counts are absolute and merged by maximum, so a frame may be repeated or arrive late; only a
//! lost frame matters, and only until the bucket's next update. Each peer's connection is
//! therefore resynchronised whole: a new connection starts with the full set this node
//! publishes, and anything that may have lost a frame (a failed connect or write, a queue full
//! because the peer is slow) marks the peer as needing the full set again. One task per peer
//! owns its connection, so a stalled or unreachable peer delays nobody: the publish loop only
//! `try_send`s into a short queue, and a failed peer is retried after a backoff.

use super::counters::GlobalCounters;
use super::wire::{self, Update};
use crate::cluster::transport::GossipBlocklist;
use crate::cluster::{MemberState, View};
use bytes::Bytes;
use futures::SinkExt;
use ringlimit_core::link::client::{PeerSettings, connect};
use ringlimit_core::link::framing::FramedPeer;
use ringlimit_proto::peer::Frame;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// Rounds that may wait for a peer's connection; beyond, the peer is resynchronised later.
const QUEUE: usize = 4;
/// A frame that cannot be written within this means the peer is stalled: reconnect.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// First wait after a failed connection, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What one peer's task is given: encoded frames, shared by every peer.
enum Msg {
    /// The buckets changed since the previous round: useless to a peer that missed a frame.
    Delta(Arc<[Bytes]>),
    /// Every bucket this node publishes: brings a peer up to date whatever it missed.
    Full(Arc<[Bytes]>),
}

/// One live peer: its task's queue, and whether it needs the full set.
struct Peer {
    tx: mpsc::Sender<Msg>,
    needs_full: Arc<AtomicBool>,
    task: tokio::task::AbortHandle,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Who a peer is: a restarted member (new generation) or a moved one (new address) is a new
/// peer, with a fresh connection and a full set.
type PeerKey = (String, u64, String);

/// Sends this node's counts to the live members of the current view.
pub struct Pusher {
    settings: PeerSettings,
    generation: u64,
    counters: Arc<GlobalCounters>,
    peers: HashMap<PeerKey, Peer>,
    /// Test hook: members whose peer address is blocked get nothing (see [`GossipBlocklist`]).
    blocklist: Option<Arc<GossipBlocklist>>,
}

impl Pusher {
    /// `generation` is this node's incarnation, as its gossip identity carries it.
    pub fn new(settings: PeerSettings, generation: u64, counters: Arc<GlobalCounters>) -> Self {
        Self {
            settings,
            generation,
            counters,
            peers: HashMap::new(),
            blocklist: None,
        }
    }

    /// Test hook: members the blocklist blocks are treated as unreachable.
    #[doc(hidden)]
    pub fn with_blocklist(mut self, blocklist: Option<Arc<GossipBlocklist>>) -> Self {
        self.blocklist = blocklist;
        self
    }

    /// Keeps one task per other member that is alive (or leaving: it still admits) in `view`;
    /// returns how many there are.
    pub fn track(&mut self, view: &View) -> usize {
        let mut live: HashSet<PeerKey> = HashSet::new();
        for m in &view.members {
            if *m.node_id == *view.self_id || m.state == MemberState::Dead {
                continue;
            }
            // A blocked member is let go like a lost one: a full set once it is reachable again.
            let blocked = self.blocklist.as_ref().is_some_and(|b| {
                m.peer_addr
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| b.blocks(&a))
            });
            if !blocked {
                live.insert((m.node_id.clone(), m.generation, m.peer_addr.clone()));
            }
        }
        self.peers.retain(|k, _| live.contains(k));
        for key in live {
            if !self.peers.contains_key(&key) {
                let peer = self.start(&key.2);
                self.peers.insert(key, peer);
            }
        }
        self.peers.len()
    }

    fn start(&self, addr: &str) -> Peer {
        let (tx, rx) = mpsc::channel(QUEUE);
        let needs_full = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(run(
            addr.to_owned(),
            self.settings.clone(),
            rx,
            needs_full.clone(),
            self.counters.clone(),
        ))
        .abort_handle();
        Peer {
            tx,
            needs_full,
            task,
        }
    }

    /// Whether some peer waits for the full set and has room for it in its queue.
    pub fn wants_full(&self) -> bool {
        self.peers
            .values()
            .any(|p| p.needs_full.load(Ordering::Relaxed) && p.tx.capacity() > 0)
    }

    /// Queues `delta` for every peer that is up to date, and the full set (made by `full`, at
    /// most once) for every peer that needs it.
    pub fn send(&mut self, delta: &[Update], full: impl FnOnce() -> Vec<Update>) {
        let delta_len = delta.len() as u64;
        let delta = (!delta.is_empty()).then(|| self.encode(delta));
        let mut full = Some(full);
        let mut full_frames: Option<Arc<[Bytes]>> = None;
        for peer in self.peers.values() {
            if peer.needs_full.load(Ordering::Relaxed) {
                if peer.tx.capacity() == 0 {
                    continue;
                }
                let frames = match (&full_frames, full.take()) {
                    (Some(f), _) => f.clone(),
                    (None, Some(make)) => {
                        let f = self.encode(&make());
                        full_frames = Some(f.clone());
                        f
                    }
                    (None, None) => continue,
                };
                if peer.tx.try_send(Msg::Full(frames)).is_ok() {
                    peer.needs_full.store(false, Ordering::Relaxed);
                    self.counters.stats.resyncs.fetch_add(1, Ordering::Relaxed);
                }
            } else if let Some(frames) = &delta
                && peer.tx.try_send(Msg::Delta(frames.clone())).is_err()
            {
                // The peer is slow or its task is retrying: it gets everything later.
                peer.needs_full.store(true, Ordering::Relaxed);
                self.counters
                    .stats
                    .dropped_events
                    .fetch_add(delta_len, Ordering::Relaxed);
            }
        }
    }

    /// The updates as `GlobalCounts` frames of at most [`wire::MAX_PER_FRAME`] each.
    fn encode(&self, updates: &[Update]) -> Arc<[Bytes]> {
        updates
            .chunks(wire::MAX_PER_FRAME)
            .filter_map(|chunk| {
                let frame = Frame::GlobalCounts {
                    generation: self.generation,
                    counts: chunk.to_vec(),
                };
                match frame.encode() {
                    Ok(bytes) => Some(Bytes::from(bytes)),
                    Err(e) => {
                        // Cannot happen within MAX_PER_FRAME; never panic over it.
                        tracing::error!(error = %e, "global counts frame not encodable");
                        None
                    }
                }
            })
            .collect()
    }
}

/// One peer's task: owns the connection, writes what it is given, and on any failure drops
/// the connection, waits, discards what queued meanwhile and asks for the full set.
async fn run(
    addr: String,
    settings: PeerSettings,
    mut rx: mpsc::Receiver<Msg>,
    needs_full: Arc<AtomicBool>,
    counters: Arc<GlobalCounters>,
) {
    let stats = &counters.stats;
    let mut conn: Option<FramedPeer> = None;
    // Whether every frame since the last full set reached the connection.
    let mut synced = false;
    let mut backoff = MIN_BACKOFF;
    while let Some(msg) = rx.recv().await {
        let (frames, full) = match msg {
            Msg::Full(f) => (f, true),
            Msg::Delta(f) => (f, false),
        };
        if !full && !synced {
            continue;
        }
        let sent = write(&addr, &settings, &mut conn, &frames, stats).await;
        match sent {
            Ok(()) => {
                synced |= full;
                backoff = MIN_BACKOFF;
            }
            Err(reason) => {
                tracing::debug!(peer = %addr, %reason, "global counts not delivered; resyncing");
                stats.push_failed.fetch_add(1, Ordering::Relaxed);
                conn = None;
                synced = false;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                while rx.try_recv().is_ok() {}
                needs_full.store(true, Ordering::Relaxed);
            }
        }
    }
}

async fn write(
    addr: &str,
    settings: &PeerSettings,
    conn: &mut Option<FramedPeer>,
    frames: &[Bytes],
    stats: &super::counters::GlobalStats,
) -> Result<(), String> {
    let c = match conn {
        Some(c) => c,
        None => {
            let c = tokio::time::timeout(settings.connect_timeout, connect(addr, settings))
                .await
                .map_err(|_| "connect timed out".to_string())??;
            conn.insert(c)
        }
    };
    for f in frames {
        tokio::time::timeout(WRITE_TIMEOUT, c.send(f.clone()))
            .await
            .map_err(|_| "write timed out".to_string())?
            .map_err(|e| e.to_string())?;
        stats.push_frames.fetch_add(1, Ordering::Relaxed);
        stats
            .push_bytes
            .fetch_add(f.len() as u64 + 4, Ordering::Relaxed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Member;
    use crate::cluster::quorum::Quorum;
    use crate::decide::Here;
    use crate::engine::Engine;
    use crate::forward::{PeerServer, ServerSettings};
    use crate::global::actor;
    use crate::rules::RuleSet;
    use ringlimit_core::clock::ManualClock;
    use ringlimit_core::link::memnet::MemNet;
    use ringlimit_proto::Ring;
    use std::collections::BTreeMap;

    const WINDOW: u64 = 1_700_000_000;

    fn update(id: u64, current: u64) -> Update {
        Update {
            id,
            period_ms: 1_000,
            window: WINDOW,
            current,
            previous: 0,
        }
    }

    fn member(id: &str, addr: &str) -> Member {
        Member {
            node_id: id.into(),
            peer_addr: addr.into(),
            http_addr: String::new(),
            state: MemberState::Alive,
            generation: 1,
        }
    }

    /// This node ("me") and `peers` (id, address), all alive.
    fn view(peers: &[(&str, &str)]) -> View {
        let mut members = vec![member("me", "me")];
        members.extend(peers.iter().map(|(id, addr)| member(id, addr)));
        View {
            self_id: Arc::from("me"),
            members,
            ring: Ring::new(["me"]),
            peer_addrs: BTreeMap::new(),
            quorum: Quorum::solo(&Arc::from("me")),
        }
    }

    fn pusher(net: &MemNet) -> Pusher {
        let settings = PeerSettings {
            dialer: net.dialer("me"),
            node_id: "me".into(),
            cluster_id: "c".into(),
            secret: None,
            deadline: Duration::from_millis(25),
            connect_timeout: Duration::from_millis(500),
            open_for: Duration::from_secs(1),
            queue: 16,
        };
        Pusher::new(
            settings,
            9,
            Arc::new(GlobalCounters::new(actor("me", 9), 100)),
        )
    }

    /// A real peer server at `addr` (within the window on its clock); returns its counters.
    fn receiver(net: &MemNet, addr: &str) -> Arc<GlobalCounters> {
        let counters = Arc::new(GlobalCounters::new(actor(addr, 1), 100_000));
        let clock = Arc::new(ManualClock::new(WINDOW * 1_000_000_000));
        let engine = Arc::new(Engine::new(RuleSet::builtin(), 100, clock));
        let server = Arc::new(PeerServer::new(
            Here::new(engine, counters.clone()),
            ServerSettings {
                node_id: addr.into(),
                cluster_id: "c".into(),
                secret: None,
                accept_members: true,
                handshake_timeout: Duration::from_secs(1),
            },
            None,
        ));
        tokio::spawn(server.run(net.listen(addr)));
        counters
    }

    /// Whether `counters` come to hold `current` for bucket `id` (from "me") within 10 s of
    /// tokio's paused clock.
    async fn reaches(counters: &GlobalCounters, id: u64, current: u64) -> bool {
        for _ in 0..1_000 {
            if counters.totals(id, 1_000, WINDOW) == (current, 0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A new peer gets the full set, then only deltas; after its connections drop it gets the
    /// full set again on a new connection; a peer that leaves the view is let go.
    #[tokio::test(start_paused = true)]
    async fn full_set_first_deltas_after_and_again_after_a_loss() {
        let net = MemNet::new();
        let got = receiver(&net, "p");
        let mut pusher = pusher(&net);
        assert_eq!(pusher.track(&view(&[("p", "p")])), 1);
        assert!(pusher.wants_full());
        pusher.send(&[update(1, 5)], || vec![update(1, 5), update(2, 3)]);
        assert!(reaches(&got, 1, 5).await && reaches(&got, 2, 3).await);
        assert!(!pusher.wants_full());
        // A delta carries only what changed: the full set's closure is not called.
        pusher.send(&[update(2, 4)], || vec![update(1, 99)]);
        assert!(reaches(&got, 2, 4).await);
        assert_eq!(got.totals(1, 1_000, WINDOW), (5, 0));
        assert_eq!(net.dials("p"), 1);

        // The connection is lost: the next delta fails, the task backs off and asks for the
        // full set, which comes on a second connection (bucket 1 is only in the full set).
        net.drop_connections("p");
        let mut resynced = false;
        for _ in 0..50 {
            pusher.send(&[update(3, 1)], || {
                vec![update(1, 6), update(2, 4), update(3, 1)]
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            if got.totals(1, 1_000, WINDOW) == (6, 0) {
                resynced = true;
                break;
            }
        }
        assert!(resynced, "no full set after the loss");
        assert_eq!(net.dials("p"), 2);
        let stats = &pusher.counters.stats;
        assert!(stats.push_failed.load(Ordering::Relaxed) >= 1);
        assert_eq!(stats.resyncs.load(Ordering::Relaxed), 2);

        assert_eq!(pusher.track(&view(&[])), 0);
    }

    /// A member the blocklist blocks gets nothing, and the full set once unblocked.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_member_is_resynced_when_unblocked() {
        let net = MemNet::new();
        let addr = "127.0.0.1:9";
        let got = receiver(&net, addr);
        let list = Arc::new(GossipBlocklist::default());
        let mut pusher = pusher(&net).with_blocklist(Some(list.clone()));
        let v = view(&[("q", addr)]);
        assert_eq!(pusher.track(&v), 1);
        pusher.send(&[], || vec![update(1, 1)]);
        assert!(reaches(&got, 1, 1).await);
        list.block(addr.parse().expect("addr"));
        assert_eq!(pusher.track(&v), 0);
        pusher.send(&[update(1, 2)], || vec![update(1, 2)]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(got.totals(1, 1_000, WINDOW), (1, 0));
        list.clear();
        assert_eq!(pusher.track(&v), 1);
        pusher.send(&[update(1, 3)], || vec![update(1, 3), update(2, 1)]);
        assert!(reaches(&got, 1, 3).await && reaches(&got, 2, 1).await);
        assert_eq!(net.dials(addr), 2);
    }

    /// A stalled member (its process paused: bytes stop moving, nothing is lost) holds up
    /// nobody: the other member gets every round at once; once resumed it catches up.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_member_holds_up_nobody_and_catches_up_when_it_resumes() {
        let net = MemNet::new();
        let p = receiver(&net, "p");
        let q = receiver(&net, "q");
        let mut pusher = pusher(&net);
        assert_eq!(pusher.track(&view(&[("p", "p"), ("q", "q")])), 2);
        // Every bucket changes every round, so a round's delta is also the full set.
        let round_of = |round: u64| -> Vec<Update> {
            (0..=2_000u64).map(|i| update(i << 40 | 1, round)).collect()
        };
        pusher.send(&[], || round_of(1));
        assert!(reaches(&p, 1, 1).await && reaches(&q, 1, 1).await);
        net.stall("q");
        // Rounds of 2,001 buckets (~50 KB a frame): q's pipe is full within a few.
        for round in 2..=30u64 {
            let delta = round_of(round);
            pusher.send(&delta, || delta.clone());
            assert!(reaches(&p, 1, round).await, "round {round} late at p");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(q.totals(1, 1_000, WINDOW).0 < 30);
        net.resume("q");
        let delta = round_of(31);
        pusher.send(&delta, || delta.clone());
        assert!(reaches(&q, 1, 31).await && reaches(&q, 2_000 << 40 | 1, 31).await);
        assert!(pusher.counters.stats.push_failed.load(Ordering::Relaxed) >= 1);
    }
}
