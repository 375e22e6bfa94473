//! The node's table of blocks (see the module doc of [`crate::blocks`] for its shape, bounds
//! and expiry).

use super::target::{Target, address_of};
use super::{BlockChange, BlockSource};
use ipnet::IpNet;
use parking_lot::RwLock;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A block in force, as a check meets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub source: BlockSource,
    /// Unix ms (on this node's clock) the block ends.
    pub until_ms: u64,
}

/// A block as listed (and as it travels): see [`BlockChange`].
pub type Listed = BlockChange;

/// Why a block was not put in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error(
        "this node holds {max} blocks already (--max-blocks); remove some or let them end \
         before adding more"
    )]
    Full { max: usize },
}

#[derive(Debug, Clone)]
struct Entry {
    until_ms: u64,
    since_ms: u64,
    reason: Arc<str>,
    by: Arc<str>,
}

#[derive(Debug, Clone)]
struct AutoEntry {
    key: Box<str>,
    rule: Arc<str>,
    entry: Entry,
}

#[derive(Debug, Default)]
struct Inner {
    /// Managed blocks of one key, under every rule.
    keys: HashMap<Box<str>, Entry>,
    /// Managed blocks of IPv4 networks: per prefix length, longest first.
    v4: BTreeMap<Reverse<u8>, HashMap<u32, Entry>>,
    /// Managed blocks of IPv6 networks: per prefix length, longest first.
    v6: BTreeMap<Reverse<u8>, HashMap<u128, Entry>>,
    /// Networks held, IPv4 and IPv6.
    nets: usize,
    /// Automatic blocks, by bucket identity (their rule and key).
    auto: HashMap<u64, AutoEntry>,
    /// Automatic blocks by end, nearest first (which one a full table gives up).
    auto_by_end: BTreeSet<(u64, u64)>,
}

impl Inner {
    fn len(&self) -> usize {
        self.keys.len() + self.nets + self.auto.len()
    }

    fn net(&self, net: &IpNet) -> Option<&Entry> {
        match net {
            IpNet::V4(n) => self
                .v4
                .get(&Reverse(n.prefix_len()))?
                .get(&u32::from(n.network())),
            IpNet::V6(n) => self
                .v6
                .get(&Reverse(n.prefix_len()))?
                .get(&u128::from(n.network())),
        }
    }

    fn put_net(&mut self, net: &IpNet, e: Entry) {
        let fresh = match net {
            IpNet::V4(n) => self
                .v4
                .entry(Reverse(n.prefix_len()))
                .or_default()
                .insert(u32::from(n.network()), e)
                .is_none(),
            IpNet::V6(n) => self
                .v6
                .entry(Reverse(n.prefix_len()))
                .or_default()
                .insert(u128::from(n.network()), e)
                .is_none(),
        };
        self.nets += usize::from(fresh);
    }

    fn remove_net(&mut self, net: &IpNet) -> Option<Entry> {
        let removed = match net {
            IpNet::V4(n) => {
                let len = Reverse(n.prefix_len());
                let map = self.v4.get_mut(&len)?;
                let e = map.remove(&u32::from(n.network()));
                if map.is_empty() {
                    self.v4.remove(&len);
                }
                e
            }
            IpNet::V6(n) => {
                let len = Reverse(n.prefix_len());
                let map = self.v6.get_mut(&len)?;
                let e = map.remove(&u128::from(n.network()));
                if map.is_empty() {
                    self.v6.remove(&len);
                }
                e
            }
        };
        self.nets -= usize::from(removed.is_some());
        removed
    }

    /// The longest network holding `ip`, in force at `now_ms`.
    fn find_net(&self, ip: IpAddr, now_ms: u64) -> Option<&Entry> {
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().find_map(|(Reverse(len), map)| {
                    let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
                    map.get(&(a & mask)).filter(|e| e.until_ms > now_ms)
                })
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().find_map(|(Reverse(len), map)| {
                    let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
                    map.get(&(a & mask)).filter(|e| e.until_ms > now_ms)
                })
            }
        }
    }
}

