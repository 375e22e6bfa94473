//! The lifecycle stage: readiness (following membership until the node may answer), then,
//! on shutdown, leaving the cluster, draining, and stopping what the other stages started.

use super::LOG;
use super::local::LocalState;
use super::membership::Members;
use super::peers::{Peering, Publishing};
use crate::cluster::{MemberState, Membership};
use crate::config::NodeConfig;
use crate::durable::Durable;
use crate::global::GlobalCounters;
use crate::lifecycle::Lifecycle;
use crate::peers::Recall;
use crate::rlqs::Rlqs;
use crate::rules::sync::Synced;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Readiness, peers following membership, handover and promotion on ring changes.
pub(super) fn new(config: &NodeConfig, local: &LocalState, peers: &Peering) -> Arc<Lifecycle> {
    Arc::new(
        Lifecycle::new(
            local.local.clone(),
            peers.pool.clone(),
            peers.handed_over.clone(),
            config.replicas,
        )
        .with_durable(local.durable.clone()),
    )
}

/// Follows membership: the peers in step with it, handover on ring changes, and readiness
/// (see [`track_view`]).
pub(super) fn follow_membership(
    config: &NodeConfig,
    members: &Members,
    local: &LocalState,
    peers: &Peering,
    lifecycle: &Arc<Lifecycle>,
    tasks: &mut JoinSet<()>,
) {
    tasks.spawn(track_view(
        members.membership.clone(),
        lifecycle.clone(),
        peers.recall.clone(),
        members.needs_peers,
        Readiness {
            grace: config.gossip_interval * 20,
            settle: config.gossip_interval * 3,
            rules: members.rules_synced.clone(),
            global: local.global.clone(),
        },
    ));
}

/// What the node does once `shutdown` completes, while it still serves: RLQS streams told to
/// go, readiness taken back, `leaving` announced, and the leave delay waited out before HTTP
/// drains.
pub(super) async fn leave(
    shutdown: impl Future<Output = ()>,
    rlqs: Arc<Rlqs>,
    durable: Option<Arc<Durable>>,
    lifecycle: Arc<Lifecycle>,
    membership: Arc<Membership>,
    leave_delay: Duration,
) {
    shutdown.await;
    // Envoys fall back and find another node before this one leaves.
    rlqs.stop();
    lifecycle.set_ready(false);
    // What is handed over from now on stays on this node's disk too: the members it goes to
    // may be stopping as well.
    if let Some(d) = &durable {
        d.leaving();
    }
    tracing::info!(
        target: LOG,
        delay = ?leave_delay,
        "leaving the cluster: peers stop routing here"
    );
    membership.leave().await;
    // Keep answering while peers learn that we leave and move our keys.
    tokio::time::sleep(leave_delay).await;
    tracing::info!(target: LOG, "draining in-flight requests");
}

/// Once HTTP has drained: the last global counts sent, every task stopped, the durable
/// buckets' last changes flushed to disk, gossip shut down.
pub(super) async fn stop(
    publishing: Publishing,
    mut tasks: JoinSet<()>,
    membership: &Membership,
    durable: Option<Arc<Durable>>,
) {
    publishing.finish().await;
    tasks.abort_all();
    if let Some(d) = durable {
        // Off the runtime's threads: the commit waits for the disk.
        let _ = tokio::task::spawn_blocking(move || d.flush_at_exit()).await;
    }
    membership.shutdown();
    tracing::info!(target: LOG, "ringlimit node stopped");
}

/// How long a node with seeds waits before it is ready.
struct Readiness {
    /// With no other member seen by then, this node forms the cluster alone (as the first pod
    /// of a fresh StatefulSet must).
    grace: Duration,
    /// Once another member is seen, how long membership must stay unchanged: a node that has
    /// heard from one peer may not know the others yet, and until it does it would decide their
    /// keys itself (seen in the rolling-restart test as over-admission).
    settle: Duration,
    /// Set once the admin API's rules were merged from peers: a node that joins has every rule
    /// before it answers checks.
    rules: Arc<Synced>,
    /// A node that joins waits for the full set of global counts of every alive peer, so that
    /// once ready it counts what the cluster admitted before it came (its own previous life's
    /// included): a rolling restart that waits for readiness loses no global counts.
    global: Arc<GlobalCounters>,
}

