//! The peer facade: every message this node sends a member goes through [`Peers`], one typed
//! method per message (see the recipe in [`super`]). It keeps one client per alive member in
//! step with membership (the pipelined link of checks, refunds and pings) and, for a runtime of
//! its own ([`Peers::for_runtime`]: the HTTP edge's threads), a [`PeersHandle`] holding a copy
//! of each client made on that runtime; handovers and resets go on connections of their own
//! ([`ringlimit_core::link::session`]), and so do global counts, whose pusher (a layer below)
//! gets its sessions from here ([`Peers::sessions`]).
//!
//! Why per-runtime copies: the HTTP API runs on dedicated single-threaded runtimes. With the node's
//! shared clients, on the main runtime, every forwarded check cost two cross-thread wake-ups, and
//! forwarding through one node of three lost throughput when HTTP moved to its own runtimes
//! (measured: the docs' benchmarks page, "Forwarding through one node of three"). With a copy per
//! runtime, a forwarded check, its frame and its answer never cross threads.

use crate::cluster::View;
use crate::cluster::clock::Sample;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::link::reservations::{self as link_reserve, SESSIONS_PER_OWNER};
use ringlimit_core::link::{PeerClient, PeerSettings, PeerStats};
use ringlimit_core::link::{Session, SessionError, SessionPool, Sessions};
use ringlimit_core::reservations::ReserveError;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{
    BLOCKS_SINCE, BlockChange, CALENDAR_SINCE, Frame, HandedBucket, OPERATORS_SINCE, PeerReserve,
    PeerSettle, QUOTA_SINCE, QuotaAnswer, QuotaAsk, RECALL_SINCE, ReplicaBucket, RuleChange,
    RuleChanged, TopBy, TopKey,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Buckets per handover frame (each at most a few dozen bytes, except sliding logs).
const BUCKETS_PER_FRAME: usize = 2_000;
/// How long a member may take to merge one handover frame.
const HANDOVER_ACK_WITHIN: Duration = Duration::from_secs(2);

/// How long a replica may take to keep one frame of copies.
const REPLICATE_ACK_WITHIN: Duration = Duration::from_secs(1);

/// How long a member may take to answer a recall: a check waits for it (see
/// [`super::recall_on_join`]), so not long; without an answer the check decides on what is here.
const RECALL_WITHIN: Duration = Duration::from_millis(200);

/// A facade's clients as one runtime holds them.
struct LocalPeers {
    generation: u64,
    /// By member: the shared client this one mirrors (a member that left and came back gets a
    /// new shared client, and so a new local one: the old one's circuit may still be open),
    /// and this runtime's own client.
    peers: HashMap<Arc<str>, (Arc<PeerClient>, Arc<PeerClient>)>,
}

/// Every member, as this node reaches it: one typed method per message.
pub struct Peers {
    settings: Arc<PeerSettings>,
    /// Read lock-free on every forwarded check, replaced whole (under `update`) when
    /// membership changes.
    peers: ArcSwap<HashMap<Arc<str>, Arc<PeerClient>>>,
    update: Mutex<()>,
    /// Bumped whenever `peers` is replaced, so that per-thread copies know to follow.
    generation: AtomicU64,
    stats: Arc<PeerStats>,
    /// Set by [`super::reach::probe`]: the links of a majority of the known members are silent.
    cut_off: AtomicBool,
    /// Connections of their own (handover, reset, global counts).
    sessions: Sessions,
    /// Connections of their own kept open for reservations (see [`Peers::reserve`]).
    reservations: SessionPool,
}

/// A connection of its own to the member after this node on the ring, for recalling buckets
/// (see [`Peers::recall_link`]).
pub struct RecallLink(Session);

impl RecallLink {
    /// The live states the member holds of buckets `ids` (at most [`BUCKETS_PER_FRAME`]; the
    /// rest are not asked). A member of a protocol older than [`RECALL_SINCE`] is not asked
    /// (it holds nothing to give). On an error the connection is dropped.
    pub async fn recall(&mut self, ids: &[u64]) -> Result<Vec<(u64, BucketState)>, SessionError> {
        if self.0.version().await? < RECALL_SINCE {
            return Ok(Vec::new());
        }
        let ids = ids[..ids.len().min(BUCKETS_PER_FRAME)].to_vec();
        let ask = Frame::Recall { ids };
        request_or_close(&mut self.0, &ask, RECALL_WITHIN, |answer| match answer {
            Frame::Recalled { buckets } => Ok(buckets
                .into_iter()
                .map(|b| (b.id, BucketState::from_wire(b.state)))
                .collect()),
            other => Err(other),
        })
        .await
    }
}

/// `frame` asked on a link's own session, the answer taken by `accept`; on an error, or an
/// answer `accept` gives back, the connection is dropped (the next request makes a new one).
async fn request_or_close<T>(
    session: &mut Session,
    frame: &Frame,
    within: Duration,
    accept: impl FnOnce(Frame) -> Result<T, Frame>,
) -> Result<T, SessionError> {
    let answer = session
        .request(frame, within)
        .await
        .and_then(|f| accept(f).map_err(|other| SessionError::Unexpected(other.kind())));
    if answer.is_err() {
        session.close();
    }
    answer
}

/// One member's connection of its own for clock samples (see [`Peers::clock_link`]).
pub struct ClockLink(Session);

impl ClockLink {
    /// One sample of the member's wall clock: `now` reads this node's before and after. `None`
    /// from a member older than [`OPERATORS_SINCE`]. On an error the connection is dropped
    /// (the next sample makes a new one).
    pub async fn sample(
        &mut self,
        now: impl Fn() -> u64,
        within: Duration,
    ) -> Result<Option<Sample>, SessionError> {
        if self.0.version().await? < OPERATORS_SINCE {
            return Ok(None);
        }
        let sent_ns = now();
        request_or_close(
            &mut self.0,
            &Frame::Clock { sent_ns },
            within,
            |answer| match answer {
                Frame::ClockIs {
                    sent_ns: echoed,
                    now_ns,
                } if echoed == sent_ns => Ok(Some(Sample {
                    sent_ns,
                    peer_ns: now_ns,
                    received_ns: now(),
                })),
                other => Err(other),
            },
        )
        .await
    }
}

/// One replica member's connection of its own (see [`Peers::replica_link`]).
pub struct ReplicaLink(Session);

impl ReplicaLink {
    /// The member's address.
    pub fn addr(&self) -> &str {
        self.0.addr()
    }

    /// Sends `buckets` (at most [`BUCKETS_PER_FRAME`] a frame): written one way to a member of
    /// protocol 5 on (`ReplicateOneWay`), each frame acknowledged before the next to an older
    /// one; returns the frames sent and their bytes on the wire. On an error the connection is
    /// dropped (the next call makes a new one) and the caller resends what it cannot know
    /// arrived.
    pub async fn replicate(&mut self, buckets: Vec<ReplicaBucket>) -> Result<Sent, SessionError> {
        if self.0.version().await? < RECALL_SINCE {
            return self
                .send(buckets, |buckets| Frame::Replicate { buckets })
                .await;
        }
        let mut sent = Sent::default();
        let encoded: Result<Vec<bytes::Bytes>, _> =
            in_frames(buckets, |buckets| Frame::ReplicateOneWay { buckets })
                .map(|frame| frame.encode().map(bytes::Bytes::from))
                .collect();
        let frames = match encoded {
            Ok(frames) => frames,
            Err(e) => {
                self.0.close();
                return Err(SessionError::Link(e.into()));
            }
        };
        let written = self
            .0
            .write(&frames, REPLICATE_ACK_WITHIN, |bytes| {
                sent.frames += 1;
                sent.bytes += bytes as u64;
            })
            .await;
        if let Err(e) = written {
            self.0.close();
            return Err(e);
        }
        Ok(sent)
    }

    /// Hands back to their owner (this member) the copies this node decided on as their
    /// replica while the owner did not answer; like [`ReplicaLink::replicate`] otherwise.
    pub async fn hand_back(&mut self, buckets: Vec<ReplicaBucket>) -> Result<Sent, SessionError> {
        self.send(buckets, |buckets| Frame::HandBack { buckets })
            .await
    }

    /// Each frame acknowledged before the next.
    async fn send(
        &mut self,
        buckets: Vec<ReplicaBucket>,
        frame: impl Fn(Vec<ReplicaBucket>) -> Frame,
    ) -> Result<Sent, SessionError> {
        let mut sent = Sent::default();
        for frame in in_frames(buckets, frame) {
            match self.0.exchange(&frame, REPLICATE_ACK_WITHIN).await {
                Ok((Frame::ReplicateAck { .. }, bytes)) => {
                    sent.frames += 1;
                    sent.bytes += bytes as u64;
                }
                Ok((other, _)) => {
                    self.0.close();
                    return Err(SessionError::Unexpected(other.kind()));
                }
                Err(e) => {
                    self.0.close();
                    return Err(e);
                }
            }
        }
        Ok(sent)
    }
}

/// `buckets` in frames made by `frame`, at most [`BUCKETS_PER_FRAME`] a frame. Owned, so that a
/// batch of one frame (the usual one) goes as it is, not copied.
fn in_frames(
    mut buckets: Vec<ReplicaBucket>,
    frame: impl Fn(Vec<ReplicaBucket>) -> Frame,
) -> impl Iterator<Item = Frame> {
    std::iter::from_fn(move || {
        if buckets.is_empty() {
            return None;
        }
        let rest = buckets.split_off(buckets.len().min(BUCKETS_PER_FRAME));
        Some(frame(std::mem::replace(&mut buckets, rest)))
    })
}

/// What a [`ReplicaLink`] exchange sent, acknowledged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub frames: u64,
    /// On the wire, length prefixes included.
    pub bytes: u64,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("members", &self.peers.load().len())
            .finish_non_exhaustive()
    }
}