/// Blocks added and ended, by source (`ringlimit_blocks_added_total`,
/// `ringlimit_blocks_expired_total`).
#[derive(Debug, Default)]
pub struct BlockStats {
    pub added_auto: AtomicU64,
    pub added_managed: AtomicU64,
    pub expired_auto: AtomicU64,
    pub expired_managed: AtomicU64,
    /// Auto blocks given up (or not kept) because the table was full.
    pub dropped_full: AtomicU64,
}

impl BlockStats {
    fn added(&self, source: BlockSource) {
        match source {
            BlockSource::Auto => &self.added_auto,
            BlockSource::Managed => &self.added_managed,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// The node's blocks.
#[derive(Debug)]
pub struct Blocks {
    max: usize,
    /// Entries held: the one read a check makes while there are none.
    len: AtomicUsize,
    inner: RwLock<Inner>,
    pub stats: BlockStats,
}

impl Default for Blocks {
    fn default() -> Self {
        Self::new(super::DEFAULT_MAX_BLOCKS)
    }
}

impl Blocks {
    /// A table of at most `max` blocks.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            len: AtomicUsize::new(0),
            inner: RwLock::default(),
            stats: BlockStats::default(),
        }
    }

    /// The block in force at `now_ms` for `key` under the bucket `id` (its rule and key), if
    /// any: a managed block of the key, of a network holding the address the key was built
    /// from, or an automatic block of the bucket.
    #[inline]
    pub fn find(&self, key: &str, id: u64, now_ms: u64) -> Option<Hit> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.find_held(key, id, now_ms)
    }

    #[cold]
    fn find_held(&self, key: &str, id: u64, now_ms: u64) -> Option<Hit> {
        let inner = self.inner.read();
        let managed = |e: &Entry| Hit {
            source: BlockSource::Managed,
            until_ms: e.until_ms,
        };
        if !inner.auto.is_empty()
            && let Some(a) = inner.auto.get(&id).filter(|a| a.entry.until_ms > now_ms)
        {
            return Some(Hit {
                source: BlockSource::Auto,
                until_ms: a.entry.until_ms,
            });
        }
        if !inner.keys.is_empty()
            && let Some(e) = inner.keys.get(key).filter(|e| e.until_ms > now_ms)
        {
            return Some(managed(e));
        }
        if inner.nets > 0
            && let Some(ip) = address_of(key)
        {
            return inner.find_net(ip, now_ms).map(managed);
        }
        None
    }

    /// Blocks held (ended ones not swept yet included).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bound on blocks held.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Blocks held (ended ones not swept yet included), (auto, managed).
    pub fn held(&self) -> (usize, usize) {
        let inner = self.inner.read();
        (inner.auto.len(), inner.keys.len() + inner.nets)
    }

    /// Blocks in force at `now_ms`, (auto, managed).
    pub fn counts(&self, now_ms: u64) -> (usize, usize) {
        let inner = self.inner.read();
        let auto = inner
            .auto
            .values()
            .filter(|a| a.entry.until_ms > now_ms)
            .count();
        let keys = inner.keys.values().filter(|e| e.until_ms > now_ms).count();
        let nets: usize = (inner.v4.values().flat_map(|m| m.values()))
            .chain(inner.v6.values().flat_map(|m| m.values()))
            .filter(|e| e.until_ms > now_ms)
            .count();
        (auto, keys + nets)
    }

    /// Puts a managed block of `target` in force until `until_ms` (replacing one of the same
    /// target); refused when the table is full and the target is new. `since_ms` orders
    /// changes of one target: an older change than the one held is ignored (`Ok(false)`).
    pub fn put_managed(
        &self,
        target: &Target,
        (since_ms, until_ms): (u64, u64),
        reason: &str,
        by: &str,
    ) -> Result<bool, BlockError> {
        let e = Entry {
            until_ms,
            since_ms,
            reason: reason.into(),
            by: by.into(),
        };
        let mut inner = self.inner.write();
        let held = match target {
            Target::Key(k) => inner.keys.get(k),
            Target::Net(n) => inner.net(n),
        };
        match held {
            Some(h) if h.since_ms > since_ms => return Ok(false),
            Some(_) => {}
            None if inner.len() >= self.max => return Err(BlockError::Full { max: self.max }),
            None => self.stats.added(BlockSource::Managed),
        }
        match target {
            Target::Key(k) => {
                inner.keys.insert(k.clone(), e);
            }
            Target::Net(n) => inner.put_net(n, e),
        }
        self.len.store(inner.len(), Ordering::Relaxed);
        Ok(true)
    }

