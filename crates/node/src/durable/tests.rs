//! The disk follower on a manual clock: what a flush writes and deletes, and what a restart
//! restores.

use super::disk::{Disk, Held};
use super::*;
use crate::rules::RuleSet;
use ringlimit_core::clock::ManualClock;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::rule::{PersistMode, validate};
use ringlimit_proto::Algorithm;

const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn bucket(i: u64) -> u64 {
    ringlimit_core::rule::bucket_id(7, &i.to_string())
}

struct Node {
    local: Arc<Local>,
    durable: Durable,
}

fn node(dir: &std::path::Path, clock: &ManualClock) -> Node {
    node_of(dir, clock, 1000)
}

/// A node whose store holds `max_keys`.
fn node_of(dir: &std::path::Path, clock: &ManualClock, max_keys: u64) -> Node {
    let local = Arc::new(
        Local::alone(RuleSet::default(), max_keys, Arc::new(clock.clone()))
            .with_persistence(60 * SEC),
    );
    let disk = Disk::open(dir, "c", "n1").expect("opens");
    let durable = Durable::new(disk, local.clone(), Arc::default());
    Node { local, durable }
}

fn fixed(limit: u64, period_s: u64) -> Rule {
    validate(Algorithm::FixedWindow, limit, period_s * SEC, None).expect("valid")
}

/// A check of bucket `i` (spread over the store's shards, as bucket ids are).
fn check(n: &Node, i: u64, rule: &Rule, persist: PersistMode) -> Decision {
    let id = bucket(i);
    let kind = n.local.kind(rule, persist);
    n.local
        .owned()
        .check(kind, id, rule, 1, || n.local.now(), || None)
}

#[test]
fn a_flush_writes_changed_durable_buckets_once_and_a_restart_restores_them() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(1, 86_400);
    let short = fixed(5, 1);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("empty"), 0);
    for id in 0..10 {
        let d = check(&n, id, &daily, PersistMode::Auto);
        assert!(d.allowed, "{id}: {d:?}");
        assert!(!check(&n, id, &daily, PersistMode::Auto).allowed);
        assert!(check(&n, 100 + id, &short, PersistMode::Auto).allowed);
    }
    assert!(check(&n, 200, &short, PersistMode::Always).allowed);
    assert!(check(&n, 300, &daily, PersistMode::Never).allowed);
    let f = n.durable.flush().expect("written");
    assert_eq!(
        (f.written, f.deleted),
        (11, 0),
        "10 daily buckets and one always"
    );
    assert_eq!(n.durable.flush().expect("nothing new"), Flushed::default());
    drop(n);

    clock.advance(3600 * SEC);
    let n = node(d.path(), &clock);
    assert_eq!(
        n.durable.restore().expect("restored"),
        10,
        "the 1 s bucket is over"
    );
    for id in 0..10 {
        assert!(
            !check(&n, id, &daily, PersistMode::Auto).allowed,
            "{id} still used up"
        );
    }
    assert!(
        check(&n, 300, &daily, PersistMode::Never).allowed,
        "never kept"
    );
}

#[test]
fn gone_reset_and_no_longer_durable_buckets_are_deleted_but_not_while_leaving() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(10, 86_400);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    for id in 0..4 {
        check(&n, id, &daily, PersistMode::Auto);
    }
    assert_eq!(n.durable.flush().expect("written").written, 4);
    n.local.reset(&[bucket(0)]);
    check(&n, 1, &daily, PersistMode::Never);
    assert_eq!(n.durable.flush().expect("deleted").deleted, 2);
    // Leaving: handed over (gone) buckets stay on disk.
    n.durable.leaving();
    assert_eq!(n.local.owned().hand_out(|id, _| id == bucket(2)).len(), 1);
    check(&n, 3, &daily, PersistMode::Auto);
    n.durable.flush_at_exit();
    drop(n);
    let n = node(d.path(), &clock);
    assert_eq!(
        n.durable.restore().expect("restored"),
        2,
        "2 (handed over) and 3"
    );
    assert_eq!(check(&n, 3, &daily, PersistMode::Auto).remaining, 7);
}

