//! Durable buckets: the owned buckets worth keeping, written to `--data-dir` by a second
//! follower of the store's change feed (beside the replica sender), and read back before the
//! node is ready; the replica copies too (their store's feed has this one follower), kept while
//! their state matters past `--persist-min-period` (a copy comes without its rule).
//!
//! Which buckets: a rule says `persist: auto | always | never`; `auto` keeps those whose
//! period is at least `--persist-min-period`. The store does not know a bucket's rule, so
//! every write under a rule says whether its bucket is durable (a bit beside the bucket's
//! local bit, [`ringlimit_core::store::Kind::Durable`]) and that bit reaches the follower with
//! the state (carried in a check's feed entry, or read at the drain): the check path pays
//! nothing beyond the feed itself (an entry of the id and the state the check left, appended
//! under the shard lock the check holds anyway, and only while a follower exists). A bucket
//! that comes without its rule (a handover, a recall) is durable while buckets are kept at
//! all; its next write under its rule says for sure.
//!
//! When: every `--persist-interval-ms` the follower drains the feed (coalesced: a bucket
//! changed a thousand times is written once) and appends one commit to the log (see
//! [`disk`]): the changed durable buckets' states, and deletions of those that went (evicted,
//! reset, handed over), that are no longer durable, or whose state stopped mattering (full
//! again, window over). The feed's rings are bounded: after an interval that read many changes
//! ([`BUSY_CHANGES`]) the follower also drains every [`DRAIN_EVERY`] in between, into the next
//! commit, so that a flood of new keys does not overrun them (an overrun costs a snapshot of
//! the whole store). What a SIGKILL loses is the last interval; SIGTERM flushes before the
//! process exits. While the node leaves (SIGTERM), buckets it hands over stay on its disk: the
//! peers they go to may be stopping too (a whole-cluster restart), and a state restored here
//! and the same state handed back by a peer are two readings of one history, which overlap
//! (the larger consumption), never add.
//!
//! # Compaction
//! The log is folded into a new snapshot once it holds more bytes than the last snapshot
//! (and at least [`LOG_FLOOR`]) and [`COMPACT_EVERY`] has passed since the last compaction,
//! or at once when it grew to [`LOG_GROWTH`] times that, after the feed overran or a write failed (the disk may then
//! miss changes: the snapshot writes the store whole), and when a sweep (every
//! [`SWEEP_EVERY`]) finds that a stored state stopped mattering. The snapshot is written **in
//! the background**, by a thread of its own, from the store itself (see `Durable::compact`
//! for why not from a mirror of the disk); commits go on meanwhile into the next log, and the
//! follower ends the compaction at its first flush after the thread is done. None while the
//! node leaves: the buckets it hands over are in the logs only.
//!
//! Bounded: the files hold the last snapshot (at most what the stores hold, `--max-keys`
//! buckets and as many copies, plus what stopped mattering since) and a log at most
//! [`LOG_GROWTH`] times larger (or than [`LOG_FLOOR`]): at most five times the live data
//! (about twice under a steady trickle of changes, which reaches the snapshot's size slower
//! than [`COMPACT_EVERY`]), six while a snapshot is written beside the last one.
//!
//! Restore: [`Durable::restore`], before the node serves anything, merges every stored state
//! still mattering into the owned buckets as another reading of their history
//! (`Local::recall_in`), so that a peer's handover or recall of the same bucket overlaps it.
//!
//! # Layout
//! - this module — [`Durable`]: the follower's flushes, compactions, restore, and its metrics.
//! - [`disk`] — the bucket files (snapshot and logs), their records and their stamp.
//! - [`reservations`] — the live reservations' file, so that settles work across a restart.

pub mod disk;
pub mod reservations;
#[cfg(test)]
mod tests;

