//! Memory per live bucket in the store, and that a flood of distinct keys keeps memory flat.
//!
//! ```text
//! cargo run --release -p ringlimit-node --example bytes_per_key            # every phase
//! cargo run --release -p ringlimit-node --example bytes_per_key -- flood   # one phase
//! ```
//!
//! Each phase runs in a child process of its own so that its resident-set baseline is not
//! polluted by what an earlier phase freed. For each phase it prints the resident memory
//! (VmRSS from /proc/self/status) before and after, and the heap bytes the program holds (from a
//! counting global allocator), so slack in the allocator can be told from bytes actually asked for.
//!
//! Phases:
//! - `token_bucket`, `fixed_window`, `sliding_window`: `Store::new(1_000_000)`, then 1,000,000
//!   distinct ids each checked once (admitted, so each creates a bucket);
//! - `flood`: 5,000,000 distinct ids into a 1,000,000-key store, RSS after 1M, 3M and 5M, with the
//!   store's eviction counters;
//! - `layout`: the sizes quick_cache 0.7's slab entry is made of (mirrored types) and the
//!   `memory_used()` of a replica of the store's shards, as built today and pre-sized with
//!   `reserve`, to show where the bytes go.

use quick_cache::unsync::{Cache, DefaultLifecycle};
use quick_cache::{OptionsBuilder, UnitWeighter};
use ringlimit_node::clock::{Clock, SystemClock};
use ringlimit_node::limiter::{BucketState, Rule};
use ringlimit_node::rules;
use ringlimit_node::store::Store;
use ringlimit_proto::Algorithm;
use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes currently allocated.
struct Counting;

static HEAP: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to `System`, only counting sizes on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(new_size, Ordering::Relaxed);
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MAX_KEYS: u64 = 1_000_000;
const BUCKETS: u64 = 1_000_000;
/// Store shards for a million keys, and what each holds (see `Store::new`).
const SHARDS: usize = 64;
const PER_SHARD: u64 = MAX_KEYS / SHARDS as u64;

fn heap() -> usize {
    HEAP.load(Ordering::Relaxed)
}

