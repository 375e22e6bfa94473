//! Durable buckets: the owned buckets worth keeping, written to `--data-dir` by a second
//! follower of the store's change feed (beside the replica sender), and read back before the
//! node is ready; the replica copies too (their store's feed has this one follower), kept while
//! their state matters past `--persist-min-period` (a copy comes without its rule).
//!
//! Which buckets: a rule says `persist: auto | always | never`; `auto` keeps those whose
//! period is at least `--persist-min-period`. The store does not know a bucket's rule, so
//! every write under a rule says whether its bucket is durable (a bit beside the bucket's
//! local bit, [`ringlimit_core::store::Kind::Durable`]) and the drain reads that bit with the
//! state: the check path pays nothing beyond the feed itself. A bucket that comes without its
//! rule (a handover, a recall) is durable while buckets are kept at all; its next write under
//! its rule says for sure.
//!
//! When: every `--persist-interval-ms` the follower drains the feed (coalesced: a bucket
//! changed a thousand times is written once) and commits one batch: the changed durable
//! buckets' states, and deletions of those that went (evicted, reset, handed over), that are
//! no longer durable, or whose state stopped mattering (full again, window over). What a
//! SIGKILL loses is the last interval; SIGTERM flushes before the process exits. While the
//! node leaves (SIGTERM), buckets it hands over stay on its disk: the peers they go to may be
//! stopping too (a whole-cluster restart), and a state restored here and the same state
//! handed back by a peer are two readings of one history, which overlap (the larger
//! consumption), never add.
//!
//! Bounded: the file holds at most what the store holds (`--max-keys`) plus states that
//! stopped mattering since the last sweep (every [`SWEEP_EVERY`], deleted by their `idle_at`);
//! redb reuses freed pages, so the file stays at its high-water mark.
//!
//! Restore: [`Durable::restore`], before the node serves anything, merges every stored state
//! still mattering into the owned buckets as another reading of their history
//! (`Local::recall_in`), so that a peer's handover or recall of the same bucket overlaps it.
//!
//! # Layout
//! - this module — [`Durable`]: the follower's flushes, the sweep, restore, and its metrics.
//! - [`disk`] — the bucket file (redb), its value layout and its stamp.

pub mod disk;
#[cfg(test)]
mod tests;

use crate::cluster::View;
use crate::local::Local;
use crate::metrics::{Family, load};
use disk::{Batch, Disk, DiskError, Held};
use parking_lot::Mutex;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::store::{Change, Cursor};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// `--persist-interval-ms`'s default: the group commit interval, what a SIGKILL may lose.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// `--persist-min-period`'s default: shorter rules refill before a restart is over.
pub const MIN_PERIOD: Duration = Duration::from_secs(60);
/// `--members-wait-ms`'s default: how long a node that starts waits for the members of the
/// ring it last saw before their keys are no longer theirs. Long enough for the members of a
/// cluster restarted whole to come back one after the other (a StatefulSet's ordered start
/// waits for each pod to be ready before it starts the next).
pub const MEMBERS_WAIT: Duration = Duration::from_secs(60);
/// How often stored states that stopped mattering are deleted.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The disk follower's counters.
#[derive(Debug, Default)]
pub struct DurableStats {
    pub written: AtomicU64,
    pub deleted: AtomicU64,
    pub batches: AtomicU64,
    pub failures: AtomicU64,
    /// 1 while the last write failed (a full or unwritable disk): the node answers from
    /// memory meanwhile.
    pub failing: AtomicBool,
    pub restored: AtomicU64,
    pub restore_ms: AtomicU64,
    pub restore_failures: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub stored: AtomicU64,
    /// Whether buckets are kept at all (`--data-dir`).
    pub enabled: AtomicBool,
    /// The last write error while writes fail (the cluster view shows it).
    pub error: Mutex<Option<String>>,
}

/// Hashes a bucket id by itself: ids are already hashes (xxh3 of rule and key), so the
/// follower's sets of them need no hashing of their own.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64s are hashed here; anything else is folded in, never lost.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

/// A set of bucket ids.
type Ids = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// What the follower holds of one kind of bucket between flushes.
#[derive(Default)]
struct Source {
    cursor: Option<Cursor>,
    /// Ids stored: a change of a bucket that is not (no longer) kept deletes only these.
    stored: Ids,
    /// Write every kept bucket again (the feed overran, or a write failed).
    resync: bool,
    changes: Vec<Change>,
}

/// What the follower holds between flushes.
#[derive(Default)]
struct Following {
    owned: Source,
    copies: Source,
    last_sweep: Option<u64>,
}