    /// Lifts the managed block of `target` (one made at or before `since_ms`); whether one
    /// was held.
    pub fn remove_managed(&self, target: &Target, since_ms: u64) -> bool {
        let mut inner = self.inner.write();
        let held = match target {
            Target::Key(k) => inner.keys.get(k),
            Target::Net(n) => inner.net(n),
        };
        if held.is_none_or(|h| h.since_ms > since_ms) {
            return false;
        }
        match target {
            Target::Key(k) => {
                inner.keys.remove(k);
            }
            Target::Net(n) => {
                inner.remove_net(n);
            }
        }
        self.len.store(inner.len(), Ordering::Relaxed);
        true
    }

    /// Puts an automatic block of bucket `id` (`key` under `rule`) in force until `until_ms`,
    /// at `now_ms`. A full table gives up the automatic block nearest its end for it, or keeps
    /// this one out when it would end first; whether it is kept.
    pub fn put_auto(
        &self,
        (id, key, rule): (u64, &str, &str),
        (since_ms, until_ms): (u64, u64),
        by: &str,
        now_ms: u64,
    ) -> bool {
        if until_ms <= now_ms {
            return false;
        }
        let mut inner = self.inner.write();
        let inner = &mut *inner;
        if let Some(held) = inner.auto.get_mut(&id) {
            if held.entry.since_ms > since_ms || held.entry.until_ms >= until_ms {
                return false;
            }
            inner.auto_by_end.remove(&(held.entry.until_ms, id));
            held.entry.until_ms = until_ms;
            held.entry.since_ms = since_ms;
            inner.auto_by_end.insert((until_ms, id));
            return true;
        }
        if inner.len() >= self.max {
            // The auto block nearest its end gives way, unless this one ends sooner.
            let nearest = inner.auto_by_end.first().copied();
            match nearest {
                Some((end, victim)) if end < until_ms => {
                    inner.auto_by_end.remove(&(end, victim));
                    inner.auto.remove(&victim);
                }
                _ => {
                    self.stats.dropped_full.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
            self.stats.dropped_full.fetch_add(1, Ordering::Relaxed);
        }
        inner.auto.insert(
            id,
            AutoEntry {
                key: key.into(),
                rule: rule.into(),
                entry: Entry {
                    until_ms,
                    since_ms,
                    reason: "auto".into(),
                    by: by.into(),
                },
            },
        );
        inner.auto_by_end.insert((until_ms, id));
        self.stats.added(BlockSource::Auto);
        self.len.store(inner.len(), Ordering::Relaxed);
        true
    }

    /// Lifts the automatic block of bucket `id`; whether one was held.
    pub fn remove_auto(&self, id: u64) -> bool {
        let mut inner = self.inner.write();
        let Some(held) = inner.auto.remove(&id) else {
            return false;
        };
        inner.auto_by_end.remove(&(held.entry.until_ms, id));
        self.len.store(inner.len(), Ordering::Relaxed);
        true
    }

    /// Frees the blocks ended at `now_ms` and counts them; returns how many, (auto, managed).
    pub fn sweep(&self, now_ms: u64) -> (u64, u64) {
        let mut inner = self.inner.write();
        let inner = &mut *inner;
        let mut auto = 0u64;
        while let Some(&(end, id)) = inner.auto_by_end.first() {
            if end > now_ms {
                break;
            }
            inner.auto_by_end.pop_first();
            inner.auto.remove(&id);
            auto += 1;
        }
        let before = inner.keys.len() + inner.nets;
        inner.keys.retain(|_, e| e.until_ms > now_ms);
        for map in inner.v4.values_mut() {
            map.retain(|_, e| e.until_ms > now_ms);
        }
        inner.v4.retain(|_, m| !m.is_empty());
        for map in inner.v6.values_mut() {
            map.retain(|_, e| e.until_ms > now_ms);
        }
        inner.v6.retain(|_, m| !m.is_empty());
        inner.nets = inner.v4.values().map(HashMap::len).sum::<usize>()
            + inner.v6.values().map(HashMap::len).sum::<usize>();
        let managed = (before - inner.keys.len() - inner.nets) as u64;
        self.len.store(inner.len(), Ordering::Relaxed);
        self.stats.expired_auto.fetch_add(auto, Ordering::Relaxed);
        self.stats
            .expired_managed
            .fetch_add(managed, Ordering::Relaxed);
        (auto, managed)
    }

    /// Every block in force at `now_ms`, as it travels (a member that joins is sent these).
    pub fn all(&self, now_ms: u64) -> Vec<BlockChange> {
        let mut out = self.managed(now_ms);
        let inner = self.inner.read();
        out.extend(
            inner
                .auto
                .values()
                .filter(|a| a.entry.until_ms > now_ms)
                .map(|a| {
                    change(
                        a.key.to_string(),
                        Some(&a.rule),
                        BlockSource::Auto,
                        &a.entry,
                    )
                }),
        );
        out
    }

    /// The managed blocks in force at `now_ms` (what `--data-dir` keeps).
    pub fn managed(&self, now_ms: u64) -> Vec<BlockChange> {
        let inner = self.inner.read();
        let live = |e: &&Entry| e.until_ms > now_ms;
        let mut out: Vec<BlockChange> = inner
            .keys
            .iter()
            .filter(|(_, e)| live(e))
            .map(|(k, e)| change(k.to_string(), None, BlockSource::Managed, e))
            .collect();
        for (Reverse(len), map) in &inner.v4 {
            for (a, e) in map.iter().filter(|(_, e)| live(e)) {
                let net = format!("cidr:{}/{len}", std::net::Ipv4Addr::from(*a));
                out.push(change(net, None, BlockSource::Managed, e));
            }
        }
        for (Reverse(len), map) in &inner.v6 {
            for (a, e) in map.iter().filter(|(_, e)| live(e)) {
                let net = format!("cidr:{}/{len}", std::net::Ipv6Addr::from(*a));
                out.push(change(net, None, BlockSource::Managed, e));
            }
        }
        out
    }
}

fn change(target: String, rule: Option<&str>, source: BlockSource, e: &Entry) -> BlockChange {
    BlockChange {
        target,
        rule: rule.map(str::to_owned),
        source,
        since_ms: e.since_ms,
        until_ms: e.until_ms,
        reason: e.reason.to_string(),
        by: e.by.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Target {
        Target::parse(s).expect("valid target")
    }

    #[test]
    fn an_empty_table_finds_nothing() {
        let b = Blocks::new(10);
        assert!(b.is_empty());
        assert_eq!(b.find("user:1", 1, 0), None);
    }

    #[test]
    fn a_managed_key_is_blocked_until_its_end_exactly() {
        let b = Blocks::new(10);
        assert_eq!(
            b.put_managed(&key("user:1"), (1_000, 5_000), "abuse", "ops"),
            Ok(true)
        );
        let hit = Some(Hit {
            source: BlockSource::Managed,
            until_ms: 5_000,
        });
        assert_eq!(b.find("user:1", 7, 1_000), hit);
        assert_eq!(b.find("user:1", 8, 4_999), hit, "under every rule");
        assert_eq!(b.find("user:1", 7, 5_000), None, "ended at its end");
        assert_eq!(b.find("user:2", 7, 1_000), None);
        // The sweeper frees it and counts it; the answer did not wait for it.
        assert_eq!(b.sweep(4_999), (0, 0));
        assert_eq!(b.sweep(5_000), (0, 1));
        assert!(b.is_empty());
        assert_eq!(b.stats.expired_managed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_auto_block_holds_its_bucket_only() {
        let b = Blocks::new(10);
        assert!(b.put_auto((42, "user:1", "per-user"), (0, 1_000), "n1", 0));
        assert_eq!(
            b.find("user:1", 42, 999).map(|h| h.source),
            Some(BlockSource::Auto)
        );
        assert_eq!(b.find("user:1", 43, 999), None, "another rule's bucket");
        assert_eq!(b.find("user:1", 42, 1_000), None);
        let all = b.all(0);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].rule.as_deref(), Some("per-user"));
        assert_eq!(b.sweep(1_000), (1, 0));
        assert!(b.is_empty());
    }

    #[test]
    fn networks_match_v4_and_v6_addresses_longest_first() {
        let b = Blocks::new(10);
        b.put_managed(&key("cidr:203.0.113.0/24"), (0, 9_000), "net", "ops")
            .expect("room");
        b.put_managed(&key("cidr:203.0.113.128/25"), (0, 5_000), "half", "ops")
            .expect("room");
        b.put_managed(&key("cidr:2001:db8::/32"), (0, 9_000), "v6", "ops")
            .expect("room");
        b.put_managed(&key("cidr:0.0.0.0/0"), (0, 100), "all", "ops")
            .expect("room");
        let until = |k: &str, now| b.find(k, 1, now).map(|h| h.until_ms);
        assert_eq!(until("ip:203.0.113.200", 0), Some(5_000), "the /25 first");
        assert_eq!(
            until("ip:203.0.113.200", 6_000),
            Some(9_000),
            "then the /24"
        );
        assert_eq!(until("203.0.113.7", 0), Some(9_000));
        assert_eq!(until("ip:198.51.100.1", 50), Some(100), "the /0 holds all");
        assert_eq!(until("ip:198.51.100.1", 100), None);
        assert_eq!(until("ip:2001:db8:ffff::1", 0), Some(9_000));
        assert_eq!(until("ip:2001:db9::1", 0), None);
        assert_eq!(until("user:203", 0), None);
        assert!(b.remove_managed(&key("cidr:203.0.113.0/24"), 10));
        assert_eq!(until("203.0.113.7", 100), None);
        assert_eq!(b.len(), 3);
        assert_eq!(b.managed(0).len(), 3);
    }

    #[test]
    fn a_full_table_refuses_managed_and_gives_up_the_auto_block_nearest_its_end() {
        let b = Blocks::new(3);
        b.put_managed(&key("a"), (0, 10_000), "", "ops")
            .expect("room");
        assert!(b.put_auto((1, "k1", "r"), (0, 2_000), "n", 0));
        assert!(b.put_auto((2, "k2", "r"), (0, 3_000), "n", 0));
        assert_eq!(
            b.put_managed(&key("b"), (0, 10_000), "", "ops"),
            Err(BlockError::Full { max: 3 })
        );
        // A managed block already held may still change.
        assert_eq!(b.put_managed(&key("a"), (1, 20_000), "", "ops"), Ok(true));
        // A new auto block ending later replaces the one nearest its end (k1).
        assert!(b.put_auto((3, "k3", "r"), (0, 4_000), "n", 0));
        assert_eq!(b.find("k1", 1, 0), None);
        assert!(b.find("k3", 3, 0).is_some());
        // One ending sooner than all of them is not kept.
        assert!(!b.put_auto((4, "k4", "r"), (0, 1_000), "n", 0));
        assert_eq!(b.len(), 3);
        assert_eq!(b.stats.dropped_full.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_older_change_of_a_target_never_wins() {
        let b = Blocks::new(10);
        b.put_managed(&key("a"), (5, 10_000), "new", "ops")
            .expect("room");
        assert_eq!(
            b.put_managed(&key("a"), (4, 99_000), "old", "ops"),
            Ok(false)
        );
        assert!(!b.remove_managed(&key("a"), 4));
        assert!(b.remove_managed(&key("a"), 5));
        assert!(b.is_empty());
    }
}
