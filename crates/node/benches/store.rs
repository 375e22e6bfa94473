//! ns per check on the store + algorithm path, side by side with governor's keyed limiter on
//! the same key stream.
//!
//! Both limiters see the same precomputed pseudo-random sequence of 64-bit keys:
//! - `uniform_100k`: 100,000 keys drawn uniformly;
//! - `hot_skewed`: 90% of checks on 1,000 hot keys, 10% uniform over all 100,000;
//! - `uniform_1m`: 1,000,000 keys drawn uniformly (the store's bound: its tables at their
//!   largest; store and governor variants on `u64` keys only).
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
//! - `ringlimit_store/system_clock`: the same, reading `SystemClock::now()` per check as the node
//!   does, through `Store::check_now` like `Engine::decide` (governor reads its own quanta clock
//!   per check, so this is the fair pairing);
//! - `governor_keyed/u64`: `DefaultKeyedRateLimiter<u64>::check_key(&key)`;
//! - `ringlimit_engine/named` and `/inline`: `Engine::check(key, RuleSpec, 1)` on string keys:
//!   key validation, rule resolution (an `ArcSwap` load and a map lookup, or inline validation
//!   and seeding), xxh3 of the key, the store, and phrasing the answer; SystemClock;
//! - `governor_keyed/string`: governor keyed on the same strings (`DefaultKeyedRateLimiter<String>`),
//!   the pairing for the engine variants.
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

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::limiter::Rule;
use ringlimit_core::store::Store;
use ringlimit_node::engine::{Engine, RuleSpec};
use ringlimit_node::rules::RuleSet;
use ringlimit_proto::{Algorithm, InlineRule};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Distinct keys in each distribution.
const KEYS: usize = 100_000;
/// Distinct keys of the `uniform_1m` distribution.
const KEYS_1M: usize = 1_000_000;
/// Hot keys of the skewed distribution, and the share of checks they get.
const HOT_KEYS: usize = 1_000;
const HOT_SHARE_PERMILLE: u64 = 900;
/// Length of the precomputed key stream (a power of two, so the index is a mask).
const STREAM: usize = 1 << 20;
const MASK: usize = STREAM - 1;
/// Rate of the rule and of governor's quota.
const RATE: u32 = 1_000_000;
/// What the manual clock advances per check.
const STEP_NS: u64 = 100;
/// Bucket bound of the store: well above the keys, so nothing is evicted.
const MAX_KEYS: u64 = 1_000_000;
const THREADS: usize = 2;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A key stream: key indices in `0..KEYS`, as 64-bit ids and as strings.
struct Workload {
    name: &'static str,
    /// Index into `strings` per position of the stream.
    idx: Vec<u32>,
    /// The 64-bit key per position of the stream (`splitmix64` of the index).
    ids: Vec<u64>,
    /// The string key per key index.
    strings: Vec<String>,
}

impl Workload {
    fn new(name: &'static str, skewed: bool, keys: usize) -> Self {
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state.wrapping_add(1);
            splitmix64(state ^ 0xdead_beef)
        };
        let idx: Vec<u32> = (0..STREAM)
            .map(|_| {
                let r = next();
                let k = if skewed && r % 1000 < HOT_SHARE_PERMILLE {
                    (r >> 32) % HOT_KEYS as u64
                } else {
                    (r >> 32) % keys as u64
                };
                k as u32
            })
            .collect();
        let ids = idx.iter().map(|&k| splitmix64(u64::from(k))).collect();
        let strings = (0..keys).map(|k| format!("user:{k:08}")).collect();
        Self {
            name,
            idx,
            ids,
            strings,
        }
    }

    #[inline(always)]
    fn id(&self, i: usize) -> u64 {
        // The mask keeps the index in bounds, so the bounds check is elided.
        self.ids[i & MASK]
    }

    #[inline(always)]
    fn string(&self, i: usize) -> &String {
        &self.strings[self.idx[i & MASK] as usize]
    }
}

fn rule() -> Rule {
    ringlimit_core::rule::validate(Algorithm::TokenBucket, u64::from(RATE), 1_000_000_000, None)
        .expect("valid bench rule")
}

fn inline_rule() -> InlineRule {
    InlineRule {
        limit: u64::from(RATE),
        period_ms: 1_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
    }
}

fn engine() -> Engine {
    let rules = RuleSet::from_yaml(&format!(
        "rules:\n  - name: bench\n    limit: {RATE}\n    period: 1s\n"
    ))
    .expect("valid bench rules");
    Engine::new(rules, MAX_KEYS, Arc::new(SystemClock::new()))
}

fn governor_u64() -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).expect("non-zero")))
}

fn governor_string() -> DefaultKeyedRateLimiter<String> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).expect("non-zero")))
}

