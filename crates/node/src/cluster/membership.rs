//! Membership through gossip (chitchat): who is in the cluster, where to reach them, and the
//! ring over the live ones.
//!
//! Each node publishes four small keys — its HTTP address, its peer address, its gRPC address
//! (empty without `--grpc`; absent from nodes that predate it) and its state (`joining`,
//! `alive` or `leaving`) — and never writes them again unless its state changes, so
//! gossip carries membership and nothing else. A node with seeds starts `joining` and enters
//! the other members' rings only once it says `alive` (when it is ready): a member routed to
//! before it knows the cluster would decide its keys on buckets it does not hold yet. A task
//! turns chitchat's live-node watcher into an immutable [`View`]; the ring inside it is
//! rebuilt only when the set of live members changes. Right after this node's own pause, the
//! members gossip declares dead stay as they were (see [`super::pause`]).
//!
//! A node that starts again with `--data-dir` may be the first of a cluster restarted whole:
//! the others' buckets are on their disks, and on a ring of itself alone it would decide their
//! keys from fresh buckets (a used-up daily quota admitted again). So the members of the ring
//! it last saw ([`Remembered`], kept under `--data-dir`) stay in its ring as `unseen` until
//! gossip shows them alive (or leaving), or `--members-wait-ms` has passed: their keys are
//! asked of them, and while they do not answer, of their replicas, then answered from the
//! fallback share (or denied, for `closed` rules), as for any owner that does not answer.

pub use super::member::{Member, MemberState};
use super::pause::Pauses;
use super::quorum::Quorum;
use arc_swap::ArcSwap;
use chitchat::transport::Transport;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState, ProtocolVersion,
    spawn_chitchat,
};
use ringlimit_proto::Ring;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const KEY_HTTP: &str = "http";
const KEY_PEER: &str = "peer";
const KEY_GRPC: &str = "grpc";
const KEY_STATE: &str = "state";

/// An immutable snapshot of membership.
#[derive(Debug, Clone)]
pub struct View {
    pub self_id: Arc<str>,
    /// Every member known, dead ones included, sorted by id.
    pub members: Vec<Member>,
    /// Ring over the alive members (not leaving, not dead); without a majority, over the
    /// members last known (see [`View::quorum`]).
    pub ring: Ring,
    /// Peer address of each alive member.
    pub peer_addrs: BTreeMap<Arc<str>, String>,
    /// Whether this node sees a majority of the members it last knew; without one it owns no
    /// keys (see [`super::quorum`]).
    pub quorum: Quorum,
    /// Ring members not seen alive since this node started ([`Remembered`]: `unseen`, or
    /// `joining` again), sorted: owners of their keys that nothing is sent to but checks (and
    /// what goes back to an owner), until they are alive.
    pub awaited: Vec<Arc<str>>,
}

impl View {
    /// A view of this node alone.
    pub fn solo(self_id: &str, peer_addr: &str, http_addr: &str) -> Self {
        Self::solo_with_grpc(self_id, peer_addr, http_addr, "")
    }

    /// [`View::solo`] of a node that serves ringlimit.v1 at `grpc_addr` (empty: none).
    pub fn solo_with_grpc(
        self_id: &str,
        peer_addr: &str,
        http_addr: &str,
        grpc_addr: &str,
    ) -> Self {
        let id: Arc<str> = Arc::from(self_id);
        Self {
            self_id: id.clone(),
            members: vec![Member {
                node_id: self_id.to_owned(),
                peer_addr: peer_addr.to_owned(),
                http_addr: http_addr.to_owned(),
                grpc_addr: grpc_addr.to_owned(),
                state: MemberState::Alive,
                generation: 0,
            }],
            ring: Ring::new([self_id]),
            peer_addrs: BTreeMap::from([(id.clone(), peer_addr.to_owned())]),
            quorum: Quorum::solo(&id),
            awaited: Vec::new(),
        }
    }