impl Peers {
    pub fn new(settings: PeerSettings) -> Self {
        let settings = Arc::new(settings);
        Self {
            sessions: Sessions::new(settings.clone()),
            reservations: SessionPool::new(Sessions::new(settings.clone()), SESSIONS_PER_OWNER),
            settings,
            peers: ArcSwap::from_pointee(HashMap::new()),
            update: Mutex::new(()),
            generation: AtomicU64::new(0),
            stats: Arc::new(PeerStats::default()),
            cut_off: AtomicBool::new(false),
        }
    }

    /// How this node dials its peers.
    pub fn settings(&self) -> &Arc<PeerSettings> {
        &self.settings
    }

    /// Frames and checks sent by every member's link.
    pub fn stats(&self) -> &PeerStats {
        &self.stats
    }

    /// Whether the links of a majority of the known members are silent (see [`super::reach`]).
    pub fn cut_off(&self) -> bool {
        self.cut_off.load(Ordering::Relaxed)
    }

    /// Sets [`Peers::cut_off`]; returns the previous value.
    pub fn set_cut_off(&self, cut_off: bool) -> bool {
        self.cut_off.swap(cut_off, Ordering::Relaxed)
    }

    /// Connections of their own to members, for what sits below this layer (the global counts'
    /// pusher).
    pub fn sessions(&self) -> Sessions {
        self.sessions.clone()
    }

