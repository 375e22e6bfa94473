//! One peer's client: a persistent connection, requests pipelined and coalesced, a circuit.
//!
//! Callers hand a group of checks to [`PeerClient::send`]; a writer task takes whatever groups
//! are queued when it is free and sends them as **one** frame (no fixed wait), and a reader task
//! matches answers to groups by id. Every wait is bounded: the queue (full → shed at once), the
//! caller's deadline, and the circuit. A lost connection opens the circuit at once, so no
//! request waits on a dead peer. Timeouts open it after [`TIMEOUTS_TO_OPEN`] of them once the
//! peer has also been silent for as many deadlines: a paused or partitioned peer costs about
//! that many waits, while a live owner that is briefly slow (a busy host, a 1000-check batch, one
//! stall that times out many concurrent requests at once) is not bypassed for a whole second.

use super::framing::{self, FramedPeer};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use ringlimit_proto::auth::Role;
use ringlimit_proto::handshake::ClientHandshake;
use ringlimit_proto::peer::{
    CALENDAR_SINCE, CheckGroup, FlaggedGroup, Frame, GROUP_FLAGS, GROUP_KIND_SINCE, GroupKind,
    PeerAnswer, PeerCheck, PeerRefund, RefundGroup,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
// Tokio's clock: the same as std's, except in tests with a paused clock, where the circuit
// then follows virtual time.
use tokio::time::Instant;

/// Most checks coalesced into one frame (keeps frames far below the size limit).
const MAX_CHECKS_PER_FRAME: usize = 4096;
/// Timeouts without an answer in between that open the circuit, provided the peer has also
/// been silent for this many deadlines.
pub const TIMEOUTS_TO_OPEN: u32 = 3;
/// Extra time a group may take per check beyond the first (an owner decides ~1-2 M checks/s per
/// connection), capped at four times the base deadline.
const DEADLINE_PER_CHECK: Duration = Duration::from_micros(20);

/// How a node talks to its peers.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// Opens the byte stream to a peer ([`super::dial::tcp`] outside tests).
    pub dialer: Arc<dyn super::dial::Dial>,
    pub node_id: String,
    pub cluster_id: String,
    pub secret: Option<Arc<[u8]>>,
    /// A client credential (a token with the `check` role) to prove instead of the secret: an
    /// SDK that is a client of the cluster, not a member (see `ringlimit_proto::handshake`).
    pub client_token: Option<Arc<[u8]>>,
    /// How long a forwarded check may wait for its owner before the caller falls back.
    pub deadline: Duration,
    /// Connect plus handshake.
    pub connect_timeout: Duration,
    /// How long the circuit stays open after a timeout or a lost connection.
    pub open_for: Duration,
    /// Groups that may wait for the writer; beyond, requests are shed at once.
    pub queue: usize,
}

/// Why a forward failed. Each makes the caller fall back; none is the client's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("the owner's circuit is open")]
    CircuitOpen,
    #[error("the queue to the owner is full")]
    Shed,
    #[error("the owner did not answer within the deadline")]
    Timeout,
    #[error("the connection to the owner was lost")]
    Lost,
    #[error("the owner answered a different number of checks")]
    Mismatch,
    /// A named rule the sender knows and the owner does not (yet): rules written through the
    /// admin API reach every node within about a second.
    #[error("the owner does not know the rule yet")]
    RuleUnknownAtOwner,
}

/// Counters of one peer client (and, summed, of all).
#[derive(Debug, Default)]
pub struct PeerStats {
    pub frames: AtomicU64,
    pub checks: AtomicU64,
}

struct Outgoing {
    body: Body,
    reply: oneshot::Sender<Vec<PeerAnswer>>,
    /// What a group of checks asks of the owner (refunds have none).
    kind: GroupKind,
}

