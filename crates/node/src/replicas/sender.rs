//! The replica sender: follows the owned buckets' change feed and sends each replica member copies
//! of the changed buckets this node owns, off the check path (a check is answered before its
//! change is read here).
//!
//! Every flush interval (`--replica-flush-ms`, [`FLUSH_EVERY`] by default) it drains the feed
//! (coalesced: a bucket written a thousand times between two drains is sent once, in its state
//! at the drain), groups the changed buckets by replica member under the current view
//! (`Ring::place`) and writes each member its frames (bounded like handover's) one way on a
//! connection of its own (`ReplicateOneWay`; to a member older than protocol 5, one
//! acknowledged `Replicate` exchange a frame). A member is sent the whole store again (its
//! share of it) when the feed overran ([`ringlimit_core::store::Lagged`]), when the ring's
//! members changed (replica sets moved), when it is new, and after a failed write or exchange
//! (what it got is unknown); a member that failed is left alone for [`RETRY_AFTER`], so that a
//! dead member does not hold up the others.
//!
//! The interval is the one trade-off of replication: a change waits at most one interval (plus
//! its write) before it is on the wire, which bounds what a SIGKILLed owner's copies can miss;
//! and each member gets at most one frame (a few syscalls and wake-ups on each side, and a
//! pass over cold caches) per interval, whatever the load. What replication costs is its
//! frames, not its buckets: the same buckets sent in rarer frames cost less, down to nothing
//! measurable at a second, and a bare tokio writer and reader pay about what the sender does
//! for the same frames. The default is the longest interval that keeps the replication lag's
//! p99 under 10 ms (measured: the docs' benchmarks page, "What `--replicas 1` costs", and
//! `bench/notes/replica-cost.md`).

use super::ReplicaStats;
use crate::cluster::View;
use crate::local::OwnedBuckets;
use crate::peers::{Peers, ReplicaLink};
use arc_swap::ArcSwap;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::store::{Change, Cursor};
use ringlimit_proto::peer::ReplicaBucket;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// The default flush interval (`--replica-flush-ms`): the longest a change waits before it is
/// on the wire, so the window a dead owner's last admissions may be missing from its copies
/// (see `crate::local::copies`), and under 10 ms with its write (the replication lag's target).
pub const FLUSH_EVERY: Duration = Duration::from_millis(8);
/// How long a member whose exchange failed is left alone before it is tried again (with the
/// whole store).
pub const RETRY_AFTER: Duration = Duration::from_millis(200);

/// What the sender needs.
pub struct Sender {
    pub owned: Arc<OwnedBuckets>,
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
    /// `--replicas`: members after the owner that keep a copy.
    pub replicas: usize,
    /// `--replica-flush-ms`: how often the changes are drained and sent.
    pub flush: Duration,
    pub stats: Arc<ReplicaStats>,
}

/// One replica member as the sender keeps it.
struct Target {
    link: ReplicaLink,
    /// Send it the whole store (its share) next.
    resend: bool,
    /// Left alone until then after a failure.
    retry_at: Instant,
}

impl Sender {
    /// Runs until the task is dropped; returns at once with `--replicas 0` or a store without
    /// a feed.
    pub async fn run(self) {
        if self.replicas == 0 {
            return;
        }
        // Followed only while some member may keep copies: a lone node's checks then write
        // nothing to the feed (a follower makes every write of a bucket append its id).
        let mut cursor: Option<Cursor> = None;
        let mut targets: HashMap<Arc<str>, Target> = HashMap::new();
        let mut members: Vec<Arc<str>> = Vec::new();
        let mut changes: Vec<Change> = Vec::new();
        // The previous drain: every change this drain finds was made after it, so the time
        // since then bounds from above how long the oldest of them waited (the lag exported;
        // never less than the truth, at most an interval more when changes are rare).
        let mut last_drain = Instant::now();
        let mut tick = tokio::time::interval(self.flush.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let view = self.view.load_full();
            let mut resend_all = false;
            if view.ring.members() != members.as_slice() {
                members = view.ring.members().to_vec();
                resend_all = true;
            }
            let alone = view.ring.members().iter().all(|m| **m == *view.self_id);
            match (alone, cursor.take()) {
                (true, Some(c)) => self.owned.unfollow(c),
                (true, None) => {}
                (false, Some(c)) => cursor = Some(c),
                (false, None) => match self.owned.follow() {
                    Ok(c) => {
                        cursor = Some(c);
                        // Whatever changed while nobody followed goes whole.
                        resend_all = true;
                    }
                    Err(_) => return,
                },
            }
            let since = last_drain;
            last_drain = Instant::now();
            if let Some(c) = cursor.as_mut()
                && self.owned.changes(c, &mut changes).is_err()
            {
                tracing::debug!("replica sender fell behind the change feed; resending");
                resend_all = true;
            }
            let now = Instant::now();
            self.sync_targets(&view, &mut targets, resend_all);
            let resend_due = targets.values().any(|t| t.resend && t.retry_at <= now);
            if !resend_due && changes.is_empty() {
                continue;
            }
            let batches = self.batches(&view, &changes, &mut targets, now);
            changes.clear();
            for (member, buckets) in batches {
                let Some(target) = targets.get_mut(&member) else {
                    continue;
                };
                let n = buckets.len() as u64;
                match target.link.replicate(buckets).await {
                    Ok(sent) => {
                        target.resend = false;
                        let s = &self.stats;
                        s.frames.fetch_add(sent.frames, Ordering::Relaxed);
                        s.bytes.fetch_add(sent.bytes, Ordering::Relaxed);
                        s.replicated.fetch_add(n, Ordering::Relaxed);
                        s.lag.observe(since.elapsed().as_secs_f64());
                    }
                    Err(e) => {
                        tracing::debug!(%member, error = %e, "replicating failed; retrying with the whole store");
                        target.resend = true;
                        target.retry_at = Instant::now() + RETRY_AFTER;
                    }
                }
            }
        }
    }

