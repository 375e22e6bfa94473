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
//! - `layout`: the store's shards, slots and their load with a million buckets, i.e. the
//!   table bytes per bucket that the RSS figures should come close to.
//!
//! The `live` phases also print the peak RSS (VmHWM) above the baseline: tables double as
//! buckets arrive, so for a moment a shard holds its old table and its new one.

use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::limiter::{BucketState, Rule};
use ringlimit_core::store::Store;
use ringlimit_proto::Algorithm;
use std::process::Command;
use std::sync::atomic::Ordering;

#[path = "common/counting.rs"]
mod counting;
use counting::heap;

const MAX_KEYS: u64 = 1_000_000;
const BUCKETS: u64 = 1_000_000;

/// Resident set size in bytes.
fn rss() -> u64 {
    status_bytes("VmRSS:")
}

/// A size line of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a size line of /proc/self/status");
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
    ringlimit_core::rule::validate(algorithm, 100, 60_000_000_000, None).expect("valid rule")
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
    let (rss1, heap1, peak) = (rss(), heap(), status_bytes("VmHWM:"));
    let n = store.len() as u64;
    let d = rss1.saturating_sub(rss0);
    let h = heap1.saturating_sub(heap0) as u64;
    let p = peak.saturating_sub(rss0);
    println!(
        "[{algorithm}] buckets={n} rss_delta_bytes={d} bytes_per_bucket={:.1} \
         peak_rss_delta_bytes={p} peak_bytes_per_bucket={:.1} \
         heap_delta_bytes={h} heap_bytes_per_bucket={:.1} inserted={BUCKETS} denied={denied} \
         evictions={} size_of::<BucketState>={}",
        d as f64 / n as f64,
        p as f64 / n as f64,
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

/// Where the bytes of a full million-key store go: slots allocated against buckets held.
fn layout() {
    let rule = rule(Algorithm::TokenBucket);
    let store = Store::new(MAX_KEYS);
    let now = SystemClock::new().now();
    for i in 0..BUCKETS {
        store.check(id(i), &rule, now, 1);
    }
    let (n, slots) = (store.len(), store.slots());
    let bytes = slots * Store::SLOT_BYTES;
    println!(
        "[layout] shards={} slot_bytes={} buckets={n} slots={slots} load={:.3} \
         table_bytes={bytes} table_bytes_per_bucket={:.1} (plus 1 referenced bit per slot)",
        store.shard_count(),
        Store::SLOT_BYTES,
        n as f64 / slots as f64,
        bytes as f64 / n as f64,
    );
}

fn run_phase(phase: &str) {
    match phase {
        "token_bucket" => live(Algorithm::TokenBucket),
        "fixed_window" => live(Algorithm::FixedWindow),
        "sliding_window" => live(Algorithm::SlidingWindow),
        "flood" => flood(),
        "layout" => layout(),
        other => {
            eprintln!("unknown phase {other:?}");
            std::process::exit(2);
        }
    }
}

const PHASES: [&str; 5] = [
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "flood",
    "layout",
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