#[test]
fn states_that_stopped_mattering_are_swept() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let minute = fixed(10, 60);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    check(&n, 1, &minute, PersistMode::Auto);
    let f = n.durable.flush().expect("written");
    assert_eq!((f.written, f.compacting), (1, false));
    assert_eq!(n.durable.disk.len(Held::Owned), 1);
    clock.advance(2 * SWEEP_EVERY.as_nanos() as u64);
    check(&n, 2, &fixed(10, 86_400), PersistMode::Auto);
    let f = n.durable.flush().expect("swept");
    assert_eq!((f.written, f.compacting), (1, true), "1 stopped mattering");
    n.durable.settle();
    assert_eq!(n.durable.disk.len(Held::Owned), 1, "only 2 is left");
    assert_eq!(load(&n.durable.stats.snapshots), 1);
    // Nothing stopped mattering since: the next sweep has nothing to fold.
    clock.advance(SWEEP_EVERY.as_nanos() as u64);
    assert!(!n.durable.flush().expect("nothing").compacting);
}

#[test]
fn the_log_folds_into_a_snapshot_and_the_files_stay_bounded_through_churn() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(1_000_000, 86_400);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    const LIVE: u64 = 500;
    let mut most = 0;
    let mut compactions = 0;
    // The same 500 buckets changed again and again, and 50 new ones each interval that
    // are reset (deleted) the next.
    for round in 0..2_000u64 {
        for i in 0..LIVE {
            check(&n, i, &daily, PersistMode::Auto);
        }
        for i in 0..50 {
            check(&n, 1_000_000 + round * 50 + i, &daily, PersistMode::Auto);
        }
        if round > 0 {
            let gone: Vec<u64> = (0..50)
                .map(|i| bucket(1_000_000 + (round - 1) * 50 + i))
                .collect();
            n.local.reset(&gone);
        }
        clock.advance(100_000_000);
        let f = n.durable.flush().expect("written");
        if f.compacting {
            compactions += 1;
            n.durable.settle();
        }
        most = most.max(n.durable.disk.bytes());
    }
    // What is live: 550 buckets of ~40 bytes (~22 kB); the log is folded at LOG_FLOOR.
    assert!(compactions >= 5, "{compactions} compactions");
    assert!(
        most < 2 * LOG_FLOOR + (1 << 20),
        "the files reached {most} bytes"
    );
    n.durable.flush_at_exit();
    drop(n);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("restored"), LIVE + 50);
    assert!(n.durable.disk.bytes() < 2 * LOG_FLOOR + (1 << 20));
    assert_eq!(
        super::disk::log_files(d.path()),
        1,
        "the folded logs are gone"
    );
}

#[test]
fn a_restored_bucket_overlaps_what_a_peer_hands_back_never_adds() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(10, 86_400);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    for _ in 0..6 {
        check(&n, 1, &daily, PersistMode::Auto);
    }
    n.durable.flush().expect("written");
    let handed = n.local.owned().peek(bucket(1)).expect("held");
    drop(n);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("restored");
    // The peer that held it meanwhile hands the same history back.
    n.local.take_in(bucket(1), handed, n.local.now());
    assert_eq!(
        check(&n, 1, &daily, PersistMode::Auto).remaining,
        3,
        "6 + 1, not 13"
    );
}