    /// This view with `awaited` (node id → peer address) in its ring as `unseen` members (the
    /// first view of a node that remembers members: see [`Remembered`]).
    fn awaiting(mut self, awaited: &BTreeMap<Arc<str>, String>) -> Self {
        for (id, addr) in awaited.iter().filter(|(id, _)| **id != self.self_id) {
            self.members.push(unseen(id, addr));
            self.peer_addrs.insert(id.clone(), addr.clone());
            self.awaited.push(id.clone());
        }
        self.members.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        self.ring = Ring::new(self.peer_addrs.keys());
        self
    }

    /// Whether `id` is a ring member not seen alive yet (see [`View::awaited`]).
    pub fn awaits(&self, id: &str) -> bool {
        self.awaited.iter().any(|a| **a == *id)
    }

    /// Alive members (the ring's size), at least 1.
    pub fn alive(&self) -> usize {
        self.ring.len().max(1)
    }

    /// How many members a limit is shared among when answered from a fallback share: the alive
    /// ones, or on the small side of a partition all those last known.
    pub fn share_members(&self) -> usize {
        if self.quorum.quorate {
            self.alive()
        } else {
            self.quorum.share_members()
        }
    }
}

/// The members of the ring this node last saw before it stopped (kept under `--data-dir`),
/// waited for as the owners of their keys (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Remembered {
    /// Node id and peer address of each.
    pub members: Vec<(String, String)>,
    /// How long after gossip starts a member not seen alive yet stops being waited for
    /// (`--members-wait-ms`): then its keys are the others', as when a member dies.
    pub within: Duration,
}

/// A member this node remembers and has not seen since it started.
fn unseen(id: &Arc<str>, peer_addr: &str) -> Member {
    Member {
        node_id: id.to_string(),
        peer_addr: peer_addr.to_owned(),
        http_addr: String::new(),
        grpc_addr: String::new(),
        state: MemberState::Unseen,
        generation: 0,
    }
}

/// A member's state as its gossip says.
fn state_of(node: &NodeState) -> MemberState {
    match node.get(KEY_STATE) {
        Some("leaving") => MemberState::Leaving,
        Some("joining") => MemberState::Joining,
        _ => MemberState::Alive,
    }
}

/// Gossip settings.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    pub node_id: String,
    pub cluster_id: String,
    pub advertise: SocketAddr,
    pub http_advertise: String,
    /// Where this node serves ringlimit.v1, as clients reach it; empty: no gRPC.
    pub grpc_advertise: String,
    pub seeds: Vec<String>,
    pub interval: Duration,
    /// Start `joining` (a node with seeds, until it is ready: see
    /// [`Membership::announce_ready`]) rather than `alive`.
    pub joining: bool,
    /// The members this node knew before it stopped, waited for.
    pub remembered: Remembered,
}

/// Gossip could not start.
#[derive(Debug, thiserror::Error)]
#[error("gossip failed to start: {0}")]
pub struct GossipError(pub String);

/// Running membership: the gossip handle and the current view. Dropping it stops gossip.
pub struct Membership {
    handle: ChitchatHandle,
    view: Arc<ArcSwap<View>>,
    updates: watch::Receiver<Arc<View>>,
    task: tokio::task::JoinHandle<()>,
    pauses: Arc<Pauses>,
    detector: tokio::task::JoinHandle<()>,
}