use crate::cluster::View;
use crate::local::Local;
use crate::metrics::{Family, load};
use disk::{Disk, DiskError, Held, Pending, SnapshotJob, SnapshotWriter, Snapshotted};
use parking_lot::Mutex;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::store::{Change, Cursor};
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
/// How often the follower looks whether stored states stopped mattering (then compacts).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// The log is folded into a snapshot once it holds more than the last snapshot and at least
/// this: a small directory is not rewritten every few commits.
pub const LOG_FLOOR: u64 = 4 << 20;
/// How often a log past the last snapshot is folded into a new one, at most, unless it grew to
/// [`LOG_GROWTH`] times the snapshot.
pub const COMPACT_EVERY: Duration = Duration::from_secs(10);
/// How many times the last snapshot (or [`LOG_FLOOR`]) the log may grow before it is folded
/// sooner than [`COMPACT_EVERY`]: the bound of the files, and of what a restore replays.
pub const LOG_GROWTH: u64 = 4;

/// How often the follower drains the feed between two commits while it is busy (see
/// [`BUSY_CHANGES`]).
pub const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// Changes read from the feeds in one interval from which the follower drains them every
/// [`DRAIN_EVERY`] until the next commit, not only at the commit: the feed's rings are bounded
/// (`FEED_ENTRIES`), and a flood of changes between two commits overran them; each overrun
/// made the follower write the store whole (a snapshot), at every commit. Below it, one drain
/// a commit coalesces a bucket changed many times into one record.
pub const BUSY_CHANGES: usize = crate::local::owned::FEED_ENTRIES / 8;
/// How often the live reservations are written again, at most, when they changed (and at the
/// last flush before exit): a SIGKILL forgets those taken since, whose estimates then stay
/// taken.
pub const RESERVATIONS_EVERY: Duration = Duration::from_secs(1);
/// Quiet intervals in a row after which a busy follower drains only at its commits again: a
/// flood that pauses for an interval or two does not overrun the feed again when it resumes.
pub const QUIET_COMMITS: u32 = 10;
/// Changes gathered for the next commit from which it is written at once, before its
/// interval: what waits for a commit stays bounded whatever `--persist-interval-ms` is.
pub const MAX_PENDING: usize = 256 * 1024;

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
    pub snapshots: AtomicU64,
    /// Whether buckets are kept at all (`--data-dir`).
    pub enabled: AtomicBool,
    /// The last write error while writes fail (the cluster view shows it).
    pub error: Mutex<Option<String>>,
}

/// How many changes ahead a drain fetches the filter's words of the ids it reads: about as many
/// as the core keeps misses in flight.
const PREFETCH_AHEAD: usize = 8;

/// A superset of the ids on disk, a bit per id (its low bits; ids are hashes): a change of a
/// bucket not kept is written as a delete only when its bit is set. Stands in for a set of the
/// ids stored, which costs a hashed insert per changed bucket and ~16 bytes per stored one;
/// a false positive costs a delete record of 9 bytes, harmless. Cleared at each snapshot to
/// the ids it holds (and those put since it started).
#[derive(Debug, Clone)]
struct MaybeStored {
    words: Vec<u64>,
    mask: u64,
}

impl MaybeStored {
    /// 16 bits for each of `max_keys` buckets (a few % of false positives when the store is
    /// full, twice as many with as many copies), a power of two.
    fn for_keys(max_keys: u64) -> Self {
        let bits = max_keys
            .saturating_mul(16)
            .clamp(1 << 16, 1 << 32)
            .next_power_of_two();
        Self {
            words: vec![0; (bits / 64) as usize],
            mask: bits - 1,
        }
    }

    fn at(&self, id: u64) -> (usize, u64) {
        let bit = id & self.mask;
        ((bit >> 6) as usize, 1 << (bit & 63))
    }

    /// Sets `id`'s bit; whether it was clear.
    #[inline]
    fn insert(&mut self, id: u64) -> bool {
        let (w, b) = self.at(id);
        let word = &mut self.words[w];
        let was = *word & b == 0;
        *word |= b;
        was
    }

    /// Starts fetching `id`'s word: a commit sets thousands of bits at random places in a table
    /// larger than the caches, and each set waited for its word alone.
    #[inline]
    fn prefetch(&self, id: u64) {
        if let Some(word) = self.words.get(self.at(id).0) {
            ringlimit_core::store::hint(std::ptr::from_ref(word).addr());
        }
    }

