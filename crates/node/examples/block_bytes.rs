//! Memory per managed block in a node's block table, and what a lookup costs.
//!
//! ```text
//! cargo run -p ringlimit-node --example block_bytes                      # bytes (deterministic)
//! cargo run --release -p ringlimit-node --example block_bytes -- lookup   # bytes, then timings
//! ```
//!
//! `bytes`: a table of `--max-blocks` 1,100,000 takes 1,000,000 managed key blocks
//! (`apikey:` and 16 hex digits, reason `abuse`, by `ops`), then 100,000 network blocks (IPv4
//! /24s and /32s, IPv6 /48s and /64s: four prefix lengths). It prints the heap bytes asked for
//! (a counting global allocator: the same count in debug and release builds) and the resident
//! set's growth, each per entry, keys and networks apart.
//!
//! `lookup` (wall clock: run it on a quiet host) then times [`Blocks::find`] for a blocked key,
//! a key that is not blocked, and an address key (`ip:...`) inside and outside the networks:
//! a key is one hash lookup in the key map; an address is at most one hash lookup per prefix
//! length present (here 2 for IPv4, 2 for IPv6), longest first, whatever the number of networks.

use ringlimit_node::blocks::{Blocks, Target};
use std::hint::black_box;
use std::time::Instant;

#[path = "common/counting.rs"]
mod counting;
use counting::heap;

const KEYS: u64 = 1_000_000;
const NETS: u64 = 100_000;
const UNTIL_MS: u64 = u64::MAX / 2;

/// Resident set size in bytes (0 where /proc is not there).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn key(i: u64) -> String {
    format!("apikey:{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Network `i`: a quarter each of IPv4 /24s and /32s, IPv6 /48s and /64s, all distinct.
fn net(i: u64) -> String {
    let j = i / 4;
    let (a, b, c) = ((j >> 16) as u8, (j >> 8) as u8, j as u8);
    match i % 4 {
        0 => format!("cidr:10.{b}.{c}.0/24"),
        1 => format!("cidr:11.{a}.{b}.{c}/32"),
        2 => format!("cidr:2001:db8:{j:x}::/48"),
        _ => format!("cidr:2001:db9:0:{j:x}::/64"),
    }
}

fn put(b: &Blocks, target: &str) {
    let t = Target::parse(target).expect("a valid target");
    b.put_managed(&t, (1, UNTIL_MS), "abuse", "ops")
        .expect("room");
}

/// Median nanoseconds per call of `f` over `rounds` rounds of `n` calls.
fn time(n: u64, rounds: usize, mut f: impl FnMut(u64)) -> f64 {
    let mut per: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

fn main() {
    let lookup = std::env::args().nth(1).as_deref() == Some("lookup");
    let blocks = Blocks::new((KEYS + NETS) as usize);
    let (heap0, rss0) = (heap(), rss());
    for i in 0..KEYS {
        put(&blocks, &key(i));
    }
    let (heap1, rss1) = (heap(), rss());
    for i in 0..NETS {
        put(&blocks, &net(i));
    }
    let (heap2, rss2) = (heap(), rss());
    assert_eq!(blocks.len() as u64, KEYS + NETS);
    let per = |d: usize, n: u64| d as f64 / n as f64;
    let key_bytes = key(0).len();
    println!(
        "[keys] blocks={KEYS} key_bytes={key_bytes} heap_bytes_per_entry={:.1} \
         rss_bytes_per_entry={:.1}",
        per(heap1 - heap0, KEYS),
        per(rss1.saturating_sub(rss0) as usize, KEYS),
    );
    println!(
        "[networks] blocks={NETS} prefix_lengths=4 heap_bytes_per_entry={:.1} \
         rss_bytes_per_entry={:.1}",
        per(heap2 - heap1, NETS),
        per(rss2.saturating_sub(rss1) as usize, NETS),
    );
    println!(
        "[all] blocks={} heap_bytes_per_entry={:.1} rss_bytes_per_entry={:.1}",
        KEYS + NETS,
        per(heap2 - heap0, KEYS + NETS),
        per(rss2.saturating_sub(rss0) as usize, KEYS + NETS),
    );
    if !lookup {
        return;
    }
    let now = 2;
    let keys: Vec<String> = (0..1024).map(key).collect();
    let free: Vec<String> = (0..1024).map(|i| format!("user:{i}")).collect();
    let inside: Vec<String> = (0..1024)
        .map(|i| format!("ip:10.{}.{}.7", i >> 8, i & 255))
        .collect();
    let outside: Vec<String> = (0..1024)
        .map(|i| format!("ip:192.0.2.{}", i % 250))
        .collect();
    let v6: Vec<String> = (0..1024).map(|i| format!("ip:2001:db7::{i:x}")).collect();
    let n = 1_000_000;
    for (name, keys, want) in [
        ("key_blocked", &keys, true),
        ("key_not_blocked", &free, false),
        ("ipv4_in_a_network", &inside, true),
        ("ipv4_in_none", &outside, false),
        ("ipv6_in_none", &v6, false),
    ] {
        assert_eq!(blocks.find(&keys[0], 7, now).is_some(), want, "{name}");
        let ns = time(n, 5, |i| {
            black_box(blocks.find(black_box(&keys[(i & 1023) as usize]), 7, now));
        });
        println!("[lookup] {name} ns_per_find={ns:.0}");
    }
}
