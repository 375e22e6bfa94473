//! The client's side of core's coordinator ([`ringlimit_core::coordinator`]): checks go
//! straight to their owner, or are decided in-process on a lease of a hot key (`crate::lease`);
//! without an owner, the fail mode and the local fallback decide.

use crate::builder::FailMode;
use crate::check::ClientError;
use crate::client::{Inner, Prepared};
use crate::topology::Topology;
use ringlimit_core::check::Resolved;
use ringlimit_core::coordinator::{FallbackCause, Item, Nowhere, Route, ShareTaken, Site, Standby};
use ringlimit_core::lease::{self, Take};
use ringlimit_core::link::{ForwardError, PeerClient};
use ringlimit_core::rule::LeaseMode;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{BlockSource, Mark, PeerAnswer, PeerCheck, PeerRefund};
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Inner {
    /// The coordinator's view of this client under `topo` (here, beside the adapter, so that
    /// `client.rs` and this file do not import each other).
    pub(crate) fn site<'a>(&'a self, topo: &'a Topology) -> Client<'a> {
        Client { inner: self, topo }
    }
}

/// The client as the coordinator sees it, under one topology.
pub(crate) struct Client<'a> {
    pub(crate) inner: &'a Inner,
    pub(crate) topo: &'a Topology,
}

impl Client<'_> {
    /// A check of a key another member owns, with leases on: decided on a slice held here,
    /// denied as the owner said, or `None` (to the owner). Every such check counts towards
    /// hot keys.
    #[inline]
    fn leased<L, H>(&self, p: &Prepared<'_>) -> Option<Route<L, H>> {
        let l = self.inner.leasing.as_ref()?;
        let known = p.known.as_ref()?;
        if known.lease == LeaseMode::Off || !lease::leasable(known.rule.algorithm) {
            return None;
        }
        l.record(p.id);
        let key = || (p.check.key.clone(), p.check.rule.clone());
        let now = || self.inner.fallback.now();
        match l.held.take_with(p.id, p.check.cost, now, key) {
            Take::Forward => None,
            Take::Leased(answer, taken) => {
                l.leased.fetch_add(1, Ordering::Relaxed);
                Some(Route::Leased(answer, Some(taken)))
            }
            Take::Denied(answer) => {
                l.denied.fetch_add(1, Ordering::Relaxed);
                Some(Route::Leased(answer, None))
            }
        }
    }
}

impl Site<Prepared<'_>> for Client<'_> {
    type Link = Arc<PeerClient>;
    type Here = Nowhere;

    /// Denied here while an owner's block of the bucket holds (before any lease: a slice never
    /// admits a blocked key); at the owner, when the rule and the members are known; else
    /// from the fallback.
    fn route(&self, p: &Prepared<'_>) -> Route<Arc<PeerClient>, Nowhere> {
        if let Some(answer) = self.inner.blocked.find(p.id, self.inner.fallback.now()) {
            self.inner.stats.blocked.fetch_add(1, Ordering::Relaxed);
            return Route::Leased(answer, None);
        }
        if let Some(leased) = self.leased(p) {
            return leased;
        }
        match p.known.and_then(|_| self.topo.owner(p.id)) {
            Some((owner, link)) => Route::Owner(owner.clone(), link.clone()),
            None => Route::Share { own: None },
        }
    }

    fn now(&self) -> u64 {
        self.inner.fallback.now()
    }

    /// The answer without the cluster: per the fail mode, the rule's policy and the fallback.
    fn fall_back(
        &self,
        p: &Prepared<'_>,
        why: FallbackCause,
    ) -> Result<(CheckAnswer, Option<ShareTaken>), ClientError> {
        let inner = self.inner;
        let reason = match why {
            FallbackCause::NoOwner if p.known.is_none() => "no cluster member reached yet",
            FallbackCause::NoOwner => "no cluster member alive",
            FallbackCause::Unreachable(e) => {
                // A dead or slow owner: the topology may be stale.
                inner.wake.notify_one();
                match e {
                    ForwardError::CircuitOpen | ForwardError::Lost => "owner unreachable",
                    ForwardError::Timeout => "owner did not answer within the deadline",
                    ForwardError::Shed => "queue to the owner is full",
                    ForwardError::Mismatch => "owner answered too few checks",
                    ForwardError::RuleUnknownAtOwner => "owner does not know the rule yet",
                }
            }
        };
        if self.topo.peers.is_empty() {
            inner.wake.notify_one();
        }
        if inner.settings.fail_mode == FailMode::Closed {
            return Err(ClientError::Unavailable(reason));
        }
        inner.stats.degraded.fetch_add(1, Ordering::Relaxed);
        let fallback = inner.fallback.share().fall_back(
            p.id,
            p.known.as_ref(),
            p.check.cost,
            self.topo.alive(),
            inner.fallback.now(),
        );
        Ok(fallback.held())
    }

    /// The member after the owner on the ring: the SDK does not know the cluster's
    /// `--replicas`, and a member that keeps no copy says so (then the fallback decides).
    fn replica(&self, p: &Prepared<'_>) -> Option<Standby<Arc<PeerClient>, Nowhere>> {
        p.known?;
        let (id, link) = self.topo.replica(p.id)?;
        Some(Standby::Member(id.clone(), link.clone()))
    }

    fn replica_answered(&self) {
        self.inner.stats.replica.fetch_add(1, Ordering::Relaxed);
    }

    fn refund_lease(&self, taken: &lease::SliceTaken) {
        if let Some(l) = &self.inner.leasing {
            l.held.give_back(taken);
        }
    }

    fn refund_share(&self, taken: &ShareTaken) {
        let fallback = &self.inner.fallback;
        fallback.share().refund(taken, fallback.now());
    }

    fn answered(&self, reply: &Result<PeerAnswer, ForwardError>) {
        match reply {
            Ok(PeerAnswer::Answer(_) | PeerAnswer::Held { .. } | PeerAnswer::Blocked { .. }) => {
                self.inner.stats.direct.fetch_add(1, Ordering::Relaxed);
            }
            // The owner knows rules we do not (or no longer): look again soon.
            Ok(PeerAnswer::Error { code, .. }) if code == "unknown_rule" => {
                self.inner.wake.notify_one()
            }
            _ => {}
        }
    }

    /// Kept until the block's end (a shadow rule's checks are not held to blocks).
    fn blocked(&self, _: usize, p: &Prepared<'_>, answer: &CheckAnswer, _: BlockSource) {
        if !p.shadow() {
            self.inner
                .blocked
                .insert(p.id, answer, self.inner.fallback.now());
        }
    }

    fn gave_back(&self, lost: u64) {
        if lost > 0 {
            tracing::debug!(
                lost,
                "refunds did not reach their owner; their costs stay taken"
            );
        }
    }
}

impl Item for Prepared<'_> {
    fn id(&self) -> u64 {
        self.id
    }

    fn cost(&self) -> u64 {
        self.check.cost
    }

    fn resolved(&self) -> Option<&Resolved> {
        self.known.as_ref()
    }

    fn peer_check(&self) -> PeerCheck {
        PeerCheck {
            key: self.check.key.clone(),
            rule: self.check.rule.clone(),
            cost: self.check.cost,
        }
    }

    fn peer_refund(&self, mark: Mark) -> PeerRefund {
        PeerRefund {
            key: self.check.key.clone(),
            rule: self.check.rule.clone(),
            cost: self.check.cost,
            mark,
        }
    }
}
