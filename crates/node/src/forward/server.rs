//! The peer server: accepts connections on the peer port, authenticates them, and decides the
//! checks that arrive here. One exception: a check for a bucket this node no longer holds and no
//! longer owns (it handed the bucket to its new owner, or it is leaving) is relayed once to that
//! owner, marked so that it is decided there whatever that node's ring says; so a check crosses
//! at most two hops and rings that disagree for a moment cannot make it loop.

use super::logins::{Login, Logins};
use super::pool::PeerPool;
use crate::cluster::View;
use crate::decide::Here;
use crate::engine::RuleSpec;
use crate::log_gate::LogGate;
use arc_swap::ArcSwap;
use futures::StreamExt;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::link::fanout::OwnerGroups;
use ringlimit_core::link::framing::{self, FramedPeer, LinkError};
use ringlimit_core::rule::Mode;
use ringlimit_proto::auth::Role;
use ringlimit_proto::handshake::ServerHandshake;
use ringlimit_proto::peer::{
    ALL_OR_NOTHING_GROUP, AnswerGroup, CheckGroup, Frame, PeerAnswer, PeerCheck, RELAYED_GROUP,
    RefundGroup,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Most peer connections served at once once they have logged in; more are refused.
const MAX_CONNECTIONS: usize = 4096;
/// Refusals and bad frames are logged at most this often (with how many were not).
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Global counts merged between two yields to the runtime.
const MERGE_SLICE: usize = 512;

/// Where peer connections come from.
pub trait Acceptor: Send + 'static {
    /// The next connection, framed, and who it comes from (for logs).
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(FramedPeer, String)>> + Send;
}

impl Acceptor for TcpListener {
    async fn accept(&mut self) -> std::io::Result<(FramedPeer, String)> {
        let (stream, from) = TcpListener::accept(self).await?;
        Ok((framing::framed_tcp(stream), from.to_string()))
    }
}

impl Acceptor for ringlimit_core::link::memnet::MemListener {
    async fn accept(&mut self) -> std::io::Result<(FramedPeer, String)> {
        match ringlimit_core::link::memnet::MemListener::accept(self).await {
            Some((io, from)) => Ok((framing::framed(io), from)),
            // The network is gone: nothing will ever connect again.
            None => std::future::pending().await,
        }
    }
}

/// Who this server is.
#[derive(Clone)]
pub struct ServerSettings {
    pub node_id: String,
    pub cluster_id: String,
    pub secret: Option<Arc<[u8]>>,
    /// Whether other nodes may send what only members send (handovers, resets, global counts).
    /// `false` for a node with neither a secret nor `--allow-unauthenticated-peers`: it still
    /// answers checks (the SDK), as its HTTP port does, and nothing else.
    pub accept_members: bool,
    /// The whole handshake must finish within this.
    pub handshake_timeout: Duration,
}

impl ServerSettings {
    /// A server without a secret that accepts members: in-memory clusters of tests.
    pub fn open(node_id: &str, cluster_id: &str) -> Self {
        Self {
            node_id: node_id.into(),
            cluster_id: cluster_id.into(),
            secret: None,
            accept_members: true,
            handshake_timeout: Duration::from_secs(2),
        }
    }
}

/// Counters of the peer server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections refused (bad handshake, wrong cluster or secret, garbage, too many).
    pub refused: AtomicU64,
    /// Checks decided for peers.
    pub checks: AtomicU64,
    /// `Checks` frames received.
    pub frames: AtomicU64,
    /// Buckets received from their previous owner and merged.
    pub handed_over: AtomicU64,
    /// Checks relayed to the owner of a bucket this node had handed over.
    pub relayed: AtomicU64,
}

/// Where checks for buckets this node no longer holds nor owns are relayed: the owner under
/// this node's current view, through its peer pool.
#[derive(Clone)]
pub struct Relay {
    pub view: Arc<ArcSwap<View>>,
    pub pool: Arc<PeerPool>,
}

/// What a node without a secret (and not allowed unauthenticated peers) answers to a frame
/// only members send.
const NOT_MEMBERS: &str = "this node accepts no cluster members: it has no cluster secret \
     (set the same RINGLIMIT_CLUSTER_SECRET on every node)";