/// The disk follower of the owned buckets and of the replica copies.
pub struct Durable {
    disk: Disk,
    local: Arc<Local>,
    following: Mutex<Following>,
    /// Set when the node starts leaving: buckets that go stay on disk from then on.
    leaving: AtomicBool,
    pub stats: Arc<DurableStats>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("disk", &self.disk)
            .finish_non_exhaustive()
    }
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    pub written: usize,
    pub deleted: usize,
}

impl Durable {
    /// The follower of `local`'s owned buckets onto `disk`.
    pub fn new(disk: Disk, local: Arc<Local>, stats: Arc<DurableStats>) -> Self {
        stats.disk_bytes.store(disk.bytes(), Ordering::Relaxed);
        stats.enabled.store(true, Ordering::Relaxed);
        Self {
            disk,
            local,
            following: Mutex::new(Following::default()),
            leaving: AtomicBool::new(false),
            stats,
        }
    }

    /// Loads every stored bucket still mattering into the owned buckets, and every stored
    /// copy into the replica copies (before the node serves), then follows both feeds from
    /// there. Returns how many buckets and copies were restored.
    pub fn restore(&self) -> Result<u64, DiskError> {
        let started = Instant::now();
        let now = self.local.now();
        let mut f = self.following.lock();
        let mut n = 0;
        for held in [Held::Owned, Held::Copies] {
            let (buckets, bad) = match self.disk.load(held, now) {
                Ok(loaded) => loaded,
                Err(e) => {
                    self.stats.restore_failures.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            };
            if bad > 0 {
                tracing::warn!(
                    path = %self.disk.path().display(),
                    values = bad,
                    "stored bucket states that do not decode were left out"
                );
                self.stats
                    .restore_failures
                    .fetch_add(bad, Ordering::Relaxed);
            }
            n += buckets.len() as u64;
            let source = match held {
                Held::Owned => &mut f.owned,
                Held::Copies => &mut f.copies,
            };
            source.stored.reserve(buckets.len());
            for (id, state) in buckets {
                match held {
                    Held::Owned => self.local.restore_in(id, state, now),
                    Held::Copies => self.local.copies().keep(id, Some(state), now),
                }
                source.stored.insert(id);
            }
        }
        // Followed from here on: what was restored is stored already.
        f.owned.cursor = self.local.owned().follow().ok();
        f.copies.cursor = self.local.copies().follow().ok();
        let stored = (f.owned.stored.len() + f.copies.stored.len()) as u64;
        drop(f);
        let ms = started.elapsed().as_millis();
        self.stats
            .restore_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.stats.restored.store(n, Ordering::Relaxed);
        self.stats.stored.store(stored, Ordering::Relaxed);
        tracing::info!(buckets = n, ms = %ms, path = %self.disk.path().display(), "buckets restored from disk");
        Ok(n)
    }

    /// The node starts leaving: from now on buckets that go (handed over) stay on disk.
    pub fn leaving(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    /// Whether the node is leaving (see [`Durable::leaving`]).
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }

    /// While the node leaves, writes `buckets`, taken out of the store to be handed over, to
    /// disk before they go: the feed shows them gone, not in the state they went in, so what
    /// they changed since the last flush would be missing here, and the members they go to may
    /// be stopping too. Kept as copies are, while their state matters past
    /// `--persist-min-period` (their rule is not known here). Returns how many were written.
    pub fn keep_handed(&self, buckets: &[(u64, BucketState)]) -> Result<usize, DiskError> {
        if !self.leaving.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let mut f = self.following.lock();
        let now = self.local.now();
        let horizon = now.saturating_add(self.local.persist_min_ns().unwrap_or(0));
        let batch = Batch {
            put: buckets
                .iter()
                .filter(|(_, st)| st.idle_at() >= horizon)
                .cloned()
                .collect(),
            delete: Vec::new(),
        };
        if batch.is_empty() {
            return Ok(0);
        }
        self.disk.commit(&[(Held::Owned, &batch)])?;
        f.owned.stored.extend(batch.put.iter().map(|(id, _)| *id));
        self.stats
            .written
            .fetch_add(batch.put.len() as u64, Ordering::Relaxed);
        Ok(batch.put.len())
    }

    /// Drains both feeds and commits the changed buckets worth keeping in one transaction
    /// (the follower's tick, and the last flush at shutdown); sweeps stored states that
    /// stopped mattering every [`SWEEP_EVERY`].
    ///
    /// Owned buckets are kept when durable (their rule said so on their last write). A copy
    /// comes without its rule: it is kept while its state matters for at least
    /// `--persist-min-period` from now (a short rule's bucket never does; a long one's does
    /// until it has nearly refilled or its window nearly ended).
    pub fn flush(&self) -> Result<Flushed, DiskError> {
        let mut guard = self.following.lock();
        if self.disk.is_closed() {
            // Stopped: the last flush is done.
            return Ok(Flushed::default());
        }
        let f = &mut *guard;
        let now = self.local.now();
        let leaving = self.leaving.load(Ordering::Relaxed);
        let horizon = now.saturating_add(self.local.persist_min_ns().unwrap_or(0));
        let owned = self.local.owned();
        let copies = self.local.copies();
        let mut b_owned = Batch::default();
        let mut b_copies = Batch::default();
        drain(
            &mut f.owned,
            &mut b_owned,
            leaving,
            || owned.follow().ok(),
            |c, out| owned.changes(c, out).is_ok(),
            |keep| {
                owned.for_each_durable(|id, st| {
                    if st.idle_at() > now {
                        keep(id, st);
                    }
                })
            },
            |ch| ch.durable && ch.state.as_ref().is_some_and(|st| st.idle_at() > now),
        );
        drain(
            &mut f.copies,
            &mut b_copies,
            leaving,
            || copies.follow().ok(),
            |c, out| copies.changes(c, out).is_ok(),
            |keep| {
                copies.for_each(|id, st| {
                    if st.idle_at() >= horizon {
                        keep(id, st);
                    }
                })
            },
            |ch| ch.state.as_ref().is_some_and(|st| st.idle_at() >= horizon),
        );
        let sweep_ns = SWEEP_EVERY.as_nanos() as u64;
        if f.last_sweep
            .is_none_or(|at| now.saturating_sub(at) >= sweep_ns)
        {
            f.last_sweep = Some(now);
            for (held, batch) in [(Held::Owned, &mut b_owned), (Held::Copies, &mut b_copies)] {
                if let Ok(idle) = self.disk.idle(held, now) {
                    batch.delete.extend(idle);
                }
            }
        }
        if b_owned.is_empty() && b_copies.is_empty() {
            return Ok(Flushed::default());
        }
        match self
            .disk
            .commit(&[(Held::Owned, &b_owned), (Held::Copies, &b_copies)])
        {
            Ok(()) => {
                let mut done = Flushed::default();
                for (source, batch) in [(&mut f.owned, &b_owned), (&mut f.copies, &b_copies)] {
                    for (id, _) in &batch.put {
                        source.stored.insert(*id);
                    }
                    for id in &batch.delete {
                        source.stored.remove(id);
                    }
                    source.resync = false;
                    done.written += batch.put.len();
                    done.deleted += batch.delete.len();
                }
                let s = &self.stats;
                s.written.fetch_add(done.written as u64, Ordering::Relaxed);
                s.deleted.fetch_add(done.deleted as u64, Ordering::Relaxed);
                s.batches.fetch_add(1, Ordering::Relaxed);
                let stored = f.owned.stored.len() + f.copies.stored.len();
                s.stored.store(stored as u64, Ordering::Relaxed);
                s.disk_bytes.store(self.disk.bytes(), Ordering::Relaxed);
                if s.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.disk.path().display(), "writing buckets to disk works again");
                }
                *s.error.lock() = None;
                Ok(done)
            }
            Err(e) => {
                // What these batches held is not on disk: everything again next time.
                f.owned.resync = true;
                f.copies.resync = true;
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                if !self.stats.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(error = %e, "cannot write buckets to disk; answering from memory, retrying");
                }
                *self.stats.error.lock() = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The last write error while writes fail (`None`: the disk takes them).
    pub fn error(&self) -> Option<String> {
        self.stats.error.lock().clone()
    }

    /// Flushes every `interval` until the task is dropped (each flush off the runtime's
    /// threads: a commit waits for the disk).
    pub async fn run(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let me = self.clone();
            // The error is counted and logged by the flush itself.
            let _ = tokio::task::spawn_blocking(move || me.flush()).await;
        }
    }

