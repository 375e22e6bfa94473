//! Pushing this node's global counts to every other live member, over the peer protocol.
//!
//! Counts used to travel in chitchat's replicated key-values. That costs every node a copy of every
//! other node's hot keys, and chitchat's live-node watcher clones that whole state on every change:
//! with many hot keys on 9 nodes it took most of a node's CPU, and live members were declared dead
//! (measured with `bench/scale.sh`: the docs' benchmarks page, "Cost as the cluster grows"). Gossip
//! now carries membership only; counts go straight to each live member on a peer connection of
//! their own, authenticated like every peer connection, one `GlobalCounts` frame per publish round.
//!
//! # Never lost for good, never blocking
//! Counts are absolute and merged by maximum, so a frame may be repeated or arrive late; only a
//! lost frame matters, and only until the bucket's next update. Each peer's connection is
//! therefore resynchronised whole: a new connection starts with the full set this node
//! publishes, and anything that may have lost a frame (a failed connect or write, a queue full
//! because the peer is slow) marks the peer as needing the full set again. One task per peer
//! owns its connection, so a stalled or unreachable peer delays nobody: the publish loop only
//! `try_send`s into a short queue, and a failed peer is retried after a backoff.
//!
//! A full set is this node's own counts (`GlobalCounts` frames, as nodes of every version
//! read them) followed by the other actors' counts it holds (`GlobalCountsOf` frames, at least
//! one, which ends the full set: see [`super::GlobalCounters::has_full_set`]).

use super::counters::GlobalCounters;
use super::numbering::Numbering;
use super::wire::{self, ActorCounts, FullSet, Update};
use crate::cluster::transport::GossipBlocklist;
use crate::cluster::{MemberState, View};
use bytes::Bytes;
use ringlimit_core::link::{Session, Sessions};
use ringlimit_proto::peer::{Frame, GLOBAL_CALENDAR_SINCE};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

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
    Delta(Frames),
    /// Every bucket this node publishes: brings a peer up to date whatever it missed.
    Full(Frames),
    /// The last full set of a node that leaves: written once (no retry), then the task ends
    /// and says whether it was written.
    Last(Frames, oneshot::Sender<bool>),
}

/// Encoded frames, and the same without counts of calendar windows for peers older than
/// [`GLOBAL_CALENDAR_SINCE`] (which would refuse them as malformed): `None` when there are none.
#[derive(Clone)]
struct Frames {
    all: Arc<[Bytes]>,
    older: Option<Arc<[Bytes]>>,
}

impl Frames {
    /// What a peer speaking `version` is written.
    fn for_version(&self, version: u16) -> &Arc<[Bytes]> {
        match &self.older {
            Some(older) if version < GLOBAL_CALENDAR_SINCE => older,
            _ => &self.all,
        }
    }
}

/// Whether `u` counts calendar windows.
fn is_calendar(u: &Update) -> bool {
    Numbering::is_calendar(u.period_ms)
}

/// `updates` without counts of calendar windows, if there were any.
fn without_calendars(updates: &[Update]) -> Option<Vec<Update>> {
    updates.iter().any(is_calendar).then(|| {
        updates
            .iter()
            .filter(|u| !is_calendar(u))
            .copied()
            .collect()
    })
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
    /// Connections of their own, from the peer facade (`crate::peers::Peers::sessions`).
    sessions: Sessions,
    generation: u64,
    counters: Arc<GlobalCounters>,
    peers: HashMap<PeerKey, Peer>,
    /// Test hook: members whose peer address is blocked get nothing (see [`GossipBlocklist`]).
    blocklist: Option<Arc<GossipBlocklist>>,
}