    /// Keeps a target per alive member other than this node (a new one, or one whose address
    /// changed, starts with the whole store). Members awaited since this node started are
    /// not sent copies until they are alive (then the whole store, as a new member).
    fn sync_targets(&self, view: &View, targets: &mut HashMap<Arc<str>, Target>, resend_all: bool) {
        targets.retain(|m, t| {
            view.peer_addrs.get(m).is_some_and(|a| a == t.link.addr()) && !view.awaits(m)
        });
        for (member, addr) in &view.peer_addrs {
            if **member == *view.self_id || view.awaits(member) {
                continue;
            }
            let t = targets.entry(member.clone()).or_insert_with(|| Target {
                link: self.peers.replica_link(addr),
                resend: true,
                retry_at: Instant::now(),
            });
            t.resend |= resend_all;
        }
    }

    /// What each member is sent now: the drained `changes` of buckets this node owns, grouped
    /// by replica member, or its share of the whole store when it is due a resend. Members
    /// left alone after a failure get nothing (they are due a resend anyway).
    ///
    /// Members are told apart by their index in the ring (`Ring::place`: one hash and one
    /// search per bucket, no allocation), not by name: this runs for every changed bucket.
    fn batches(
        &self,
        view: &View,
        changes: &[Change],
        targets: &mut HashMap<Arc<str>, Target>,
        now: Instant,
    ) -> HashMap<Arc<str>, Vec<ReplicaBucket>> {
        let ring = &view.ring;
        let members = ring.members();
        let Some(me) = members.iter().position(|m| **m == *view.self_id) else {
            return HashMap::new();
        };
        let me = me as u32;
        // Per ring member: due the whole store (`Some(true)`), the changes (`Some(false)`), or
        // nothing (not a target, or left alone after a failure).
        let due: Vec<Option<bool>> = members
            .iter()
            .map(|m| {
                targets
                    .get(m)
                    .filter(|t| t.retry_at <= now)
                    .map(|t| t.resend)
            })
            .collect();
        let mut out: Vec<Vec<ReplicaBucket>> = vec![Vec::new(); members.len()];
        let mut placed = Vec::with_capacity(self.replicas + 1);
        let mut add = |id: u64, state: Option<&BucketState>, full: bool| {
            ring.place(id, self.replicas, &mut placed);
            if placed.first() != Some(&me) {
                return;
            }
            for &m in &placed[1..] {
                if due[m as usize] == Some(full) {
                    out[m as usize].push(ReplicaBucket {
                        id,
                        state: state.map(BucketState::to_wire),
                    });
                }
            }
        };
        for ch in changes {
            add(ch.id, ch.state.as_ref(), false);
        }
        if due.contains(&Some(true)) {
            self.owned.for_each(|id, st| add(id, Some(st), true));
            // A member due a resend with nothing to resend is up to date now.
            for ((m, d), sent) in members.iter().zip(&due).zip(&out) {
                if *d == Some(true)
                    && sent.is_empty()
                    && let Some(t) = targets.get_mut(m)
                {
                    t.resend = false;
                }
            }
        }
        members
            .iter()
            .zip(out)
            .filter(|(_, buckets)| !buckets.is_empty())
            .map(|(m, buckets)| (m.clone(), buckets))
            .collect()
    }
}
