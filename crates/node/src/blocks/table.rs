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

impl Hit {
    /// A check's answer under this block at `now_ms`, for a rule of `limit`: denied until the
    /// block's end (its rest as the retry time, at least 1 ms).
    pub fn answer(&self, limit: u64, now_ms: u64) -> ringlimit_proto::CheckAnswer {
        ringlimit_proto::CheckAnswer {
            allowed: false,
            limit,
            remaining: 0,
            reset_at_ms: self.until_ms,
            retry_after_ms: self.until_ms.saturating_sub(now_ms).max(1),
            degraded: false,
            replica: false,
            leased: false,
        }
    }
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

/// A lift remembered until the end of the block it lifted (a tombstone): a block of its
/// target made at or before `since_ms` arriving later (from a member that missed the lift, or
/// a node restored from `--data-dir`) stays lifted; a later one wins.
#[derive(Debug, Clone)]
struct Tomb {
    source: BlockSource,
    since_ms: u64,
    until_ms: u64,
    by: Arc<str>,
}

/// A tombstone's name: its target (a key, or `cidr:NET/LEN`) and, for an automatic block,
/// its rule.
type TombKey = (Box<str>, Option<Arc<str>>);

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
    /// Lifts remembered, by target (and rule).
    tombs: HashMap<TombKey, Tomb>,
}

impl Inner {
    /// Blocks in force (ended ones not swept yet included).
    fn len(&self) -> usize {
        self.keys.len() + self.nets + self.auto.len()
    }

    /// What the bound counts: blocks and remembered lifts.
    fn held(&self) -> usize {
        self.len() + self.tombs.len()
    }

    /// Whether a remembered lift of `key` outranks a block made at `since_ms`.
    fn lifted_since(&self, key: &TombKey, since_ms: u64) -> bool {
        self.tombs.get(key).is_some_and(|t| t.since_ms >= since_ms)
    }

