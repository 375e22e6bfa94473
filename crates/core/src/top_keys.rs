//! Top keys: which keys of each rule are denied (and checked) most, in bounded memory, for
//! operators asking "who is being limited?" without a metric series per key.
//!
//! Per rule, Filtered Space-Saving sketches (the `topk` crate, as [`crate::hot_keys`]) count denied
//! checks and all checks by bucket id; the key text is kept only for ids the sketches hold. A
//! count is an estimate with an error bound (its estimate minus the error is a lower bound of
//! the true count), over the current epoch and the one before it: with the default epoch of 5
//! minutes, the last 5 to 10 minutes. Memory is bounded: at most `max_rules` rules are tracked,
//! each with four sketches of `k` counters and the text of at most `8·k` keys.
//!
//! The rules tracked are themselves a Space-Saving table, so that no one can fill it for good
//! (any client can name inline rules): once it is full, a rule not tracked is counted in a small
//! sketch of candidates, and takes the place of the tracked rule counted least over the same two
//! epochs as soon as it has been counted more (what it earned, a lower bound, counts as its
//! activity from then on; its keys are counted from then on). A rule not counted for two epochs
//! shows nothing any more and gives way to any newcomer; a rule counted often keeps its place
//! against a flood of rules counted once. Checks of a rule while it is not tracked are not
//! counted ([`TopKeys::untracked`]). Checks of tracked rules (the hot path) pay what they did
//! before plus a few relaxed atomics; only checks of untracked rules lock the candidates, and
//! only one that may win a place scans the table.

use parking_lot::{Mutex, RwLock};
use ringlimit_proto::peer::{TopBy, TopKey};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use topk::FilteredSpaceSaving;

/// How top keys are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopSettings {
    /// Counters per sketch (a key among the top `k` of its rule is found; memory about 100
    /// bytes a counter).
    pub k: usize,
    /// Length of an epoch: counts cover the current epoch and the previous one.
    pub epoch_ns: u64,
    /// Most rules tracked at once.
    pub max_rules: usize,
}

impl Default for TopSettings {
    fn default() -> Self {
        Self {
            k: 64,
            epoch_ns: 300 * 1_000_000_000,
            max_rules: 128,
        }
    }
}

const DENIED: usize = 0;
const CHECKS: usize = 1;

fn slot(by: TopBy) -> usize {
    match by {
        TopBy::Denied => DENIED,
        TopBy::Checks => CHECKS,
    }
}

struct RuleTop {
    epoch: u64,
    current: [FilteredSpaceSaving<u64>; 2],
    previous: [FilteredSpaceSaving<u64>; 2],
    /// The key of every id a sketch holds (and, until the next prune, of some it held).
    names: HashMap<u64, Box<str>>,
}

impl RuleTop {
    fn new(k: usize, epoch: u64) -> Self {
        let fresh = || [FilteredSpaceSaving::new(k), FilteredSpaceSaving::new(k)];
        Self {
            epoch,
            current: fresh(),
            previous: fresh(),
            names: HashMap::new(),
        }
    }

    /// Moves to `epoch`: the current counts become the previous ones (or both go, when more
    /// than one epoch passed).
    fn rotate(&mut self, epoch: u64, k: usize) {
        if epoch <= self.epoch {
            return;
        }
        let fresh = || [FilteredSpaceSaving::new(k), FilteredSpaceSaving::new(k)];
        self.previous = if epoch == self.epoch + 1 {
            std::mem::replace(&mut self.current, fresh())
        } else {
            self.current = fresh();
            fresh()
        };
        self.epoch = epoch;
        self.prune();
    }

    /// Forgets the keys of ids no sketch holds.
    fn prune(&mut self) {
        let held: HashSet<u64> = self
            .current
            .iter()
            .chain(&self.previous)
            .flat_map(|s| s.iter().map(|(id, _)| *id))
            .collect();
        self.names.retain(|id, _| held.contains(id));
    }