/// What a caller sends: checks, or refunds of all-or-nothing checks.
enum Body {
    Checks(Vec<PeerCheck>),
    Refunds(Vec<PeerRefund>),
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Checks(c) => c.len(),
            Body::Refunds(r) => r.len(),
        }
    }

    /// The oldest protocol version that can decode this body (an inline rule with calendar
    /// windows needs [`CALENDAR_SINCE`]).
    fn since(&self) -> u16 {
        let calendar = match self {
            Body::Checks(c) => c.iter().any(|c| c.rule.has_calendar()),
            Body::Refunds(r) => r.iter().any(|r| r.rule.has_calendar()),
        };
        if calendar { CALENDAR_SINCE } else { 0 }
    }
}

struct Shared {
    connected: AtomicBool,
    open_until: Mutex<Option<Instant>>,
    /// Timeouts since the last answer.
    timeouts: std::sync::atomic::AtomicU32,
    /// When the peer last answered, in ns since `epoch` (creation counts as an answer).
    last_answer_ns: AtomicU64,
    epoch: Instant,
    /// The circuit was opened (timeouts, a lost connection, a failed connect) and has not been
    /// seen closed since: makes "opened" and "closed" one log line per transition.
    tripped: AtomicBool,
}

impl Shared {
    fn since_epoch(&self) -> u64 {
        duration_ns(self.epoch.elapsed())
    }

    fn open(&self, for_: Duration) {
        *self.open_until.lock() = Some(Instant::now() + for_);
    }

    fn is_open(&self) -> bool {
        let mut g = self.open_until.lock();
        match *g {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                // Half-open: let traffic try again; the next failure reopens it.
                *g = None;
                false
            }
            None => false,
        }
    }

    /// Notes that the peer answers again; logs once if the circuit had been opened.
    fn mark_closed(&self, addr: &str) {
        // A plain load first: on the hot path the flag is false and the line stays shared.
        if self.tripped.load(Ordering::Relaxed) && self.tripped.swap(false, Ordering::Relaxed) {
            tracing::info!(peer = %addr, "peer circuit closed");
        }
    }
}

/// A client for one peer. Dropping it stops its connection task.
pub struct PeerClient {
    pub addr: String,
    settings: Arc<PeerSettings>,
    tx: mpsc::Sender<Outgoing>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PeerClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PeerClient {
    /// Starts connecting to `addr` at once, and keeps reconnecting (with backoff) while alive.
    pub fn spawn(addr: String, settings: Arc<PeerSettings>, stats: Arc<PeerStats>) -> Self {
        Self::spawn_to(addr, None, settings, stats)
    }

    /// [`PeerClient::spawn`] for the member `node` at `addr`: a connection answered by another
    /// node is not used (an address known from before a restart, a member's previous pod IP,
    /// may now be another member's), and checks fall back as for an unreachable owner.
    pub fn spawn_to(
        addr: String,
        node: Option<Arc<str>>,
        settings: Arc<PeerSettings>,
        stats: Arc<PeerStats>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(settings.queue.max(1));
        let shared = Arc::new(Shared {
            connected: AtomicBool::new(false),
            open_until: Mutex::new(None),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            last_answer_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            tripped: AtomicBool::new(false),
        });
        let task = tokio::spawn(connection_loop(
            addr.clone(),
            node,
            settings.clone(),
            rx,
            shared.clone(),
            stats,
        ));
        Self {
            addr,
            settings,
            tx,
            shared,
            task,
        }
    }

    /// Whether checks sent now have a chance (connected, circuit closed).
    pub fn available(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire) && !self.shared.is_open()
    }

    /// An empty group: answered by a live peer, so that an idle link's silence is noticed too;
    /// a timeout counts towards opening the circuit like any other.
    pub async fn ping(&self) -> Result<(), ForwardError> {
        self.send_group(Body::Checks(Vec::new()), GroupKind::Owned)
            .await
            .map(drop)
    }

