//! The peer server: accepts connections on the peer port, authenticates them, and answers
//! their frames. Checks go to the node's one front door ([`PeerChecks`]: the check service,
//! which routes them as they arrived and counts a client's); every other frame is answered by
//! its handler from the local state.
//!
//! This file keeps the connection: the accept loop, mutual TLS when the port has it, the
//! handshake, the member check and the dispatch of each frame kind to its handler, one file
//! each:
//! - [`checks`] — `Checks` (and version 2's `FlaggedChecks`): to the front door.
//! - [`refunds`] — `Refunds`: give back what all-or-nothing checks held (a client only what
//!   its own connection's holds took: [`crate::local::holds`]).
//! - [`handover`] — `Handover`: merge the buckets a previous owner hands over.
//! - [`replicate`] — `Replicate`, `ReplicateOneWay`: keep copies of an owner's buckets;
//!   `HandBack`: merge what a replica decided for this node while it did not answer.
//! - [`reset`] — `Reset`: drop the buckets an operator reset.
//! - [`blocks`] — `Blocks`: keep the blocks a member announced.
//! - [`recall`] — `Recall`: the states of buckets a member that joined lately owns.
//! - [`lease`] — `Lease`: slices of hot buckets this node owns.
//! - [`reservations`] — `Reserve`, `Settle`: costs estimated now and settled later.
//! - [`rules`] — `RuleChange`: admin API rule changes of names this node owns.
//! - [`top_keys`] — `TopKeys`: this node's most limited keys of a rule.
//! - [`quota`] — `Quota`: RLQS shares of the buckets this node owns.
//! - [`global_counts`] — `GlobalCounts`, `GlobalCountsOf`: merge a member's global counts.
//!
//! # Members and clients
//! A connection that proved the cluster secret (or, on a node with peer mTLS or
//! `--allow-unauthenticated-peers`, any that got through) is a member's and may send every
//! frame. One that proved a client credential (a token with the `check` role), or nothing on a
//! node without a secret, is a client's: it may send checks, lease asks, reservations, settles,
//! clock samples and refunds of what its own holds took ([`crate::local::holds`]), and is
//! closed on anything else (see [`members_only`]).

mod blocks;
mod checks;
mod global_counts;
mod handover;
mod lease;
mod quota;
mod recall;
mod refunds;
mod replicate;
mod reservations;
mod reset;
mod rules;
mod top_keys;

use super::Recall;
use super::logins::{Login, Logins};
use crate::cluster::View;
use crate::local::Local;
use crate::local::holds::Holds;
use crate::log_gate::LogGate;
use crate::rules::book::RuleBook;
use arc_swap::ArcSwap;
use futures::StreamExt;
use ringlimit_core::link::framing::{self, BoxedIo, FramedPeer, LinkError};
use ringlimit_core::tls::PeerTls;
use ringlimit_core::top_keys::TopKeys;
use ringlimit_proto::auth::{NamedClientKey, Role};
use ringlimit_proto::handshake::{Proven, ServerHandshake};
use ringlimit_proto::peer::{
    AnswerGroup, BLOCKED_ANSWER_SINCE, BLOCKS_SINCE, CheckGroup, Frame, GROUP_KIND_SINCE,
    GroupKind, OPERATORS_SINCE, QUOTA_SINCE, REGION_COUNTS_SINCE, REGION_TALLY_SINCE,
    RESERVE_SINCE,
};
use ringlimit_proto::region::RegionAskEntry;
use std::pin::Pin;
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
    /// The client credentials this node accepts, read at each client's handshake (they are
    /// reloaded with their file).
    pub clients: Arc<dyn ClientKeys>,
}

/// The client credentials a node accepts: tokens with the `check` role (the admin tokens'
/// file, `RINGLIMIT_CLIENT_TOKEN`). A trait so that the peer server knows nothing of the file.
pub trait ClientKeys: Send + Sync {
    /// The keys in force now.
    fn client_keys(&self) -> Arc<[NamedClientKey]>;
}

/// No client credentials: clients are refused unless the node has no secret.
#[cfg(test)]
pub struct NoClientKeys;

#[cfg(test)]
impl ClientKeys for NoClientKeys {
    fn client_keys(&self) -> Arc<[NamedClientKey]> {
        Arc::from(Vec::new())
    }
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
            clients: Arc::new(NoClientKeys),
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
}

/// The cluster this server answers in: the membership view (who owns a bucket, who is a
/// member), and the buckets this node owns but does not hold yet, recalled before a lease or a
/// reservation takes from them.
#[derive(Clone)]
pub struct Cluster {
    pub view: Arc<ArcSwap<View>>,
    pub recall: Arc<Recall>,
}

/// The node's one front door for checks (`crate::service::CheckService`), as the peer port
/// calls it: the checks that arrive here are decided, counted and timed where every edge's
/// are. A trait here keeps the server below the service.
pub trait PeerChecks: Send + Sync {
    /// Decides one frame's groups, each answered under its id; `client`: a client's frame
    /// (counted there), not a member's (counted where it arrived).
    fn checks<'a>(
        &'a self,
        groups: &'a [CheckGroup],
        client: bool,
    ) -> Pin<Box<dyn Future<Output = Vec<AnswerGroup>> + Send + 'a>>;
}