impl Membership {
    /// Joins (or forms) the cluster over `transport`: the node's UDP port with its MAC
    /// ([`super::transport::PeerTransport`]), or chitchat's in-memory `ChannelTransport`; runs
    /// `pauses`' detector, whose pauses hold gossip's death verdicts for a while.
    pub async fn start(
        settings: GossipSettings,
        transport: &dyn Transport,
        pauses: Arc<Pauses>,
    ) -> Result<Self, GossipError> {
        let generation = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros()),
        )
        .unwrap_or(0);
        let id = ChitchatId::new(settings.node_id.clone(), generation, settings.advertise);
        let interval = settings.interval;
        let config = ChitchatConfig {
            chitchat_id: id,
            cluster_id: settings.cluster_id.clone(),
            gossip_interval: interval,
            listen_addr: settings.advertise,
            seed_nodes: settings.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                // A killed node declared dead in about a second at 100 ms rounds in a small
                // cluster; lower thresholds declared it sooner, but now and then declared a live
                // node dead when a busy host delayed its gossip for a second (measured: the docs'
                // benchmarks page, "Measured by the process tests").
                phi_threshold: 20.0,
                sampling_window_size: 1_000,
                // Heartbeats further apart than this are not samples of the interval.
                max_interval: Duration::from_secs(10),
                // Start from the real gossip interval, not chitchat's 5 s, so that a node that dies
                // soon after joining still leaves the ring within seconds.
                initial_interval: interval,
                dead_node_grace_period: Duration::from_secs(600),
            },
            // Only API rules' keys are ever deleted (when the rule book forgets a delete, after
            // days); chitchat's tombstones are sent to every node and kept this long, so keep it
            // short. A member out of touch for longer catches up through a full-state reset.
            marked_for_deletion_grace_period: Duration::from_secs(300),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        let initial = vec![
            (KEY_HTTP.to_owned(), settings.http_advertise.clone()),
            (KEY_PEER.to_owned(), settings.advertise.to_string()),
            (KEY_GRPC.to_owned(), settings.grpc_advertise.clone()),
            (
                KEY_STATE.to_owned(),
                if settings.joining { "joining" } else { "alive" }.to_owned(),
            ),
        ];
        let handle = spawn_chitchat(config, initial, transport)
            .await
            .map_err(|e| GossipError(format!("{e:#}")))?;
        let self_id: Arc<str> = Arc::from(settings.node_id.as_str());
        let awaited: BTreeMap<Arc<str>, String> = settings
            .remembered
            .members
            .iter()
            .filter(|(id, _)| *id != settings.node_id && !settings.remembered.within.is_zero())
            .map(|(id, addr)| (Arc::from(id.as_str()), addr.clone()))
            .collect();
        if !awaited.is_empty() {
            tracing::info!(
                members = ?awaited.keys().collect::<Vec<_>>(),
                within = ?settings.remembered.within,
                "waiting for the members of the ring this node last saw: their keys are theirs until they are seen"
            );
        }
        let first = Arc::new(
            View::solo_with_grpc(
                &settings.node_id,
                &settings.advertise.to_string(),
                &settings.http_advertise,
                &settings.grpc_advertise,
            )
            .awaiting(&awaited),
        );
        let view = Arc::new(ArcSwap::new(first.clone()));
        let (tx, updates) = watch::channel(first);
        let chitchat = handle.chitchat();
        let live = chitchat.lock().await.live_nodes_watcher();
        let detector = tokio::spawn(pauses.clone().run());
        let task = tokio::spawn(watch_members(
            chitchat,
            live,
            self_id,
            view.clone(),
            tx,
            pauses.clone(),
            Awaited {
                members: awaited,
                until: tokio::time::Instant::now() + settings.remembered.within,
            },
        ));
        Ok(Self {
            handle,
            view,
            updates,
            task,
            pauses,
            detector,
        })
    }

    /// This node's pause detector.
    pub fn pauses(&self) -> &Arc<Pauses> {
        &self.pauses
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// The shared cell holding the current view (read on every check).
    pub fn view_cell(&self) -> Arc<ArcSwap<View>> {
        self.view.clone()
    }

    /// The shared chitchat state, for the API rules' replication ([`crate::rules::sync`]). Lock it
    /// briefly: gossip waits on the same lock.
    pub fn chitchat(&self) -> Arc<tokio::sync::Mutex<chitchat::Chitchat>> {
        self.handle.chitchat()
    }

    /// This node's gossip identity (node id, generation, advertised address).
    pub fn chitchat_id(&self) -> ChitchatId {
        self.handle.chitchat_id().clone()
    }

    /// Notified whenever the view changes.
    pub fn updates(&self) -> watch::Receiver<Arc<View>> {
        self.updates.clone()
    }

    /// Announces that this node is ready: peers put it in their rings on the next gossip (a node
    /// already leaving stays leaving).
    pub async fn announce_ready(&self) {
        self.handle
            .with_chitchat(|cc| {
                let state = cc.self_node_state();
                if state.get(KEY_STATE) == Some("joining") {
                    state.set(KEY_STATE, "alive");
                }
            })
            .await;
    }

    /// Announces that this node is leaving: peers drop it from their rings on the next gossip.
    pub async fn leave(&self) {
        self.handle
            .with_chitchat(|cc| cc.self_node_state().set(KEY_STATE, "leaving"))
            .await;
    }

    /// Stops gossiping.
    pub fn shutdown(&self) {
        self.task.abort();
        self.detector.abort();
        if let Err(e) = self.handle.initiate_shutdown() {
            tracing::debug!(error = %e, "gossip already stopped");
        }
    }
}