    /// Sends a group of checks and waits, at most the deadline, for their answers (in order).
    pub async fn send(&self, checks: Vec<PeerCheck>) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.send_group(Body::Checks(checks), GroupKind::Owned)
            .await
    }

    /// Sends one request's checks at this owner, decided there all-or-nothing (see
    /// [`GroupKind::AllOrNothing`]): admitted checks that took their cost come back
    /// [`PeerAnswer::Held`].
    pub async fn send_all(&self, checks: Vec<PeerCheck>) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.send_group(Body::Checks(checks), GroupKind::AllOrNothing)
            .await
    }

    /// Gives back what held checks took; one [`PeerAnswer::Refunded`] (or error) per refund.
    pub async fn refund(&self, refunds: Vec<PeerRefund>) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.send_group(Body::Refunds(refunds), GroupKind::Owned)
            .await
    }

    /// Like [`PeerClient::send`], for checks this node relays to their new owner: the owner
    /// decides them whatever its ring says (see [`GroupKind::Relayed`]).
    pub async fn send_relayed(
        &self,
        checks: Vec<PeerCheck>,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.send_group(Body::Checks(checks), GroupKind::Relayed)
            .await
    }

    /// Sends checks whose owner did not answer to the owner's replica, decided there on its
    /// copies (`all`: all-or-nothing, see [`GroupKind::ReplicaAllOrNothing`]). A peer older
    /// than [`REPLICA_KINDS_SINCE`](ringlimit_proto::peer::REPLICA_KINDS_SINCE) is never sent them: each check is answered
    /// [`PeerAnswer::Error`] `unsupported` without a frame.
    pub async fn send_replica(
        &self,
        checks: Vec<PeerCheck>,
        all: bool,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        let kind = match all {
            true => GroupKind::ReplicaAllOrNothing,
            false => GroupKind::Replica,
        };
        self.send_group(Body::Checks(checks), kind).await
    }

    async fn send_group(
        &self,
        body: Body,
        kind: GroupKind,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        // Not connected yet: while the first connection is being made, checks queue for it
        // (bounded by their deadline) rather than fail open; once a connection attempt has failed
        // or a connection was lost, the circuit is open and they fail open at once.
        if self.shared.is_open() {
            return Err(ForwardError::CircuitOpen);
        }
        let n = body.len();
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(Outgoing { body, reply, kind })
            .map_err(|_| ForwardError::Shed)?;
        let extra = DEADLINE_PER_CHECK
            .saturating_mul(u32::try_from(n.saturating_sub(1)).unwrap_or(u32::MAX));
        let deadline = (self.settings.deadline + extra).min(self.settings.deadline * 4);
        let (started, mut answer) = (Instant::now(), answer);
        let mut waited = tokio::time::timeout(deadline, &mut answer).await;
        // A deadline that fired a whole deadline late passed while this process did not run
        // (stopped, starved): no sign of the peer, whose answer may wait unread in the socket.
        // One more deadline for it; only then does the timeout count towards the circuit.
        if waited.is_err() && started.elapsed() >= deadline.saturating_mul(2) {
            waited = tokio::time::timeout(deadline, &mut answer).await;
        }
        match waited {
            Ok(Ok(answers)) if answers.len() == n => {
                self.shared.timeouts.store(0, Ordering::Relaxed);
                self.shared
                    .last_answer_ns
                    .store(self.shared.since_epoch(), Ordering::Relaxed);
                self.shared.mark_closed(&self.addr);
                Ok(answers)
            }
            Ok(Ok(_)) => Err(ForwardError::Mismatch),
            Ok(Err(_)) => {
                self.shared.open(self.settings.open_for);
                Err(ForwardError::Lost)
            }
            Err(_) => {
                let timeouts = self.shared.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                // Concurrent requests caught by one stall time out together; only a peer silent
                // for several deadlines is bypassed.
                let silent_ns = self
                    .shared
                    .since_epoch()
                    .saturating_sub(self.shared.last_answer_ns.load(Ordering::Relaxed));
                let patience = self.settings.deadline.saturating_mul(TIMEOUTS_TO_OPEN);
                if timeouts >= TIMEOUTS_TO_OPEN && silent_ns >= duration_ns(patience) {
                    if !self.shared.tripped.swap(true, Ordering::Relaxed) {
                        tracing::warn!(peer = %self.addr, ?deadline, timeouts, "peer too slow; circuit opened");
                    }
                    self.shared.timeouts.store(0, Ordering::Relaxed);
                    self.shared.open(self.settings.open_for);
                }
                Err(ForwardError::Timeout)
            }
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn connection_loop(
    addr: String,
    node: Option<Arc<str>>,
    settings: Arc<PeerSettings>,
    mut rx: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
    stats: Arc<PeerStats>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut warned = false;
    loop {
        let connected = async {
            let conn = connect(&addr, &settings).await?;
            match &node {
                Some(want) if *conn.node_id != **want => Err(format!(
                    "the node at this address is {:?}, not {want:?}",
                    conn.node_id
                )),
                _ => Ok(conn),
            }
        };
        match tokio::time::timeout(settings.connect_timeout, connected).await {
            Ok(Ok(conn)) => {
                tracing::debug!(peer = %addr, version = conn.version, "peer connection up");
                shared.mark_closed(&addr);
                warned = false;
                backoff = Duration::from_millis(50);
                *shared.open_until.lock() = None;
                shared.connected.store(true, Ordering::Release);
                let reason = serve(conn, &mut rx, &stats).await;
                shared.connected.store(false, Ordering::Release);
                shared.tripped.store(true, Ordering::Relaxed);
                tracing::info!(peer = %addr, %reason, "peer connection lost; circuit opened");
            }
            Ok(Err(e)) if !warned => {
                tracing::warn!(peer = %addr, error = %e, "cannot connect to peer; will retry");
                warned = true;
                shared.tripped.store(true, Ordering::Relaxed);
            }
            Err(_) if !warned => {
                tracing::warn!(peer = %addr, "connecting to peer timed out; will retry");
                warned = true;
                shared.tripped.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
        // No connection now: checks fail open at once until the next attempt succeeds, and
        // whatever was queued can no longer be answered: its callers fall back now.
        shared.open(
            backoff
                .max(Duration::from_millis(100))
                .max(settings.open_for),
        );
        while rx.try_recv().is_ok() {}
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// A connection through its handshake, and the protocol version both sides speak on it.
pub struct Connection {
    pub framed: FramedPeer,
    /// What the handshake agreed (see [`ringlimit_proto::handshake`]): it decides how check
    /// groups are encoded.
    pub version: u16,
    /// The node id the server welcomed us with.
    pub node_id: String,
}

/// Connects and completes the handshake.
pub async fn connect(addr: &str, settings: &PeerSettings) -> Result<Connection, String> {
    let io = settings
        .dialer
        .dial(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = framing::framed(io);
    let (mut hs, hello) = match &settings.client_token {
        Some(token) => ClientHandshake::start_client(
            &settings.cluster_id,
            &settings.node_id,
            token,
            rand::random(),
        ),
        None => ClientHandshake::start(
            &settings.cluster_id,
            &settings.node_id,
            settings.secret.as_deref(),
            rand::random(),
        ),
    };
    let step = settings.connect_timeout;
    framing::send(&mut conn, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let challenge = framing::recv(&mut conn, step)
        .await
        .map_err(|e| e.to_string())?;
    let proof = hs.on_challenge(challenge).map_err(|e| e.to_string())?;
    framing::send(&mut conn, &proof)
        .await
        .map_err(|e| e.to_string())?;
    let welcome = framing::recv(&mut conn, step)
        .await
        .map_err(|e| e.to_string())?;
    let key = hs.session_key();
    let version = hs.version();
    let node_id = hs.on_welcome(welcome).map_err(|e| e.to_string())?;
    if let Some(key) = key {
        conn.codec_mut().seal(&key, Role::Client);
    }
    Ok(Connection {
        framed: conn,
        version,
        node_id,
    })
}

/// Serves one connection until it fails; returns why.
async fn serve(conn: Connection, rx: &mut mpsc::Receiver<Outgoing>, stats: &PeerStats) -> String {
    // Version 2 peers read a group's kind in its id's top bits, and echo the id whole.
    let version = conn.version;
    let flagged = version < GROUP_KIND_SINCE;
    let (mut sink, mut stream) = conn.framed.split();
    let pending: Mutex<HashMap<u64, oneshot::Sender<Vec<PeerAnswer>>>> = Mutex::new(HashMap::new());
    let mut next_id: u64 = 0;

    let writer = async {
        while let Some(first) = rx.recv().await {
            let mut groups = Vec::new();
            let mut refunds = Vec::new();
            let mut checks = 0usize;
            let mut take =
                |o: Outgoing, groups: &mut Vec<CheckGroup>, refunds: &mut Vec<RefundGroup>| {
                    // A caller that gave up is not worth the bytes.
                    if o.reply.is_closed() {
                        return 0;
                    }
                    // A kind (or a calendar rule) this peer does not know would fail its
                    // whole frame; a calendar rule is never sent as a plain one either.
                    if version < o.kind.since().max(o.body.since()) {
                        let unsupported = PeerAnswer::Error {
                            code: "unsupported".into(),
                            message: format!("the peer speaks protocol version {version}"),
                        };
                        let _ = o.reply.send(vec![unsupported; o.body.len()]);
                        return 0;
                    }
                    next_id = next_id.wrapping_add(1) & !GROUP_FLAGS;
                    let id = match flagged {
                        true => next_id | o.kind.flag_bits(),
                        false => next_id,
                    };
                    let n = o.body.len();
                    pending.lock().insert(id, o.reply);
                    match o.body {
                        Body::Checks(checks) => groups.push(CheckGroup {
                            id,
                            kind: o.kind,
                            checks,
                        }),
                        Body::Refunds(r) => refunds.push(RefundGroup { id, refunds: r }),
                    }
                    n
                };
            checks += take(first, &mut groups, &mut refunds);
            // Alone in the queue: let the callers that are ready run first, so that checks
            // arriving together leave in one frame instead of one frame each (32 SDK callers
            // sent 1.16 checks a frame, and every frame costs a write and a read on both ends).
            if rx.is_empty() {
                tokio::task::yield_now().await;
            }
            while checks < MAX_CHECKS_PER_FRAME {
                match rx.try_recv() {
                    Ok(o) => checks += take(o, &mut groups, &mut refunds),
                    Err(_) => break,
                }
            }
            // Refunds first: they only ever make room for the checks that follow.
            for frame in [
                (!refunds.is_empty()).then_some(Frame::Refunds(refunds)),
                (!groups.is_empty()).then(|| checks_frame(groups, flagged)),
            ]
            .into_iter()
            .flatten()
            {
                let bytes = match frame.encode() {
                    Ok(b) => b,
                    Err(e) => return format!("encode: {e}"),
                };
                if let Err(e) = sink.send(Bytes::from(bytes)).await {
                    return format!("write: {e}");
                }
                stats.frames.fetch_add(1, Ordering::Relaxed);
            }
            stats.checks.fetch_add(checks as u64, Ordering::Relaxed);
        }
        "client closed".to_owned()
    };
    let reader = async {
        while let Some(bytes) = stream.next().await {
            let frame = match bytes {
                Ok(b) => Frame::decode(&b),
                Err(e) => return format!("read: {e}"),
            };
            match frame {
                Ok(Frame::Answers(groups)) => {
                    for g in groups {
                        if let Some(reply) = pending.lock().remove(&g.id) {
                            let _ = reply.send(g.answers);
                        }
                    }
                }
                Ok(Frame::Refused { reason }) => return format!("refused: {reason}"),
                Ok(other) => return format!("unexpected {} frame", other.kind()),
                Err(e) => return format!("bad frame: {e}"),
            }
        }
        "closed by peer".to_owned()
    };
    // Either side failing ends the connection; dropping `pending` fails every waiting caller.
    tokio::select! {
        r = writer => r,
        r = reader => r,
    }
}

/// Check groups as the connection's version encodes them.
fn checks_frame(groups: Vec<CheckGroup>, flagged: bool) -> Frame {
    match flagged {
        true => Frame::FlaggedChecks(groups.into_iter().map(FlaggedGroup::from).collect()),
        false => Frame::Checks(groups),
    }
}