    fn record(&mut self, id: u64, key: &str, by: TopBy, weight: u64, k: usize) {
        let sketch = &mut self.current[slot(by)];
        sketch.insert(id, weight);
        if !self.names.contains_key(&id) && sketch.get(&id).is_some() {
            // Pruned at twice what the sketches can hold, so that a prune (a pass over every
            // name) comes at most once every 4·k new names, not on every one when keys churn.
            if self.names.len() >= 8 * k {
                self.prune();
            }
            self.names.insert(id, key.into());
        }
    }

    fn top(&self, by: TopBy, n: usize) -> Vec<TopKey> {
        let (cur, prev) = (&self.current[slot(by)], &self.previous[slot(by)]);
        let ids: HashSet<u64> = cur.iter().chain(prev.iter()).map(|(id, _)| *id).collect();
        let mut out: Vec<TopKey> = ids
            .into_iter()
            .filter_map(|id| {
                let name = self.names.get(&id)?;
                let (a, b) = (cur.estimate(&id), prev.estimate(&id));
                Some(TopKey {
                    key: name.to_string(),
                    count: a.estimated_count() + b.estimated_count(),
                    error: a.associated_error() + b.associated_error(),
                })
            })
            .filter(|t| t.count > 0)
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        out.truncate(n);
        out
    }
}

/// One decided check in this many is counted into the top keys' checks (with this weight);
/// every denied one is counted into their denials. Each count takes the rule's lock and a
/// Space-Saving update, so the sample is sparse enough to stay off the check's cost: the keys
/// checked most are the ones checked thousands of times, which a 1-in-64 sample finds as well
/// (see the docs' benchmarks page, "Top keys").
pub const CHECKS_SAMPLE: u32 = 64;

/// Denials one thread counts one by one in each [`DENIALS_WINDOW_NS`]; beyond them (a flood:
/// more than 10,000 a second on one thread) one in [`DENIALS_SAMPLE`] is counted, with that
/// weight. Denials at the rates people read them at are counted exactly; a flood costs the
/// sketches a sixteenth of what it would, and its keys still stand out by as much.
pub const DENIALS_EXACT: u32 = 1_000;
/// See [`DENIALS_EXACT`].
pub const DENIALS_WINDOW_NS: u64 = 100_000_000;
/// See [`DENIALS_EXACT`].
pub const DENIALS_SAMPLE: u32 = 16;

thread_local! {
    static TURN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// This thread's denials: the window they fall in, and how many fell in it.
    static DENIALS: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// What of one decided check the top keys count (see [`CHECKS_SAMPLE`], [`DENIALS_EXACT`]),
/// chosen before the caller names the rule and the key (which costs it a string for an inline
/// rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// Counted into the checks, with weight [`CHECKS_SAMPLE`].
    pub sampled: bool,
    /// Counted into the denials with this weight (0: not counted).
    pub denied: u64,
}

impl Counted {
    /// This thread's next check at `now_ns`, `denied` or not.
    pub fn of(denied: bool, now_ns: u64) -> Self {
        let turn = TURN.with(|t| {
            let turn = t.get().wrapping_add(1);
            t.set(turn);
            turn
        });
        let sampled = turn.is_multiple_of(CHECKS_SAMPLE);
        let denied = match denied {
            false => 0,
            true => DENIALS.with(|d| {
                let (window, n) = d.get();
                let now = now_ns / DENIALS_WINDOW_NS;
                let n = if window == now {
                    n.saturating_add(1)
                } else {
                    1
                };
                d.set((now, n));
                match n <= DENIALS_EXACT {
                    true => 1,
                    false if turn.is_multiple_of(DENIALS_SAMPLE) => u64::from(DENIALS_SAMPLE),
                    false => 0,
                }
            }),
        };
        Self { sampled, denied }
    }

    /// Nothing to count.
    pub fn is_nothing(self) -> bool {
        !self.sampled && self.denied == 0
    }
}