impl Drop for Membership {
    /// The detector has nothing to tell once membership is gone (a node in memory that is
    /// killed and restarted keeps its detector's state, not its task).
    fn drop(&mut self) {
        self.detector.abort();
    }
}

/// The remembered members still waited for, and until when.
struct Awaited {
    /// Node id → peer address.
    members: BTreeMap<Arc<str>, String>,
    until: tokio::time::Instant,
}

impl Awaited {
    /// Stops waiting for the members `live` shows alive or leaving (seen: from now on they are
    /// members like any other), and for all of them once the wait is over.
    fn seen(&mut self, live: &BTreeMap<ChitchatId, NodeState>, now: tokio::time::Instant) {
        if self.members.is_empty() {
            return;
        }
        if now >= self.until {
            tracing::warn!(
                members = ?self.members.keys().collect::<Vec<_>>(),
                "members of the ring this node last saw were not seen within --members-wait-ms: \
                 their keys go to the members alive"
            );
            self.members.clear();
            return;
        }
        self.members.retain(|id, _| {
            !live.iter().any(|(cid, node)| {
                *cid.node_id == **id
                    && matches!(state_of(node), MemberState::Alive | MemberState::Leaving)
            })
        });
    }
}

async fn watch_members(
    chitchat: Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    mut live: watch::Receiver<BTreeMap<ChitchatId, NodeState>>,
    self_id: Arc<str>,
    view: Arc<ArcSwap<View>>,
    tx: watch::Sender<Arc<View>>,
    pauses: Arc<Pauses>,
    mut awaited: Awaited,
) {
    // Dead members only show in `/v1/cluster`; a slow tick refreshes them.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let waiting = !awaited.members.is_empty();
        tokio::select! {
            changed = live.changed() => if changed.is_err() { return },
            _ = tick.tick() => {},
            () = tokio::time::sleep_until(awaited.until), if waiting => {},
        }
        let dead: Vec<ChitchatId> = chitchat.lock().await.dead_nodes().cloned().collect();
        // Read the live nodes in place: the watcher fires on every key-value change of any
        // node, and a clone would copy every node's state.
        let next = {
            let live_nodes = live.borrow_and_update();
            if live_nodes.is_empty() {
                // chitchat's first watcher value, before its first round: not a real view.
                continue;
            }
            // tokio's clock: follows a paused test clock (the same instant otherwise).
            let now = tokio::time::Instant::now();
            awaited.seen(&live_nodes, now);
            build_view(
                &self_id,
                &live_nodes,
                &dead,
                &view.load(),
                now.into_std(),
                pauses.resumed(now),
                &awaited.members,
            )
        };
        if let Some(next) = next {
            let next = Arc::new(next);
            log_changes(&view.load(), &next);
            view.store(next.clone());
            let _ = tx.send(next);
        }
    }
}

