//! The peer server: accepts connections on the peer port, authenticates them, and decides the
//! checks that arrive here. One exception: a check for a bucket this node no longer holds and no
//! longer owns (it handed the bucket to its new owner, or it is leaving) is relayed once to that
//! owner, marked so that it is decided there whatever that node's ring says; so a check crosses
//! at most two hops and rings that disagree for a moment cannot make it loop.
//!
//! This file keeps the connection: the accept loop, mutual TLS when the port has it, the
//! handshake, the member check and the dispatch of each frame kind to its handler, one file
//! each:
//! - [`checks`] — `Checks` (and version 2's `FlaggedChecks`): decide, relay once, all-or-nothing.
//! - [`refunds`] — `Refunds`: give back what all-or-nothing checks held.
//! - [`handover`] — `Handover`: merge the buckets a previous owner hands over.
//! - [`reset`] — `Reset`: drop the buckets an operator reset.
//! - [`recall`] — `Recall`: the states of buckets a member that joined lately owns.
//! - [`lease`] — `Lease`: slices of hot buckets this node owns.
//! - [`reserve`] — `Reserve`, `Settle`: costs estimated now and settled later.
//! - [`rules`] — `RuleChange`: admin API rule changes of names this node owns.
//! - [`top`] — `TopKeys`: this node's most limited keys of a rule.
//! - [`global_counts`] — `GlobalCounts`, `GlobalCountsOf`: merge a member's global counts.

mod checks;
mod global_counts;
mod handover;
mod lease;
mod recall;
mod refunds;
mod replicate;
mod reserve;
mod reset;
mod rules;
mod top;

use super::logins::{Login, Logins};
use super::{PeersHandle, Recall};
use crate::cluster::View;
use crate::decide::Here;
use crate::log_gate::LogGate;
use crate::rules::book::RuleBook;
use arc_swap::ArcSwap;
use futures::StreamExt;
use ringlimit_core::link::framing::{self, BoxedIo, FramedPeer, LinkError};
use ringlimit_core::tls::PeerTls;
use ringlimit_core::top::TopKeys;
use ringlimit_proto::auth::Role;
use ringlimit_proto::handshake::ServerHandshake;
use ringlimit_proto::peer::{
    CheckGroup, Frame, GROUP_KIND_SINCE, GroupKind, OPERATORS_SINCE, QUOTA_SINCE, RESERVE_SINCE,
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

/// Where peer connections come from. What a connection goes through before its frames (TLS,
/// with [`ServerSettings::tls`]) is the server's, in the connection's own task: an acceptor
/// only accepts.
pub trait Acceptor: Send + 'static {
    /// The next connection's byte stream, and who it comes from (for logs).
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(BoxedIo, String)>> + Send;
}

impl Acceptor for TcpListener {
    async fn accept(&mut self) -> std::io::Result<(BoxedIo, String)> {
        let (stream, from) = TcpListener::accept(self).await?;
        // No Nagle: frames are small and latency is the point.
        let _ = stream.set_nodelay(true);
        Ok((Box::new(stream), from.to_string()))
    }
}

