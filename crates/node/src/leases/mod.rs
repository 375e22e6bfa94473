//! Leases this node holds: slices of hot buckets that other members own, so that the checks of
//! those buckets arriving here are decided here (see `ringlimit_core::lease` for what a slice
//! is and why it never admits more than the bucket).
//!
//! Where each piece lives:
//! - the holder's table, `Engine::held` (core's `lease::Held`): checks take from it in
//!   `crate::routing` (`Route::Leased`), hot keys are wanted and released by
//!   `routing::hot`'s tick, a reset revokes (`Engine::reset`);
//! - the owner's side, `Engine::lease` and `peers/server/lease.rs`: slices taken from the
//!   bucket at once, sized among its holders;
//! - this module: the task that asks owners for slices when one is due and gives back what
//!   slices had left ([`Asking`]), and their counters ([`metrics`]).
//!
//! A ring change releases every lease (their owners may have changed; what the slices had
//! left goes back to the owners under the new ring, which hold the buckets by then), and the
//! next checks of a bucket still hot ask its owner again.

pub mod metrics;

use crate::cluster::View;
use crate::engine::Engine;
use crate::peers::{LeaseLink, Peers};
use crate::rules::RuleSpec;
use arc_swap::ArcSwap;
use ringlimit_core::lease::{Due, Release, Return};
use ringlimit_core::rule::Mode;
use ringlimit_proto::peer::{LeaseGrant, PeerRefund};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often held slices are looked at (expired ones go back) while any are held; an ask that
/// becomes due wakes the task at once.
const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// The asking task's counters.
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Answers to asks: slices granted, refused while the bucket denies, refused otherwise
    /// (kept by its owner, not leasable, an error), and asks that got no answer.
    pub granted: AtomicU64,
    pub denied: AtomicU64,
    pub refused: AtomicU64,
    pub unanswered: AtomicU64,
    /// Tokens granted in slices.
    pub tokens_granted: AtomicU64,
    /// Unused tokens given back to owners, and those that did not reach them (they stay
    /// taken: under-admission only).
    pub tokens_returned: AtomicU64,
    pub tokens_lost: AtomicU64,
}

/// What the asking task needs.
pub struct Asking {
    pub engine: Arc<Engine>,
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
    pub stats: Arc<LeaseStats>,
}

impl Asking {
    /// Runs until the task is dropped.
    pub async fn run(self) {
        let held = self.engine.held().clone();
        let mut links: HashMap<Arc<str>, LeaseLink> = HashMap::new();
        let mut ring: Vec<Arc<str>> = Vec::new();
        loop {
            if held.count() == 0 {
                held.wake.notified().await;
            } else {
                tokio::select! {
                    () = held.wake.notified() => {}
                    () = tokio::time::sleep(SWEEP_EVERY) => {}
                }
            }
            let view = self.view.load_full();
            if view.ring.members() != ring.as_slice() {
                if !ring.is_empty() {
                    let n = held.release_all(Release::Ring);
                    tracing::debug!(released = n, "ring changed; leases released");
                }
                ring = view.ring.members().to_vec();
            }
            links.retain(|m, l| view.peer_addrs.get(m).is_some_and(|a| a == l.addr()));
            let now = self.engine.clock().now();
            self.ask(&view, &mut links, held.due(now)).await;
            let now = self.engine.clock().now();
            self.give_back(&view, &mut links, held.returns(now)).await;
        }
    }