/// What a tracked rule was counted (weights, checks and denials alike) in its last epoch and
/// the one before: how it competes for its place. Written under its rule's lock (one writer at
/// a time), read without it by the scan that chooses which rule gives way.
#[derive(Debug, Default)]
struct Activity {
    epoch: AtomicU64,
    current: AtomicU64,
    previous: AtomicU64,
}

impl Activity {
    fn new(epoch: u64, earned: u64) -> Self {
        Self {
            epoch: AtomicU64::new(epoch),
            current: AtomicU64::new(earned),
            previous: AtomicU64::new(0),
        }
    }

    /// Adds `weight` in `epoch` (the caller holds the rule's lock).
    fn add(&self, epoch: u64, weight: u64) {
        let last = self.epoch.load(Ordering::Relaxed);
        if epoch > last {
            let carried = if epoch == last + 1 {
                self.current.load(Ordering::Relaxed)
            } else {
                0
            };
            self.previous.store(carried, Ordering::Relaxed);
            self.current.store(0, Ordering::Relaxed);
            self.epoch.store(epoch, Ordering::Relaxed);
        }
        let now = self.current.load(Ordering::Relaxed);
        self.current
            .store(now.saturating_add(weight), Ordering::Relaxed);
    }

    /// What was counted in `epoch` and the one before (what the rule's counts still show).
    fn score(&self, epoch: u64) -> u64 {
        let last = self.epoch.load(Ordering::Relaxed);
        let current = self.current.load(Ordering::Relaxed);
        if last >= epoch {
            current.saturating_add(self.previous.load(Ordering::Relaxed))
        } else if last + 1 == epoch {
            current
        } else {
            0
        }
    }
}

/// One tracked rule: its keys' counts, and its own.
struct Tracked {
    top: Mutex<RuleTop>,
    activity: Activity,
}

/// Rules counted while the table was full, by a hash of their name: what each has earned over
/// the current epoch and the one before, against the tracked rules' [`Activity`].
struct Candidates {
    epoch: u64,
    current: FilteredSpaceSaving<u64>,
    previous: FilteredSpaceSaving<u64>,
    /// The least activity of a tracked rule when the table was last scanned in this epoch: a
    /// lower bound of it (activities only grow within an epoch), so a candidate that earned no
    /// more cannot win a place, and the scan is skipped.
    floor: Option<u64>,
}

impl Candidates {
    fn new(k: usize) -> Self {
        Self {
            epoch: 0,
            current: FilteredSpaceSaving::new(k),
            previous: FilteredSpaceSaving::new(k),
            floor: None,
        }
    }

    fn rotate(&mut self, epoch: u64) {
        if epoch <= self.epoch {
            return;
        }
        let k = self.current.k();
        self.previous = if epoch == self.epoch + 1 {
            std::mem::replace(&mut self.current, FilteredSpaceSaving::new(k))
        } else {
            self.current = FilteredSpaceSaving::new(k);
            FilteredSpaceSaving::new(k)
        };
        self.epoch = epoch;
        self.floor = None;
    }

    /// Counts `weight` for rule `hash`; what it has surely earned (a lower bound).
    fn add(&mut self, hash: u64, weight: u64) -> u64 {
        self.current.insert(hash, weight);
        let sure = |s: &FilteredSpaceSaving<u64>| {
            s.get(&hash)
                .map_or(0, |e| e.estimated_count() - e.associated_error())
        };
        sure(&self.current).saturating_add(sure(&self.previous))
    }
}

fn rule_hash(rule: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    rule.hash(&mut h);
    h.finish()
}

/// Tables made in this process, for [`TopKeys::id`].
static NEXT_TABLE: AtomicU64 = AtomicU64::new(0);

/// A thread's last rule counted: which table, at which generation of its rules.
struct LastRule {
    table: u64,
    generation: u64,
    name: Box<str>,
    tracked: Arc<Tracked>,
}

thread_local! {
    static LAST_RULE: std::cell::RefCell<Option<LastRule>> = const { std::cell::RefCell::new(None) };
}