#[test]
fn a_full_disk_is_reported_the_node_answers_from_memory_and_everything_is_written_once_it_frees() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(10, 86_400);
    let full = Arc::new(AtomicBool::new(false));
    let local = Arc::new(
        Local::alone(RuleSet::default(), 1000, Arc::new(clock.clone())).with_persistence(60 * SEC),
    );
    let stats = Arc::new(DurableStats::default());
    let disk = Disk::failing(d.path(), full.clone()).expect("opens");
    let durable = Durable::new(disk, local.clone(), stats.clone());
    let n = Node { local, durable };
    n.durable.restore().expect("empty");
    check(&n, 1, &daily, PersistMode::Auto);
    assert_eq!(n.durable.flush().expect("written").written, 1);

    full.store(true, Ordering::Relaxed);
    for i in 2..5 {
        assert!(
            check(&n, i, &daily, PersistMode::Auto).allowed,
            "answered from memory"
        );
    }
    let e = n.durable.flush().expect_err("the disk is full");
    assert!(e.to_string().contains("no space left"), "{e}");
    assert!(stats.failing.load(Ordering::Relaxed));
    assert_eq!(load(&stats.failures), 1);
    assert!(
        n.durable
            .error()
            .is_some_and(|e| e.contains("no space left"))
    );
    assert!(
        n.durable.flush().is_err(),
        "still full: the snapshot cannot start"
    );

    full.store(false, Ordering::Relaxed);
    check(&n, 5, &daily, PersistMode::Auto);
    let f = n.durable.flush().expect("the disk takes writes again");
    assert_eq!(f.written, 1, "what changed since");
    assert!(
        f.compacting,
        "every durable bucket again, the failed batch's included, in a snapshot"
    );
    assert!(!stats.failing.load(Ordering::Relaxed));
    assert_eq!(n.durable.error(), None);
    n.durable.settle();
    assert_eq!(
        n.durable.disk.load(Held::Owned, T0).expect("reads").0.len(),
        5
    );
}

#[test]
fn replica_copies_that_matter_past_the_min_period_are_kept_and_restored() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    let daily = BucketState::Fixed {
        end: T0 + 3600 * SEC,
        count: 9,
        period_tag: 0,
    };
    let short = BucketState::Gcra {
        tat: T0 + 5 * SEC,
        tag: 0,
    };
    n.local.copies().keep(bucket(1), Some(daily.clone()), T0);
    n.local.copies().keep(bucket(2), Some(short), T0);
    let f = n.durable.flush().expect("written");
    assert_eq!(f.written, 1, "only the copy that matters past a minute");
    assert_eq!(n.durable.disk.len(Held::Copies), 1);
    assert_eq!(n.durable.disk.len(Held::Owned), 0);
    // The owner says the bucket is gone: so is the stored copy.
    n.local.copies().keep(bucket(1), None, T0);
    assert_eq!(n.durable.flush().expect("deleted").deleted, 1);
    n.local.copies().keep(bucket(1), Some(daily.clone()), T0);
    n.durable.flush_at_exit();
    drop(n);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("restored"), 1);
    assert_eq!(n.local.copies().peek(bucket(1)), Some(daily));
}

#[test]
fn buckets_handed_over_while_leaving_are_kept_in_the_state_they_went_in() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(10, 86_400);
    let n = node(d.path(), &clock);
    n.durable.restore().expect("empty");
    check(&n, 1, &daily, PersistMode::Auto);
    n.durable.flush().expect("written");
    // Not leaving yet: nothing is written out of turn.
    assert_eq!(n.durable.keep_handed(&[]).expect("nothing"), 0);
    n.durable.leaving();
    // Used again since the last flush, then handed over before the next: the feed will show
    // it gone, not in this state.
    for _ in 0..4 {
        check(&n, 1, &daily, PersistMode::Auto);
    }
    let handed = n.local.owned().hand_out(|id, _| id == bucket(1));
    assert_eq!(n.durable.keep_handed(&handed).expect("written"), 1);
    n.durable.flush_at_exit();
    drop(n);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("restored"), 1);
    assert_eq!(
        check(&n, 1, &daily, PersistMode::Auto).remaining,
        4,
        "5 + 1 of 10"
    );
}

