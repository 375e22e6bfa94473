//! Asking for leases: the task through which this node holds slices of hot buckets that other
//! members own, so that the checks of those buckets arriving here are decided here (see
//! `ringlimit_core::lease` for what a slice is and why it never admits more than the bucket).
//!
//! Where each piece lives:
//! - both sides' tables, `crate::local::leases` (the holder's: checks take from it in
//!   `crate::routing` (`Route::Leased`), hot keys are wanted and released by `routing::hot_keys`'s
//!   tick, a reset revokes; the owner's: `Local::lease`, asked through
//!   `peers/server/lease.rs`, slices taken from the bucket at once, sized among its holders);
//! - this module: the task that asks owners for slices and gives back what slices had left:
//!   core's `lease::asking::Asker` (the SDK runs it too), run here over this node's view
//!   ([`Asking`]); its counters are exported with the tables.
//!
//! A ring change releases every lease (their owners may have changed; what the slices had
//! left goes back to the owners under the new ring, which hold the buckets by then), and the
//! next checks of a bucket still hot ask its owner again.

use crate::cluster::View;
use crate::local::Local;
use crate::peers::Peers;
use crate::rules::RuleSpec;
use arc_swap::ArcSwap;
use ringlimit_core::lease::asking::{Asker, LeaseStats, Owners};
use ringlimit_core::rule::Mode;
use ringlimit_proto::peer::PeerRefund;
use std::sync::Arc;

/// What the asking task needs.
pub struct Asking {
    pub local: Arc<Local>,
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
    pub stats: Arc<LeaseStats>,
}

impl Asking {
    /// Runs until the task is dropped.
    pub async fn run(self) {
        let asker = Asker::new(
            self.local.leases().held().clone(),
            self.peers.sessions(),
            self.stats.clone(),
        );
        let owners = || Snapshot {
            view: self.view.load_full(),
            local: &self.local,
        };
        asker.run(owners, || self.local.now()).await;
    }
}

/// This node's view, as the asking task reads it.
struct Snapshot<'a> {
    view: Arc<View>,
    local: &'a Local,
}

impl Owners for Snapshot<'_> {
    fn owner(&self, id: u64) -> Option<(Arc<str>, String)> {
        let view = &self.view;
        let owner = view.ring.owner(id).filter(|o| *o != &*view.self_id)?;
        let (member, addr) = view.peer_addrs.get_key_value(owner)?;
        Some((member.clone(), addr.clone()))
    }

    fn ring(&self) -> Vec<Arc<str>> {
        self.view.ring.members().to_vec()
    }

    /// A slice of a bucket this node owns now goes back into its bucket here.
    fn refund_here(&self, r: &PeerRefund) -> bool {
        let local = self.local;
        match local.rules().prepare(&r.key, RuleSpec::of(&r.rule), r.cost) {
            Ok((resolved, id)) if resolved.mode == Mode::Owner => {
                let now = local.now();
                local.bucket(id, &resolved.rule, now).refund(r.cost, r.mark);
                true
            }
            _ => false,
        }
    }
}
