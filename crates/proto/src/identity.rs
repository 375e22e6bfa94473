//! Bucket identities: the 64-bit hash of (rule, key) that names a bucket everywhere.
//!
//! xxh3 with fixed seeds, so every node and every SDK, whatever its build, computes the same
//! identity, and so the same owner on the ring.

/// The seed of a named rule's bucket identities: its name and algorithm (a reload that changes
/// the algorithm starts fresh buckets; one that changes only numbers keeps them).
pub fn named_seed(name: &str, algorithm_code: u8) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(
        name.as_bytes(),
        0x6e61_6d65_6400 | u64::from(algorithm_code),
    )
}

/// The seed of an inline rule's bucket identities: its parameters, hashed.
pub fn inline_seed(algorithm_code: u8, limit: u64, period_ns: u64, burst: u64) -> u64 {
    let mut buf = [0u8; 25];
    buf[0] = algorithm_code;
    buf[1..9].copy_from_slice(&limit.to_le_bytes());
    buf[9..17].copy_from_slice(&period_ns.to_le_bytes());
    buf[17..25].copy_from_slice(&burst.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&buf, 0x696e_6c69_6e65) // "inline"
}

/// The seed of an inline rule with calendar windows: its [`inline_seed`] with the calendar's
/// unit and zone name hashed in (a plain rule's seed is unchanged).
pub fn calendar_seed(inline_seed: u64, unit_code: u8, zone: &str) -> u64 {
    let mut buf = Vec::with_capacity(zone.len() + 1);
    buf.push(unit_code);
    buf.extend_from_slice(zone.as_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&buf, inline_seed ^ 0x6361_6c65_6e64) // "calend"
}

/// A bucket's identity: the key hashed with its rule's seed.
pub fn bucket_id(seed: u64, key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), seed)
}