    /// Keeps the other members of the ring under `--data-dir` whenever they change (their ids
    /// and peer addresses), until the node starts leaving: a node that starts again waits for
    /// them as the owners of their keys (see `crate::cluster::membership::Remembered`). Runs
    /// until the task is dropped.
    pub async fn remember_members(self: Arc<Self>, mut updates: watch::Receiver<Arc<View>>) {
        let mut kept: Option<Vec<(String, String)>> = None;
        loop {
            let members = ring_members(&updates.borrow_and_update());
            if kept.as_ref() != Some(&members) && !self.leaving.load(Ordering::Relaxed) {
                let me = self.clone();
                let list = members.clone();
                // Off the runtime's threads: the commit waits for the disk.
                match tokio::task::spawn_blocking(move || me.disk.remember_members(&list)).await {
                    Ok(Ok(())) => kept = Some(members),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "cannot keep the ring's members on disk")
                    }
                    Err(_) => {}
                }
            }
            if updates.changed().await.is_err() {
                return;
            }
        }
    }

    /// The last flush at shutdown: everything changed since the last tick. The file is closed
    /// after it.
    pub fn flush_at_exit(&self) {
        match self.flush() {
            Ok(f) => tracing::info!(
                written = f.written,
                deleted = f.deleted,
                "buckets flushed to disk before exit"
            ),
            Err(e) => tracing::error!(error = %e, "the last flush of buckets to disk failed"),
        }
        self.disk.close();
    }
}