    #[inline]
    fn contains(&self, id: u64) -> bool {
        let (w, b) = self.at(id);
        self.words[w] & b != 0
    }

    fn union(&mut self, other: &Self) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    fn empty_like(&self) -> Self {
        Self {
            words: vec![0; self.words.len()],
            mask: self.mask,
        }
    }
}

/// What the follower holds of one kind of bucket between flushes.
struct Source {
    held: Held,
    cursor: Option<Cursor>,
    /// What is on disk may differ from the store beyond the feed's changes (the feed overran,
    /// or a write failed): a snapshot of the store sets it right.
    resync: bool,
    changes: Vec<Change>,
}

impl Source {
    fn new(held: Held) -> Self {
        Self {
            held,
            cursor: None,
            resync: false,
            changes: Vec::new(),
        }
    }
}

/// A snapshot being written by its own thread (see the module's "Compaction").
struct Compaction {
    thread: std::thread::JoinHandle<Result<(Snapshotted, MaybeStored), DiskError>>,
    /// Ids put since it started (the log after it holds them).
    since: MaybeStored,
    /// Of those, how many set a bit of their own.
    since_new: u64,
    /// When the first state put since it started stops mattering.
    since_first_idle: u64,
}

/// What the follower holds between flushes.
struct Following {
    owned: Source,
    copies: Source,
    last_sweep: Option<u64>,
    maybe: MaybeStored,
    /// When the first state on disk stops mattering, as far as the follower knows (a sweep
    /// compacts once it has).
    first_idle: u64,
    compaction: Option<Compaction>,
    /// When the last compaction started (the node's clock).
    last_compaction: Option<u64>,
    /// Changes read from the feeds since the last commit.
    read: usize,
    /// Whether the last interval read [`BUSY_CHANGES`] or more (or overran a feed): the
    /// follower then drains every [`DRAIN_EVERY`].
    busy: bool,
    /// Whether a feed overran since the last commit.
    overran: bool,
    /// Commits in a row since the last busy interval.
    quiet: u32,
    /// The reservations table's version when last written, and when (the node's clock).
    reservations: Option<(u64, u64)>,
    /// The next commit, encoded by the drains since the last.
    pending: Pending,
    /// Of its puts, how many set a bit of their own in `maybe` (stored from its commit on).
    pending_new: u64,
}

impl Following {
    /// The two sources the drains read, and where they put what they gather.
    fn split(&mut self) -> (&mut Source, &mut Source, Sink<'_>) {
        let sink = Sink {
            pending: &mut self.pending,
            maybe: &mut self.maybe,
            since: self.compaction.as_mut(),
            first_idle: &mut self.first_idle,
            new: &mut self.pending_new,
        };
        (&mut self.owned, &mut self.copies, sink)
    }
}

/// Where the drains put what they gather: the next commit's records, and their ids in what may
/// be on disk (set before the commit: a superset of the ids on disk stays one when it fails).
struct Sink<'a> {
    pending: &'a mut Pending,
    maybe: &'a mut MaybeStored,
    since: Option<&'a mut Compaction>,
    first_idle: &'a mut u64,
    new: &'a mut u64,
}

impl Sink<'_> {
    /// Starts fetching the filters' words [`Sink::put`] or [`Sink::may_be_stored`] of `id`
    /// reads: a drain of a flood of new keys sets bits at random places in tables larger than
    /// the caches, and each waited for its word alone.
    #[inline]
    fn prefetch(&self, id: u64) {
        self.maybe.prefetch(id);
        if let Some(c) = self.since.as_deref() {
            c.since.prefetch(id);
        }
    }

    #[inline]
    fn put(&mut self, held: Held, id: u64, st: &BucketState) {
        self.pending.put(held, id, st);
        *self.new += u64::from(self.maybe.insert(id));
        *self.first_idle = (*self.first_idle).min(st.idle_at());
        if let Some(c) = self.since.as_deref_mut() {
            c.since_new += u64::from(c.since.insert(id));
            c.since_first_idle = c.since_first_idle.min(st.idle_at());
        }
    }

    #[inline]
    fn delete(&mut self, held: Held, id: u64) {
        self.pending.delete(held, id);
    }

    #[inline]
    fn may_be_stored(&self, id: u64) -> bool {
        self.maybe.contains(id)
    }
}

