//! The peer server: accepts connections on the peer port, authenticates them, and decides the
//! checks that arrive here. One exception: a check for a bucket this node no longer holds and no
//! longer owns (it handed the bucket to its new owner, or it is leaving) is relayed once to that
//! owner, marked so that it is decided there whatever that node's ring says; so a check crosses
//! at most two hops and rings that disagree for a moment cannot make it loop.

use super::framing::{self, FramedPeer, LinkError};
use crate::engine::{CheckError, Engine, RuleSpec};
use crate::forward::PeerClient;
use crate::global::GlobalCounters;
use crate::limiter::Rule;
use crate::router::Router;
use crate::rules::Mode;
use futures::StreamExt;
use ringlimit_proto::RuleRef;
use ringlimit_proto::handshake::ServerHandshake;
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, Frame, PeerAnswer, PeerCheck, RELAYED_GROUP};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Most peer connections served at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 4096;

/// Who this server is.
#[derive(Clone)]
pub struct ServerSettings {
    pub node_id: String,
    pub cluster_id: String,
    pub secret: Option<Arc<[u8]>>,
    /// The whole handshake must finish within this.
    pub handshake_timeout: Duration,
}

/// Counters of the peer server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections refused (bad handshake, wrong cluster or secret, garbage).
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

/// The peer server; [`PeerServer::run`] serves until dropped.
pub struct PeerServer {
    pub stats: Arc<ServerStats>,
    engine: Arc<Engine>,
    global: Arc<GlobalCounters>,
    settings: ServerSettings,
    /// Where to relay checks for buckets this node handed over; `None`: never relay.
    router: Option<Arc<Router>>,
}

impl PeerServer {
    pub fn new(engine: Arc<Engine>, global: Arc<GlobalCounters>, settings: ServerSettings) -> Self {
        Self {
            stats: Arc::new(ServerStats::default()),
            engine,
            global,
            settings,
            router: None,
        }
    }

    /// Relays checks for buckets handed over to their new owner through `router`.
    pub fn with_router(mut self, router: Arc<Router>) -> Self {
        self.router = Some(router);
        self
    }