/// The members of `view`'s ring other than this node: id and peer address.
fn ring_members(view: &View) -> Vec<(String, String)> {
    view.ring
        .members()
        .iter()
        .filter(|id| ***id != *view.self_id)
        .filter_map(|id| {
            let addr = view.peer_addrs.get(id).cloned().or_else(|| {
                let m = view.members.iter().find(|m| *m.node_id == **id)?;
                Some(m.peer_addr.clone())
            })?;
            Some((id.to_string(), addr))
        })
        .collect()
}

/// One source's part of a flush: its changes drained (or, after a lag or a failed write, every
/// bucket it keeps) into `batch`. `follow` starts following, `read` drains (false: lagged),
/// `each` visits every bucket worth keeping, `keep` says whether a change is. While the node
/// leaves, buckets that go stay on disk.
fn drain(
    source: &mut Source,
    batch: &mut Batch,
    leaving: bool,
    follow: impl FnOnce() -> Option<Cursor>,
    read: impl FnOnce(&mut Cursor, &mut Vec<Change>) -> bool,
    each: impl FnOnce(&mut dyn FnMut(u64, &BucketState)),
    keep: impl Fn(&Change) -> bool,
) {
    if source.cursor.is_none() {
        source.cursor = follow();
        source.resync = true;
    }
    source.changes.clear();
    if let Some(c) = source.cursor.as_mut()
        && !read(c, &mut source.changes)
    {
        source.resync = true;
    }
    if source.resync {
        let mut kept = Ids::default();
        each(&mut |id, st| {
            kept.insert(id);
            batch.put.push((id, st.clone()));
        });
        if !leaving {
            batch
                .delete
                .extend(source.stored.iter().filter(|id| !kept.contains(id)));
        }
        return;
    }
    for ch in source.changes.drain(..) {
        if keep(&ch) {
            if let Some(st) = ch.state {
                batch.put.push((ch.id, st));
            }
        } else if (ch.state.is_some() || !leaving) && source.stored.contains(&ch.id) {
            batch.delete.push(ch.id);
        }
    }
}

/// The disk follower's counters as metrics (zero without `--data-dir`).
pub const METRICS: &[Family<DurableStats>] = &[
    Family::gauge(
        "persist_disk_bytes",
        "Size of the bucket file under --data-dir, in bytes.",
        |s| load(&s.disk_bytes),
    ),
    Family::gauge(
        "persist_buckets",
        "Buckets kept in the bucket file under --data-dir.",
        |s| load(&s.stored),
    ),
    Family::counter(
        "persist_buckets_written",
        "Bucket states written to disk (each changed durable bucket once per commit).",
        |s| load(&s.written),
    ),
    Family::counter(
        "persist_buckets_deleted",
        "Buckets deleted from disk (gone, no longer durable, or no longer mattering).",
        |s| load(&s.deleted),
    ),
    Family::counter(
        "persist_batches",
        "Group commits of changed buckets to disk.",
        |s| load(&s.batches),
    ),
    Family::counter(
        "persist_write_failures",
        "Group commits that failed (a full or unwritable disk): the node answers from memory and retries with every durable bucket.",
        |s| load(&s.failures),
    ),
    Family::gauge(
        "persist_failing",
        "1 while writing buckets to disk fails, else 0.",
        |s| u64::from(s.failing.load(Ordering::Relaxed)),
    ),
    Family::gauge(
        "persist_restored_buckets",
        "Buckets restored from disk when this node started.",
        |s| load(&s.restored),
    ),
    Family::gauge_f64(
        "persist_restore_seconds",
        "How long restoring buckets from disk took when this node started.",
        |s| load(&s.restore_ms) as f64 / 1000.0,
    ),
    Family::counter(
        "persist_restore_failures",
        "Stored bucket states that could not be read back at start (left out).",
        |s| load(&s.restore_failures),
    ),
];