    /// Remembers the lift `t` of `key` (a later or longer one of the same target stays).
    fn bury(&mut self, key: TombKey, t: Tomb) {
        let t = match self.tombs.get(&key) {
            Some(old) if old.since_ms > t.since_ms => return,
            Some(old) => Tomb {
                until_ms: old.until_ms.max(t.until_ms),
                ..t
            },
            None => t,
        };
        self.tombs.insert(key, t);
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
        let tomb: TombKey = (target.to_string().into(), None);
        if inner.lifted_since(&tomb, since_ms) {
            return Ok(false);
        }
        // A newer block wins over an older lift.
        inner.tombs.remove(&tomb);
        let held = match target {
            Target::Key(k) => inner.keys.get(k),
            Target::Net(n) => inner.net(n),
        };
        match held {
            Some(h) if h.since_ms > since_ms => return Ok(false),
            Some(_) => {}
            None if inner.held() >= self.max => return Err(BlockError::Full { max: self.max }),
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

    /// Lifts the managed block of `target` made at or before `since_ms`, at `now_ms`, and
    /// remembers the lift until the lifted block's end or `until_ms`, whichever is later (a
    /// later block of the target still wins); the lifted block's end, if one was lifted.
    pub fn remove_managed(
        &self,
        target: &Target,
        (since_ms, until_ms): (u64, u64),
        by: &str,
        now_ms: u64,
    ) -> Option<u64> {
        let mut inner = self.inner.write();
        let held = match target {
            Target::Key(k) => inner.keys.get(k),
            Target::Net(n) => inner.net(n),
        };
        if held.is_some_and(|h| h.since_ms > since_ms) {
            return None;
        }
        let end = held.map_or(until_ms, |h| h.until_ms.max(until_ms));
        let lifted = match target {
            Target::Key(k) => inner.keys.remove(k).is_some(),
            Target::Net(n) => inner.remove_net(n).is_some(),
        };
        self.remember(
            &mut inner,
            (target.to_string().into(), None),
            (BlockSource::Managed, since_ms, end),
            by,
            now_ms,
            lifted,
        );
        self.len.store(inner.len(), Ordering::Relaxed);
        lifted.then_some(end)
    }

    /// Remembers a lift (unless it has ended, or the table is full and it frees no room).
    fn remember(
        &self,
        inner: &mut Inner,
        key: TombKey,
        (source, since_ms, until_ms): (BlockSource, u64, u64),
        by: &str,
        now_ms: u64,
        freed: bool,
    ) {
        if until_ms <= now_ms {
            return;
        }
        if !freed && !inner.tombs.contains_key(&key) && inner.held() >= self.max {
            self.stats.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        inner.bury(
            key,
            Tomb {
                source,
                since_ms,
                until_ms,
                by: by.into(),
            },
        );
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
        let tomb: TombKey = (key.into(), Some(rule.into()));
        if inner.lifted_since(&tomb, since_ms) {
            return false;
        }
        inner.tombs.remove(&tomb);
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
        if inner.held() >= self.max {
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

    /// Lifts the automatic block of bucket `id` (`key` under `rule`) made at or before
    /// `since_ms`, at `now_ms`, and remembers the lift as [`Self::remove_managed`] does;
    /// the lifted block's end, if one was lifted.
    pub fn remove_auto(
        &self,
        (id, key, rule): (u64, &str, &str),
        (since_ms, until_ms): (u64, u64),
        by: &str,
        now_ms: u64,
    ) -> Option<u64> {
        let mut inner = self.inner.write();
        let inner = &mut *inner;
        let mut end = until_ms;
        let lifted = match inner.auto.get(&id) {
            Some(held) if held.entry.since_ms > since_ms => return None,
            Some(held) => {
                end = end.max(held.entry.until_ms);
                inner.auto_by_end.remove(&(held.entry.until_ms, id));
                inner.auto.remove(&id);
                true
            }
            None => false,
        };
        self.remember(
            inner,
            (key.into(), Some(rule.into())),
            (BlockSource::Auto, since_ms, end),
            by,
            now_ms,
            lifted,
        );
        self.len.store(inner.len(), Ordering::Relaxed);
        lifted.then_some(end)
    }

    /// When the latest change of the managed target `target` held here (a block or a lift)
    /// was made: a change made through this node is made later, so that it wins.
    pub fn version(&self, target: &Target) -> Option<u64> {
        let inner = self.inner.read();
        let held = match target {
            Target::Key(k) => inner.keys.get(k),
            Target::Net(n) => inner.net(n),
        };
        let tomb = inner.tombs.get(&(target.to_string().into(), None));
        held.map(|e| e.since_ms).max(tomb.map(|t| t.since_ms))
    }

    /// Lifts remembered (ended ones not swept yet included).
    pub fn lifts(&self) -> usize {
        self.inner.read().tombs.len()
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
        inner.tombs.retain(|_, t| t.until_ms > now_ms);
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

    /// Every block in force at `now_ms` and every lift remembered, as they travel (a member
    /// that joins, or missed a change, is sent these).
    pub fn all(&self, now_ms: u64) -> Vec<BlockChange> {
        let mut out = self.managed(now_ms);
        let inner = self.inner.read();
        out.extend(
            inner
                .tombs
                .iter()
                .filter(|(_, t)| t.source == BlockSource::Auto && t.until_ms > now_ms)
                .map(|(k, t)| tomb_change(k, t)),
        );
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

    /// The managed blocks in force at `now_ms` and the managed lifts remembered (what
    /// `--data-dir` keeps).
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
        out.extend(
            inner
                .tombs
                .iter()
                .filter(|(_, t)| t.source == BlockSource::Managed && t.until_ms > now_ms)
                .map(|(k, t)| tomb_change(k, t)),
        );
        out
    }
}

fn tomb_change((target, rule): &TombKey, t: &Tomb) -> BlockChange {
    BlockChange {
        target: target.to_string(),
        rule: rule.as_deref().map(str::to_owned),
        source: t.source,
        since_ms: t.since_ms,
        until_ms: t.until_ms,
        reason: String::new(),
        by: t.by.to_string(),
        lifted: true,
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
        lifted: false,
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
        assert_eq!(
            b.remove_managed(&key("cidr:203.0.113.0/24"), (10, 0), "ops", 100),
            Some(9_000)
        );
        assert_eq!(until("203.0.113.7", 100), None);
        assert_eq!(b.len(), 3);
        assert_eq!(
            b.managed(0).len(),
            4,
            "three blocks and the lift remembered"
        );
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
        assert_eq!(b.remove_managed(&key("a"), (4, 0), "ops", 6), None);
        assert_eq!(b.remove_managed(&key("a"), (5, 0), "ops", 6), Some(10_000));
        assert!(b.is_empty());
    }

    #[test]
    fn a_lift_is_remembered_until_the_blocks_end_and_beats_older_blocks_only() {
        let b = Blocks::new(10);
        let a = key("a");
        b.put_managed(&a, (10, 5_000), "abuse", "ops")
            .expect("room");
        assert_eq!(b.remove_managed(&a, (20, 0), "ops", 20), Some(5_000));
        assert_eq!(b.find("a", 1, 20), None);
        // The old block again (a member that missed the lift, a restored file): stays lifted.
        assert_eq!(b.put_managed(&a, (10, 5_000), "abuse", "ops"), Ok(false));
        assert_eq!(
            b.put_managed(&a, (20, 5_000), "abuse", "ops"),
            Ok(false),
            "a tie: lifted"
        );
        assert_eq!(b.find("a", 1, 30), None);
        // The lift travels in a full sync, with the lifted block's end.
        let all = b.all(30);
        assert_eq!(all.len(), 1);
        assert!(all[0].lifted && all[0].until_ms == 5_000 && all[0].since_ms == 20);
        assert_eq!(b.version(&a), Some(20));
        // A later block wins over the lift.
        assert_eq!(b.put_managed(&a, (21, 9_000), "again", "ops"), Ok(true));
        assert!(b.find("a", 1, 30).is_some());
        assert_eq!(b.lifts(), 0);
        // A lift of a block never seen here is remembered too, and freed at its end.
        assert_eq!(b.remove_managed(&key("c"), (40, 6_000), "ops", 40), None);
        assert_eq!(b.put_managed(&key("c"), (30, 6_000), "", "ops"), Ok(false));
        assert_eq!(b.lifts(), 1);
        b.sweep(5_999);
        assert_eq!(b.lifts(), 1);
        b.sweep(6_000);
        assert_eq!(b.lifts(), 0);
        assert_eq!(
            b.stats.expired_managed.load(Ordering::Relaxed),
            0,
            "a lift is no block"
        );
    }

    #[test]
    fn an_automatic_lift_beats_the_owners_older_announcement() {
        let b = Blocks::new(10);
        assert!(b.put_auto((42, "k", "r"), (100, 2_000), "n1", 100));
        assert_eq!(
            b.remove_auto((42, "k", "r"), (150, 0), "ops", 150),
            Some(2_000)
        );
        assert!(!b.put_auto((42, "k", "r"), (100, 2_000), "n1", 160));
        assert_eq!(b.find("k", 42, 160), None);
        let all = b.all(160);
        assert_eq!(all.len(), 1);
        assert!(all[0].lifted && all[0].rule.as_deref() == Some("r"));
        // The owner blocks it again after the lift: in force.
        assert!(b.put_auto((42, "k", "r"), (200, 4_000), "n1", 200));
        assert!(b.find("k", 42, 200).is_some());
    }

    #[test]
    fn lifts_count_against_the_bound() {
        let b = Blocks::new(2);
        b.put_managed(&key("a"), (0, 9_000), "", "ops")
            .expect("room");
        assert_eq!(b.remove_managed(&key("x"), (1, 9_000), "ops", 1), None);
        assert_eq!(b.lifts(), 1);
        assert_eq!(b.remove_managed(&key("y"), (1, 9_000), "ops", 1), None);
        assert_eq!(
            b.lifts(),
            1,
            "full: a lift of nothing held is not remembered"
        );
        assert_eq!(
            b.put_managed(&key("b"), (2, 9_000), "", "ops"),
            Err(BlockError::Full { max: 2 })
        );
        // Lifting a block held frees its room for the lift.
        assert_eq!(b.remove_managed(&key("a"), (3, 0), "ops", 3), Some(9_000));
        assert_eq!(b.lifts(), 2);
    }
}