/// A flood of changes between two commits: once an interval has read many, the drains in
/// between keep the feed's bounded rings from overrunning, and the commit writes every change
/// (no snapshot of the whole store). Without them the same flood overruns the feed.
#[test]
fn a_busy_follower_drains_between_commits_and_the_feed_never_overruns() {
    use crate::local::owned::FEED_ENTRIES;
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let rule = fixed(1_000_000, 86_400);
    let n = node_of(d.path(), &clock, 4_000_000);
    n.durable.restore().expect("empty");
    let flood = |first: u64, drains: bool| {
        let chunk = FEED_ENTRIES as u64 / 4;
        for c in 0..12 {
            for i in first + c * chunk..first + (c + 1) * chunk {
                check(&n, i, &rule, PersistMode::Auto);
            }
            if drains {
                n.durable.drain().expect("drained");
            }
        }
        12 * chunk
    };
    // Not busy yet: a drain between commits does nothing.
    check(&n, 0, &rule, PersistMode::Auto);
    n.durable.drain().expect("a no-op");
    assert!(n.durable.following.lock().pending.is_empty());
    let f = n.durable.flush().expect("written");
    assert_eq!(f.written, 1);
    // Three times the feed in one interval, no drains: it overruns, the store is written whole.
    let changed = flood(1, false);
    let f = n.durable.flush().expect("written");
    assert!(f.compacting, "{f:?}");
    n.durable.settle();
    // Busy now: drained in between, every change is in the commit and nothing overran.
    let f = n.durable.flush().expect("nothing new");
    assert!(!f.compacting, "{f:?}");
    let first = 1 + changed;
    let changed = flood(first, true);
    let f = n.durable.flush().expect("written");
    assert_eq!(f.written as u64, changed, "{f:?}");
    assert!(!f.compacting, "no overrun: {f:?}");
    // Quiet again: after QUIET_COMMITS intervals, no drains in between.
    for quiet in 1..=QUIET_COMMITS {
        assert!(n.durable.following.lock().busy, "{quiet}");
        assert_eq!(n.durable.flush().expect("nothing new"), Flushed::default());
    }
    assert!(!n.durable.following.lock().busy);
}

/// A reservation taken before a restart is settled after it: its unused estimate given back
/// to the restored bucket, as if the node had never stopped. One taken after the last write
/// and lost (a SIGKILL) is settled as unknown, its estimate still taken.
#[test]
fn reservations_outlive_a_restart_and_their_settles_give_back() {
    use ringlimit_core::check::Resolved;
    use ringlimit_proto::check::InlineRule;
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = Resolved::inline(&InlineRule {
        limit: 100,
        period_ms: 86_400_000,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        calendar: None,
    })
    .expect("valid");
    let id = bucket(1);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("empty"), 0);
    let now = n.local.now();
    let a = n
        .local
        .reserve(&daily, id, (60, 600_000, 1), now)
        .expect("kept");
    assert_eq!(a.remaining, 40);
    n.durable.flush_at_exit();
    drop(n);

    clock.advance(10 * SEC);
    let n = node(d.path(), &clock);
    assert_eq!(n.durable.restore().expect("restored"), 1);
    assert_eq!(n.local.reservations().table().len(), 1);
    let now = n.local.now();
    let after = n.local.settle(&daily, id, (1, 10), now).expect("known");
    assert_eq!(after.remaining, 90, "50 of the 60 given back");
    // Taken, written within RESERVATIONS_EVERY of the last write? Not yet: lost to a kill.
    n.local
        .reserve(&daily, id, (30, 600_000, 2), now)
        .expect("kept");
    n.durable.flush().expect("written");
    clock.advance(RESERVATIONS_EVERY.as_nanos() as u64);
    n.local
        .reserve(&daily, id, (20, 600_000, 3), n.local.now())
        .expect("kept");
    n.durable.flush().expect("written, reservations too");
    n.local
        .reserve(&daily, id, (5, 600_000, 4), n.local.now())
        .expect("kept");
    n.durable
        .flush()
        .expect("written; reservations not yet due");
    drop(n);

    let n = node(d.path(), &clock);
    n.durable.restore().expect("restored");
    let now = n.local.now();
    assert_eq!(n.local.reservations().table().len(), 2, "2 and 3, not 4");
    let r = n.local.settle(&daily, id, (4, 0), now);
    assert!(r.is_err(), "4 was never written: {r:?}");
    let after = n.local.settle(&daily, id, (3, 0), now).expect("known");
    assert_eq!(
        after.remaining,
        90 - 30 - 5,
        "3's 20 back; 2's and 4's estimates taken"
    );
}