/// Who is on the other end of a connection, for handlers' logs and counts.
struct Caller<'a> {
    /// The source address.
    from: &'a str,
    /// The node id it logged in with (its own word: only its proof is checked).
    peer: &'a str,
    /// Whether it may send what only members send (see the module doc).
    member: bool,
}

impl PeerServer {
    /// Whether the caller's checks are counted into the top keys here: a client's (the SDK's)
    /// are; a ring member's were counted where they arrived. A process that proved the secret
    /// without being on the ring (an SDK run as a member) is counted here too.
    fn is_client(&self, caller: &Caller<'_>) -> bool {
        !caller.member
            || self.cluster.as_ref().is_some_and(|r| {
                !r.view
                    .load()
                    .members
                    .iter()
                    .any(|m| *m.node_id == *caller.peer)
            })
    }

    /// Whether a connection that proved `proven` is a member's, or refused (a reason).
    fn membership(&self, proven: &Proven, clients: bool) -> Result<bool, String> {
        match proven {
            Proven::Secret => Ok(true),
            Proven::Credential(_) => Ok(false),
            Proven::Nothing if self.settings.accept_members => Ok(true),
            // A node that keeps client credentials takes no anonymous clients.
            Proven::Nothing if clients => Err(NEEDS_CREDENTIAL.to_owned()),
            Proven::Nothing | Proven::Region(_) => Ok(false),
        }
    }
}

/// What a node without a secret (and not allowed unauthenticated peers) answers to a frame
/// only members send.
const NOT_MEMBERS: &str = "this node accepts no cluster members: it has no cluster secret \
     (set the same RINGLIMIT_CLUSTER_SECRET on every node)";
/// What a client's connection is told when it sends a frame only members send.
const CLIENTS_MAY_NOT: &str = "a client may send checks, leases, reservations, settles and \
     refunds of its own holds only: this frame is a cluster member's (members prove the \
     cluster secret)";
/// What an anonymous client of a node that keeps client credentials is told.
const NO_REGIONS: &str = "region link refused: this node has no --region-peers (it shares \
     no limits with other regions)";
const NO_REGION_SECRET: &str = "region link refused: this node has no RINGLIMIT_REGION_SECRET \
     and no peer mTLS, so it cannot authenticate other regions";
const NEEDS_CREDENTIAL: &str = "this node needs a client credential: a token with the `check` \
     role (the SDK's client_token)";