/// The disk follower of the owned buckets and of the replica copies.
pub struct Durable {
    disk: Arc<Disk>,
    local: Arc<Local>,
    following: Mutex<Following>,
    /// Set when the node starts leaving: buckets that go stay on disk from then on.
    leaving: AtomicBool,
    /// `Following::busy` as the last flush left it, read without the lock: a quiet follower's
    /// thread does not take the lock for a drain that would do nothing.
    busy: AtomicBool,
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
    /// Whether a snapshot was started (written by its own thread).
    pub compacting: bool,
}

impl Durable {
    /// The follower of `local`'s owned buckets onto `disk`.
    pub fn new(disk: Disk, local: Arc<Local>, stats: Arc<DurableStats>) -> Self {
        stats.disk_bytes.store(disk.bytes(), Ordering::Relaxed);
        stats.enabled.store(true, Ordering::Relaxed);
        let following = Following {
            owned: Source::new(Held::Owned),
            copies: Source::new(Held::Copies),
            last_sweep: None,
            maybe: MaybeStored::for_keys(local.max_keys()),
            first_idle: u64::MAX,
            compaction: None,
            last_compaction: None,
            read: 0,
            busy: false,
            overran: false,
            quiet: 0,
            reservations: None,
            pending: Pending::default(),
            pending_new: 0,
        };
        Self {
            disk: Arc::new(disk),
            local,
            following: Mutex::new(following),
            leaving: AtomicBool::new(false),
            busy: AtomicBool::new(false),
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
        // States already idle stay on disk until the first sweep compacts them away.
        f.first_idle = self.disk.first_idle_at_open();
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
            for (id, state) in buckets {
                f.maybe.insert(id);
                match held {
                    Held::Owned => self.local.restore_in(id, state, now),
                    Held::Copies => self.local.copies().keep(id, Some(state), now),
                }
            }
        }
        self.restore_reservations(&mut f, now);
        // Followed from here on: what was restored is stored already.
        f.owned.cursor = self.local.owned().follow_durable().ok();
        f.copies.cursor = self.local.copies().follow().ok();
        drop(f);
        let ms = started.elapsed().as_millis();
        self.stats
            .restore_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.stats.restored.store(n, Ordering::Relaxed);
        self.stats.stored.store(n, Ordering::Relaxed);
        tracing::info!(buckets = n, ms = %ms, path = %self.disk.path().display(), "buckets restored from disk");
        Ok(n)
    }