/// The view for these live and dead nodes, or `None` when nothing changed. `resumed`: this
/// node has just been paused (see [`super::pause`]), and a member alive in `previous` that
/// gossip now calls dead stays alive: gossip has not heard from it because this node did not
/// run, not because it is gone. `awaited`: remembered members not seen alive yet (node id →
/// peer address), in the ring whatever gossip says of them but alive.
fn build_view(
    self_id: &Arc<str>,
    live: &BTreeMap<ChitchatId, NodeState>,
    dead: &[ChitchatId],
    previous: &View,
    now: std::time::Instant,
    resumed: bool,
    awaited: &BTreeMap<Arc<str>, String>,
) -> Option<View> {
    // A restarted node may briefly show twice: keep the newest generation of each id.
    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    for (id, state) in live {
        let (Some(peer), Some(http)) = (state.get(KEY_PEER), state.get(KEY_HTTP)) else {
            continue;
        };
        let member = Member {
            node_id: id.node_id.to_string(),
            peer_addr: peer.to_owned(),
            http_addr: http.to_owned(),
            // Absent from members that predate it: no gRPC address known.
            grpc_addr: state.get(KEY_GRPC).unwrap_or_default().to_owned(),
            state: state_of(state),
            generation: id.generation_id,
        };
        match members.get(member.node_id.as_str()) {
            Some(m) if m.generation >= member.generation => {}
            _ => {
                members.insert(member.node_id.clone(), member);
            }
        }
    }
    for id in dead {
        if members.contains_key(id.node_id.as_ref()) {
            continue;
        }
        // chitchat counts a node it has only just heard of as dead until its heartbeats arrive;
        // only a member this node has seen can be reported dead.
        let Some(known) = previous
            .members
            .iter()
            .find(|m| m.node_id == id.node_id.as_ref())
        else {
            continue;
        };
        if resumed && known.state == MemberState::Alive && known.generation == id.generation_id {
            tracing::debug!(member = %known.node_id, "declared dead by gossip just after this node's pause: still asked");
            members.insert(id.node_id.to_string(), known.clone());
            continue;
        }
        members.insert(
            id.node_id.to_string(),
            Member {
                state: MemberState::Dead,
                generation: id.generation_id,
                ..known.clone()
            },
        );
    }
    // A remembered member gossip does not show, or shows dead (its previous life, or a new
    // one chitchat has only just heard of): still the owner of its keys. One that joins again
    // stays in the ring too, so that its keys are asked of it, which holds their buckets.
    let mut waiting: Vec<Arc<str>> = Vec::new();
    for (id, addr) in awaited.iter().filter(|(id, _)| **id != *self_id) {
        match members.get(&**id).map(|m| m.state) {
            Some(MemberState::Alive | MemberState::Leaving) => continue,
            Some(MemberState::Joining) => {}
            Some(MemberState::Dead | MemberState::Unseen) | None => {
                members.insert(id.to_string(), unseen(id, addr));
            }
        }
        waiting.push(id.clone());
    }
    let members: Vec<Member> = members.into_values().collect();
    // This node counts itself alive while it joins: its own ring holds it (it decides what
    // reaches it directly, and knows which keys it will own).
    let me_joining = |m: &Member| m.state == MemberState::Joining && *m.node_id == **self_id;
    let quorum = if members.iter().any(me_joining) {
        let as_alive: Vec<Member> = members
            .iter()
            .map(|m| {
                let state = if me_joining(m) {
                    MemberState::Alive
                } else {
                    m.state
                };
                Member { state, ..m.clone() }
            })
            .collect();
        previous.quorum.next(&as_alive, now)
    } else {
        previous.quorum.next(&members, now)
    };
    if members == previous.members && quorum == previous.quorum && waiting == previous.awaited {
        return None;
    }
    let peer_addrs: BTreeMap<Arc<str>, String> = members
        .iter()
        .filter(|m| {
            m.state == MemberState::Alive
                || me_joining(m)
                || waiting.iter().any(|w| **w == *m.node_id)
        })
        .map(|m| (Arc::from(m.node_id.as_str()), m.peer_addr.clone()))
        .collect();
    // Without a majority this node owns no keys; its ring stays that of the members it last
    // knew, which says which keys it owned (the router bounds those by their exact buckets).
    let members_of_ring: Vec<&Arc<str>> = if quorum.quorate {
        peer_addrs.keys().collect()
    } else {
        quorum.known.iter().collect()
    };
    let ring = if members_of_ring
        .iter()
        .copied()
        .eq(previous.ring.members().iter())
    {
        previous.ring.clone()
    } else {
        Ring::new(members_of_ring)
    };
    Some(View {
        self_id: self_id.clone(),
        members,
        ring,
        peer_addrs,
        quorum,
        awaited: waiting,
    })
}