/// Applies `merge` to `items` in slices of [`MERGE_SLICE`], yielding between them: a full set
/// (up to 10,000 counts, a few ms to merge) must not hold up the checks sharing this worker.
async fn in_slices<T>(items: &[T], mut merge: impl FnMut(&[T])) {
    for (i, slice) in items.chunks(MERGE_SLICE).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        merge(slice);
    }
}

/// Frames that only a cluster member sends: they change buckets or counts wholesale.
fn members_only(frame: &Frame) -> bool {
    match frame {
        Frame::Checks(groups) => groups.iter().any(|g| g.id & RELAYED_GROUP != 0),
        Frame::Refunds(_) => false,
        _ => true,
    }
}

/// The peer server; [`PeerServer::run`] serves until dropped.
pub struct PeerServer {
    pub stats: Arc<ServerStats>,
    log_gate: LogGate,
    here: Here,
    settings: ServerSettings,
    /// `None`: never relay (decide everything here).
    relay: Option<Relay>,
}

impl PeerServer {
    pub fn new(here: Here, settings: ServerSettings, relay: Option<Relay>) -> Self {
        Self {
            stats: Arc::new(ServerStats::default()),
            log_gate: LogGate::new(LOG_EVERY),
            here,
            settings,
            relay,
        }
    }