    /// Keeps the reservations still live at `now` from the file again (see [`reservations`]).
    fn restore_reservations(&self, f: &mut Following, now: u64) {
        let table = self.local.reservations().table();
        match reservations::read(self.disk.path(), self.disk.owner()) {
            Ok((live, bad)) => {
                let mut kept = 0u64;
                for (nonce, r) in live {
                    if r.deadline >= now && table.restore(nonce, r).is_ok() {
                        kept += 1;
                    }
                }
                if bad > 0 {
                    tracing::warn!(
                        reservations = bad,
                        "stored reservations that do not decode were left out"
                    );
                    self.stats
                        .restore_failures
                        .fetch_add(bad, Ordering::Relaxed);
                }
                if kept > 0 {
                    tracing::info!(reservations = kept, "reservations restored from disk");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reservations not restored");
                self.stats.restore_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        f.reservations = Some((table.version(), now));
    }

    /// Writes the live reservations when they changed since the last write and `due` (or at
    /// as soon as they changed with `at_exit`: the last flush).
    fn keep_reservations(&self, f: &mut Following, now: u64, at_exit: bool) {
        let table = self.local.reservations().table();
        let version = table.version();
        let due = match f.reservations {
            None => true,
            Some((v, at)) => {
                v != version
                    && (at_exit || now.saturating_sub(at) >= RESERVATIONS_EVERY.as_nanos() as u64)
            }
        };
        if !due {
            return;
        }
        let live = table.live_at(now);
        match reservations::write(self.disk.path(), self.disk.owner(), &live) {
            Ok(_) => f.reservations = Some((version, now)),
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cannot keep the live reservations on disk");
            }
        }
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
        let mut guard = self.following.lock();
        let f = &mut *guard;
        let now = self.local.now();
        let horizon = now.saturating_add(self.local.persist_min_ns().unwrap_or(0));
        self.disk.begin(&mut f.pending);
        let (_, _, mut sink) = f.split();
        let mut n = 0;
        for (id, st) in buckets.iter().filter(|(_, st)| st.idle_at() >= horizon) {
            sink.put(Held::Owned, *id, st);
            n += 1;
        }
        if n > 0 {
            // In one commit with what the drains gathered before: an older state of one of
            // them is not written after it.
            self.commit_gathered(f)?;
        }
        Ok(n)
    }

    /// Drains both feeds and appends the changed buckets worth keeping to the log as one
    /// commit (the follower's tick, and the last flush at shutdown); folds the log into a
    /// snapshot when it has grown past the last one, after a lag or a failed write, and every
    /// [`SWEEP_EVERY`] when stored states stopped mattering.
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
        self.compacted(f, false);
        let now = self.local.now();
        let leaving = self.leaving.load(Ordering::Relaxed);
        self.gather(f, now, leaving);
        if f.read >= BUSY_CHANGES || f.overran {
            (f.busy, f.quiet) = (true, 0);
        } else {
            f.quiet = f.quiet.saturating_add(1);
            f.busy &= f.quiet < QUIET_COMMITS;
        }
        f.overran = false;
        self.busy.store(f.busy, Ordering::Relaxed);
        let mut done = self.commit_gathered(f)?;
        self.keep_reservations(f, now, false);
        // While leaving, nothing is folded away: buckets handed over are on disk only.
        if !leaving && f.compaction.is_none() {
            let sweep = f
                .last_sweep
                .is_none_or(|at| now.saturating_sub(at) >= SWEEP_EVERY.as_nanos() as u64);
            if sweep {
                f.last_sweep = Some(now);
            }
            let (log, snapshot) = self.disk.log_and_snapshot_bytes();
            let resync = f.owned.resync || f.copies.resync;
            // A snapshot rewrites every bucket kept: under a flood of new keys the log
            // outgrows it every second or so, and writing it that often cost the node more
            // than the commits. So a log past the snapshot waits until COMPACT_EVERY has passed
            // since the last one, unless it reached LOG_GROWTH times the snapshot.
            let floor = snapshot.max(LOG_FLOOR);
            let due = f
                .last_compaction
                .is_none_or(|at| now.saturating_sub(at) >= COMPACT_EVERY.as_nanos() as u64);
            let grown = log > floor && (due || log > floor.saturating_mul(LOG_GROWTH));
            if resync || (sweep && f.first_idle <= now) || grown {
                f.last_compaction = Some(now);
                match self.compact(f) {
                    Ok(()) => {
                        done.compacting = true;
                        self.works();
                    }
                    Err(e) => return Err(self.failed(f, e)),
                }
            }
        }
        self.stats
            .disk_bytes
            .store(self.disk.bytes(), Ordering::Relaxed);
        Ok(done)
    }

    /// Between two commits, while the follower is busy: drains the feeds into the next
    /// commit, so that their bounded rings do not overrun; commits at once when the gathered
    /// changes reach [`MAX_PENDING`]. Nothing while the follower is not busy, or stopped.
    pub fn drain(&self) -> Result<(), DiskError> {
        let mut guard = self.following.lock();
        if !guard.busy || self.disk.is_closed() {
            return Ok(());
        }
        let f = &mut *guard;
        let now = self.local.now();
        let leaving = self.leaving.load(Ordering::Relaxed);
        self.gather(f, now, leaving);
        if f.pending.len() >= MAX_PENDING {
            self.commit_gathered(f)?;
        }
        Ok(())
    }

    /// Drains both feeds into the next commit (`Following::pending`).
    fn gather(&self, f: &mut Following, now: u64, leaving: bool) {
        let horizon = now.saturating_add(self.local.persist_min_ns().unwrap_or(0));
        let owned = self.local.owned();
        let copies = self.local.copies();
        self.disk.begin(&mut f.pending);
        let (owned_source, copies_source, mut sink) = f.split();
        let from_owned = drain(
            owned_source,
            &mut sink,
            leaving,
            || owned.follow_durable().ok(),
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
        let from_copies = drain(
            copies_source,
            &mut sink,
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
        for (read, lagged) in [from_owned, from_copies] {
            f.read += read;
            // An overrun: the next interval drains often from its start.
            f.overran |= lagged;
        }
    }

    /// Appends what the drains gathered since the last commit as one commit (nothing when
    /// they gathered nothing).
    fn commit_gathered(&self, f: &mut Following) -> Result<Flushed, DiskError> {
        f.read = 0;
        let mut done = Flushed::default();
        if f.pending.is_empty() {
            return Ok(done);
        }
        (done.written, done.deleted) = f.pending.counts();
        let new = std::mem::take(&mut f.pending_new);
        if let Err(e) = self.disk.commit_pending(&mut f.pending) {
            // Not on disk: the snapshot the failure asks for writes the store whole.
            return Err(self.failed(f, e));
        }
        let s = &self.stats;
        let was = s.stored.load(Ordering::Relaxed);
        s.stored.store(
            was.saturating_add(new).saturating_sub(done.deleted as u64),
            Ordering::Relaxed,
        );
        s.written.fetch_add(done.written as u64, Ordering::Relaxed);
        s.deleted.fetch_add(done.deleted as u64, Ordering::Relaxed);
        s.batches.fetch_add(1, Ordering::Relaxed);
        self.works();
        Ok(done)
    }

    /// A write worked: the disk takes writes (again).
    fn works(&self) {
        let s = &self.stats;
        if s.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(path = %self.disk.path().display(), "writing buckets to disk works again");
        }
        *s.error.lock() = None;
    }

    /// A write failed: what it held is not on disk, so the store is written whole (a snapshot)
    /// once the disk takes writes again.
    fn failed(&self, f: &mut Following, e: DiskError) -> DiskError {
        f.owned.resync = true;
        f.copies.resync = true;
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if !self.stats.failing.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, "cannot write buckets to disk; answering from memory, retrying");
        }
        *self.stats.error.lock() = Some(e.to_string());
        e
    }