fn log_changes(before: &View, after: &View) {
    match (before.quorum.quorate, after.quorum.quorate) {
        (true, false) => tracing::warn!(
            known = after.quorum.known.len(),
            alive = after.ring.len(),
            "fewer than a majority of the known members are seen: owning no keys, answering from fallback shares"
        ),
        (false, true) => tracing::info!(
            alive = after.ring.len(),
            "a majority is seen again: owning keys"
        ),
        _ => {}
    }
    for m in &after.members {
        let old = before
            .members
            .iter()
            .find(|o| o.node_id == m.node_id)
            .map(|o| o.state);
        if old == Some(m.state) {
            continue;
        }
        match m.state {
            MemberState::Alive => {
                tracing::info!(member = %m.node_id, peer = %m.peer_addr, "member joined")
            }
            MemberState::Leaving => tracing::info!(member = %m.node_id, "member leaving"),
            MemberState::Joining => {
                tracing::info!(member = %m.node_id, peer = %m.peer_addr, "member joining")
            }
            MemberState::Dead => tracing::warn!(member = %m.node_id, "member declared dead"),
            // Logged once for all of them when this node starts.
            MemberState::Unseen => {}
        }
    }
    for m in &before.members {
        if !after.members.iter().any(|a| a.node_id == m.node_id) {
            tracing::info!(member = %m.node_id, "member removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chitchat::transport::ChannelTransport;

    fn settings(id: &str, port: u16, seeds: &[u16]) -> GossipSettings {
        GossipSettings {
            node_id: id.to_owned(),
            cluster_id: "ringlimit".to_owned(),
            advertise: SocketAddr::from(([10, 0, 0, 1], port)),
            http_advertise: format!("10.0.0.1:{}", port + 1000),
            grpc_advertise: format!("10.0.0.1:{}", port + 2000),
            seeds: seeds.iter().map(|p| format!("10.0.0.1:{p}")).collect(),
            interval: Duration::from_millis(100),
            joining: false,
            remembered: Remembered::default(),
        }
    }

    async fn start(settings: GossipSettings, net: &ChannelTransport) -> Membership {
        match Membership::start(
            settings,
            net,
            Arc::new(Pauses::new(Duration::from_millis(100))),
        )
        .await
        {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// Waits (in virtual time, at most a minute) until `m`'s view satisfies `what`.
    async fn until(m: &Membership, what: impl Fn(&View) -> bool) -> Arc<View> {
        let mut updates = m.updates();
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let view = updates.borrow_and_update().clone();
                if what(&view) {
                    return view;
                }
                if updates.changed().await.is_err() {
                    return view;
                }
            }
        })
        .await;
        match waited {
            Ok(view) => view,
            Err(_) => panic!("view never came: {:?}", m.view().members),
        }
    }

    fn alive(view: &View) -> Vec<&str> {
        view.members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.node_id.as_str())
            .collect()
    }

    /// Three members over chitchat's in-memory transport see each other; one cut off from the
    /// others is declared dead by them, and its keys leave their ring.
    #[tokio::test(start_paused = true)]
    async fn members_join_see_each_other_and_drop_one_cut_off() {
        let net = ChannelTransport::default();
        let a = start(settings("a", 7001, &[]), &net).await;
        let b = start(settings("b", 7002, &[7001]), &net).await;
        let c = start(settings("c", 7003, &[7001]), &net).await;
        for m in [&a, &b, &c] {
            let view = until(m, |v| alive(v).len() == 3).await;
            assert_eq!(alive(&view), ["a", "b", "c"]);
            assert_eq!(view.ring.len(), 3);
            assert_eq!(view.members[1].http_addr, "10.0.0.1:8002");
            assert_eq!(view.members[1].grpc_addr, "10.0.0.1:9002");
        }
        let addr = |p: u16| SocketAddr::from(([10, 0, 0, 1], p));
        net.remove_link(addr(7003), addr(7001)).await;
        net.remove_link(addr(7003), addr(7002)).await;
        for m in [&a, &b] {
            let view = until(m, |v| alive(v) == ["a", "b"]).await;
            assert_eq!(view.ring.len(), 2);
            assert!(
                view.members
                    .iter()
                    .any(|m| m.node_id == "c" && m.state == MemberState::Dead)
            );
        }
    }

    /// A member that announces it leaves drops out of the others' rings at once (still listed).
    #[tokio::test(start_paused = true)]
    async fn a_leaving_member_leaves_the_ring() {
        let net = ChannelTransport::default();
        let a = start(settings("a", 7001, &[]), &net).await;
        let b = start(settings("b", 7002, &[7001]), &net).await;
        until(&a, |v| v.ring.len() == 2).await;
        b.leave().await;
        let view = until(&a, |v| v.ring.len() == 1).await;
        assert!(
            view.members
                .iter()
                .any(|m| m.node_id == "b" && m.state == MemberState::Leaving)
        );
    }

    /// A node that starts again alone keeps the members of the ring it last saw in its ring,
    /// `unseen`, until each is seen alive (a joining one stays an owner until then), and the
    /// others until the wait is over.
    #[tokio::test(start_paused = true)]
    async fn remembered_members_own_their_keys_until_seen_or_the_wait_is_over() {
        let net = ChannelTransport::default();
        let mut first = settings("a", 7001, &[7002, 7003]);
        first.remembered = Remembered {
            members: vec![
                ("a".to_owned(), "10.0.0.1:7001".to_owned()),
                ("b".to_owned(), "10.0.0.1:7002".to_owned()),
                ("c".to_owned(), "10.0.0.1:7003".to_owned()),
            ],
            within: Duration::from_secs(30),
        };
        let started = tokio::time::Instant::now();
        let a = start(first, &net).await;
        let states = |v: &View| -> Vec<(String, MemberState)> {
            v.members
                .iter()
                .map(|m| (m.node_id.clone(), m.state))
                .collect()
        };
        let view = a.view();
        assert_eq!(view.ring.len(), 3, "the first view already waits for them");
        assert_eq!(view.awaited.len(), 2);
        assert_eq!(
            view.peer_addrs.get("c").map(String::as_str),
            Some("10.0.0.1:7003")
        );
        // Gossip's rounds go by: still theirs.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let view = a.view();
        assert_eq!(
            states(&view),
            [
                ("a".to_owned(), MemberState::Alive),
                ("b".to_owned(), MemberState::Unseen),
                ("c".to_owned(), MemberState::Unseen)
            ]
        );
        assert_eq!((view.ring.len(), view.share_members()), (3, 3));
        assert!(view.quorum.quorate, "a node alone owns its own keys");

        // b starts joining: still awaited, and asked at its own address now.
        let mut second = settings("b", 7002, &[7001]);
        second.joining = true;
        let b = start(second, &net).await;
        let view = until(&a, |v| {
            v.members
                .iter()
                .any(|m| m.node_id == "b" && m.state == MemberState::Joining)
        })
        .await;
        assert_eq!(view.ring.len(), 3);
        assert!(view.awaits("b") && view.awaits("c"));
        b.announce_ready().await;
        let view = until(&a, |v| alive(v) == ["a", "b"]).await;
        assert_eq!((view.ring.len(), view.awaited.len()), (3, 1));
        assert!(!view.awaits("b") && view.awaits("c"));

        // c never comes: dropped once the wait is over, as a dead member is.
        let view = until(&a, |v| v.ring.len() == 2).await;
        assert!(view.awaited.is_empty());
        assert!(!view.members.iter().any(|m| m.node_id == "c"));
        assert!(
            started.elapsed() >= Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }
}