/// Every tracked rule's top keys (see the module doc). Shared: each rule behind its own lock.
pub struct TopKeys {
    settings: TopSettings,
    rules: RwLock<HashMap<Box<str>, Arc<Tracked>>>,
    /// This table among every one in the process, and how many times its rules changed: a
    /// thread's [`LastRule`] is good while both are the same.
    id: u64,
    generation: AtomicU64,
    candidates: Mutex<Candidates>,
    untracked: AtomicU64,
    replaced: AtomicU64,
}

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeys")
            .field("settings", &self.settings)
            .field("rules", &self.rules.read().len())
            .finish_non_exhaustive()
    }
}

impl Default for TopKeys {
    fn default() -> Self {
        Self::new(TopSettings::default())
    }
}

impl TopKeys {
    pub fn new(settings: TopSettings) -> Self {
        Self {
            settings: TopSettings {
                k: settings.k.max(1),
                epoch_ns: settings.epoch_ns.max(1),
                ..settings
            },
            rules: RwLock::new(HashMap::new()),
            id: NEXT_TABLE.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            candidates: Mutex::new(Candidates::new(settings.max_rules.max(1))),
            untracked: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
        }
    }

    fn epoch(&self, now_ns: u64) -> u64 {
        now_ns / self.settings.epoch_ns
    }

    fn tracked(&self, epoch: u64, earned: u64) -> Arc<Tracked> {
        Arc::new(Tracked {
            top: Mutex::new(RuleTop::new(self.settings.k, epoch)),
            activity: Activity::new(epoch, earned),
        })
    }

    /// The rule's place in the table, taken now if there is room or if it has earned it (see
    /// the module doc); `None` while it has not.
    fn admit(&self, rule: &str, weight: u64, epoch: u64) -> Option<Arc<Tracked>> {
        let max = self.settings.max_rules;
        if self.rules.read().len() < max {
            let mut rules = self.rules.write();
            if let Some(r) = rules.get(rule) {
                return Some(r.clone());
            }
            if rules.len() < max {
                let r = self.tracked(epoch, 0);
                rules.insert(rule.into(), r.clone());
                self.generation.fetch_add(1, Ordering::Release);
                return Some(r);
            }
        }
        let mut candidates = self.candidates.lock();
        candidates.rotate(epoch);
        let earned = candidates.add(rule_hash(rule), weight);
        if candidates.floor.is_some_and(|floor| earned <= floor) {
            return None;
        }
        let mut rules = self.rules.write();
        if let Some(r) = rules.get(rule) {
            return Some(r.clone());
        }
        let least = |rules: &HashMap<Box<str>, Arc<Tracked>>| {
            rules
                .iter()
                .map(|(name, r)| (r.activity.score(epoch), name))
                .min()
                .map(|(score, name)| (score, name.clone()))
        };
        let (score, name) = least(&rules)?;
        if earned <= score {
            candidates.floor = Some(score);
            return None;
        }
        rules.remove(&name);
        self.generation.fetch_add(1, Ordering::Release);
        self.replaced.fetch_add(1, Ordering::Relaxed);
        // The weight being counted is added by the caller.
        let r = self.tracked(epoch, earned.saturating_sub(weight));
        rules.insert(rule.into(), r.clone());
        candidates.floor = least(&rules).map(|(score, _)| score);
        Some(r)
    }

    /// Counts one decided check of `key` (bucket `id`) under `rule` as `counted` says.
    pub fn count(&self, rule: &str, id: u64, key: &str, counted: Counted, now_ns: u64) {
        if counted.sampled {
            let weight = u64::from(CHECKS_SAMPLE);
            self.record(rule, id, key, TopBy::Checks, weight, now_ns);
        }
        if counted.denied > 0 {
            self.record(rule, id, key, TopBy::Denied, counted.denied, now_ns);
        }
    }