    /// Starts the next log and writes the snapshot of what the store holds now on a thread
    /// of its own.
    ///
    /// The snapshot's states are read from the store (`Local`), not from a mirror of the disk
    /// kept by the follower: a mirror would cost memory per stored bucket (its id and encoded
    /// state, the size of the snapshot again) to spare a walk of the store once per
    /// compaction. The store is what the disk follows: every change it holds that the logs
    /// before the new one do not is in the feed, so in the new log, and the new log is
    /// replayed over the snapshot (a state read later than the commit that follows it in the
    /// log is overwritten by that commit, as it would have been had the snapshot been read
    /// first). What the store no longer holds (evicted, handed over, stopped mattering) is
    /// left out, which is the sweep. Each shard is copied under its lock and encoded after,
    /// so checks wait for a copy of one shard at most.
    fn compact(&self, f: &mut Following) -> Result<(), DiskError> {
        let job = self.disk.rotate()?;
        f.owned.resync = false;
        f.copies.resync = false;
        let local = self.local.clone();
        let maybe = f.maybe.empty_like();
        let thread = std::thread::Builder::new()
            .name("ringlimit-snapshot".into())
            .spawn(move || snapshot(job, &local, maybe))
            .map_err(|e| DiskError::Write {
                path: self.disk.path().to_owned(),
                reason: format!("cannot start the snapshot's thread: {e}"),
            })?;
        f.compaction = Some(Compaction {
            thread,
            since: f.maybe.empty_like(),
            since_new: 0,
            since_first_idle: u64::MAX,
        });
        Ok(())
    }