impl Pusher {
    /// `generation` is this node's incarnation, as its gossip identity carries it.
    pub fn new(sessions: Sessions, generation: u64, counters: Arc<GlobalCounters>) -> Self {
        Self {
            sessions,
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
            if *m.node_id == *view.self_id
                || matches!(m.state, MemberState::Dead | MemberState::Unseen)
            {
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
            self.sessions.open(addr),
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
    pub fn send(&mut self, delta: &[Update], full: impl FnOnce() -> FullSet) {
        let delta_len = delta.len() as u64;
        let delta = (!delta.is_empty()).then(|| self.encode(delta));
        let mut full = Some(full);
        let mut full_frames: Option<Frames> = None;
        for peer in self.peers.values() {
            if peer.needs_full.load(Ordering::Relaxed) {
                if peer.tx.capacity() == 0 {
                    continue;
                }
                let frames = match (&full_frames, full.take()) {
                    (Some(f), _) => f.clone(),
                    (None, Some(make)) => {
                        let f = self.encode_full(&make());
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

    /// Queues other actors' counts (other regions', merged here) for every peer that is up
    /// to date, as `GlobalCountsOf` frames; a peer whose queue is full gets the full set later.
    pub fn relay(&mut self, others: &[ActorCounts]) {
        let frames = self.encode_full(&FullSet {
            own: Vec::new(),
            others: others.to_vec(),
        });
        let n: u64 = others.iter().map(|a| a.counts.len() as u64).sum();
        for peer in self.peers.values() {
            if !peer.needs_full.load(Ordering::Relaxed)
                && peer.tx.try_send(Msg::Delta(frames.clone())).is_err()
            {
                peer.needs_full.store(true, Ordering::Relaxed);
                self.counters
                    .stats
                    .dropped_events
                    .fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Marks every peer as needing the full set (more changed than a round relays).
    pub fn resync_all(&mut self) {
        for peer in self.peers.values() {
            peer.needs_full.store(true, Ordering::Relaxed);
        }
    }

    /// Sends every peer `full` as a leaving node's last word and waits, at most `within`, for
    /// it to be written (after what their queues hold); then lets every peer go. Returns to how
    /// many peers it was written, and how many there were.
    pub async fn flush(&mut self, full: &FullSet, within: Duration) -> (usize, usize) {
        let deadline = tokio::time::Instant::now() + within;
        let frames = self.encode_full(full);
        let peers: Vec<Peer> = self.peers.drain().map(|(_, p)| p).collect();
        let written = futures::future::join_all(peers.iter().map(|p| {
            let frames = frames.clone();
            async move {
                let (done, written) = oneshot::channel();
                let sent = tokio::time::timeout_at(deadline, p.tx.send(Msg::Last(frames, done)));
                if !matches!(sent.await, Ok(Ok(()))) {
                    return false;
                }
                matches!(
                    tokio::time::timeout_at(deadline, written).await,
                    Ok(Ok(true))
                )
            }
        }))
        .await;
        (written.into_iter().filter(|&w| w).count(), peers.len())
    }

    /// The updates as `GlobalCounts` frames of at most [`wire::MAX_PER_FRAME`] each.
    fn encode(&self, updates: &[Update]) -> Frames {
        Frames {
            all: self.own_frames(updates).collect(),
            older: without_calendars(updates).map(|u| self.own_frames(&u).collect()),
        }
    }

    /// A full set's frames: the own counts' `GlobalCounts`, then the others' `GlobalCountsOf`
    /// (at least one).
    fn encode_full(&self, full: &FullSet) -> Frames {
        let any = full.own.iter().any(is_calendar)
            || full.others.iter().any(|a| a.counts.iter().any(is_calendar));
        let older = any.then(|| {
            let own: Vec<Update> = full
                .own
                .iter()
                .filter(|u| !is_calendar(u))
                .copied()
                .collect();
            let others: Vec<ActorCounts> = full
                .others
                .iter()
                .map(|a| ActorCounts {
                    counts: a
                        .counts
                        .iter()
                        .filter(|u| !is_calendar(u))
                        .copied()
                        .collect(),
                    ..a.clone()
                })
                .filter(|a| !a.counts.is_empty())
                .collect();
            self.full_frames(&own, &others)
        });
        Frames {
            all: self.full_frames(&full.own, &full.others),
            older,
        }
    }

    fn full_frames(&self, own: &[Update], others: &[ActorCounts]) -> Arc<[Bytes]> {
        let relayed = wire::relay_frames(others)
            .into_iter()
            .filter_map(|counts| encoded(&Frame::GlobalCountsOf { counts }));
        self.own_frames(own).chain(relayed).collect()
    }

    fn own_frames<'a>(&self, updates: &'a [Update]) -> impl Iterator<Item = Bytes> + 'a {
        let generation = self.generation;
        updates
            .chunks(wire::MAX_PER_FRAME)
            .filter_map(move |chunk| {
                encoded(&Frame::GlobalCounts {
                    generation,
                    counts: chunk.to_vec(),
                })
            })
    }
}

fn encoded(frame: &Frame) -> Option<Bytes> {
    match frame.encode() {
        Ok(bytes) => Some(Bytes::from(bytes)),
        Err(e) => {
            // Cannot happen within the per-frame bounds of `wire`; never panic over it.
            tracing::error!(error = %e, kind = frame.kind(), "global counts frame not encodable");
            None
        }
    }
}

/// One peer's task: owns the connection, writes what it is given, and on any failure drops
/// the connection, waits, discards what queued meanwhile and asks for the full set.
async fn run(
    mut session: Session,
    mut rx: mpsc::Receiver<Msg>,
    needs_full: Arc<AtomicBool>,
    counters: Arc<GlobalCounters>,
) {
    let stats = &counters.stats;
    // Whether every frame since the last full set reached the connection.
    let mut synced = false;
    let mut backoff = MIN_BACKOFF;
    while let Some(msg) = rx.recv().await {
        let (frames, full, last) = match msg {
            Msg::Full(f) => (f, true, None),
            Msg::Delta(f) => (f, false, None),
            Msg::Last(f, done) => (f, true, Some(done)),
        };
        if !full && !synced {
            continue;
        }
        let sent = match session.version().await {
            Ok(version) => {
                let frames = frames.for_version(version).clone();
                session
                    .write(&frames, WRITE_TIMEOUT, |bytes| {
                        stats.push_frames.fetch_add(1, Ordering::Relaxed);
                        stats.push_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        if let Some(done) = last {
            let _ = done.send(sent.is_ok());
            return;
        }
        match sent {
            Ok(()) => {
                synced |= full;
                backoff = MIN_BACKOFF;
            }
            Err(reason) => {
                tracing::debug!(peer = %session.addr(), %reason, "global counts not delivered; resyncing");
                stats.push_failed.fetch_add(1, Ordering::Relaxed);
                session.close();
                synced = false;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                while rx.try_recv().is_ok() {}
                needs_full.store(true, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Member;
    use crate::cluster::quorum::Quorum;
    use crate::global::actor;
    use ringlimit_core::link::memnet::MemNet;
    use ringlimit_proto::Ring;
    use std::collections::BTreeMap;

    /// A peer server on `net` at `id` whose global counts go to `counters`, its clock at `now`:
    /// the receiving end of the tests below.
    pub(super) fn serve_in_memory(
        net: &ringlimit_core::link::memnet::MemNet,
        id: &str,
        counters: Arc<GlobalCounters>,
        now: u64,
    ) -> tokio::task::JoinHandle<()> {
        use crate::peers::{PeerServer, ServerSettings};
        let clock = Arc::new(ringlimit_core::clock::ManualClock::new(now));
        let rules = Arc::new(crate::rules::InForce::new(crate::rules::RuleSet::builtin()));
        let local = Arc::new(crate::local::Local::new(rules, clock, 100, counters));
        let server = Arc::new(PeerServer::new(local, ServerSettings::open(id, "c"), None));
        tokio::spawn(server.run(net.listen(id)))
    }

    /// How the tests below dial peers on `net` as `id`.
    pub(super) fn dial_in_memory(net: &ringlimit_core::link::memnet::MemNet, id: &str) -> Sessions {
        Sessions::new(Arc::new(crate::peers::test_settings(
            net.dialer(id),
            id,
            "c",
        )))
    }

    const WINDOW: u64 = 1_700_000_000;

    /// The counts in `frames`, own and relayed.
    fn counts_in(frames: &[Bytes]) -> (Vec<Update>, Vec<Update>) {
        let (mut own, mut relayed) = (Vec::new(), Vec::new());
        for f in frames {
            match Frame::decode(f).expect("frame") {
                Frame::GlobalCounts { counts, .. } => own.extend(counts),
                Frame::GlobalCountsOf { counts } => {
                    relayed.extend(counts.into_iter().flat_map(|a| a.counts))
                }
                other => panic!("{other:?}"),
            }
        }
        (own, relayed)
    }

    /// Counts of calendar windows go only to peers that merge them (protocol 11 on): an older
    /// peer is written the same frames without them, and a full set that has none is one set
    /// of frames for everybody.
    #[tokio::test(start_paused = true)]
    async fn calendar_counts_are_left_out_for_older_peers() {
        let net = MemNet::new();
        let p = pusher(&net);
        let zone = ringlimit_core::calendar::Zone::parse("Europe/Berlin").expect("zone");
        let calendar =
            crate::global::numbering::Numbering::Calendar(ringlimit_core::calendar::Calendar {
                unit: ringlimit_core::calendar::Unit::Day,
                zone,
            });
        let daily = Update {
            period_ms: calendar.code(),
            window: 20_000,
            ..update(2, 5)
        };
        let plain = update(1, 3);
        let frames = p.encode(&[plain, daily]);
        assert_eq!(counts_in(frames.for_version(11)).0, [plain, daily]);
        assert_eq!(counts_in(frames.for_version(10)).0, [plain]);
        let full = FullSet {
            own: vec![daily],
            others: vec![
                ActorCounts {
                    node_id: "x".into(),
                    generation: 1,
                    counts: vec![daily, plain],
                },
                ActorCounts {
                    node_id: "y".into(),
                    generation: 1,
                    counts: vec![daily],
                },
            ],
        };
        let frames = p.encode_full(&full);
        assert_eq!(
            counts_in(frames.for_version(11)),
            (vec![daily], vec![daily, plain, daily])
        );
        assert_eq!(counts_in(frames.for_version(10)), (vec![], vec![plain]));
        let frames = p.encode_full(&FullSet::from(vec![plain]));
        assert!(frames.older.is_none());
        assert_eq!(counts_in(frames.for_version(2)).0, [plain]);
    }

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
            grpc_addr: String::new(),
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
            awaited: Vec::new(),
        }
    }

    fn pusher(net: &MemNet) -> Pusher {
        let settings = dial_in_memory(net, "me");
        Pusher::new(
            settings,
            9,
            Arc::new(GlobalCounters::new(actor("me", 9), 100)),
        )
    }

    /// A real peer server at `addr` (within the window on its clock); returns its counters.
    fn receiver(net: &MemNet, addr: &str) -> Arc<GlobalCounters> {
        let counters = Arc::new(GlobalCounters::new(actor(addr, 1), 100_000));
        serve_in_memory(net, addr, counters.clone(), WINDOW * 1_000_000_000);
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
        pusher.send(&[update(1, 5)], || vec![update(1, 5), update(2, 3)].into());
        assert!(reaches(&got, 1, 5).await && reaches(&got, 2, 3).await);
        assert!(!pusher.wants_full());
        // A delta carries only what changed: the full set's closure is not called.
        pusher.send(&[update(2, 4)], || vec![update(1, 99)].into());
        assert!(reaches(&got, 2, 4).await);
        assert_eq!(got.totals(1, 1_000, WINDOW), (5, 0));
        assert_eq!(net.dials("p"), 1);

        // The connection is lost: the next delta fails, the task backs off and asks for the
        // full set, which comes on a second connection (bucket 1 is only in the full set).
        net.drop_connections("p");
        let mut resynced = false;
        for _ in 0..50 {
            pusher.send(&[update(3, 1)], || {
                vec![update(1, 6), update(2, 4), update(3, 1)].into()
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
        pusher.send(&[], || vec![update(1, 1)].into());
        assert!(reaches(&got, 1, 1).await);
        list.block(addr.parse().expect("addr"));
        assert_eq!(pusher.track(&v), 0);
        pusher.send(&[update(1, 2)], || vec![update(1, 2)].into());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(got.totals(1, 1_000, WINDOW), (1, 0));
        list.clear();
        assert_eq!(pusher.track(&v), 1);
        pusher.send(&[update(1, 3)], || vec![update(1, 3), update(2, 1)].into());
        assert!(reaches(&got, 1, 3).await && reaches(&got, 2, 1).await);
        assert_eq!(net.dials(addr), 2);
    }

    /// A full set ends with the other actors' counts: merged under each actor, a bad entry
    /// counted and skipped, and the receiver knows the full set has come (even with nothing
    /// to relay).
    #[tokio::test(start_paused = true)]
    async fn a_full_set_relays_other_actors_and_bad_entries_are_skipped() {
        let net = MemNet::new();
        let got = receiver(&net, "p");
        let mut pusher = pusher(&net);
        pusher.track(&view(&[("p", "p")]));
        let of = |node_id: &str, current| wire::ActorCounts {
            node_id: node_id.into(),
            generation: 3,
            counts: vec![update(1, current)],
        };
        pusher.send(&[], || FullSet {
            own: vec![update(1, 5)],
            others: vec![of("old", 20), of("", 99), of("x", 7)],
        });
        assert!(reaches(&got, 1, 32).await);
        assert_eq!(got.stats.malformed.load(Ordering::Relaxed), 1);
        assert!(got.has_full_set("me"));

        let empty = receiver(&net, "q");
        pusher.track(&view(&[("p", "p"), ("q", "q")]));
        assert!(!empty.has_full_set("me"));
        pusher.send(&[], FullSet::default);
        for _ in 0..100 {
            if empty.has_full_set("me") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(empty.has_full_set("me"));
    }

    /// Other regions' counts this node merged go to its up-to-date members as they rise (not
    /// only in full sets), merged under their qualified actors; a member that still needs its
    /// full set gets them in it.
    #[tokio::test(start_paused = true)]
    async fn other_regions_counts_are_relayed_to_members_as_they_rise() {
        let net = MemNet::new();
        let got = receiver(&net, "p");
        let mut pusher = pusher(&net);
        pusher.track(&view(&[("p", "p")]));
        pusher.send(&[update(1, 5)], || vec![update(1, 5)].into());
        assert!(reaches(&got, 1, 5).await);
        let foreign = |current| wire::ActorCounts {
            node_id: "eu/n1".into(),
            generation: 2,
            counts: vec![update(1, current)],
        };
        pusher.relay(&[foreign(30)]);
        assert!(reaches(&got, 1, 35).await);
        pusher.relay(&[foreign(31)]);
        assert!(reaches(&got, 1, 36).await);
        // A new member: nothing relayed before its full set.
        let q = receiver(&net, "q");
        pusher.track(&view(&[("p", "p"), ("q", "q")]));
        pusher.relay(&[foreign(40)]);
        assert!(reaches(&got, 1, 45).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(q.totals(1, 1_000, WINDOW), (0, 0));
        // Resynchronising every member: the full sets come at the next send.
        pusher.resync_all();
        assert!(pusher.wants_full());
        pusher.send(&[], || FullSet {
            own: vec![update(1, 5)],
            others: vec![foreign(40)],
        });
        assert!(reaches(&q, 1, 45).await);
    }

    /// A leaving node's last full set (here with a count newer than any sent) is written to
    /// every peer before `flush` returns; a paused peer holds it up no longer than the bound.
    #[tokio::test(start_paused = true)]
    async fn the_last_full_set_is_written_before_leaving_within_a_bound() {
        let net = MemNet::new();
        let p = receiver(&net, "p");
        let _q = receiver(&net, "q");
        net.stall("q");
        let mut pusher = pusher(&net);
        assert_eq!(pusher.track(&view(&[("p", "p"), ("q", "q")])), 2);
        let started = tokio::time::Instant::now();
        let last = FullSet::from(vec![update(1, 7)]);
        let within = Duration::from_secs(1);
        assert_eq!(pusher.flush(&last, within).await, (1, 2));
        assert!(started.elapsed() <= within);
        assert!(reaches(&p, 1, 7).await);
        assert_eq!(pusher.track(&view(&[])), 0);
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
        pusher.send(&[], || round_of(1).into());
        assert!(reaches(&p, 1, 1).await && reaches(&q, 1, 1).await);
        net.stall("q");
        // Rounds of 2,001 buckets (~50 KB a frame): q's pipe is full within a few.
        for round in 2..=30u64 {
            let delta = round_of(round);
            pusher.send(&delta, || delta.clone().into());
            assert!(reaches(&p, 1, round).await, "round {round} late at p");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(q.totals(1, 1_000, WINDOW).0 < 30);
        net.resume("q");
        let delta = round_of(31);
        pusher.send(&delta, || delta.clone().into());
        assert!(reaches(&q, 1, 31).await && reaches(&q, 2_000 << 40 | 1, 31).await);
        assert!(pusher.counters.stats.push_failed.load(Ordering::Relaxed) >= 1);
    }
}

/// Restarts under the publish loop's wiring: a node is its counters (actor `id@generation`), a
/// real peer server at address `id`, a publisher and a pusher, all on one in-memory network.
#[cfg(test)]
mod restart_tests {
    use super::tests::{dial_in_memory, serve_in_memory};
    use super::*;
    use crate::cluster::Member;
    use crate::cluster::quorum::Quorum;
    use crate::global::actor;
    use crate::global::publish::Publisher;
    use ringlimit_core::limiter::Rule;
    use ringlimit_core::limiter::test_support::{SEC, rule};
    use ringlimit_core::link::memnet::MemNet;
    use ringlimit_proto::{Algorithm, Ring};
    use std::collections::BTreeMap;

    const DAY_MS: u64 = 86_400_000;
    /// An hour into a day (days are aligned to the epoch, like every global window).
    const NOW: u64 = 19_700 * 86_400 * SEC + 3_600 * SEC;
    const ID: u64 = 42;

    fn daily() -> Rule {
        rule(Algorithm::FixedWindow, 100, DAY_MS, 100)
    }

    struct Node {
        id: &'static str,
        generation: u64,
        counters: Arc<GlobalCounters>,
        publisher: Publisher,
        pusher: Pusher,
        serving: tokio::task::JoinHandle<()>,
    }

    impl Drop for Node {
        fn drop(&mut self) {
            self.serving.abort();
        }
    }

    impl Node {
        fn start(net: &MemNet, id: &'static str, generation: u64) -> Self {
            let counters = Arc::new(GlobalCounters::new(actor(id, generation), 1_000));
            let serving = serve_in_memory(net, id, counters.clone(), NOW);
            let settings = dial_in_memory(net, id);
            Self {
                id,
                generation,
                counters: counters.clone(),
                publisher: Publisher::new(100),
                pusher: Pusher::new(settings, generation, counters),
                serving,
            }
        }

        /// Admits `n` hits of the daily bucket here; returns how many were admitted.
        fn hits(&self, n: u64) -> u64 {
            (0..n)
                .filter(|_| self.counters.check(ID, &daily(), NOW, 1).allowed)
                .count() as u64
        }

        fn total(&self) -> u64 {
            self.counters
                .totals(ID, DAY_MS, NOW / (DAY_MS * 1_000_000))
                .0
        }

        /// One publish round, as `publish_loop` runs it, with `members` alive.
        fn round(&mut self, members: &[(&str, u64)]) {
            let view = View {
                self_id: Arc::from(self.id),
                members: members
                    .iter()
                    .map(|&(id, generation)| Member {
                        node_id: id.into(),
                        peer_addr: id.into(),
                        http_addr: String::new(),
                        grpc_addr: String::new(),
                        state: MemberState::Alive,
                        generation,
                    })
                    .collect(),
                ring: Ring::new(members.iter().map(|m| m.0)),
                peer_addrs: BTreeMap::new(),
                quorum: Quorum::solo(&Arc::from(self.id)),
                awaited: Vec::new(),
            };
            self.pusher.track(&view);
            let round = self.publisher.round(&self.counters, NOW, usize::MAX);
            if !round.set.is_empty() || self.pusher.wants_full() {
                let (publisher, counters) = (&self.publisher, &self.counters);
                self.pusher
                    .send(&round.set, || publisher.full_set(counters, NOW));
            }
        }
    }

    /// Runs publish rounds of `nodes` (every 100 ms of tokio's paused clock, for 10 s at most)
    /// until each node's total of the daily bucket is `want`; returns the totals.
    async fn converge(nodes: &mut [&mut Node], want: u64) -> Vec<u64> {
        let members: Vec<(&str, u64)> = nodes.iter().map(|n| (n.id, n.generation)).collect();
        for _ in 0..100 {
            for n in nodes.iter_mut() {
                n.round(&members);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if nodes.iter().all(|n| n.total() == want) {
                break;
            }
        }
        nodes.iter().map(|n| n.total()).collect()
    }

    /// A rolling restart on two nodes: a restarted node hears from its peer's full set every
    /// actor's counts, its own previous life's included; the peer, restarted next, hears them all
    /// back, and the day's quota holds across both restarts.
    #[tokio::test(start_paused = true)]
    async fn a_restarted_node_learns_every_actors_counts_from_a_full_set() {
        let net = MemNet::new();
        let mut a = Node::start(&net, "a", 1);
        let mut b = Node::start(&net, "b", 1);
        assert_eq!(a.hits(30) + b.hits(30), 60);
        assert_eq!(converge(&mut [&mut a, &mut b], 60).await, [60, 60]);

        // b restarts: its new incarnation has no counts of its own, and learns a@1's and
        // b@1's from a's full set.
        drop(b);
        let mut b = Node::start(&net, "b", 2);
        assert_eq!(converge(&mut [&mut a, &mut b], 60).await, [60, 60]);
        assert!(b.counters.has_full_set("a"));
        assert_eq!(b.hits(10), 10);
        assert_eq!(converge(&mut [&mut a, &mut b], 70).await, [70, 70]);

        // Then a restarts: b's full set carries a@1, b@1 and b@2.
        drop(a);
        let mut a = Node::start(&net, "a", 2);
        assert_eq!(converge(&mut [&mut a, &mut b], 70).await, [70, 70]);
        assert_eq!(a.hits(100), 30, "the day admits 100 in all");
        assert_eq!(converge(&mut [&mut a, &mut b], 100).await, [100, 100]);
        assert_eq!(b.hits(1), 0);
    }
}