    /// Hands `buckets` to the member at `addr` (their new owner) on a connection of its own,
    /// then an empty frame that says this node has handed it everything (a member that just
    /// joined stops recalling from this one: see [`super::recall_on_join`]); returns how many it
    /// merged. Borrowed, so that the caller can keep them if it fails.
    pub async fn hand_over(
        &self,
        addr: &str,
        buckets: &[(u64, BucketState)],
    ) -> Result<u64, SessionError> {
        let mut session = self.sessions.open(addr);
        let mut merged = 0;
        let end: &[(u64, BucketState)] = &[];
        for chunk in buckets.chunks(BUCKETS_PER_FRAME).chain([end]) {
            let chunk: Vec<HandedBucket> = chunk
                .iter()
                .map(|(id, st)| HandedBucket {
                    id: *id,
                    state: st.to_wire(),
                })
                .collect();
            match session
                .request(&Frame::Handover(chunk), HANDOVER_ACK_WITHIN)
                .await?
            {
                Frame::HandoverAck { merged: m } => merged += m,
                other => return Err(SessionError::Unexpected(other.kind())),
            }
        }
        Ok(merged)
    }

    /// A connection of its own to the member at `addr` for sending it copies of this node's
    /// buckets (see [`ReplicaLink::replicate`]); kept by the sender across frames.
    pub fn replica_link(&self, addr: &str) -> ReplicaLink {
        ReplicaLink(self.sessions.open(addr))
    }

