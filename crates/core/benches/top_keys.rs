//! ns per counted check of `ringlimit_core::top_keys::TopKeys::record` (what the check service pays
//! for every denied check, and for one check in 8: `service/mod.rs`), its memory, and a query.
//!
//! Streams (precomputed): `uniform_100k` — 100,000 keys drawn uniformly (nearly every record
//! misses the 64 counters); `skewed` — 90% of records on 90 keys, 10% uniform over 100,000.
//! The resident bytes of 128 rules' sketches filled with 20-byte keys are printed once
//! (`top_keys_memory`), from the allocator's own count.

use criterion::{Criterion, criterion_group, criterion_main};
use ringlimit_core::top_keys::{TopKeys, TopSettings};
use ringlimit_proto::peer::TopBy;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live heap bytes, to measure what the sketches hold.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: a pointer this allocator returned, with its layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// (id, key) pairs: keys like `user:0000012345` (20 bytes).
fn stream(hot_share: u64) -> Vec<(u64, String)> {
    (0..200_000u64)
        .map(|i| {
            let r = splitmix64(i);
            let n = if r % 100 < hot_share {
                r % 100
            } else {
                r % 100_000
            };
            (splitmix64(n ^ 0x5eed), format!("user:{n:015}"))
        })
        .collect()
}

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("top_keys_record");
    for (name, keys) in [("uniform_100k", stream(0)), ("skewed", stream(90))] {
        group.bench_function(name, |b| {
            let t = TopKeys::default();
            let mut i = 0;
            b.iter(|| {
                let (id, key) = &keys[i];
                t.record("per-user", black_box(*id), key, TopBy::Denied, 1, 0);
                i = (i + 1) % keys.len();
            });
        });
    }
    group.finish();
    c.bench_function("top_keys_query/n10", |b| {
        let t = TopKeys::default();
        for (id, key) in stream(90) {
            t.record("per-user", id, &key, TopBy::Denied, 1, 0);
        }
        b.iter(|| black_box(t.top("per-user", TopBy::Denied, 10, 0)));
    });
}

fn memory(_: &mut Criterion) {
    let keys = stream(0);
    let before = LIVE.load(Ordering::Relaxed);
    let t = TopKeys::new(TopSettings::default());
    for r in 0..128 {
        let rule = format!("rule-{r}");
        for (id, key) in &keys[..20_000] {
            t.record(&rule, *id, key, TopBy::Checks, 8, 0);
            t.record(&rule, *id, key, TopBy::Denied, 1, 0);
        }
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "top_keys_memory: 128 rules filled with 20-byte keys: {bytes} bytes ({} per rule)",
        bytes / 128
    );
    black_box(t);
}

criterion_group! {
    name = top;
    config = Criterion::default().sample_size(30);
    targets = record, memory
}
criterion_main!(top);