/// Resident set size in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// Distinct, well-spread 64-bit ids, like the node's xxh3 bucket identities.
fn id(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rule(algorithm: Algorithm) -> Rule {
    rules::validate(algorithm, 100, 60_000_000_000, None).expect("valid rule")
}

/// One algorithm: a million buckets in a million-key store.
fn live(algorithm: Algorithm) {
    let rule = rule(algorithm);
    let clock = SystemClock::new();
    let store = Store::new(MAX_KEYS);
    let (rss0, heap0) = (rss(), heap());
    let mut denied = 0u64;
    let now = clock.now();
    for i in 0..BUCKETS {
        denied += u64::from(!store.check(id(i), &rule, now, 1).allowed);
    }
    let (rss1, heap1) = (rss(), heap());
    let n = store.len() as u64;
    let d = rss1.saturating_sub(rss0);
    let h = heap1.saturating_sub(heap0) as u64;
    println!(
        "[{algorithm}] buckets={n} rss_delta_bytes={d} bytes_per_bucket={:.1} \
         heap_delta_bytes={h} heap_bytes_per_bucket={:.1} inserted={BUCKETS} denied={denied} \
         evictions={} size_of::<BucketState>={}",
        d as f64 / n as f64,
        h as f64 / n as f64,
        store.stats().evictions.load(Ordering::Relaxed),
        std::mem::size_of::<BucketState>(),
    );
    drop(store);
}

/// Five million distinct ids into a million-key store.
fn flood() {
    let rule = rule(Algorithm::TokenBucket);
    let clock = SystemClock::new();
    let store = Store::new(MAX_KEYS);
    let rss0 = rss();
    println!("[flood] store=Store::new({MAX_KEYS}) rule=token_bucket 100/1m rss_before={rss0}");
    // A flood of 1M new ids per second: `now` moves 1 µs per check.
    let t0 = clock.now();
    for i in 0..5_000_000u64 {
        store.check(id(i), &rule, t0 + i * 1_000, 1);
        let done = i + 1;
        if matches!(done, 1_000_000 | 3_000_000 | 5_000_000) {
            let r = rss();
            println!(
                "[flood] inserted={done} buckets={} rss_bytes={r} rss_delta_bytes={} \
                 heap_bytes={} evictions={} evictions_limiting={}",
                store.len(),
                r.saturating_sub(rss0),
                heap(),
                store.stats().evictions.load(Ordering::Relaxed),
                store.stats().evictions_limiting.load(Ordering::Relaxed),
            );
        }
    }
}

/// quick_cache 0.7's private per-entry types, mirrored to print their sizes.
#[allow(dead_code)]
mod mirror {
    use ringlimit_node::limiter::BucketState;
    use std::num::NonZeroU32;
    use std::sync::atomic::AtomicU16;

    pub enum ResidentState {
        Hot,
        Cold,
    }
    /// `shard::Resident<u64, BucketState>`.
    pub struct Resident<V> {
        key: u64,
        value: V,
        state: ResidentState,
        referenced: AtomicU16,
    }
    /// `unsync::SharedPlaceholder`.
    pub struct SharedPlaceholder {
        hash: u64,
        idx: NonZeroU32,
    }
    pub struct Placeholder {
        key: u64,
        hot: ResidentState,
        shared: SharedPlaceholder,
    }
    /// `shard::Entry<u64, BucketState, SharedPlaceholder>`.
    pub enum Entry<V> {
        Resident(Resident<V>),
        Placeholder(Placeholder),
        Ghost(u64),
    }
    /// `linked_slab::Entry<shard::Entry<..>>`: one slab slot per live bucket.
    pub struct SlabEntry<V> {
        item: Option<Entry<V>>,
        next: NonZeroU32,
        prev: NonZeroU32,
    }
    pub type Sizes = (usize, usize, usize, usize);
    pub fn sizes<V>() -> Sizes {
        (
            size_of::<V>(),
            size_of::<Resident<V>>(),
            size_of::<Entry<V>>(),
            size_of::<SlabEntry<V>>(),
        )
    }
    pub fn current() -> Sizes {
        sizes::<BucketState>()
    }
}

type Shard<V> =
    Cache<u64, V, UnitWeighter, nohash_hasher::BuildNoHashHasher<u64>, DefaultLifecycle<u64, V>>;

/// The store's shards rebuilt from quick_cache directly (same options, same routing), filled
/// with the same million ids; `reserve` pre-sizes each shard as `Store::new` could.
fn replica<V: Clone>(label: &str, value: V, reserve: bool) {
    let (rss0, heap0) = (rss(), heap());
    let mut shards: Vec<Shard<V>> = (0..SHARDS)
        .map(|_| {
            let opts = OptionsBuilder::new()
                .estimated_items_capacity(PER_SHARD as usize)
                .weight_capacity(PER_SHARD)
                .ghost_allocation(0.0)
                .build()
                .expect("valid options");
            let mut c = Shard::with_options(
                opts,
                UnitWeighter,
                nohash_hasher::BuildNoHashHasher::default(),
                DefaultLifecycle::default(),
            );
            if reserve {
                c.reserve(PER_SHARD as usize);
            }
            c
        })
        .collect();
    let shift = 64 - SHARDS.trailing_zeros();
    for i in 0..BUCKETS {
        let k = id(i);
        shards[(k >> shift) as usize].insert(k, value.clone());
    }
    let (rss1, heap1) = (rss(), heap());
    let n: usize = shards.iter().map(|s| s.len()).sum();
    let slab: usize = shards.iter().map(|s| s.memory_used().entries).sum();
    let map: usize = shards.iter().map(|s| s.memory_used().map).sum();
    let d = rss1.saturating_sub(rss0);
    let h = heap1.saturating_sub(heap0);
    println!(
        "[layout] {label}: buckets={n} rss_delta_bytes={d} bytes_per_bucket={:.1} \
         heap_delta_bytes={h} heap_bytes_per_bucket={:.1} \
         slab_used_per_bucket={:.1} map_alloc_per_bucket={:.1}",
        d as f64 / n as f64,
        h as f64 / n as f64,
        slab as f64 / n as f64,
        map as f64 / n as f64,
    );
}

fn layout() {
    let (v, r, e, s) = mirror::current();
    println!(
        "[layout] size_of BucketState={v} Resident<u64,BucketState>={r} \
         shard::Entry={e} linked_slab::Entry={s} hashbrown slot=4+1 ctrl"
    );
    let (v, r, e, s) = mirror::sizes::<[u64; 2]>();
    println!(
        "[layout] with a 16-byte state: size_of state={v} Resident={r} shard::Entry={e} \
         linked_slab::Entry={s}"
    );
    let per_shard = PER_SHARD as usize;
    let buckets = (per_shard * 8 / 7 + 1).next_power_of_two();
    println!(
        "[layout] hashbrown table for {per_shard} items: {buckets} buckets x 5 B = {} B/shard \
         = {:.1} B/bucket at {per_shard} per shard",
        buckets * 5,
        (buckets * 5) as f64 / per_shard as f64
    );
}

fn run_phase(phase: &str) {
    match phase {
        "token_bucket" => live(Algorithm::TokenBucket),
        "fixed_window" => live(Algorithm::FixedWindow),
        "sliding_window" => live(Algorithm::SlidingWindow),
        "flood" => flood(),
        "layout" => layout(),
        "replica" => replica(
            "replica as built (no reserve)",
            BucketState::Gcra { tat: 1 },
            false,
        ),
        "replica_reserved" => replica(
            "replica reserve(per_shard)",
            BucketState::Gcra { tat: 1 },
            true,
        ),
        "replica_16b" => replica("replica 16-byte state, no reserve", [1u64; 2], false),
        "replica_16b_reserved" => {
            replica("replica 16-byte state, reserve(per_shard)", [1u64; 2], true)
        }
        other => {
            eprintln!("unknown phase {other:?}");
            std::process::exit(2);
        }
    }
}

const PHASES: [&str; 9] = [
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "flood",
    "layout",
    "replica",
    "replica_reserved",
    "replica_16b",
    "replica_16b_reserved",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.is_empty() {
        for phase in &args {
            run_phase(phase);
        }
        return;
    }
    let exe = std::env::current_exe().expect("own executable");
    for phase in PHASES {
        let status = Command::new(&exe)
            .arg(phase)
            .status()
            .expect("run a phase in a child process");
        assert!(status.success(), "phase {phase} failed: {status}");
    }
}