/// Keeps the peer clients in step with membership, hands buckets over when the ring changes,
/// and sets readiness: at once for a lone node; with seeds, once another member is
/// seen and membership has settled, or after the grace period.
async fn track_view(
    membership: Arc<Membership>,
    lifecycle: Arc<Lifecycle>,
    recall: Arc<Recall>,
    needs_peers: bool,
    readiness: Readiness,
) {
    let mut updates = membership.updates();
    let deadline = tokio::time::Instant::now() + readiness.grace;
    let mut changed_at = tokio::time::Instant::now();
    let mut ring_members: Vec<Arc<str>> = Vec::new();
    // Members waited for since this node started (`cluster::membership::Remembered`).
    let mut awaited: Vec<Arc<str>> = Vec::new();
    // Readiness is granted once; only shutdown takes it back, and a later view change (such as
    // this node's own `leaving`) must not grant it again.
    let mut became_ready = false;
    loop {
        let view = updates.borrow_and_update().clone();
        lifecycle.follow_members(&view);
        let now = tokio::time::Instant::now();
        // A member waited for and now seen alive is handed what this node holds of its keys,
        // as a member that joins is: buckets handed here while the cluster stopped.
        let seen: Vec<Arc<str>> = awaited
            .iter()
            .filter(|m| !view.awaits(m) && view.ring.members().contains(m))
            .cloned()
            .collect();
        awaited.clone_from(&view.awaited);
        if view.ring.members() != ring_members.as_slice() || !seen.is_empty() {
            let joined: Vec<Arc<str>> = view
                .ring
                .members()
                .iter()
                .filter(|m| !ring_members.contains(m) || seen.contains(m))
                .cloned()
                .collect();
            ring_members = view.ring.members().to_vec();
            changed_at = now;
            // Ownership moved: copies of buckets this node now owns become its own (at once,
            // before anything else here waits), then the buckets that moved away go to their
            // new owners.
            lifecycle.promote(&view);
            let (lifecycle, view) = (lifecycle.clone(), view.clone());
            tokio::spawn(async move { lifecycle.hand_over(&view, &joined).await });
        }
        let settled_at = changed_at + readiness.settle;
        // Members that are joining count: at a cluster's start every member joins at once.
        let has_peers = view.members.iter().any(|m| {
            *m.node_id != *view.self_id
                && matches!(m.state, MemberState::Alive | MemberState::Joining)
        });
        let counts_heard = view.members.iter().all(|m| {
            *m.node_id == *view.self_id
                || m.state != MemberState::Alive
                || readiness.global.has_full_set(&m.node_id)
        });
        let settled = has_peers && now >= settled_at && readiness.rules.get() && counts_heard;
        if !became_ready && (!needs_peers || settled || now >= deadline) {
            tracing::info!(target: LOG, members = view.ring.len(), "node ready");
            lifecycle.set_ready(true);
            recall.ready();
            membership.announce_ready().await;
            became_ready = true;
        }
        let wait = if became_ready {
            updates.changed().await.map_err(|_| ())
        } else {
            let wake = if has_peers {
                // Settled, waiting for the rules or peers' counts: look again shortly.
                settled_at
                    .max(now + Duration::from_millis(20))
                    .min(deadline)
            } else {
                deadline
            };
            match tokio::time::timeout_at(wake, updates.changed()).await {
                Ok(r) => r.map_err(|_| ()),
                Err(_) => Ok(()),
            }
        };
        if wait.is_err() {
            return;
        }
    }
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
