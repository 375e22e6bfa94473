//! The peer server: accepts connections on the peer port, authenticates them, and decides every
//! check that arrives here locally — a forwarded check is never forwarded again, so rings that
//! disagree for a moment cannot make a check loop.

use super::framing::{self, FramedPeer, LinkError};
use crate::engine::{CheckError, Engine, RuleSpec};
use crate::global::GlobalCounters;
use crate::rules::Mode;
use futures::StreamExt;
use ringlimit_proto::RuleRef;
use ringlimit_proto::handshake::ServerHandshake;
use ringlimit_proto::peer::{AnswerGroup, Frame, PeerAnswer, PeerCheck};
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
}

/// The peer server; [`PeerServer::run`] serves until dropped.
pub struct PeerServer {
    pub stats: Arc<ServerStats>,
    engine: Arc<Engine>,
    global: Arc<GlobalCounters>,
    settings: ServerSettings,
}

impl PeerServer {
    pub fn new(engine: Arc<Engine>, global: Arc<GlobalCounters>, settings: ServerSettings) -> Self {
        Self {
            stats: Arc::new(ServerStats::default()),
            engine,
            global,
            settings,
        }
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
            // One instant for the whole frame (see `Engine::decide_at`).
            let now = self.engine.clock().now();
            let answers: Vec<AnswerGroup> = groups
                .into_iter()
                .map(|g| AnswerGroup {
                    id: g.id,
                    answers: g.checks.iter().map(|c| self.decide(c, now)).collect(),
                })
                .collect();
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

    /// Decides a forwarded check here at `now`, whatever this node's ring says.
    fn decide(&self, c: &PeerCheck, now: u64) -> PeerAnswer {
        self.stats.checks.fetch_add(1, Ordering::Relaxed);
        let spec = match &c.rule {
            RuleRef::Named(name) => RuleSpec::Named(name),
            RuleRef::Inline(r) => RuleSpec::Inline(*r),
        };
        match self.engine.prepare(&c.key, spec, c.cost) {
            // A global rule reached through the SDK (which sends every check to an owner):
            // decided from the global counters like any global check.
            Ok((resolved, id)) if resolved.mode == Mode::Global => {
                PeerAnswer::Answer(self.global.answer(id, &resolved.rule, now, c.cost))
            }
            Ok((resolved, id)) => {
                PeerAnswer::Answer(self.engine.decide_at(id, &resolved.rule, c.cost, now))
            }
            Err(e) => error_answer(&e),
        }
    }
}

fn error_answer(e: &CheckError) -> PeerAnswer {
    PeerAnswer::Error {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