impl Acceptor for ringlimit_core::link::memnet::MemListener {
    async fn accept(&mut self) -> std::io::Result<(BoxedIo, String)> {
        match ringlimit_core::link::memnet::MemListener::accept(self).await {
            Some((io, from)) => Ok((io, from)),
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
    /// TLS's handshake, and each message of the protocol's, must come within this.
    pub handshake_timeout: Duration,
    /// Mutual TLS (`--peer-tls-*`): every connection's TLS handshake first, which only a
    /// certificate of the cluster CA passes; `None`: the stream as it is.
    pub tls: Option<PeerTls>,
}

impl ServerSettings {
    /// A server without a secret that accepts members: in-memory clusters of tests.
    #[cfg(test)]
    pub fn open(node_id: &str, cluster_id: &str) -> Self {
        Self {
            node_id: node_id.into(),
            cluster_id: cluster_id.into(),
            secret: None,
            accept_members: true,
            handshake_timeout: Duration::from_secs(2),
            tls: None,
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
/// this node's current view, through its peers.
#[derive(Clone)]
pub struct Relay {
    pub view: Arc<ArcSwap<View>>,
    pub peers: PeersHandle,
    /// `--replicas`: whether this node keeps a copy of a bucket, to decide on it when a peer
    /// asks it as the owner's replica.
    pub replicas: usize,
    /// Buckets this node owns but does not hold yet, recalled before their first check.
    pub recall: Arc<Recall>,
}

/// Who is on the other end of a connection, for handlers' logs and counts.
struct Caller<'a> {
    /// The source address.
    from: &'a str,
    /// The node id it logged in with.
    peer: &'a str,
}

impl PeerServer {
    /// Whether the caller is a client (the SDK) rather than a member: a member's checks were
    /// counted into the top keys where they arrived, a client's are counted here.
    fn is_client(&self, caller: &Caller<'_>) -> bool {
        self.relay.as_ref().is_some_and(|r| {
            !r.view
                .load()
                .members
                .iter()
                .any(|m| *m.node_id == *caller.peer)
        })
    }
}

/// What a node without a secret (and not allowed unauthenticated peers) answers to a frame
/// only members send.
const NOT_MEMBERS: &str = "this node accepts no cluster members: it has no cluster secret \
     (set the same RINGLIMIT_CLUSTER_SECRET on every node)";

/// Frames that only a cluster member sends: they change buckets or counts wholesale.
fn members_only(frame: &Frame) -> bool {
    match frame {
        Frame::Checks(groups) => groups.iter().any(|g| g.kind == GroupKind::Relayed),
        // A lease is a check of many tokens, and its leftovers come back as refunds: what an
        // SDK may do too. A reservation is a check whose cost is settled later: the same.
        // A clock sample tells the time, nothing more: the SDK may ask too.
        Frame::Refunds(_)
        | Frame::Lease { .. }
        | Frame::Reserve { .. }
        | Frame::Settle { .. }
        | Frame::Clock { .. } => false,
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
    /// What operators ask of members; `None`: none kept here (tests' bare servers).
    operators: Option<Operators>,
}

/// What the admin API asks of the member that keeps it: API rules whose names it owns, and the
/// keys it limited most.
#[derive(Clone)]
pub struct Operators {
    pub book: Arc<RuleBook>,
    pub top: Arc<TopKeys>,
    /// RLQS shares of the buckets this node owns.
    pub quota: Option<Arc<dyn QuotaShares>>,
}

/// Who splits the RLQS buckets this node owns among members' streams (`crate::rlqs`, which
/// asks other members through the facade: a trait here keeps the two apart).
pub trait QuotaShares: Send + Sync {
    /// The answers to `member`'s asks, in order.
    fn answer(
        &self,
        member: &str,
        asks: &[ringlimit_proto::peer::QuotaAsk],
    ) -> Vec<ringlimit_proto::peer::QuotaAnswer>;
}

impl PeerServer {
    pub fn new(here: Here, settings: ServerSettings, relay: Option<Relay>) -> Self {
        Self {
            stats: Arc::new(ServerStats::default()),
            log_gate: LogGate::new(LOG_EVERY),
            here,
            settings,
            relay,
            operators: None,
        }
    }

    /// This server, keeping what operators ask of members.
    pub fn with_operators(mut self, operators: Operators) -> Self {
        self.operators = Some(operators);
        self
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
                    let (io, from) = match accepted {
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
                    conns.spawn(async move { this.serve(io, from, login, slots).await });
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

    async fn serve(&self, io: BoxedIo, from: String, login: Login, slots: Arc<Semaphore>) {
        // TLS first (its failure can only be counted and logged: there is no channel to say
        // why), then the protocol's handshake, both in the login's place.
        let io = match &self.settings.tls {
            None => io,
            Some(tls) => {
                let within = self.settings.handshake_timeout;
                let secured = tokio::select! {
                    r = tokio::time::timeout(within, tls.accept(io)) => match r {
                        Ok(Ok(io)) => Ok(io),
                        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
                        Err(_) => Err("TLS handshake not done in time".to_owned()),
                    },
                    () = login.evicted() => Err("too many connections in their handshake; the \
                                                oldest is closed".to_owned()),
                };
                match secured {
                    Ok(io) => io,
                    Err(reason) => return self.refuse_quietly(&from, &reason),
                }
            }
        };
        let mut conn = framing::framed(io);
        let handshake = tokio::select! {
            r = self.handshake(&mut conn) => r,
            () = login.evicted() => Err("too many connections in their handshake; the oldest \
                                        is closed".to_owned()),
        };
        drop(login);
        let (peer, version) = match handshake {
            Ok(agreed) => agreed,
            Err(reason) => return self.refuse(&mut conn, &from, reason).await,
        };
        let Ok(_permit) = slots.try_acquire_owned() else {
            let reason = "too many peer connections".to_owned();
            return self.refuse(&mut conn, &from, reason).await;
        };
        tracing::debug!(%from, %peer, version, "peer connected");
        let caller = Caller {
            from: &from,
            peer: &peer,
        };
        while let Some(bytes) = conn.next().await {
            let mut len = 0;
            let frame = match bytes.map_err(LinkError::from).and_then(|b| {
                len = b.len();
                Ok(Frame::decode(&b)?)
            }) {
                Ok(f) => f,
                // Over TLS a peer that just closes (a session dropped) ends without TLS's
                // close_notify: an end like any other, not a bad frame.
                Err(LinkError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    tracing::debug!(%from, %peer, "peer went away");
                    return;
                }
                Err(e) => {
                    if let Some(unlogged) = self.log_gate.pass() {
                        tracing::warn!(%from, %peer, error = %e, also_closed = unlogged,
                            "bad frame from peer; closing");
                    }
                    return;
                }
            };
            // Each version's checks only where the handshake agreed on it.
            let frame = match frame {
                Frame::FlaggedChecks(groups) if version < GROUP_KIND_SINCE => {
                    Frame::Checks(groups.into_iter().map(CheckGroup::from).collect())
                }
                Frame::Checks(_) if version < GROUP_KIND_SINCE => {
                    return self.unexpected(&caller, &frame);
                }
                other => other,
            };
            if !self.settings.accept_members && members_only(&frame) {
                return self.refuse(&mut conn, &from, NOT_MEMBERS.to_owned()).await;
            }
            let reply = match frame {
                Frame::Checks(groups) => {
                    self.stats.frames.fetch_add(1, Ordering::Relaxed);
                    let client = self.is_client(&caller);
                    Some(Frame::Answers(self.checks(&groups, client).await))
                }
                Frame::Refunds(groups) => Some(Frame::Answers(self.refunds(groups))),
                Frame::Handover(buckets) => Some(self.handover(&caller, buckets)),
                Frame::Replicate { buckets } => Some(self.replicate(buckets)),
                Frame::ReplicateOneWay { buckets } => {
                    self.replicate(buckets);
                    None
                }
                Frame::HandBack { buckets } => Some(self.hand_back(buckets)),
                Frame::Recall { ids } => Some(self.recall(&ids)),
                Frame::Lease { asks } => Some(self.lease(&caller, asks).await),
                Frame::Reserve { asks } if version >= RESERVE_SINCE => {
                    Some(self.reserve(asks).await)
                }
                Frame::Settle { settles } if version >= RESERVE_SINCE => Some(self.settle(settles)),
                Frame::Reset { ids } => Some(self.reset(&caller, ids)),
                Frame::RuleChange(change) if version >= OPERATORS_SINCE => {
                    Some(self.rule_change(&caller, change))
                }
                Frame::TopKeys { rule, by, n } if version >= OPERATORS_SINCE => {
                    Some(self.top_keys(&rule, by, n))
                }
                Frame::Quota { asks } if version >= QUOTA_SINCE => Some(self.quota(&caller, &asks)),
                Frame::Clock { sent_ns } if version >= OPERATORS_SINCE => Some(Frame::ClockIs {
                    sent_ns,
                    now_ns: self.here.now(),
                }),
                Frame::GlobalCounts { generation, counts } => {
                    self.global_counts(&caller, generation, counts, len).await;
                    None
                }
                Frame::GlobalCountsOf { counts } => {
                    self.global_counts_of(&caller, counts, len).await;
                    None
                }
                other => return self.unexpected(&caller, &other),
            };
            if let Some(reply) = reply
                && let Err(e) = framing::send(&mut conn, &reply).await
            {
                tracing::debug!(%from, %peer, error = %e, "peer went away");
                return;
            }
        }
    }

    /// Logs (through the gate) a frame a peer does not send here; the connection then closes.
    fn unexpected(&self, caller: &Caller<'_>, frame: &Frame) {
        if let Some(unlogged) = self.log_gate.pass() {
            tracing::warn!(from = %caller.from, peer = %caller.peer, kind = frame.kind(),
                also_closed = unlogged, "unexpected frame from peer; closing");
        }
    }

    /// Runs the server's side of the handshake; returns the peer's node id and the version the
    /// connection speaks.
    async fn handshake(&self, conn: &mut FramedPeer) -> Result<(String, u16), String> {
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
        let version = state.version();
        let (peer, welcome) = state.on_proof(proof).map_err(|e| e.to_string())?;
        framing::send(conn, &welcome)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(key) = key {
            conn.codec_mut().seal(&key, Role::Server);
        }
        Ok((peer, version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::link::memnet::MemNet;
    use ringlimit_proto::handshake::ClientHandshake;
    use ringlimit_proto::peer::{
        ALL_OR_NOTHING_GROUP, FlaggedGroup, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, PeerAnswer,
        PeerCheck,
    };
    use ringlimit_proto::{Algorithm, InlineRule, RuleRef};

    /// A real peer server at "s" on `net`, deciding everything here.
    fn server(net: &MemNet) -> tokio::task::JoinHandle<()> {
        server_with_engine(net).0
    }

    /// [`server`], and its engine.
    fn server_with_engine(
        net: &MemNet,
    ) -> (tokio::task::JoinHandle<()>, Arc<crate::engine::Engine>) {
        let clock = Arc::new(ringlimit_core::clock::ManualClock::new(1_000_000_000));
        let engine = Arc::new(crate::engine::Engine::new(
            crate::rules::RuleSet::builtin(),
            100,
            clock,
        ));
        let counters = Arc::new(crate::global::GlobalCounters::new(
            crate::global::actor("s", 1),
            100,
        ));
        let server = Arc::new(PeerServer::new(
            Here::new(engine.clone(), counters),
            ServerSettings::open("s", "c"),
            None,
        ));
        (tokio::spawn(server.run(net.listen("s"))), engine)
    }

    /// Logs in to "s" offering `version`.
    async fn log_in(net: &MemNet, version: u16) -> FramedPeer {
        let within = Duration::from_secs(1);
        let io = net.dialer("old").dial("s").await.expect("dialed");
        let mut conn = framing::framed(io);
        let (mut hs, hello) = ClientHandshake::offering(version, "c", "old", None, [1; 16]);
        framing::send(&mut conn, &hello).await.expect("hello");
        let challenge = framing::recv(&mut conn, within).await.expect("challenge");
        let proof = hs.on_challenge(challenge).expect("accepted version");
        assert_eq!(hs.version(), version);
        framing::send(&mut conn, &proof).await.expect("proof");
        let welcome = framing::recv(&mut conn, within).await.expect("welcome");
        hs.on_welcome(welcome).expect("welcome");
        conn
    }

    fn check(key: &str) -> PeerCheck {
        PeerCheck {
            key: key.into(),
            rule: RuleRef::Inline(InlineRule {
                limit: 5,
                period_ms: 1_000,
                algorithm: Algorithm::TokenBucket,
                burst: None,
            }),
            cost: 1,
        }
    }

    /// A version-2 peer still gets its flagged groups decided as their bits say (here
    /// all-or-nothing: held answers), answered under the id it sent; version 3's frame is not
    /// what it agreed, and closes the connection.
    #[tokio::test(start_paused = true)]
    async fn a_version_2_peer_is_answered_by_its_groups_bits() {
        let net = MemNet::new();
        let _server = server(&net);
        let mut conn = log_in(&net, OLDEST_PROTOCOL_VERSION).await;
        let id = 7 | ALL_OR_NOTHING_GROUP;
        let flagged = Frame::FlaggedChecks(vec![FlaggedGroup {
            id,
            checks: vec![check("a"), check("b")],
        }]);
        framing::send(&mut conn, &flagged).await.expect("sent");
        let within = Duration::from_secs(1);
        let Frame::Answers(groups) = framing::recv(&mut conn, within).await.expect("answer") else {
            panic!("not answers");
        };
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].id, id, "the id comes back whole");
        assert!(
            groups[0]
                .answers
                .iter()
                .all(|a| matches!(a, PeerAnswer::Held { .. })),
            "{:?}",
            groups[0].answers
        );

        let new = Frame::Checks(vec![CheckGroup {
            id: 8,
            kind: GroupKind::Owned,
            checks: vec![check("c")],
        }]);
        framing::send(&mut conn, &new).await.expect("sent");
        assert!(framing::recv(&mut conn, within).await.is_err(), "closed");
    }

    /// A recall is answered with the live states held here — the bucket of its own or the copy
    /// — read, not taken, and nothing for a bucket not held; copies streamed one way are kept
    /// and not answered (the recall's answer is the next frame).
    #[tokio::test(start_paused = true)]
    async fn a_recall_reads_buckets_and_copies_and_one_way_copies_are_kept() {
        let net = MemNet::new();
        let (_server, engine) = server_with_engine(&net);
        let mut conn = log_in(&net, PROTOCOL_VERSION).await;
        let within = Duration::from_secs(1);
        let owned = Frame::Checks(vec![CheckGroup {
            id: 1,
            kind: GroupKind::Owned,
            checks: vec![check("a")],
        }]);
        framing::send(&mut conn, &owned).await.expect("sent");
        let answer = framing::recv(&mut conn, within).await.expect("answer");
        assert!(matches!(answer, Frame::Answers(_)), "{answer:?}");
        let id_of = |key: &str| {
            let c = check(key);
            let spec = crate::rules::RuleSpec::of(&c.rule);
            engine.prepare(key, spec, 1).expect("a valid check").1
        };
        let (a, b, c) = (id_of("a"), id_of("b"), id_of("c"));
        let state = engine.peek(a).expect("decided here");
        let copy = Frame::ReplicateOneWay {
            buckets: vec![ringlimit_proto::peer::ReplicaBucket {
                id: b,
                state: Some(state.to_wire()),
            }],
        };
        framing::send(&mut conn, &copy).await.expect("sent");
        let recall = Frame::Recall { ids: vec![a, b, c] };
        framing::send(&mut conn, &recall).await.expect("sent");
        let Frame::Recalled { buckets } = framing::recv(&mut conn, within).await.expect("answer")
        else {
            panic!("not recalled");
        };
        let ids: Vec<u64> = buckets.iter().map(|r| r.id).collect();
        assert_eq!(ids, [a, b]);
        assert!(
            engine.holds(a) && engine.peek_copy(b).is_some(),
            "read, not taken"
        );
    }

    /// Reservations are kept only by a connection that agreed on protocol 7: a peer that
    /// agreed on 6 and sends one anyway is closed; on 7, a reserve of a bucket is kept and
    /// settled once.
    #[tokio::test(start_paused = true)]
    async fn reservations_need_protocol_7_and_settle_once() {
        use ringlimit_proto::peer::{PeerReserve, PeerSettle, SettleAnswer};
        let net = MemNet::new();
        let _server = server(&net);
        let within = Duration::from_secs(1);
        let c = check("a");
        let reserve = Frame::Reserve {
            asks: vec![PeerReserve {
                key: c.key.clone(),
                rule: c.rule.clone(),
                cost: 3,
                ttl_ms: 1_000,
                nonce: 77,
            }],
        };
        let mut old = log_in(&net, 6).await;
        framing::send(&mut old, &reserve).await.expect("sent");
        assert!(framing::recv(&mut old, within).await.is_err(), "closed");

        let mut conn = log_in(&net, PROTOCOL_VERSION).await;
        framing::send(&mut conn, &reserve).await.expect("sent");
        let Frame::Reserved { answers } = framing::recv(&mut conn, within).await.expect("answer")
        else {
            panic!("not reserved");
        };
        assert!(
            matches!(&answers[..], [PeerAnswer::Answer(a)] if a.allowed && a.remaining == 2),
            "{answers:?}"
        );
        let settle = Frame::Settle {
            settles: vec![PeerSettle {
                key: c.key,
                rule: c.rule,
                nonce: 77,
                cost: 1,
            }],
        };
        for want_remaining in [Some(4), None] {
            framing::send(&mut conn, &settle).await.expect("sent");
            let Frame::Settled { answers } =
                framing::recv(&mut conn, within).await.expect("answer")
            else {
                panic!("not settled");
            };
            match (&answers[..], want_remaining) {
                ([SettleAnswer::Answer(a)], Some(r)) => assert_eq!(a.remaining, r),
                ([SettleAnswer::Unknown], None) => {}
                other => panic!("{other:?}"),
            }
        }
    }
}
