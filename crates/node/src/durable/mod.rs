//! Durable buckets: the owned buckets worth keeping, written to `--data-dir` by a second
//! follower of the store's change feed (beside the replica sender), and read back before the
//! node is ready.
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

use crate::local::Local;
use crate::metrics::{Family, load};
use disk::{Batch, Disk, DiskError};
use parking_lot::Mutex;
use ringlimit_core::store::{Change, Cursor};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `--persist-interval-ms`'s default: the group commit interval, what a SIGKILL may lose.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// `--persist-min-period`'s default: shorter rules refill before a restart is over.
pub const MIN_PERIOD: Duration = Duration::from_secs(60);
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

/// What the follower holds between flushes.
#[derive(Default)]
struct Following {
    cursor: Option<Cursor>,
    /// Ids stored: a change of a bucket that is not (no longer) durable deletes only these.
    stored: HashSet<u64>,
    /// Write every durable bucket again (the feed overran, or a write failed).
    resync: bool,
    changes: Vec<Change>,
    last_sweep: Option<u64>,
}

/// The disk follower of the owned buckets.
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

    /// Loads every stored bucket still mattering into the owned buckets (before the node
    /// serves), then follows the feed from there. Returns how many were restored.
    pub fn restore(&self) -> Result<u64, DiskError> {
        let started = Instant::now();
        let now = self.local.now();
        let (buckets, bad) = match self.disk.load(now) {
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
        let n = buckets.len() as u64;
        let mut f = self.following.lock();
        f.stored.reserve(buckets.len());
        for (id, state) in buckets {
            self.local.restore_in(id, state, now);
            f.stored.insert(id);
        }
        // Followed from here on: what was restored is stored already.
        f.cursor = self.local.owned().follow().ok();
        drop(f);
        let ms = started.elapsed().as_millis();
        self.stats
            .restore_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.stats.restored.store(n, Ordering::Relaxed);
        self.stats.stored.store(self.disk.len(), Ordering::Relaxed);
        tracing::info!(buckets = n, ms = %ms, path = %self.disk.path().display(), "buckets restored from disk");
        Ok(n)
    }

    /// The node starts leaving: from now on buckets that go (handed over) stay on disk.
    pub fn leaving(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    /// Drains the feed and commits the changed durable buckets in one batch (the follower's
    /// tick, and the last flush at shutdown); sweeps stored states that stopped mattering
    /// every [`SWEEP_EVERY`].
    pub fn flush(&self) -> Result<Flushed, DiskError> {
        let mut guard = self.following.lock();
        let f = &mut *guard;
        let owned = self.local.owned();
        if f.cursor.is_none() {
            f.cursor = owned.follow().ok();
            f.resync = true;
        }
        let now = self.local.now();
        f.changes.clear();
        if let Some(c) = f.cursor.as_mut()
            && owned.changes(c, &mut f.changes).is_err()
        {
            f.resync = true;
        }
        let leaving = self.leaving.load(Ordering::Relaxed);
        let mut batch = Batch::default();
        if f.resync {
            let mut keep = HashSet::new();
            owned.for_each_durable(|id, st| {
                if st.idle_at() > now {
                    keep.insert(id);
                    batch.put.push((id, st.clone()));
                }
            });
            if !leaving {
                batch
                    .delete
                    .extend(f.stored.iter().filter(|id| !keep.contains(id)));
            }
        } else {
            for ch in f.changes.drain(..) {
                match ch.state {
                    Some(st) if ch.durable && st.idle_at() > now => batch.put.push((ch.id, st)),
                    None if leaving => {}
                    _ if f.stored.contains(&ch.id) => batch.delete.push(ch.id),
                    _ => {}
                }
            }
        }
        let sweep_ns = SWEEP_EVERY.as_nanos() as u64;
        if f.last_sweep
            .is_none_or(|at| now.saturating_sub(at) >= sweep_ns)
        {
            f.last_sweep = Some(now);
            if let Ok(idle) = self.disk.idle(now) {
                batch.delete.extend(idle);
            }
        }
        if batch.is_empty() {
            return Ok(Flushed::default());
        }
        match self.disk.commit(&batch) {
            Ok(()) => {
                for (id, _) in &batch.put {
                    f.stored.insert(*id);
                }
                for id in &batch.delete {
                    f.stored.remove(id);
                }
                f.resync = false;
                let s = &self.stats;
                s.written
                    .fetch_add(batch.put.len() as u64, Ordering::Relaxed);
                s.deleted
                    .fetch_add(batch.delete.len() as u64, Ordering::Relaxed);
                s.batches.fetch_add(1, Ordering::Relaxed);
                s.stored.store(f.stored.len() as u64, Ordering::Relaxed);
                s.disk_bytes.store(self.disk.bytes(), Ordering::Relaxed);
                if s.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.disk.path().display(), "writing buckets to disk works again");
                }
                *s.error.lock() = None;
                Ok(Flushed {
                    written: batch.put.len(),
                    deleted: batch.delete.len(),
                })
            }
            Err(e) => {
                // What this batch held is not on disk: everything again next time.
                f.resync = true;
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

    /// The last flush at shutdown: everything changed since the last tick.
    pub fn flush_at_exit(&self) {
        match self.flush() {
            Ok(f) => tracing::info!(
                written = f.written,
                deleted = f.deleted,
                "buckets flushed to disk before exit"
            ),
            Err(e) => tracing::error!(error = %e, "the last flush of buckets to disk failed"),
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