    /// A connection of its own to the member at `addr` for recalling buckets this node owns
    /// from it (see [`RecallLink::recall`]).
    pub fn recall_link(&self, addr: &str) -> RecallLink {
        RecallLink(self.sessions.open(addr))
    }

    /// Asks the member at `addr`, the bucket's owner, to reserve `ask` on a connection kept
    /// for reservations (see [`ringlimit_core::link::reservations::reserve`]).
    pub async fn reserve(&self, addr: &str, ask: PeerReserve) -> Result<CheckAnswer, ReserveError> {
        link_reserve::reserve(&self.reservations, addr, ask).await
    }

    /// Asks the member at `addr` to settle `settle` (see
    /// [`ringlimit_core::link::reservations::settle`]).
    pub async fn settle(
        &self,
        addr: &str,
        settle: PeerSettle,
    ) -> Result<CheckAnswer, ReserveError> {
        link_reserve::settle(&self.reservations, addr, settle).await
    }

    /// Asks the member at `addr` to drop the buckets `ids`; returns how many it held.
    pub async fn reset(&self, addr: &str, ids: &[u64]) -> Result<u64, SessionError> {
        let within = self.settings.connect_timeout;
        let reset = Frame::Reset { ids: ids.to_vec() };
        match self.sessions.open(addr).request(&reset, within).await? {
            Frame::ResetAck { removed } => Ok(removed),
            other => Err(SessionError::Unexpected(other.kind())),
        }
    }

    /// Announces block `changes` to the member at `addr`, on a connection of their own; how
    /// many it kept, or `None` when the member is older than [`BLOCKS_SINCE`] (it keeps none,
    /// and answers blocked keys by their buckets, at their owner).
    pub async fn blocks(
        &self,
        addr: &str,
        changes: Vec<BlockChange>,
        within: Duration,
    ) -> Result<Option<u64>, SessionError> {
        let mut session = self.sessions.open(addr);
        if session.version().await? < BLOCKS_SINCE {
            return Ok(None);
        }
        match session.request(&Frame::Blocks { changes }, within).await? {
            Frame::BlocksAck { kept } => Ok(Some(kept)),
            other => Err(SessionError::Unexpected(other.kind())),
        }
    }

    /// Asks the member at `addr`, the owner of a rule's name, to make (or read) an admin API
    /// change of it; `None` when the member is older than [`OPERATORS_SINCE`] (the caller then
    /// makes the change itself, as older nodes do).
    pub async fn rule_change(
        &self,
        addr: &str,
        change: RuleChange,
        within: Duration,
    ) -> Result<Option<RuleChanged>, SessionError> {
        let mut session = self.sessions.open(addr);
        if session.version().await? < OPERATORS_SINCE {
            return Ok(None);
        }
        match session.request(&Frame::RuleChange(change), within).await? {
            Frame::RuleChanged(done) => Ok(Some(done)),
            other => Err(SessionError::Unexpected(other.kind())),
        }
    }