    /// Ends the running compaction once its snapshot is written (or waits for it with
    /// `wait`): the logs before it go, and what may be on disk is what it holds and what was
    /// put since.
    fn compacted(&self, f: &mut Following, wait: bool) {
        let Some(c) = f.compaction.take_if(|c| wait || c.thread.is_finished()) else {
            return;
        };
        let result = c.thread.join().unwrap_or_else(|_| {
            Err(DiskError::Write {
                path: self.disk.path().to_owned(),
                reason: "the snapshot's thread panicked".into(),
            })
        });
        match result {
            Ok((done, mut maybe)) => {
                self.disk.snapshot_written(&done);
                maybe.union(&c.since);
                f.maybe = maybe;
                f.first_idle = done.first_idle.min(c.since_first_idle);
                self.stats
                    .stored
                    .store(done.count + c.since_new, Ordering::Relaxed);
                self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .disk_bytes
                    .store(self.disk.bytes(), Ordering::Relaxed);
            }
            Err(e) => {
                // The logs stay as they are (nothing was lost); written whole again next time.
                tracing::warn!(error = %e, "cannot write a snapshot of the buckets; the logs stay");
                self.failed(f, e);
            }
        }
    }

    /// Waits for a snapshot being written, and ends its compaction (tests, and a node that
    /// stops).
    pub fn settle(&self) {
        let mut f = self.following.lock();
        self.compacted(&mut f, true);
    }

    /// The last write error while writes fail (`None`: the disk takes them).
    pub fn error(&self) -> Option<String> {
        self.stats.error.lock().clone()
    }

    /// Flushes every `interval` until the task is dropped, and drains every [`DRAIN_EVERY`]
    /// in between while busy, on a thread of its own (a commit waits for the disk). Handed to
    /// the runtime's blocking pool, each drain woke three threads in turn (the timer's, the
    /// pool's, the task's again), a visible share of the follower's cost under a flood
    /// (`bench/notes/durable-store.md`).
    pub async fn run(self: Arc<Self>, interval: Duration) {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("ringlimit-persist".into())
            .spawn(move || me.follow(interval, &stopped));
        if let Err(e) = started {
            let error = format!("starting the thread that writes buckets to disk: {e}");
            tracing::error!(error = %error, "buckets are not written to disk");
            self.stats.failing.store(true, Ordering::Relaxed);
            *self.stats.error.lock() = Some(error);
            return;
        }
        // Dropped with the task, which tells the thread to stop.
        let _stop = stop;
        std::future::pending::<()>().await;
    }

