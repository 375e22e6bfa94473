//! ns per counted check of `ringlimit_core::hot_keys::HotKeys::record` (what the node pays, behind
//! its lock, for one forwarded check in 8: `routing/hot_keys.rs`), and per tick.
//!
//! Streams (precomputed, splitmix64 ids): `uniform_100k` — 100,000 keys drawn uniformly (nearly
//! every counted check misses the 256 counters and goes through the alpha filter);
//! `hot_skewed` — 90% of checks on 90 hot keys, 10% uniform over 100,000 (mostly hits).

use criterion::{Criterion, criterion_group, criterion_main};
use ringlimit_core::hot_keys::{HotKeys, HotSettings};
use std::hint::black_box;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn stream(hot_share: u64) -> Vec<u64> {
    (0..1_000_000u64)
        .map(|i| {
            let r = splitmix64(i);
            let key = if r % 100 < hot_share {
                r % 100
            } else {
                r % 100_000
            };
            splitmix64(key ^ 0x5eed)
        })
        .collect()
}

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_keys_record");
    for (name, ids) in [("uniform_100k", stream(0)), ("hot_skewed", stream(90))] {
        group.bench_function(name, |b| {
            let mut h = HotKeys::new(HotSettings::default());
            let mut i = 0;
            b.iter(|| {
                h.record(black_box(ids[i]), 8);
                i = (i + 1) % ids.len();
            });
        });
    }
    group.finish();
    c.bench_function("hot_keys_tick/256_counters", |b| {
        let ids = stream(90);
        let mut h = HotKeys::new(HotSettings::default());
        b.iter(|| {
            for &id in &ids[..2_000] {
                h.record(id, 8);
            }
            black_box(h.tick())
        });
    });
}

criterion_group! {
    name = hot;
    config = Criterion::default().sample_size(30);
    targets = record
}
criterion_main!(hot);