    /// Counts `weight` checks (`by` checks) or denials (`by` denied) of `key` (bucket `id`)
    /// under `rule` at `now_ns` (a caller that samples records one in `weight`).
    pub fn record(&self, rule: &str, id: u64, key: &str, by: TopBy, weight: u64, now_ns: u64) {
        let epoch = self.epoch(now_ns);
        let count = |r: &Tracked| {
            let mut top = r.top.lock();
            top.rotate(epoch, self.settings.k);
            r.activity.add(epoch, weight);
            top.record(id, key, by, weight, self.settings.k);
        };
        // The rule this thread counted last, most of the time (a batch is mostly one rule):
        // neither the table's lock nor a hash of the name, and no reference count touched.
        let generation = self.generation.load(Ordering::Acquire);
        let counted = LAST_RULE.with(|last| match &*last.borrow() {
            Some(l) if l.table == self.id && l.generation == generation && *l.name == *rule => {
                count(&l.tracked);
                true
            }
            _ => false,
        });
        if counted {
            return;
        }
        let found = self.rules.read().get(rule).cloned();
        let Some(r) = found.or_else(|| self.admit(rule, weight, epoch)) else {
            self.untracked.fetch_add(weight, Ordering::Relaxed);
            return;
        };
        count(&r);
        LAST_RULE.with(|last| {
            *last.borrow_mut() = Some(LastRule {
                table: self.id,
                generation,
                name: rule.into(),
                tracked: r,
            });
        });
    }

    /// The `n` keys of `rule` counted most `by`, most first (ties by key).
    pub fn top(&self, rule: &str, by: TopBy, n: usize, now_ns: u64) -> Vec<TopKey> {
        let Some(r) = self.rules.read().get(rule).cloned() else {
            return Vec::new();
        };
        let mut r = r.top.lock();
        r.rotate(self.epoch(now_ns), self.settings.k);
        r.top(by, n)
    }

    /// The `n` most denied (rule, key) pairs over every rule, most first: what the metric
    /// shows, so that its series stay few whatever the keys.
    pub fn most_denied(&self, n: usize, now_ns: u64) -> Vec<(String, TopKey)> {
        let rules: Vec<(String, Arc<Tracked>)> = self
            .rules
            .read()
            .iter()
            .map(|(name, r)| (name.to_string(), r.clone()))
            .collect();
        let mut all = Vec::new();
        for (name, r) in rules {
            let mut r = r.top.lock();
            r.rotate(self.epoch(now_ns), self.settings.k);
            all.extend(
                r.top(TopBy::Denied, n)
                    .into_iter()
                    .map(|t| (name.clone(), t)),
            );
        }
        all.sort_by(|a, b| (b.1.count, &a.0, &a.1.key).cmp(&(a.1.count, &b.0, &b.1.key)));
        all.truncate(n);
        all
    }

    /// Rules tracked now.
    pub fn rules(&self) -> usize {
        self.rules.read().len()
    }

    /// Checks not counted because `max_rules` rules were tracked already (and their rule had
    /// not yet earned a place).
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// Tracked rules that gave way to another (idle, or counted less).
    pub fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }
}