    /// The most denied (or checked) keys of `rule` at the member at `addr`; `None` when the
    /// member is older than [`OPERATORS_SINCE`] (it counts none).
    pub async fn top_keys(
        &self,
        addr: &str,
        rule: &str,
        by: TopBy,
        n: u32,
        within: Duration,
    ) -> Result<Option<Vec<TopKey>>, SessionError> {
        let mut session = self.sessions.open(addr);
        if session.version().await? < OPERATORS_SINCE {
            return Ok(None);
        }
        let ask = Frame::TopKeys {
            rule: rule.to_owned(),
            by,
            n,
        };
        match session.request(&ask, within).await? {
            Frame::TopKeysAre { keys } => Ok(Some(keys)),
            other => Err(SessionError::Unexpected(other.kind())),
        }
    }

    /// The shares of this node's RLQS streams of buckets the member at `addr` owns; `None`
    /// when the member is older than [`QUOTA_SINCE`] (the streams keep what they have).
    pub async fn quota(
        &self,
        addr: &str,
        asks: Vec<QuotaAsk>,
        within: Duration,
    ) -> Result<Option<Vec<QuotaAnswer>>, SessionError> {
        let mut session = self.sessions.open(addr);
        let version = session.version().await?;
        if version < QUOTA_SINCE {
            return Ok(None);
        }
        // An inline rule with calendar windows would fail an older member's whole frame: such
        // asks are answered `unsupported` here, the others sent.
        let older = version < CALENDAR_SINCE;
        let unsupported = || QuotaAnswer::Error {
            code: "unsupported".to_owned(),
            message: format!(
                "the member speaks peer protocol {version}; inline rules with calendar windows need {CALENDAR_SINCE}"
            ),
        };
        let (sent, kept): (Vec<_>, Vec<_>) = asks
            .into_iter()
            .enumerate()
            .partition(|(_, a)| !(older && a.rule.has_calendar()));
        if sent.is_empty() {
            return Ok(Some(kept.iter().map(|_| unsupported()).collect()));
        }
        let order: Vec<usize> = sent.iter().map(|(i, _)| *i).collect();
        let asks = sent.into_iter().map(|(_, a)| a).collect();
        let answers = match session.request(&Frame::Quota { asks }, within).await? {
            Frame::Quotas { answers } => answers,
            other => return Err(SessionError::Unexpected(other.kind())),
        };
        if kept.is_empty() {
            return Ok(Some(answers));
        }
        let mut out: Vec<Option<QuotaAnswer>> = vec![None; order.len() + kept.len()];
        for (i, a) in order.into_iter().zip(answers) {
            out[i] = Some(a);
        }
        for (i, _) in &kept {
            out[*i] = Some(unsupported());
        }
        Ok(Some(out.into_iter().map_while(|a| a).collect()))
    }

    /// A session of its own with the member at `addr`, kept by the caller for clock samples
    /// (see [`ClockLink::sample`]).
    pub fn clock_link(&self, addr: &str) -> ClockLink {
        ClockLink(self.sessions.open(addr))
    }

    /// Pings every member's shared client at once; returns, when all answered or timed out,
    /// which answered.
    pub async fn ping_all(&self) -> Vec<(Arc<str>, bool)> {
        let peers = self.peers.load_full();
        let pings = peers
            .iter()
            .map(|(id, c)| async move { (id.clone(), c.ping().await.is_ok()) });
        futures::future::join_all(pings).await
    }