/// What the disk follower costs per changed bucket: the drain of the feed and the commit of
/// one interval, timed alone (no checks, no HTTP), on a file that already holds `STORED`
/// buckets. Steady on a busy machine, unlike the node's CPU under load. Run in release, alone
/// (the figure with the snapshots counts every thread of the process):
/// `cargo test -p ringlimit-node --release --lib -- --ignored --nocapture flush_cost`
#[test]
#[ignore = "a measurement: run by hand, in release"]
fn flush_cost_per_changed_bucket() {
    const STORED: u64 = 200_000;
    const CHANGED: u64 = 10_000;
    const ROUNDS: u64 = 30;
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let rule = fixed(1_000_000, 86_400);
    let n = node_of(d.path(), &clock, 2_000_000);
    n.durable.restore().expect("empty");
    for i in 0..STORED {
        check(&n, i, &rule, PersistMode::Auto);
        if i % CHANGED == 0 {
            n.durable.flush().expect("written");
        }
    }
    n.durable.flush().expect("written");
    n.durable.settle();
    let mut report = Vec::new();
    for (what, fresh) in [("the same buckets again", false), ("new buckets", true)] {
        let mut spent = Duration::ZERO;
        let mut on_cpu = 0;
        let (mut with_snapshots, mut snapshots) = (0, 0);
        for round in 0..ROUNDS {
            let first = if fresh { STORED + round * CHANGED } else { 0 };
            for i in first..first + CHANGED {
                // Spread over the stored ids, as distinct keys are.
                let i = if fresh {
                    i
                } else {
                    (i * 7_919 + round) % STORED
                };
                check(&n, i, &rule, PersistMode::Auto);
            }
            clock.advance(100_000_000);
            let (started, cpu, all) = (Instant::now(), thread_cpu_ns(), process_cpu_ns());
            let f = n.durable.flush().expect("written");
            spent += started.elapsed();
            on_cpu += thread_cpu_ns() - cpu;
            if f.compacting {
                // Its snapshot, on a thread of its own, counted in the process's CPU.
                n.durable.settle();
                snapshots += 1;
            }
            with_snapshots += process_cpu_ns() - all;
            assert!(f.written as u64 >= CHANGED - CHANGED / 100, "{f:?}");
        }
        let per = spent.as_nanos() as f64 / (ROUNDS * CHANGED) as f64;
        let cpu = on_cpu as f64 / (ROUNDS * CHANGED) as f64;
        let all = with_snapshots as f64 / (ROUNDS * CHANGED) as f64;
        report.push(format!(
            "{what}: {cpu:.0} ns of CPU ({per:.0} ns of wall time) per changed bucket, \
             {all:.0} ns with the {snapshots} snapshots (process CPU, 10 ms ticks) \
             ({CHANGED} a flush, {ROUNDS} flushes, {STORED}+ stored; files {} bytes)",
            n.durable.disk.bytes()
        ));
    }
    for line in report {
        println!("flush cost: {line}");
    }
}

/// How long a restart's restore of `BUCKETS` durable buckets takes, in process: the bucket
/// files opened and read, every state merged into the store. Run in release:
/// `cargo test -p ringlimit-node --release --lib -- --ignored --nocapture restore_cost`
#[test]
#[ignore = "a measurement: run by hand, in release"]
fn restore_cost() {
    const BUCKETS: u64 = 1_000_000;
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let rule = fixed(1_000_000, 86_400);
    let node = |clock: &ManualClock| {
        let local = Arc::new(
            Local::alone(RuleSet::default(), 2 * BUCKETS, Arc::new(clock.clone()))
                .with_persistence(60 * SEC),
        );
        let started = Instant::now();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let durable = Durable::new(disk, local.clone(), Arc::default());
        (Node { local, durable }, started)
    };
    let (n, _) = node(&clock);
    n.durable.restore().expect("empty");
    for i in 0..BUCKETS {
        check(&n, i, &rule, PersistMode::Auto);
        if i % 100_000 == 0 {
            n.durable.flush().expect("written");
        }
    }
    n.durable.flush_at_exit();
    n.durable.settle();
    let bytes = n.durable.disk.bytes();
    drop(n);
    clock.advance(3600 * SEC);
    let (n, started) = node(&clock);
    let restored = n.durable.restore().expect("restored");
    let took = started.elapsed();
    assert_eq!(restored, BUCKETS);
    println!(
        "restore cost: {restored} buckets in {:.3} s (files {bytes} bytes, {} bytes per bucket)",
        took.as_secs_f64(),
        bytes / BUCKETS
    );
}