/// Merges members' top keys of one rule: counts (and error bounds) of a key summed over the
/// members, the `n` most counted first.
pub fn merge(lists: impl IntoIterator<Item = Vec<TopKey>>, n: usize) -> Vec<TopKey> {
    let mut by_key: HashMap<String, (u64, u64)> = HashMap::new();
    for list in lists {
        for t in list {
            let e = by_key.entry(t.key).or_default();
            e.0 += t.count;
            e.1 += t.error;
        }
    }
    let mut out: Vec<TopKey> = by_key
        .into_iter()
        .map(|(key, (count, error))| TopKey { key, count, error })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60 * 1_000_000_000;

    fn id(key: &str) -> u64 {
        ringlimit_proto::identity::bucket_id(7, key)
    }

    fn record(t: &TopKeys, rule: &str, key: &str, denied: bool, times: u64, now: u64) {
        for _ in 0..times {
            t.record(rule, id(key), key, TopBy::Checks, 1, now);
            if denied {
                t.record(rule, id(key), key, TopBy::Denied, 1, now);
            }
        }
    }

    /// Among 100,000 keys checked once, the few denied often are found, in order, with exact
    /// counts (they were held since their first check), and other rules apart.
    #[test]
    fn the_most_denied_keys_stand_out_of_many() {
        let t = TopKeys::default();
        for i in 0..100_000 {
            record(&t, "per-ip", &format!("ip:{i}"), false, 1, 0);
        }
        for (key, times) in [("ip:bad-1", 900), ("ip:bad-2", 500), ("ip:bad-3", 300)] {
            record(&t, "per-ip", key, true, times, MIN);
        }
        record(&t, "per-user", "user:1", true, 50, MIN);
        let top = t.top("per-ip", TopBy::Denied, 3, MIN);
        let got: Vec<(&str, u64)> = top.iter().map(|k| (k.key.as_str(), k.count)).collect();
        assert_eq!(
            got,
            [("ip:bad-1", 900), ("ip:bad-2", 500), ("ip:bad-3", 300)]
        );
        assert!(top.iter().all(|k| k.error == 0), "{top:?}");
        assert_eq!(t.top("per-user", TopBy::Denied, 10, MIN).len(), 1);
        assert!(t.top("nope", TopBy::Denied, 10, MIN).is_empty());
        let checked = t.top("per-ip", TopBy::Checks, 1, MIN);
        assert_eq!(checked[0].key, "ip:bad-1");
        assert!(checked[0].count - checked[0].error <= 900);
        assert!(checked[0].count >= 900);
        let most = t.most_denied(2, MIN);
        assert_eq!(
            most.iter()
                .map(|(r, k)| (r.as_str(), k.key.as_str()))
                .collect::<Vec<_>>(),
            [("per-ip", "ip:bad-1"), ("per-ip", "ip:bad-2")]
        );
    }

    /// Counts cover the current epoch and the previous one; older ones are forgotten, keys too.
    #[test]
    fn counts_age_out_after_two_epochs() {
        let t = TopKeys::default();
        record(&t, "r", "old", true, 10, 0);
        record(&t, "r", "new", true, 5, 5 * MIN);
        let top = t.top("r", TopBy::Denied, 10, 5 * MIN);
        assert_eq!(top.len(), 2, "{top:?}");
        assert!(t.top("r", TopBy::Denied, 10, 10 * MIN)[0].key == "new");
        assert!(t.top("r", TopBy::Denied, 10, 15 * MIN).is_empty());
    }

    /// Memory stays bounded: never more than `max_rules` rules, key texts within 4·k each,
    /// however many rules are counted.
    #[test]
    fn memory_is_bounded() {
        let t = TopKeys::new(TopSettings {
            k: 8,
            max_rules: 3,
            ..TopSettings::default()
        });
        for r in 0..5 {
            for i in 0..10_000 {
                record(&t, &format!("rule-{r}"), &format!("k{i}"), i % 2 == 0, 1, 0);
            }
        }
        for i in 0..10_000 {
            record(&t, &format!("one-off-{i}"), "k", true, 1, 0);
        }
        assert_eq!(t.rules(), 3);
        assert!(t.untracked() > 0);
        for r in t.rules.read().values() {
            assert!(r.top.lock().names.len() <= 8 * 8);
        }
        assert!(t.candidates.lock().current.iter().count() <= 3);
    }

    /// A full table of rules counted a few times (an inline rule is anyone's to name) gives way
    /// to a rule denied more: its denials show, from the check that won it its place.
    #[test]
    fn a_rule_denied_more_takes_the_place_of_one_counted_less() {
        let t = TopKeys::default();
        for r in 0..128 {
            record(&t, &format!("filler-{r}"), "k", true, 2, 0);
        }
        assert_eq!(t.rules(), 128);
        record(&t, "victim", "user:1", true, 47, MIN);
        let top = t.top("victim", TopBy::Denied, 10, MIN);
        assert_eq!(top.len(), 1, "{top:?}");
        assert_eq!(top[0].key, "user:1");
        // Counted from the record that out-counted the least filler (4: 2 checks, 2 denials),
        // the victim's fifth; the four before it were not.
        assert!(top[0].count >= 40, "{top:?}");
        assert_eq!((t.rules(), t.replaced()), (128, 1));
        assert!(t.untracked() > 0 && t.untracked() < 10, "{}", t.untracked());
        // The fillers that kept their place still show theirs.
        assert_eq!(
            (0..128)
                .filter(|r| !t
                    .top(&format!("filler-{r}"), TopBy::Denied, 1, MIN)
                    .is_empty())
                .count(),
            127
        );
    }

    /// A rule not counted for two epochs shows nothing any more: the first check of a new rule
    /// takes its place, however much it was counted before.
    #[test]
    fn idle_rules_age_out() {
        let t = TopKeys::default();
        for r in 0..128 {
            record(&t, &format!("old-{r}"), "k", true, 1_000, 0);
        }
        record(&t, "late", "k", true, 1, 5 * MIN);
        assert!(t.top("late", TopBy::Denied, 1, 5 * MIN).is_empty());
        assert_eq!(t.replaced(), 0);
        for r in 0..200 {
            record(&t, &format!("new-{r}"), "k", true, 1, 10 * MIN);
        }
        assert_eq!(t.rules(), 128);
        assert_eq!(t.replaced(), 128);
        let top = t.top("new-0", TopBy::Denied, 1, 10 * MIN);
        assert_eq!((top.len(), top[0].count), (1, 1), "{top:?}");
        // The newcomers are as idle as each other: the next ones wait until they earn more.
        assert!(t.top("new-199", TopBy::Denied, 1, 10 * MIN).is_empty());
        record(&t, "new-199", "k", true, 3, 10 * MIN);
        assert_eq!(t.top("new-199", TopBy::Denied, 1, 10 * MIN).len(), 1);
    }

    /// A flood of rules each counted once does not push out rules counted more often.
    #[test]
    fn a_flood_of_one_off_rules_keeps_the_busy_ones() {
        let t = TopKeys::default();
        for r in 0..128 {
            record(&t, &format!("busy-{r}"), "k", true, 10, 0);
        }
        for i in 0..100_000 {
            t.record(&format!("junk-{i}"), 1, "k", TopBy::Denied, 1, MIN);
        }
        assert_eq!(t.replaced(), 0);
        assert_eq!(t.untracked(), 100_000);
        assert!((0..128).all(|r| {
            !t.top(&format!("busy-{r}"), TopBy::Denied, 1, MIN)
                .is_empty()
        }));
    }

    #[test]
    fn members_lists_merge_by_key() {
        let k = |key: &str, count, error| TopKey {
            key: key.into(),
            count,
            error,
        };
        let merged = merge(
            [
                vec![k("a", 5, 1), k("b", 4, 0)],
                vec![k("b", 3, 1), k("c", 1, 0)],
            ],
            2,
        );
        assert_eq!(merged, [k("b", 7, 1), k("a", 5, 1)]);
    }

    /// Denials are counted one by one up to a thread's budget per window, then one in 16 with
    /// weight 16: the total weight stays the number of denials (to a sample's grain), and a
    /// new window counts one by one again.
    #[test]
    fn a_flood_of_denials_is_sampled_with_its_weight() {
        let weights = |n: u32, now: u64| -> Vec<u64> {
            (0..n).map(|_| Counted::of(true, now).denied).collect()
        };
        let first = weights(DENIALS_EXACT, 5);
        assert!(first.iter().all(|w| *w == 1));
        let flood = weights(16 * 1_000, 5);
        assert!(
            flood
                .iter()
                .all(|w| *w == 0 || *w == u64::from(DENIALS_SAMPLE))
        );
        assert_eq!(flood.iter().sum::<u64>(), 16 * 1_000);
        assert!(weights(10, DENIALS_WINDOW_NS + 5).iter().all(|w| *w == 1));
        assert_eq!(Counted::of(false, 5).denied, 0);
    }
}