    /// Sends the asks due, one frame per owner, all owners at once.
    async fn ask(&self, view: &View, links: &mut HashMap<Arc<str>, LeaseLink>, due: Vec<Due>) {
        let held = self.engine.held();
        let by_owner = by_owner(
            view,
            links,
            &self.peers,
            due,
            |d| d.id,
            |d| {
                // This node owns the bucket now: its checks are decided here.
                held.release(d.id, Release::Ring);
            },
        );
        let sends = links.iter_mut().filter_map(|(owner, link)| {
            let due = by_owner.get(owner)?;
            let asks = due.iter().map(|d| d.ask.clone()).collect();
            Some(async move { (owner.clone(), link.ask(asks).await) })
        });
        let answers = futures::future::join_all(sends).await;
        let now = self.engine.clock().now();
        let s = &self.stats;
        for (owner, answer) in answers {
            let Some(due) = by_owner.get(&owner) else {
                continue;
            };
            match answer {
                Ok(grants) => {
                    let mut grants = grants.into_iter();
                    for d in due {
                        // An owner older than protocol 6 answers nothing: its keys stay there.
                        let g = grants.next().unwrap_or_else(|| LeaseGrant::Error {
                            code: "unsupported".to_owned(),
                            message: "the owner does not lease".to_owned(),
                        });
                        match &g {
                            LeaseGrant::Granted { tokens, .. } => {
                                s.granted.fetch_add(1, Ordering::Relaxed);
                                s.tokens_granted.fetch_add(*tokens, Ordering::Relaxed);
                            }
                            LeaseGrant::Refused { answer } if !answer.allowed => {
                                s.denied.fetch_add(1, Ordering::Relaxed);
                            }
                            LeaseGrant::Refused { .. } | LeaseGrant::Error { .. } => {
                                s.refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        held.answered(d, g, now);
                    }
                }
                Err(e) => {
                    tracing::debug!(%owner, error = %e, "lease asks unanswered");
                    s.unanswered.fetch_add(due.len() as u64, Ordering::Relaxed);
                    for d in due {
                        held.unanswered(d.id, now);
                    }
                }
            }
        }
    }

    /// Gives back what slices had left: to each owner as one refund frame, or here.
    async fn give_back(
        &self,
        view: &View,
        links: &mut HashMap<Arc<str>, LeaseLink>,
        returns: Vec<Return>,
    ) {
        if returns.is_empty() {
            return;
        }
        let s = &self.stats;
        let by_owner = by_owner(
            view,
            links,
            &self.peers,
            returns,
            |r| r.id,
            |r| {
                let back = self.refund_here(&r.refund);
                let counter = if back {
                    &s.tokens_returned
                } else {
                    &s.tokens_lost
                };
                counter.fetch_add(r.refund.cost, Ordering::Relaxed);
            },
        );
        let sends = links.iter_mut().filter_map(|(owner, link)| {
            let back = by_owner.get(owner)?;
            let refunds: Vec<PeerRefund> = back.iter().map(|r| r.refund.clone()).collect();
            let tokens: u64 = refunds.iter().map(|r| r.cost).sum();
            Some(async move { (link.give_back(refunds).await, tokens) })
        });
        for (result, tokens) in futures::future::join_all(sends).await {
            let counter = if result.is_ok() {
                &s.tokens_returned
            } else {
                &s.tokens_lost
            };
            counter.fetch_add(tokens, Ordering::Relaxed);
        }
    }

    /// Gives back here what a slice of a bucket this node now owns had left.
    fn refund_here(&self, r: &PeerRefund) -> bool {
        match self.engine.prepare(&r.key, RuleSpec::of(&r.rule), r.cost) {
            Ok((resolved, id)) if resolved.mode == Mode::Owner => {
                let now = self.engine.clock().now();
                self.engine.refund(id, &resolved.rule, r.cost, r.mark, now);
                true
            }
            _ => false,
        }
    }
}

/// `items` grouped by their bucket's owner under `view`, with a link opened to each owner;
/// `mine` takes those this node owns (or that no one does).
fn by_owner<T>(
    view: &View,
    links: &mut HashMap<Arc<str>, LeaseLink>,
    peers: &Peers,
    items: Vec<T>,
    id: impl Fn(&T) -> u64,
    mut mine: impl FnMut(T),
) -> HashMap<Arc<str>, Vec<T>> {
    let mut out: HashMap<Arc<str>, Vec<T>> = HashMap::new();
    for item in items {
        let owner = view.ring.owner(id(&item)).filter(|o| *o != &*view.self_id);
        let Some((member, addr)) = owner.and_then(|o| view.peer_addrs.get_key_value(o)) else {
            mine(item);
            continue;
        };
        links
            .entry(member.clone())
            .or_insert_with(|| peers.lease_link(addr));
        out.entry(member.clone()).or_default().push(item);
    }
    out
}