    /// Keeps one client per alive peer: connects to new ones, drops those that left the ring.
    pub fn sync(&self, view: &View) {
        let _one_writer = self.update.lock();
        let current = self.peers.load();
        let mut peers = HashMap::with_capacity(view.peer_addrs.len());
        for (id, addr) in &view.peer_addrs {
            if *id == view.self_id {
                continue;
            }
            let client = match current.get(id) {
                Some(c) if c.addr == *addr => c.clone(),
                _ => self.spawn(id, addr.clone()),
            };
            peers.insert(id.clone(), client);
        }
        self.peers.store(Arc::new(peers));
        self.generation.fetch_add(1, Ordering::Release);
        self.reservations
            .retain(|addr| view.peer_addrs.values().any(|a| a == addr));
    }

    fn spawn(&self, id: &Arc<str>, addr: String) -> Arc<PeerClient> {
        Arc::new(PeerClient::spawn_to(
            addr,
            Some(id.clone()),
            self.settings.clone(),
            self.stats.clone(),
        ))
    }

    /// The handle of the runtime this is called on, for checks: the members' shared clients.
    pub fn shared(self: &Arc<Self>) -> PeersHandle {
        PeersHandle {
            peers: self.clone(),
            local: None,
        }
    }

    /// A handle for one runtime of its own (a thread that runs one current-thread runtime for
    /// its whole life): checks sent through it go on copies of the members' clients spawned on
    /// the runtime that first uses it, so they never cross threads. Use it on that runtime only.
    pub fn for_runtime(self: &Arc<Self>) -> PeersHandle {
        PeersHandle {
            peers: self.clone(),
            local: Some(Arc::new(Mutex::new(LocalPeers {
                generation: u64::MAX,
                peers: HashMap::new(),
            }))),
        }
    }

    /// The shared client of member `owner`.
    fn client(&self, owner: &str) -> Option<(Arc<str>, Arc<PeerClient>)> {
        self.peers
            .load()
            .get_key_value(owner)
            .map(|(k, c)| (k.clone(), c.clone()))
    }
}

/// How one runtime reaches the members for checks: the facade, and for a runtime of its own
/// ([`Peers::for_runtime`]) its copies of the members' clients. Passed explicitly to what
/// forwards checks (the routing's `Router`), one per runtime.
#[derive(Clone)]
pub struct PeersHandle {
    peers: Arc<Peers>,
    /// Locked only by the runtime's one thread (uncontended).
    local: Option<Arc<Mutex<LocalPeers>>>,
}

impl std::ops::Deref for PeersHandle {
    type Target = Peers;

    fn deref(&self) -> &Peers {
        &self.peers
    }
}

impl PeersHandle {
    /// The facade itself.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The owner of bucket `id` under `view` and the client that reaches it, or `None` when
    /// this node owns it (or the ring is empty). A member with no client yet (the view just
    /// changed) gets one.
    pub fn owner_client(&self, view: &View, id: u64) -> Option<(Arc<str>, Arc<PeerClient>)> {
        let owner = view.ring.owner(id)?;
        if owner == &*view.self_id {
            return None;
        }
        self.client(owner).or_else(|| {
            self.peers.sync(view);
            self.client(owner)
        })
    }

    /// The client of member `owner`: this runtime's own copy, else the shared one.
    pub fn client(&self, owner: &str) -> Option<(Arc<str>, Arc<PeerClient>)> {
        let Some(local) = &self.local else {
            return self.peers.client(owner);
        };
        let generation = self.peers.generation.load(Ordering::Acquire);
        let mut local = local.lock();
        if local.generation != generation {
            let shared = self.peers.peers.load();
            let mut next = HashMap::with_capacity(shared.len());
            for (id, client) in shared.iter() {
                let mine = match local.peers.remove(id) {
                    Some((of, mine)) if Arc::ptr_eq(&of, client) => mine,
                    _ => self.peers.spawn(id, client.addr.clone()),
                };
                next.insert(id.clone(), (client.clone(), mine));
            }
            local.peers = next;
            local.generation = generation;
        }
        local
            .peers
            .get_key_value(owner)
            .map(|(k, (_, c))| (k.clone(), c.clone()))
    }
}
