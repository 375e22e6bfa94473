//! ns per check on the store + algorithm path, side by side with governor's keyed limiter on
//! the same key stream (the engine's path on top of it is `ringlimit-node`'s `benches/engine.rs`,
//! on the same streams and loops: `benches/common`).
//!
//! Both limiters see the same precomputed pseudo-random sequence of 64-bit keys:
//! - `uniform_100k`: 100,000 keys drawn uniformly;
//! - `hot_skewed`: 90% of checks on 1,000 hot keys, 10% uniform over all 100,000;
//! - `uniform_1m`: 1,000,000 keys drawn uniformly (the store's bound: its tables at their
//!   largest).
//!
//! Keys are `splitmix64(i)` of a key index, i.e. well-spread 64-bit values like the node's xxh3
//! bucket identities (the store relies on that: it shards on the top bits and does not rehash).
//! governor gets the very same `u64`s and hashes them with its default hasher.
//!
//! The rule is a token bucket of 1,000,000 per second (burst 1,000,000), and governor's quota is
//! `Quota::per_second(1_000_000)`: every check in these runs is admitted by both (asserted at
//! setup), so both measure their admit path.
//!
//! Variants:
//! - `ringlimit_store/manual_now`: `Store::check(id, &rule, now, 1)` with `now` a local counter
//!   advanced by 100 ns per check (the cost of the store and the algorithm alone);
//! - `ringlimit_store/manual_now_followed`: the same on a store with a change feed and a
//!   follower subscribed, so that every admission appends its bucket's id to its shard's feed
//!   (the follower never reads: the write side's cost alone; the feed overwrites its oldest);
//! - `ringlimit_store/system_clock`: the same as `manual_now`, reading `SystemClock::now()` per
//!   check as the node does, through `Store::check_now` like `Engine::decide` (governor reads
//!   its own quanta clock per check, so this is the fair pairing);
//! - `governor_keyed/u64`: `DefaultKeyedRateLimiter<u64>::check_key(&key)`.
//!
//! The `two_threads` groups run the same loop on 2 threads at once (`std::thread::scope` inside
//! `iter_custom`, each thread starting at a different point of the key stream) and report wall
//! time divided by the total number of checks, i.e. the inverse of the aggregate throughput.
//! On a 2-core machine that is ~half the single-thread figure if nothing contends.
//! `two_threads/*/ringlimit_store/manual_now_unshared` gives each thread a store of its own:
//! nothing is shared, so it is the scaling ceiling of this machine for this access pattern, and
//! the gap to `manual_now` is what sharing one store costs (lock and cache-line traffic).
//!
//! The `clock` group prices one reading of each clock: `SystemClock::now()` (a quanta read)
//! and governor's default clock (quanta).

mod common;

use common::{KEYS, KEYS_1M, Limiter, MAX_KEYS, RATE, STEP_NS, THREADS, Workload, multi, single};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::limiter::Rule;
use ringlimit_core::store::{Cursor, Store};
use ringlimit_proto::Algorithm;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

/// Unread changes the followed store's feed keeps (the node's engine keeps as many).
const FEED_ENTRIES: usize = 64 * 1024;

fn rule() -> Rule {
    ringlimit_core::rule::validate(Algorithm::TokenBucket, u64::from(RATE), 1_000_000_000, None)
        .expect("valid bench rule")
}

fn governor_u64() -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).expect("non-zero")))
}

/// `Store::check` with a per-thread manual clock (advanced by the caller through `i`).
struct StoreManual {
    store: Store,
    rule: Rule,
    t0: u64,
}

impl Limiter for StoreManual {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        let now = self.t0 + i as u64 * STEP_NS;
        self.store.check(w.id(i), &self.rule, now, 1).allowed
    }
}

/// [`StoreManual`] on a store whose change feed has a follower (held here, never reading).
struct StoreFollowed {
    checks: StoreManual,
    /// Keeps the feed followed.
    _follower: Cursor,
}

impl Limiter for StoreFollowed {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, t: usize) -> bool {
        self.checks.check(w, i, t)
    }
}

/// `Store::check_now` reading the system clock per check, as the node does.
struct StoreSystem {
    store: Store,
    rule: Rule,
    clock: SystemClock,
}

impl Limiter for StoreSystem {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.store
            .check_now(w.id(i), &self.rule, || self.clock.now(), 1)
            .allowed
    }
}

/// Like [`StoreManual`], but each thread has a store of its own: nothing is shared, so its
/// two-thread figure is the machine's scaling ceiling for this access pattern.
struct StorePrivate([StoreManual; THREADS]);

impl Limiter for StorePrivate {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, t: usize) -> bool {
        self.0[t].check(w, i, t)
    }
}

struct GovernorU64(DefaultKeyedRateLimiter<u64>);

impl Limiter for GovernorU64 {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.0.check_key(&w.id(i)).is_ok()
    }
}

fn store_manual() -> StoreManual {
    StoreManual {
        store: Store::new(MAX_KEYS),
        rule: rule(),
        t0: SystemClock::new().now(),
    }
}

fn store_followed() -> StoreFollowed {
    let store = Store::with_feed(MAX_KEYS, FEED_ENTRIES);
    let cursor = store.follow().expect("a store with a feed");
    StoreFollowed {
        checks: StoreManual {
            store,
            rule: rule(),
            t0: SystemClock::new().now(),
        },
        _follower: cursor,
    }
}

fn store_system() -> StoreSystem {
    StoreSystem {
        store: Store::new(MAX_KEYS),
        rule: rule(),
        clock: SystemClock::new(),
    }
}

/// What one clock reading costs: the node's `SystemClock` (an `Instant` read, i.e. a vDSO
/// `clock_gettime`) against governor's default clock (quanta, a scaled TSC read).
fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    let system = SystemClock::new();
    group.bench_function("ringlimit_system_clock_now", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut acc = 0u64;
            for _ in 0..iters {
                acc = acc.wrapping_add(system.now());
            }
            black_box(acc);
            start.elapsed()
        })
    });
    let quanta = governor::clock::DefaultClock::default();
    group.bench_function("governor_default_clock_now", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(governor::clock::Clock::now(&quanta));
            }
            start.elapsed()
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    clocks(c);
    for w in [
        Workload::new("uniform_100k", false, KEYS),
        Workload::new("hot_skewed", true, KEYS),
        Workload::new("uniform_1m", false, KEYS_1M),
    ] {
        single(c, &w, "ringlimit_store/manual_now", &store_manual());
        single(
            c,
            &w,
            "ringlimit_store/manual_now_followed",
            &store_followed(),
        );
        single(c, &w, "ringlimit_store/system_clock", &store_system());
        single(c, &w, "governor_keyed/u64", &GovernorU64(governor_u64()));

        multi(c, &w, "ringlimit_store/manual_now", &store_manual());
        multi(
            c,
            &w,
            "ringlimit_store/manual_now_followed",
            &store_followed(),
        );
        multi(
            c,
            &w,
            "ringlimit_store/manual_now_unshared",
            &StorePrivate([store_manual(), store_manual()]),
        );
        multi(c, &w, "ringlimit_store/system_clock", &store_system());
        multi(c, &w, "governor_keyed/u64", &GovernorU64(governor_u64()));
    }
}

criterion_group! {
    name = store;
    config = common::config();
    targets = benches
}
criterion_main!(store);