/// Frames that only a cluster member sends: they change buckets or counts wholesale.
/// `answers` as a peer of protocol `version` decodes them (an older one takes a block's
/// answer without its block).
fn answers_for(mut answers: Vec<AnswerGroup>, version: u16) -> Vec<AnswerGroup> {
    if version < BLOCKED_ANSWER_SINCE {
        for g in &mut answers {
            for a in &mut g.answers {
                *a = std::mem::replace(a, ringlimit_proto::peer::PeerAnswer::Refunded)
                    .for_version(version);
            }
        }
    }
    answers
}

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
    local: Arc<Local>,
    settings: ServerSettings,
    /// `None`: a server alone (tests), which owns every bucket sent to it.
    cluster: Option<Cluster>,
    /// Where checks go; unset: nowhere (tests' servers that answer other frames only). Set
    /// once the front door is built, which is after this server (the wiring's edges stage).
    checks: std::sync::OnceLock<Arc<dyn PeerChecks>>,
    /// What operators ask of members; `None`: none kept here (tests' bare servers).
    operators: Option<Operators>,
    /// A node with regions: region links' asks are answered here.
    regions: Option<Arc<crate::regions::Regions>>,
    /// Where a region link's asks for buckets other members own are relayed.
    relay: Option<ringlimit_core::link::session::Sessions>,
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
    pub fn new(local: Arc<Local>, settings: ServerSettings, cluster: Option<Cluster>) -> Self {
        Self {
            stats: Arc::new(ServerStats::default()),
            log_gate: LogGate::new(LOG_EVERY),
            local,
            settings,
            cluster,
            checks: std::sync::OnceLock::new(),
            operators: None,
            regions: None,
            relay: None,
        }
    }

    /// Answering region links (a node with `--region` and `--region-peers`).
    pub fn with_regions(
        mut self,
        regions: Option<Arc<crate::regions::Regions>>,
        relay: ringlimit_core::link::session::Sessions,
    ) -> Self {
        self.regions = regions;
        self.relay = Some(relay);
        self
    }

    /// This server, deciding checks through `checks` (the node's check service).
    #[cfg(test)]
    pub fn with_checks(self, checks: Arc<dyn PeerChecks>) -> Self {
        self.send_checks_to(checks);
        self
    }

    /// Decides checks through `checks` from now on (the first call wins: there is one front
    /// door).
    pub fn send_checks_to(&self, checks: Arc<dyn PeerChecks>) {
        let _ = self.checks.set(checks);
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
        let (peer, version, member, region) = match handshake {
            Ok(agreed) => agreed,
            Err(reason) => return self.refuse(&mut conn, &from, reason).await,
        };
        let Ok(_permit) = slots.try_acquire_owned() else {
            let reason = "too many peer connections".to_owned();
            return self.refuse(&mut conn, &from, reason).await;
        };
        tracing::debug!(%from, %peer, version, member, "peer connected");
        let caller = Caller {
            from: &from,
            peer: &peer,
            member,
        };
        // What this connection's own checks and leases took, for its refunds: a client's
        // only (see [`crate::local::holds`]).
        let mut holds = (!member).then(Holds::default);
        if region {
            return self.serve_region(conn, &caller, version).await;
        }
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
            if !member && members_only(&frame) {
                let reason = if self.settings.accept_members || self.settings.secret.is_some() {
                    CLIENTS_MAY_NOT
                } else {
                    NOT_MEMBERS
                };
                return self.refuse(&mut conn, &from, reason.to_owned()).await;
            }
            let reply = match frame {
                Frame::Checks(groups) => {
                    self.stats.frames.fetch_add(1, Ordering::Relaxed);
                    let client = self.is_client(&caller);
                    let answers = self.checks(&groups, client).await;
                    if let Some(holds) = holds.as_mut() {
                        self.keep_holds(holds, &groups, &answers);
                    }
                    Some(Frame::Answers(answers_for(answers, version)))
                }
                Frame::Refunds(groups) => {
                    Some(Frame::Answers(self.refunds(groups, holds.as_mut())))
                }
                Frame::Handover(buckets) => Some(self.handover(&caller, buckets)),
                Frame::Replicate { buckets } => Some(self.replicate(buckets)),
                Frame::ReplicateOneWay { buckets } => {
                    self.replicate(buckets);
                    None
                }
                Frame::HandBack { buckets } => Some(self.hand_back(buckets)),
                Frame::Recall { ids } => Some(self.recall(&ids)),
                Frame::Lease { asks } => Some(self.lease(&caller, asks, holds.as_mut()).await),
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
                    now_ns: self.local.now(),
                }),
                Frame::RegionRelayTallied { region, asks } if version >= REGION_TALLY_SINCE => {
                    let asks = asks.into_iter().map(RegionAskEntry::from).collect();
                    match self.region_relay(&region, asks) {
                        Some(grants) => Some(grants),
                        None => {
                            return self.unexpected(
                                &caller,
                                &Frame::RegionRelayTallied {
                                    region,
                                    asks: Vec::new(),
                                },
                            );
                        }
                    }
                }
                Frame::RegionRelay { region, asks } => match self.region_relay(&region, asks) {
                    Some(grants) => Some(grants),
                    None => {
                        return self.unexpected(
                            &caller,
                            &Frame::RegionRelay {
                                region,
                                asks: Vec::new(),
                            },
                        );
                    }
                },
                Frame::Blocks { changes } if version >= BLOCKS_SINCE => {
                    Some(self.blocks(&caller, &changes))
                }
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

    /// A region link: only `RegionAsks`, each answered with its grants, and (from
    /// [`REGION_COUNTS_SINCE`]) `RegionCounts`, merged and answered with this node's clock;
    /// anything else (or a bad frame) closes it.
    async fn serve_region(&self, mut conn: FramedPeer, caller: &Caller<'_>, version: u16) {
        let Some(regions) = self.regions.clone() else {
            return;
        };
        tracing::info!(from = %caller.from, peer = %caller.peer, "region link up");
        while let Some(bytes) = conn.next().await {
            let frame = match bytes
                .map_err(LinkError::from)
                .and_then(|b| Ok(Frame::decode(&b)?))
            {
                Ok(f) => f,
                Err(e) => {
                    if let Some(unlogged) = self.log_gate.pass() {
                        tracing::warn!(from = %caller.from, peer = %caller.peer, error = %e,
                            also_closed = unlogged, "region link closed");
                    }
                    return;
                }
            };
            let (region, asks) = match frame {
                Frame::RegionAsks { region, asks } => (region, asks),
                Frame::RegionAsksTallied { region, asks } if version >= REGION_TALLY_SINCE => {
                    (region, asks.into_iter().map(RegionAskEntry::from).collect())
                }
                Frame::RegionCounts {
                    region,
                    sent_ns,
                    counts,
                } if version >= REGION_COUNTS_SINCE => {
                    let global = self.local.global();
                    let now = self.local.now();
                    let Some(refused) =
                        crate::regions::counts::receive(&regions, global, &region, &counts, now)
                    else {
                        return self.unexpected(
                            caller,
                            &Frame::RegionCounts {
                                region,
                                sent_ns,
                                counts: Vec::new(),
                            },
                        );
                    };
                    let ack = Frame::RegionCountsAck {
                        sent_ns,
                        now_ns: global.cluster_now(self.local.now()),
                        refused,
                    };
                    if framing::send(&mut conn, &ack).await.is_err() {
                        return;
                    }
                    continue;
                }
                other => return self.unexpected(caller, &other),
            };
            if asks.len() > ringlimit_proto::region::MAX_ASKS_PER_FRAME {
                return self.unexpected(
                    caller,
                    &Frame::RegionAsks {
                        region,
                        asks: Vec::new(),
                    },
                );
            }
            let grants = self.region_asks(&regions, &region, asks).await;
            if framing::send(&mut conn, &Frame::RegionGrants { grants })
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Asks another member of this region relayed from a region link, answered here; `None`
    /// when this node takes no region links or the frame holds too many.
    fn region_relay(&self, region: &str, asks: Vec<RegionAskEntry>) -> Option<Frame> {
        match &self.regions {
            Some(r) if asks.len() <= ringlimit_proto::region::MAX_ASKS_PER_FRAME => {
                Some(Frame::RegionGrants {
                    grants: r.serve(&self.local, region, asks, |id| self.owns(id)),
                })
            }
            _ => None,
        }
    }

    /// A region link's asks: those of buckets this node owns answered here, the others relayed
    /// to their owners in this region (at once, each within an interval).
    async fn region_asks(
        &self,
        regions: &crate::regions::Regions,
        region: &str,
        asks: Vec<RegionAskEntry>,
    ) -> Vec<ringlimit_proto::region::RegionGrantEntry> {
        use ringlimit_proto::region::{RegionGrant, RegionGrantEntry};
        let view = self.cluster.as_ref().map(|c| c.view.load_full());
        let mut here = Vec::new();
        let mut away: std::collections::HashMap<String, Vec<_>> = Default::default();
        for a in asks {
            let owner = match (&view, regions.bucket_of(&self.local, &a.ask)) {
                (Some(v), Some(id)) if !self.owns(id) => v
                    .ring
                    .owner(id)
                    .and_then(|o| v.members.iter().find(|m| *m.node_id == *o))
                    .map(|m| m.peer_addr.clone()),
                _ => None,
            };
            match owner {
                Some(addr) => away.entry(addr).or_default().push(a),
                None => here.push(a),
            }
        }
        let mut grants = regions.serve(&self.local, region, here, |id| self.owns(id));
        let Some(sessions) = &self.relay else {
            return grants;
        };
        let within = Duration::from_nanos(regions.settings().interval_ns);
        let relayed = away.into_iter().map(|(addr, asks)| async move {
            let seqs: Vec<u64> = asks.iter().map(|a| a.seq).collect();
            let mut session = sessions.open(&addr);
            let answer = match session.version().await {
                Ok(version) => {
                    let frame = crate::regions::link::relay_frame(region, asks, version);
                    session.request(&frame, within).await
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(Frame::RegionGrants { grants }) => grants,
                other => {
                    let why = match other {
                        Ok(f) => format!("unexpected {} frame", f.kind()),
                        Err(e) => e.to_string(),
                    };
                    seqs.into_iter()
                        .map(|seq| RegionGrantEntry {
                            seq,
                            grant: RegionGrant::Error {
                                code: "relay_failed".to_owned(),
                                message: format!("the bucket's owner in this region: {why}"),
                            },
                        })
                        .collect()
                }
            }
        });
        for g in futures::future::join_all(relayed).await {
            grants.extend(g);
        }
        grants
    }

    /// Logs (through the gate) a frame a peer does not send here; the connection then closes.
    fn unexpected(&self, caller: &Caller<'_>, frame: &Frame) {
        if let Some(unlogged) = self.log_gate.pass() {
            tracing::warn!(from = %caller.from, peer = %caller.peer, kind = frame.kind(),
                also_closed = unlogged, "unexpected frame from peer; closing");
        }
    }

    /// Runs the server's side of the handshake; returns the peer's node id, the version the
    /// connection speaks, and whether it is a member's (see the module doc).
    async fn handshake(&self, conn: &mut FramedPeer) -> Result<(String, u16, bool, bool), String> {
        let within = self.settings.handshake_timeout;
        let hello = framing::recv(conn, within)
            .await
            .map_err(|e| format!("no hello: {e}"))?;
        // A region link proves the region secret, bound to the regions' context.
        let region_secret = match (&hello, &self.regions) {
            (Frame::RegionHello(_), None) => return Err(NO_REGIONS.to_owned()),
            (Frame::RegionHello(_), Some(r)) => Some(r.secret()),
            _ => None,
        };
        let (cluster_id, secret) = match &region_secret {
            Some(s) => (ringlimit_proto::region::REGION_CONTEXT, s.clone()),
            None => (
                self.settings.cluster_id.as_str(),
                self.settings.secret.clone(),
            ),
        };
        let (state, challenge) = ServerHandshake::on_hello(
            hello,
            cluster_id,
            &self.settings.node_id,
            secret.as_deref(),
            rand::random(),
        )
        .map_err(|e| e.to_string())?;
        framing::send(conn, &challenge)
            .await
            .map_err(|e| e.to_string())?;
        let proof = framing::recv(conn, within)
            .await
            .map_err(|e| format!("no proof: {e}"))?;
        let version = state.version();
        let clients = self.settings.clients.client_keys();
        let accepted = state.on_proof(proof, &clients).map_err(|e| e.to_string())?;
        if accepted.proven == Proven::Region(false) && self.settings.tls.is_none() {
            return Err(NO_REGION_SECRET.to_owned());
        }
        let member = self.membership(&accepted.proven, !clients.is_empty())?;
        framing::send(conn, &accepted.welcome)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(key) = accepted.session_key {
            conn.codec_mut().seal(&key, Role::Server);
        }
        if let Proven::Credential(name) = &accepted.proven {
            tracing::debug!(peer = %accepted.peer, credential = %name, "client logged in");
        }
        let region = matches!(accepted.proven, Proven::Region(_));
        Ok((accepted.peer, version, member, region))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::link::memnet::MemNet;
    use ringlimit_proto::handshake::ClientHandshake;
    use ringlimit_proto::peer::{
        ALL_OR_NOTHING_GROUP, FlaggedGroup, Mark, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
        PeerAnswer, PeerCheck, PeerRefund, RefundGroup,
    };
    use ringlimit_proto::{Algorithm, InlineRule, RuleRef};

    /// A real peer server at "s" on `net`, deciding everything here.
    fn server(net: &MemNet) -> tokio::task::JoinHandle<()> {
        server_with_local(net).0
    }

    /// [`server`], and its local state.
    fn server_with_local(net: &MemNet) -> (tokio::task::JoinHandle<()>, Arc<Local>) {
        server_with(net, ServerSettings::open("s", "c"))
    }

    /// Client credentials fixed for a test.
    struct Keys(Vec<NamedClientKey>);

    impl ClientKeys for Keys {
        fn client_keys(&self) -> Arc<[NamedClientKey]> {
            Arc::from(self.0.clone())
        }
    }

    /// A server at "s" that has `secret` (or none: then it takes no members) and accepts the
    /// client token `svc-token-0000001`, named "svc".
    fn guarded_server(net: &MemNet, secret: Option<&[u8]>) -> tokio::task::JoinHandle<()> {
        guarded_server_counted(net, secret).0
    }

    /// [`guarded_server`], and the metrics its checks are counted in.
    fn guarded_server_counted(
        net: &MemNet,
        secret: Option<&[u8]>,
    ) -> (tokio::task::JoinHandle<()>, Arc<crate::metrics::Metrics>) {
        let settings = ServerSettings {
            secret: secret.map(Arc::from),
            accept_members: secret.is_some(),
            clients: Arc::new(Keys(vec![NamedClientKey {
                name: "svc".into(),
                key: ringlimit_proto::auth::client_key(b"svc-token-0000001"),
            }])),
            ..ServerSettings::open("s", "c")
        };
        let (task, _, metrics) = server_counted(net, settings);
        (task, metrics)
    }

    /// Logs in to "s" as a client proving `token`, or as a member proving `secret`; the
    /// connection, sealed as the server seals it.
    async fn log_in_as(
        net: &MemNet,
        token: Option<&[u8]>,
        secret: Option<&[u8]>,
    ) -> Result<FramedPeer, String> {
        let within = Duration::from_secs(1);
        let io = net.dialer("sdk").dial("s").await.expect("dialed");
        let mut conn = framing::framed(io);
        let (mut hs, hello) = match token {
            Some(t) => ClientHandshake::start_client("c", "sdk", t, [1; 16]),
            None => ClientHandshake::start("c", "sdk", secret, [1; 16]),
        };
        framing::send(&mut conn, &hello).await.expect("hello");
        let challenge = framing::recv(&mut conn, within)
            .await
            .map_err(|e| e.to_string())?;
        let proof = hs.on_challenge(challenge).map_err(|e| e.to_string())?;
        framing::send(&mut conn, &proof).await.expect("proof");
        let key = hs.session_key();
        let welcome = framing::recv(&mut conn, within)
            .await
            .map_err(|e| e.to_string())?;
        hs.on_welcome(welcome).map_err(|e| e.to_string())?;
        if let Some(key) = key {
            conn.codec_mut().seal(&key, Role::Client);
        }
        Ok(conn)
    }

    /// Sends `frame` and returns the answer (an error when the connection closed).
    async fn ask(conn: &mut FramedPeer, frame: Frame) -> Result<Frame, String> {
        framing::send(conn, &frame)
            .await
            .map_err(|e| e.to_string())?;
        framing::recv(conn, Duration::from_secs(1))
            .await
            .map_err(|e| e.to_string())
    }

    /// A real peer server at "s" on `net` with `settings`, and its local state.
    fn server_with(
        net: &MemNet,
        settings: ServerSettings,
    ) -> (tokio::task::JoinHandle<()>, Arc<Local>) {
        let (task, local, _) = server_counted(net, settings);
        (task, local)
    }

    /// [`server_with`], checks decided by a check service counted in the metrics returned.
    fn server_counted(
        net: &MemNet,
        settings: ServerSettings,
    ) -> (
        tokio::task::JoinHandle<()>,
        Arc<Local>,
        Arc<crate::metrics::Metrics>,
    ) {
        let clock = Arc::new(ringlimit_core::clock::ManualClock::new(1_000_000_000));
        let counters = Arc::new(crate::global::GlobalCounters::new(
            crate::global::actor("s", 1),
            100,
        ));
        let rules = Arc::new(crate::rules::InForce::new(crate::rules::RuleSet::builtin()));
        let local = Arc::new(Local::new(rules, clock, 100, counters));
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let service = crate::service::CheckService::alone(local.clone(), metrics.clone());
        let server =
            Arc::new(PeerServer::new(local.clone(), settings, None).with_checks(Arc::new(service)));
        (tokio::spawn(server.run(net.listen("s"))), local, metrics)
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
                calendar: None,
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

    /// A check denied by a block is answered blocked to a peer that speaks
    /// [`BLOCKED_ANSWER_SINCE`], and as the plain denial it always was to an older one: in a
    /// batch's group and in an all-or-nothing group (denied whole, the other check read).
    #[tokio::test(start_paused = true)]
    async fn a_blocked_answer_says_its_block_only_to_peers_that_know_it() {
        let net = MemNet::new();
        let (_server, local) = server_with_local(&net);
        let block = crate::blocks::BlockChange {
            target: "bad".into(),
            rule: None,
            source: crate::blocks::BlockSource::Managed,
            since_ms: 1_000,
            until_ms: 3_600_000,
            reason: "scraper".into(),
            by: "test".into(),
            lifted: false,
        };
        assert_eq!(local.blocks().apply(&[block], |_, _| None, 1_000), 1);
        let frame = |kind| {
            Frame::Checks(vec![CheckGroup {
                id: 1,
                kind,
                checks: vec![check("bad"), check("good")],
            }])
        };
        for (version, blocked, kind) in [
            (PROTOCOL_VERSION, true, GroupKind::Owned),
            (PROTOCOL_VERSION, true, GroupKind::AllOrNothing),
            (BLOCKED_ANSWER_SINCE - 1, false, GroupKind::Owned),
            (BLOCKED_ANSWER_SINCE - 1, false, GroupKind::AllOrNothing),
        ] {
            let mut conn = log_in(&net, version).await;
            let Frame::Answers(g) = ask(&mut conn, frame(kind)).await.expect("answer") else {
                panic!("not answers");
            };
            match &g[0].answers[..] {
                [
                    PeerAnswer::Blocked { answer, source },
                    PeerAnswer::Answer(good),
                ] if blocked => {
                    assert!(!answer.allowed && good.allowed, "{:?}", g[0].answers);
                    assert_eq!(*source, crate::blocks::BlockSource::Managed);
                }
                [PeerAnswer::Answer(answer), PeerAnswer::Answer(good)] if !blocked => {
                    assert!(!answer.allowed && good.allowed, "{:?}", g[0].answers);
                }
                other => panic!("version {version}: {other:?}"),
            }
        }
        // A lease of the blocked key is refused with the block's answer (its holder denies
        // the key's checks itself until the block's end); another key's is granted.
        let mut conn = log_in(&net, PROTOCOL_VERSION).await;
        let lease = |key: &str| Frame::Lease {
            asks: vec![ringlimit_proto::peer::LeaseAsk {
                key: key.into(),
                rule: check(key).rule,
                want: 2,
                demand_per_s: 1_000,
            }],
        };
        let Frame::Leased { grants } = ask(&mut conn, lease("bad")).await.expect("answer") else {
            panic!("not leased");
        };
        let [ringlimit_proto::peer::LeaseGrant::Refused { answer }] = &grants[..] else {
            panic!("{grants:?}");
        };
        assert!(
            !answer.allowed && answer.reset_at_ms == 3_600_000,
            "{answer:?}"
        );
        let Frame::Leased { grants } = ask(&mut conn, lease("good")).await.expect("answer") else {
            panic!("not leased");
        };
        assert!(
            matches!(
                grants[..],
                [ringlimit_proto::peer::LeaseGrant::Granted { .. }]
            ),
            "{grants:?}"
        );
    }

    /// A recall is answered with the live states held here — the bucket of its own or the copy
    /// — read, not taken, and nothing for a bucket not held; copies streamed one way are kept
    /// and not answered (the recall's answer is the next frame).
    #[tokio::test(start_paused = true)]
    async fn a_recall_reads_buckets_and_copies_and_one_way_copies_are_kept() {
        let net = MemNet::new();
        let (_server, local) = server_with_local(&net);
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
            local
                .rules()
                .prepare(key, spec, 1)
                .expect("a valid check")
                .1
        };
        let (a, b, c) = (id_of("a"), id_of("b"), id_of("c"));
        let state = local.owned().peek(a).expect("decided here");
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
            local.owned().holds(a) && local.copies().peek(b).is_some(),
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

    fn daily(limit: u64) -> RuleRef {
        RuleRef::Inline(InlineRule {
            limit,
            period_ms: 86_400_000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        })
    }

    fn owned(key: &str, rule: &RuleRef, cost: u64) -> Frame {
        Frame::Checks(vec![CheckGroup {
            id: 1,
            kind: GroupKind::Owned,
            checks: vec![PeerCheck {
                key: key.into(),
                rule: rule.clone(),
                cost,
            }],
        }])
    }

    fn remaining(answer: Frame) -> (bool, u64) {
        match answer {
            Frame::Answers(g) => match &g[0].answers[..] {
                [PeerAnswer::Answer(a)] => (a.allowed, a.remaining),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    fn refund(key: &str, rule: &RuleRef, cost: u64, mark: Mark) -> Frame {
        Frame::Refunds(vec![RefundGroup {
            id: 2,
            refunds: vec![PeerRefund {
                key: key.into(),
                rule: rule.clone(),
                cost,
                mark,
            }],
        }])
    }

    /// A client (here anyone on a node without a secret) cannot refill a bucket with refunds
    /// it made up: a used-up 5-a-day key stays used up after a refund under any mark; a
    /// lease's slice gives back at most what it took, once; an all-or-nothing hold gives back
    /// what it held, once.
    #[tokio::test(start_paused = true)]
    async fn a_client_gives_back_only_what_its_own_holds_took_once() {
        use ringlimit_proto::peer::{LeaseAsk, LeaseGrant};
        let net = MemNet::new();
        let _server = guarded_server(&net, None);
        // Anonymous clients are refused where credentials are kept: prove the token.
        let mut conn = log_in_as(&net, Some(b"svc-token-0000001"), None)
            .await
            .expect("logged in");
        let rule = daily(5);
        for _ in 0..5 {
            assert!(remaining(ask(&mut conn, owned("v", &rule, 1)).await.expect("answer")).0);
        }
        assert!(!remaining(ask(&mut conn, owned("v", &rule, 1)).await.expect("answer")).0);
        // What every answer shows: the reset time. Forged under it and under nothing at all.
        for mark in [
            Mark {
                reset_ns: 0,
                at_ns: 0,
            },
            Mark {
                reset_ns: 1_000_000_000 + 86_400_000_000_000,
                at_ns: 1_000_000_000,
            },
        ] {
            let Frame::Answers(g) = ask(&mut conn, refund("v", &rule, 5, mark))
                .await
                .expect("answer")
            else {
                panic!("not answers");
            };
            assert!(
                matches!(&g[0].answers[..], [PeerAnswer::Error { .. }]),
                "{:?}",
                g[0].answers
            );
        }
        let (allowed, left) =
            remaining(ask(&mut conn, owned("v", &rule, 1)).await.expect("answer"));
        assert!(!allowed && left == 0, "still used up");

        // A lease of 10 of a 100-a-day key, then a refund of 1,000 under its mark.
        let rule = daily(100);
        let lease = Frame::Lease {
            asks: vec![LeaseAsk {
                key: "l".into(),
                rule: rule.clone(),
                want: 10,
                demand_per_s: 1_000,
            }],
        };
        let Frame::Leased { grants } = ask(&mut conn, lease).await.expect("answer") else {
            panic!("not leased");
        };
        let [LeaseGrant::Granted { tokens, mark, .. }] = grants[..] else {
            panic!("{grants:?}");
        };
        assert!(tokens > 0 && tokens <= 10, "{tokens}");
        let back = ask(&mut conn, refund("l", &rule, 1_000, mark))
            .await
            .expect("answer");
        assert!(matches!(back, Frame::Answers(ref g) if g[0].answers == [PeerAnswer::Refunded]));
        let (_, left) = remaining(ask(&mut conn, owned("l", &rule, 0)).await.expect("answer"));
        assert_eq!(left, 100, "given back what the slice took, no more");
        let again = ask(&mut conn, refund("l", &rule, 1_000, mark))
            .await
            .expect("answer");
        assert!(
            matches!(again, Frame::Answers(ref g) if matches!(g[0].answers[..], [PeerAnswer::Error { .. }])),
            "once: {again:?}"
        );

        // An all-or-nothing hold gives back what it held, once, on its own connection only.
        let all = Frame::Checks(vec![CheckGroup {
            id: 3,
            kind: GroupKind::AllOrNothing,
            checks: vec![PeerCheck {
                key: "h".into(),
                rule: rule.clone(),
                cost: 3,
            }],
        }]);
        let Frame::Answers(g) = ask(&mut conn, all).await.expect("answer") else {
            panic!("not answers");
        };
        let [PeerAnswer::Held { mark, .. }] = g[0].answers[..] else {
            panic!("{:?}", g[0].answers);
        };
        let mut other = log_in_as(&net, Some(b"svc-token-0000001"), None)
            .await
            .expect("logged in");
        let elsewhere = ask(&mut other, refund("h", &rule, 3, mark))
            .await
            .expect("answer");
        assert!(
            matches!(elsewhere, Frame::Answers(ref g) if matches!(g[0].answers[..], [PeerAnswer::Error { .. }])),
            "not this connection's hold: {elsewhere:?}"
        );
        for want in [PeerAnswer::Refunded, not_held_answer()] {
            let Frame::Answers(g) = ask(&mut conn, refund("h", &rule, 3, mark))
                .await
                .expect("answer")
            else {
                panic!("not answers");
            };
            assert_eq!(
                std::mem::discriminant(&g[0].answers[0]),
                std::mem::discriminant(&want)
            );
        }
        let (_, left) = remaining(ask(&mut conn, owned("h", &rule, 0)).await.expect("answer"));
        assert_eq!(left, 100);
    }

    fn not_held_answer() -> PeerAnswer {
        PeerAnswer::Error {
            code: String::new(),
            message: String::new(),
        }
    }

    /// Members prove the cluster secret, clients a client credential: a client's checks are
    /// answered and a frame only members send (here a reset) closes its connection with the
    /// reason; a member's reset is answered. A wrong token, an anonymous client where
    /// credentials are kept, and a token against a node that keeps none are refused.
    #[tokio::test(start_paused = true)]
    async fn clients_prove_a_credential_and_may_not_send_what_members_send() {
        let net = MemNet::new();
        let _server = guarded_server(&net, Some(b"cluster secret"));
        let mut client = log_in_as(&net, Some(b"svc-token-0000001"), None)
            .await
            .expect("logged in");
        let rule = daily(5);
        assert!(
            remaining(
                ask(&mut client, owned("k", &rule, 1))
                    .await
                    .expect("answer")
            )
            .0
        );
        let reset = Frame::Reset { ids: vec![1, 2] };
        match ask(&mut client, reset.clone()).await {
            Ok(Frame::Refused { reason }) => assert!(reason.contains("member"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(
            ask(&mut client, owned("k", &rule, 1)).await.is_err(),
            "closed"
        );
        let mut member = log_in_as(&net, None, Some(b"cluster secret"))
            .await
            .expect("logged in");
        assert!(matches!(
            ask(&mut member, reset).await,
            Ok(Frame::ResetAck { .. })
        ));
        let wrong = log_in_as(&net, Some(b"not-the-token-000"), None).await;
        assert!(
            wrong
                .as_ref()
                .err()
                .is_some_and(|e| e.contains("client credential")),
            "{:?}",
            wrong.err()
        );
        let anonymous = log_in_as(&net, None, None).await;
        assert!(anonymous.is_err(), "no proof of the secret");

        let net = MemNet::new();
        let _lone = guarded_server(&net, None);
        let anonymous = log_in_as(&net, None, None).await;
        assert!(
            anonymous
                .as_ref()
                .err()
                .is_some_and(|e| e.contains("client credential")),
            "{:?}",
            anonymous.err()
        );
        let net = MemNet::new();
        let _open = server(&net);
        let token = log_in_as(&net, Some(b"svc-token-0000001"), None).await;
        assert!(
            token
                .as_ref()
                .err()
                .is_some_and(|e| e.contains("accepts no client credentials")),
            "{:?}",
            token.err()
        );
    }

    /// Checks on the peer port go through the front door: a client's (an SDK's) are counted
    /// and timed there like every edge's, in `ringlimit_checks_total`, the rule's and the
    /// edge's counts and the duration histogram; a member's were counted where they arrived,
    /// and are not counted again.
    #[tokio::test(start_paused = true)]
    async fn a_clients_checks_are_counted_at_the_front_door_and_a_members_are_not() {
        let net = MemNet::new();
        let (_server, metrics) = guarded_server_counted(&net, Some(b"cluster secret"));
        let rule = daily(2);
        let mut client = log_in_as(&net, Some(b"svc-token-0000001"), None)
            .await
            .expect("logged in");
        for want in [true, true, false] {
            let answer = ask(&mut client, owned("sdk", &rule, 1)).await;
            assert_eq!(remaining(answer.expect("answer")).0, want);
        }
        let mut member = log_in_as(&net, None, Some(b"cluster secret"))
            .await
            .expect("logged in");
        for _ in 0..2 {
            let answer = ask(&mut member, owned("forwarded", &rule, 1)).await;
            assert!(remaining(answer.expect("answer")).0);
        }
        let text = metrics.encode().expect("encoded");
        let value = |series: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(series)?
                        .strip_prefix(' ')?
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        for (series, want) in [
            (
                "ringlimit_checks_total{result=\"allowed\",mode=\"owner\"}",
                2.0,
            ),
            (
                "ringlimit_checks_total{result=\"denied\",mode=\"owner\"}",
                1.0,
            ),
            (
                "ringlimit_rule_checks_total{rule=\"inline\",result=\"denied\"}",
                1.0,
            ),
            ("ringlimit_edge_checks_total{edge=\"peer\"}", 3.0),
            (
                "ringlimit_check_duration_seconds_count{endpoint=\"peer\"}",
                3.0,
            ),
        ] {
            assert_eq!(value(series), want, "{series}");
        }
    }
}