    /// [`Durable::run`]'s thread: until `stopped` says to stop (its sender dropped).
    fn follow(&self, interval: Duration, stopped: &std::sync::mpsc::Receiver<()>) {
        let interval = interval.max(Duration::from_millis(1));
        let step = interval.min(DRAIN_EVERY);
        // Commits at most `interval` apart: what a SIGKILL may lose.
        let per = (interval.as_nanos() / step.as_nanos()).max(1);
        let mut next = Instant::now() + step;
        let mut ticks: u128 = 0;
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            if stopped.recv_timeout(wait) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            ticks += 1;
            // The error is counted and logged by the flush itself.
            if ticks.is_multiple_of(per) {
                let _ = self.flush();
            } else if self.busy.load(Ordering::Relaxed) {
                let _ = self.drain();
            }
            next += step;
            let now = Instant::now();
            if next < now {
                // Late (a long commit): the next step counts from now, not in a burst.
                next = now + step;
            }
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
                let disk = self.disk.clone();
                let list = members.clone();
                // Off the runtime's threads: the commit waits for the disk.
                match tokio::task::spawn_blocking(move || disk.remember_members(&list)).await {
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
        if !self.disk.is_closed() {
            let now = self.local.now();
            self.keep_reservations(&mut self.following.lock(), now, true);
        }
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

impl Drop for Durable {
    /// A snapshot being written is finished first: a directory is never written by two
    /// followers at once (a test reopening it, a node started again in the same process).
    fn drop(&mut self) {
        if let Some(c) = self.following.get_mut().compaction.take() {
            let _ = c.thread.join();
        }
    }
}

/// Writes `job`'s snapshot from what `local` holds now: the owned buckets worth keeping and
/// the copies that matter past `--persist-min-period`, as the follower keeps them. Returns the
/// snapshot and its ids in `maybe`.
fn snapshot(
    job: SnapshotJob,
    local: &Local,
    mut maybe: MaybeStored,
) -> Result<(Snapshotted, MaybeStored), DiskError> {
    let now = local.now();
    let horizon = now.saturating_add(local.persist_min_ns().unwrap_or(0));
    let mut shard = Vec::new();
    let mut put = |w: &mut SnapshotWriter, held, shard: &mut Vec<(u64, BucketState)>| {
        for (id, st) in shard.drain(..) {
            maybe.insert(id);
            w.put(held, id, &st);
        }
    };
    let done = job.write(|w| {
        let owned = local.owned();
        for k in 0..owned.shard_count() {
            owned.for_each_durable_in(k, |id, st| {
                if st.idle_at() > now {
                    shard.push((id, st.clone()));
                }
            });
            put(w, Held::Owned, &mut shard);
        }
        let copies = local.copies();
        for k in 0..copies.shard_count() {
            copies.for_each_in(k, |id, st| {
                if st.idle_at() >= horizon {
                    shard.push((id, st.clone()));
                }
            });
            put(w, Held::Copies, &mut shard);
        }
    })?;
    Ok((done, maybe))
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

/// One source's part of a flush: its changes drained into `sink` as its records. `follow`
/// starts following, `read` drains (false: lagged), `each` visits every bucket worth keeping,
/// `keep` says whether a change is; a change of a bucket not kept is a delete when `sink` says
/// it may be on disk. A lag (or a first drain) marks the source for a snapshot; while the node
/// leaves (no snapshot then: buckets that go stay on disk) every bucket worth keeping is
/// written instead.
/// Returns how many changes were read, and whether the feed overran.
fn drain(
    source: &mut Source,
    sink: &mut Sink<'_>,
    leaving: bool,
    follow: impl FnOnce() -> Option<Cursor>,
    read: impl FnOnce(&mut Cursor, &mut Vec<Change>) -> bool,
    each: impl FnOnce(&mut dyn FnMut(u64, &BucketState)),
    keep: impl Fn(&Change) -> bool,
) -> (usize, bool) {
    if source.cursor.is_none() {
        source.cursor = follow();
        source.resync = true;
    }
    source.changes.clear();
    let mut lagged = false;
    if let Some(c) = source.cursor.as_mut()
        && !read(c, &mut source.changes)
    {
        source.resync = true;
        lagged = true;
    }
    let n = source.changes.len();
    let held = source.held;
    if source.resync && leaving {
        each(&mut |id, st| sink.put(held, id, st));
        source.resync = false;
        return (n, lagged);
    }
    let changes = &source.changes;
    for (i, ch) in changes.iter().enumerate() {
        if let Some(ahead) = changes.get(i + PREFETCH_AHEAD) {
            sink.prefetch(ahead.id);
        }
        if keep(ch) {
            if let Some(st) = &ch.state {
                sink.put(held, ch.id, st);
            }
        } else if (ch.state.is_some() || !leaving) && sink.may_be_stored(ch.id) {
            sink.delete(held, ch.id);
        }
    }
    source.changes.clear();
    (n, lagged)
}

/// The disk follower's counters as metrics (zero without `--data-dir`).
pub const METRICS: &[Family<DurableStats>] = &[
    Family::gauge(
        "persist_disk_bytes",
        "Size of the bucket files under --data-dir (the snapshot and the logs since), in bytes.",
        |s| load(&s.disk_bytes),
    ),
    Family::gauge(
        "persist_buckets",
        "Buckets kept in the bucket files under --data-dir: exact at a restore and at each snapshot, estimated in between (a bucket written again may count once more).",
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
        "persist_snapshots",
        "Snapshots written under --data-dir (each folds the log of commits before it).",
        |s| load(&s.snapshots),
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