/// What a snapshot costs per bucket: the store walked, copied shard by shard, encoded and
/// written, on this thread (the follower runs it on one of its own). Run in release, alone:
/// `cargo test -p ringlimit-node --release --lib -- --ignored --nocapture snapshot_cost`
#[test]
#[ignore = "a measurement: run by hand, in release"]
fn snapshot_cost() {
    const BUCKETS: u64 = 1_000_000;
    const ROUNDS: u32 = 5;
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let rule = fixed(1_000_000, 86_400);
    let n = node_of(d.path(), &clock, 2 * BUCKETS);
    n.durable.restore().expect("empty");
    for i in 0..BUCKETS {
        check(&n, i, &rule, PersistMode::Auto);
    }
    let mut per = Vec::new();
    for _ in 0..ROUNDS {
        let job = n.durable.disk.rotate().expect("rotates");
        let maybe = n.durable.following.lock().maybe.empty_like();
        let (started, cpu) = (Instant::now(), thread_cpu_ns());
        let (done, _) = snapshot(job, &n.local, maybe).expect("written");
        let (wall, cpu) = (started.elapsed(), thread_cpu_ns() - cpu);
        n.durable.disk.snapshot_written(&done);
        assert_eq!(done.count, BUCKETS);
        per.push((
            cpu as f64 / BUCKETS as f64,
            wall.as_nanos() as f64 / BUCKETS as f64,
        ));
    }
    per.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (cpu, wall) = per[per.len() / 2];
    println!(
        "snapshot cost: {cpu:.0} ns of CPU ({wall:.0} ns of wall time) per bucket, median of \
         {ROUNDS} snapshots of {BUCKETS} buckets ({} bytes)",
        n.durable.disk.bytes()
    );
}

/// This thread's time on a CPU so far, in ns (Linux's schedstat; 0 elsewhere).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's time on a CPU so far, in ns, every thread's (Linux's `/proc/self/stat`, in
/// clock ticks of 10 ms; 0 elsewhere).
fn process_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // After the command's name (in parentheses): state, then utime and stime are the
            // 12th and 13th fields.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks * 10_000_000)
        })
        .unwrap_or(0)
}

/// After the last flush at exit the file is closed, even while something of the stopped node
/// still holds the follower: the node's next life (in the same process, as tests run nodes)
/// opens it, and the old follower writes nothing more.
#[test]
fn the_file_is_closed_after_the_last_flush_and_opens_for_the_next_life() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let daily = fixed(1, 86_400);
    let old = node(d.path(), &clock);
    assert_eq!(old.durable.restore().expect("empty"), 0);
    assert!(check(&old, 1, &daily, PersistMode::Auto).allowed);
    old.durable.flush_at_exit();
    // Still alive, still changing buckets: nothing reaches the disk any more.
    assert!(check(&old, 2, &daily, PersistMode::Auto).allowed);
    assert_eq!(old.durable.flush().expect("a no-op"), Flushed::default());
    let next = node(d.path(), &clock);
    assert_eq!(next.durable.restore().expect("restores"), 1);
    drop(old);
}

#[tokio::test]
async fn the_follower_commits_on_its_thread_and_stops_with_its_task() {
    let d = tempfile::tempdir().expect("a temp dir");
    let clock = ManualClock::new(T0);
    let Node { local, durable } = node(d.path(), &clock);
    assert_eq!(durable.restore().expect("empty"), 0);
    let durable = Arc::new(durable);
    let task = tokio::spawn(durable.clone().run(Duration::from_millis(1)));
    let daily = fixed(1, 86_400);
    let kind = local.kind(&daily, PersistMode::Auto);
    let d1 = local
        .owned()
        .check(kind, bucket(1), &daily, 1, || local.now(), || None);
    assert!(d1.allowed);
    // Bounded waits on the thread's own clock (its interval is real time).
    let waited = std::time::Instant::now();
    while durable.stats.written.load(Ordering::Relaxed) == 0 {
        assert!(waited.elapsed() < Duration::from_secs(10), "committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    let _ = task.await;
    // The thread holds the follower until it is told to stop.
    while Arc::strong_count(&durable) > 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the thread stopped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