    /// Accepts and serves peers. Connections live in a `JoinSet` owned by this future, so
    /// dropping it closes them all.
    pub async fn run(self: Arc<Self>, listener: TcpListener) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, from) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "peer accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%from, "too many peer connections; closing");
                        continue;
                    };
                    let this = self.clone();
                    conns.spawn(async move {
                        let _permit = permit;
                        this.serve(framing::framed(stream), from).await;
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }

    async fn serve(&self, mut conn: FramedPeer, from: std::net::SocketAddr) {
        let peer = match self.handshake(&mut conn).await {
            Ok(peer) => peer,
            Err(reason) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%from, %reason, "peer connection refused");
                let _ = framing::send(&mut conn, &Frame::Refused { reason }).await;
                return;
            }
        };
        tracing::debug!(%from, %peer, "peer connected");
        while let Some(bytes) = conn.next().await {
            let frame = match bytes
                .map_err(LinkError::from)
                .and_then(|b| Ok(Frame::decode(&b)?))
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(%from, %peer, error = %e, "bad frame from peer; closing");
                    return;
                }
            };
            let groups = match frame {
                Frame::Checks(groups) => groups,
                Frame::Handover(buckets) => {
                    let now = self.engine.clock().now();
                    let merged = buckets.len() as u64;
                    for b in buckets {
                        self.engine
                            .store()
                            .absorb(b.id, super::handover::from_wire(b.state), now);
                    }
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
                    let store = self.engine.store();
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
                other => {
                    tracing::warn!(%from, %peer, kind = other.kind(), "unexpected frame from peer; closing");
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
        let (peer, welcome) = state.on_proof(proof).map_err(|e| e.to_string())?;
        framing::send(conn, &welcome)
            .await
            .map_err(|e| e.to_string())?;
        Ok(peer)
    }

    /// Answers one `Checks` frame: decides here what belongs here, relays the rest (see the
    /// module doc), and decides here whatever a relay could not deliver.
    async fn answer(&self, groups: Vec<CheckGroup>) -> Vec<AnswerGroup> {
        // One instant for the whole frame (see `Engine::decide_at`).
        let now = self.engine.clock().now();
        // By owner: its client, and each relayed check's place and local decision inputs.
        type Relay = (Arc<PeerClient>, Vec<(usize, usize, u64, Rule)>);
        let mut relays: HashMap<Arc<str>, Relay> = HashMap::new();
        let mut out: Vec<AnswerGroup> = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            let may_relay = g.id & RELAYED_GROUP == 0;
            let mut answers = Vec::with_capacity(g.checks.len());
            for (ci, c) in g.checks.iter().enumerate() {
                match self.decide(c, now, may_relay) {
                    Decided::Here(a) => answers.push(a),
                    Decided::Relay {
                        owner,
                        client,
                        id,
                        rule,
                    } => {
                        relays
                            .entry(owner)
                            .or_insert_with(|| (client, Vec::new()))
                            .1
                            .push((gi, ci, id, rule));
                        // Replaced below by the owner's answer, or by a local decision.
                        answers.push(PeerAnswer::Error {
                            code: String::new(),
                            message: String::new(),
                        });
                    }
                }
            }
            out.push(AnswerGroup { id: g.id, answers });
        }
        if relays.is_empty() {
            return out;
        }
        let sends = relays.into_values().map(|(client, idx)| {
            let checks = idx
                .iter()
                .map(|&(g, c, ..)| groups[g].checks[c].clone())
                .collect();
            async move { (client.send_relayed(checks).await, idx) }
        });
        for (sent, idx) in futures::future::join_all(sends).await {
            self.stats
                .relayed
                .fetch_add(idx.len() as u64, Ordering::Relaxed);
            let mut answers = sent.ok().map(Vec::into_iter);
            for (g, c, id, rule) in idx {
                out[g].answers[c] = match answers.as_mut().and_then(Iterator::next) {
                    Some(a) => a,
                    // The new owner did not answer: decide here, as before relaying existed.
                    None => PeerAnswer::Answer(self.engine.decide_at(
                        id,
                        &rule,
                        groups[g].checks[c].cost,
                        now,
                    )),
                };
            }
        }
        out
    }

    /// Decides a forwarded check here at `now` — or, when `may_relay` and the bucket is neither
    /// held nor owned here, says where to relay it.
    fn decide(&self, c: &PeerCheck, now: u64, may_relay: bool) -> Decided {
        self.stats.checks.fetch_add(1, Ordering::Relaxed);
        let spec = match &c.rule {
            RuleRef::Named(name) => RuleSpec::Named(name),
            RuleRef::Inline(r) => RuleSpec::Inline(*r),
        };
        Decided::Here(match self.engine.prepare(&c.key, spec, c.cost) {
            // A global rule reached through the SDK (which sends every check to an owner):
            // decided from the global counters like any global check.
            Ok((resolved, id)) if resolved.mode == Mode::Global => {
                PeerAnswer::Answer(self.global.answer(id, &resolved.rule, now, c.cost))
            }
            Ok((resolved, id)) => {
                if may_relay
                    && let Some(router) = &self.router
                    && let Some((owner, client)) = router.relay_target(id)
                    && !self.engine.store().contains(id)
                {
                    return Decided::Relay {
                        owner,
                        client,
                        id,
                        rule: resolved.rule,
                    };
                }
                PeerAnswer::Answer(self.engine.decide_at(id, &resolved.rule, c.cost, now))
            }
            Err(e) => error_answer(&e),
        })
    }
}

/// What [`PeerServer::decide`] made of a check.
enum Decided {
    Here(PeerAnswer),
    /// To the owner's client; `id` and `rule` decide it here if the owner does not answer.
    Relay {
        owner: Arc<str>,
        client: Arc<PeerClient>,
        id: u64,
        rule: Rule,
    },
}

fn error_answer(e: &CheckError) -> PeerAnswer {
    PeerAnswer::Error {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