    /// Accepts and serves peers from `acceptor` (the peer port, or an in-memory network in
    /// tests). Connections live in a `JoinSet` owned by this future, so dropping it closes them
    /// all.
    pub async fn run(self: Arc<Self>, mut acceptor: impl Acceptor) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let logins = Arc::new(Logins::default());
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = acceptor.accept() => {
                    let (conn, from) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "peer accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let Some(login) = logins.enter(&from) else {
                        self.refuse_quietly(&from, "too many connections from one address in \
                                                    their handshake");
                        continue;
                    };
                    let this = self.clone();
                    let slots = slots.clone();
                    conns.spawn(async move { this.serve(conn, from, login, slots).await });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }

    /// Counts a refusal and logs it, at most once per [`LOG_EVERY`] (with how many since).
    fn refuse_quietly(&self, from: &str, reason: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(unlogged) = self.log_gate.pass() {
            tracing::warn!(%from, %reason, also_refused = unlogged, "peer connection refused");
        }
    }

    /// Refuses `conn` (counted, logged through the gate) and tells the peer why.
    async fn refuse(&self, conn: &mut FramedPeer, from: &str, reason: String) {
        self.refuse_quietly(from, &reason);
        let _ = framing::send(conn, &Frame::Refused { reason }).await;
    }

    async fn serve(&self, mut conn: FramedPeer, from: String, login: Login, slots: Arc<Semaphore>) {
        let handshake = tokio::select! {
            r = self.handshake(&mut conn) => r,
            () = login.evicted() => Err("too many connections in their handshake; the oldest \
                                        is closed".to_owned()),
        };
        drop(login);
        let peer = match handshake {
            Ok(peer) => peer,
            Err(reason) => return self.refuse(&mut conn, &from, reason).await,
        };
        let Ok(_permit) = slots.try_acquire_owned() else {
            let reason = "too many peer connections".to_owned();
            return self.refuse(&mut conn, &from, reason).await;
        };
        tracing::debug!(%from, %peer, "peer connected");
        while let Some(bytes) = conn.next().await {
            let mut len = 0;
            let frame = match bytes.map_err(LinkError::from).and_then(|b| {
                len = b.len();
                Ok(Frame::decode(&b)?)
            }) {
                Ok(f) => f,
                Err(e) => {
                    if let Some(unlogged) = self.log_gate.pass() {
                        tracing::warn!(%from, %peer, error = %e, also_closed = unlogged,
                            "bad frame from peer; closing");
                    }
                    return;
                }
            };
            if !self.settings.accept_members && members_only(&frame) {
                return self.refuse(&mut conn, &from, NOT_MEMBERS.to_owned()).await;
            }
            let groups = match frame {
                Frame::Checks(groups) => groups,
                Frame::Handover(buckets) => {
                    let store = self.here.engine().store();
                    let merged = super::handover::receive(store, buckets, self.here.now());
                    self.stats.handed_over.fetch_add(merged, Ordering::Relaxed);
                    if framing::send(&mut conn, &Frame::HandoverAck { merged })
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                Frame::Reset { ids } => {
                    let store = self.here.engine().store();
                    let removed = ids.iter().filter(|&&id| store.remove(id)).count() as u64;
                    // The node that took the admin request logs the reset; here it is detail.
                    tracing::debug!(%from, %peer, ids = ids.len(), removed, "buckets reset by a peer");
                    if framing::send(&mut conn, &Frame::ResetAck { removed })
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                Frame::GlobalCounts { generation, counts } => {
                    // Unanswered: counts are absolute, the sender resyncs after any loss.
                    let global = self.here.global();
                    in_slices(&counts, |slice| {
                        global.receive(&peer, generation, slice, self.here.now());
                    })
                    .await;
                    global
                        .stats
                        .received_bytes
                        .fetch_add(len as u64 + 4, Ordering::Relaxed);
                    continue;
                }
                Frame::GlobalCountsOf { counts } => {
                    // The end of the peer's full set: the counts it holds of other actors,
                    // merged under each actor (bounded and validated first).
                    let global = self.here.global();
                    let (valid, refused) = crate::global::wire::relayed(&counts);
                    global.stats.malformed.fetch_add(refused, Ordering::Relaxed);
                    in_slices(&valid, |slice| global.merge_relayed(slice, self.here.now())).await;
                    global.note_merge(&peer, std::time::Instant::now());
                    global.note_full_set(&peer);
                    global
                        .stats
                        .received_bytes
                        .fetch_add(len as u64 + 4, Ordering::Relaxed);
                    continue;
                }
                Frame::Refunds(groups) => {
                    let answers = self.refund(groups);
                    if framing::send(&mut conn, &Frame::Answers(answers))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                other => {
                    if let Some(unlogged) = self.log_gate.pass() {
                        tracing::warn!(%from, %peer, kind = other.kind(), also_closed = unlogged,
                            "unexpected frame from peer; closing");
                    }
                    return;
                }
            };
            self.stats.frames.fetch_add(1, Ordering::Relaxed);
            let answers = self.answer(groups).await;
            if let Err(e) = framing::send(&mut conn, &Frame::Answers(answers)).await {
                tracing::debug!(%from, %peer, error = %e, "peer went away");
                return;
            }
        }
    }

    async fn handshake(&self, conn: &mut FramedPeer) -> Result<String, String> {
        let within = self.settings.handshake_timeout;
        let hello = framing::recv(conn, within)
            .await
            .map_err(|e| format!("no hello: {e}"))?;
        let (state, challenge) = ServerHandshake::on_hello(
            hello,
            &self.settings.cluster_id,
            &self.settings.node_id,
            self.settings.secret.as_deref(),
            rand::random(),
        )
        .map_err(|e| e.to_string())?;
        framing::send(conn, &challenge)
            .await
            .map_err(|e| e.to_string())?;
        let proof = framing::recv(conn, within)
            .await
            .map_err(|e| format!("no proof: {e}"))?;
        let key = state.session_key();
        let (peer, welcome) = state.on_proof(proof).map_err(|e| e.to_string())?;
        framing::send(conn, &welcome)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(key) = key {
            conn.codec_mut().seal(&key, Role::Server);
        }
        Ok(peer)
    }

    /// Answers one `Checks` frame: decides here what belongs here, relays the rest (see the
    /// module doc), and decides here whatever a relay could not deliver.
    async fn answer(&self, groups: Vec<CheckGroup>) -> Vec<AnswerGroup> {
        // One instant for the whole frame (see `Engine::decide_at`).
        let now = self.here.now();
        // Relayed checks: their place in `out`, and what deciding them here takes.
        let mut relayed: Vec<(usize, usize, u64, Resolved)> = Vec::new();
        let mut by_owner = OwnerGroups::new();
        let mut out: Vec<AnswerGroup> = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            if g.id & ALL_OR_NOTHING_GROUP != 0 {
                out.push(self.answer_all(g, now));
                continue;
            }
            let may_relay = g.id & RELAYED_GROUP == 0;
            let mut answers = Vec::with_capacity(g.checks.len());
            for (ci, c) in g.checks.iter().enumerate() {
                self.stats.checks.fetch_add(1, Ordering::Relaxed);
                let (resolved, id) = match self.prepare(c) {
                    Ok(p) => p,
                    Err(e) => {
                        answers.push(error_answer(&e));
                        continue;
                    }
                };
                if may_relay && let Some((owner, client)) = self.relay_target(&resolved, id) {
                    by_owner.add(owner, &client, relayed.len());
                    relayed.push((gi, ci, id, resolved));
                    // Replaced below by the owner's answer, or by a local decision.
                    answers.push(PeerAnswer::Error {
                        code: String::new(),
                        message: String::new(),
                    });
                    continue;
                }
                answers.push(PeerAnswer::Answer(
                    self.here.decide_at(id, &resolved, c.cost, now),
                ));
            }
            out.push(AnswerGroup { id: g.id, answers });
        }
        if relayed.is_empty() {
            return out;
        }
        self.stats
            .relayed
            .fetch_add(relayed.len() as u64, Ordering::Relaxed);
        let replies = by_owner
            .send(
                |i| {
                    let (g, c, ..) = relayed[i];
                    groups[g].checks[c].clone()
                },
                |client, checks| async move { client.send_relayed(checks).await },
            )
            .await;
        for (i, reply) in replies {
            let (g, c, id, resolved) = relayed[i];
            out[g].answers[c] = match reply {
                Ok(a) => a,
                // The new owner did not answer: decide here, as before relaying existed.
                Err(_) => PeerAnswer::Answer(self.here.decide_at(
                    id,
                    &resolved,
                    groups[g].checks[c].cost,
                    now,
                )),
            };
        }
        out
    }

    /// One request's checks at this owner, decided all-or-nothing here (never relayed: the
    /// sender refunds what this answers as held, and a refund must find the bucket that took).
    fn answer_all(&self, g: &CheckGroup, now: u64) -> AnswerGroup {
        self.stats
            .checks
            .fetch_add(g.checks.len() as u64, Ordering::Relaxed);
        let prepared: Vec<Result<(Resolved, u64), CheckError>> =
            g.checks.iter().map(|c| self.prepare(c)).collect();
        let items: Vec<_> = prepared
            .iter()
            .zip(&g.checks)
            .map(|(p, c)| p.as_ref().ok().map(|&(r, id)| (id, r, c.cost)))
            .collect();
        let decided = self.here.decide_all(&items, now);
        let answers = decided
            .into_iter()
            .zip(&prepared)
            .map(|(d, p)| match (d, p) {
                (Some((answer, Some(mark))), _) => PeerAnswer::Held { answer, mark },
                (Some((answer, None)), _) => PeerAnswer::Answer(answer),
                (None, Err(e)) => error_answer(e),
                (None, Ok(_)) => PeerAnswer::Error {
                    code: "invalid_request".into(),
                    message: "not decided".into(),
                },
            })
            .collect();
        AnswerGroup { id: g.id, answers }
    }

    /// Gives back what held checks took (see [`Here::refund`]).
    fn refund(&self, groups: Vec<RefundGroup>) -> Vec<AnswerGroup> {
        groups
            .into_iter()
            .map(|g| AnswerGroup {
                id: g.id,
                answers: g
                    .refunds
                    .iter()
                    .map(|r| {
                        match self
                            .here
                            .engine()
                            .prepare(&r.key, RuleSpec::of(&r.rule), r.cost)
                        {
                            Ok((resolved, id)) => {
                                self.here.refund(id, &resolved, r.cost, r.mark);
                                PeerAnswer::Refunded
                            }
                            Err(e) => error_answer(&e),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    fn prepare(&self, c: &PeerCheck) -> Result<(Resolved, u64), CheckError> {
        self.here
            .engine()
            .prepare(&c.key, RuleSpec::of(&c.rule), c.cost)
    }

    /// Where to relay an owner-mode check that a peer sent here: the bucket's owner under this
    /// node's ring, when that is another member and this node does not hold the bucket. A
    /// global rule (reached through the SDK, which sends every check to an owner) is decided
    /// here from the global counters like any global check.
    fn relay_target(
        &self,
        resolved: &Resolved,
        id: u64,
    ) -> Option<(Arc<str>, Arc<ringlimit_core::link::PeerClient>)> {
        if resolved.mode == Mode::Global {
            return None;
        }
        let relay = self.relay.as_ref()?;
        let target = relay.pool.owner_client(&relay.view.load(), id)?;
        (!self.here.engine().store().contains(id)).then_some(target)
    }
}

fn error_answer(e: &CheckError) -> PeerAnswer {
    PeerAnswer::Error {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