/// One implementation under test: a check of the stream's `i`-th key by thread `t`.
trait Limiter: Sync {
    fn check(&self, w: &Workload, i: usize, t: usize) -> bool;
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

struct GovernorString(DefaultKeyedRateLimiter<String>);

impl Limiter for GovernorString {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.0.check_key(w.string(i)).is_ok()
    }
}

struct EngineNamed(Engine);

impl Limiter for EngineNamed {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.0
            .check(w.string(i), RuleSpec::Named("bench"), 1)
            .map(|a| a.allowed)
            .unwrap_or(false)
    }
}

struct EngineInline(Engine, InlineRule);

impl Limiter for EngineInline {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.0
            .check(w.string(i), RuleSpec::Inline(self.1), 1)
            .map(|a| a.allowed)
            .unwrap_or(false)
    }
}

/// Runs `n` checks starting at stream position `start`; returns how many were admitted.
#[inline(never)]
fn run<L: Limiter>(l: &L, w: &Workload, start: usize, n: u64, t: usize) -> u64 {
    let mut admitted = 0u64;
    for k in 0..n as usize {
        admitted += u64::from(l.check(w, start.wrapping_add(k), t));
    }
    black_box(admitted)
}

/// Fills every bucket once and checks that the admit path is what is being measured.
fn warm<L: Limiter>(l: &L, w: &Workload, what: &str, threads: usize) {
    let n = (2 * STREAM) as u64;
    for t in 0..threads {
        let admitted = run(l, w, 0, n, t);
        assert!(
            admitted * 1000 >= n * 999,
            "{what} on {}: only {admitted} of {n} admitted",
            w.name
        );
    }
}

fn single<L: Limiter>(c: &mut Criterion, w: &Workload, name: &str, l: &L) {
    let mut group = c.benchmark_group(format!("single_thread/{}", w.name));
    // The manual clock must not go backwards between samples: keep the stream position.
    let mut pos = 2 * STREAM;
    let mut warmed = false;
    group.bench_function(name, |b| {
        // Here rather than before, so that benchmarks filtered out cost nothing.
        if !std::mem::replace(&mut warmed, true) {
            warm(l, w, name, 1);
        }
        b.iter_custom(|iters| {
            let start = Instant::now();
            run(l, w, pos, iters, 0);
            let elapsed = start.elapsed();
            pos = pos.wrapping_add(iters as usize);
            elapsed
        })
    });
    group.finish();
}

fn multi<L: Limiter>(c: &mut Criterion, w: &Workload, name: &str, l: &L) {
    let mut group = c.benchmark_group(format!("two_threads/{}", w.name));
    let mut pos = 2 * STREAM;
    let mut warmed = false;
    group.bench_function(name, |b| {
        if !std::mem::replace(&mut warmed, true) {
            warm(l, w, name, THREADS);
        }
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    // Threads start a quarter of the stream apart so they hit different keys.
                    let from = pos.wrapping_add(t * (STREAM / 4));
                    s.spawn(move || run(l, w, from, iters, t));
                }
            });
            let elapsed = start.elapsed();
            pos = pos.wrapping_add(iters as usize);
            // Time per check: wall time over all threads' checks.
            elapsed / THREADS as u32
        })
    });
    group.finish();
}

fn store_manual() -> StoreManual {
    StoreManual {
        store: Store::new(MAX_KEYS),
        rule: rule(),
        t0: SystemClock::new().now(),
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
        single(c, &w, "ringlimit_store/system_clock", &store_system());
        single(c, &w, "governor_keyed/u64", &GovernorU64(governor_u64()));
        if w.name == "uniform_100k" {
            single(c, &w, "ringlimit_engine/named", &EngineNamed(engine()));
            single(
                c,
                &w,
                "ringlimit_engine/inline",
                &EngineInline(engine(), inline_rule()),
            );
            single(
                c,
                &w,
                "governor_keyed/string",
                &GovernorString(governor_string()),
            );
        }

        multi(c, &w, "ringlimit_store/manual_now", &store_manual());
        multi(
            c,
            &w,
            "ringlimit_store/manual_now_unshared",
            &StorePrivate([store_manual(), store_manual()]),
        );
        multi(c, &w, "ringlimit_store/system_clock", &store_system());
        multi(c, &w, "governor_keyed/u64", &GovernorU64(governor_u64()));
        if w.name == "uniform_100k" {
            multi(c, &w, "ringlimit_engine/named", &EngineNamed(engine()));
            multi(
                c,
                &w,
                "governor_keyed/string",
                &GovernorString(governor_string()),
            );
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .noise_threshold(0.05)
}

criterion_group! {
    name = store;
    config = config();
    targets = benches
}
criterion_main!(store);
