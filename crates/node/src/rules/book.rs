//! The rules in force: the rules file's (reloaded when it changes) and those written through the
//! admin API (replicated by gossip, kept under `--data-dir`), put in force together
//! ([`super::InForce`]). File rules win a name: the API cannot write one (409), and an API rule
//! whose name the file comes to define is left out while the file defines it.
//!
//! A rule changed while buckets exist keeps them: a bucket's identity is the rule's name and the
//! key (file and API rules alike), so the next check of the key meets its consumption under the
//! new parameters, fitted to them (`BucketState::fit_to_rule`). Window algorithms keep their
//! counts (a lower limit denies at once what is already over it); a new period carries the
//! count of the window current at the change into the new rule's window containing now. Token
//! and leaky buckets keep the time they need to refill, which a new rate rescales (3 of 5 an
//! hour spent is 36 minutes: 3.6 of 6 an hour), but never more than an empty bucket of the new
//! rule (3 per hour spent, then 3 per minute: 20 s to the next token, not an hour). Another
//! algorithm starts the bucket afresh.
//!
//! An entry whose version is far ahead of this node's clock is refused from the data dir, from
//! gossip and from a name owner's answer alike (see [`crate::rules::api`]), with a warning
//! naming where it came from; so is the warning about an entry that does not validate here
//! (stored by a newer version, or a file edited by hand), once per entry.

use super::InForce;
use crate::metrics::{Family, load};
use crate::rules::api::{self, ApiRules, Entry, StoreError, TooFarAhead, Version};
use crate::rules::{RuleSet, RulesError};
use parking_lot::Mutex;
use ringlimit_core::clock::unix_ms;
use ringlimit_proto::peer::RuleOp;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why an admin API change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("rule {0:?} is defined in the rules file; change it there")]
    FromFile(String),
    #[error("{0}")]
    Invalid(RulesError),
    #[error("no rule {0:?} was written through the API")]
    NotFound(String),
    #[error("the change could not be saved: {0}")]
    Persist(StoreError),
    #[error("rule {name:?} is {}, not the version If-Match names", .current.as_deref().map_or("absent".to_owned(), |v| format!("at version {v}")))]
    VersionMismatch {
        name: String,
        current: Option<String>,
    },
}

impl ChangeError {
    /// The admin API's error code for this refusal (and what a member that owns the rule's
    /// name answers another with).
    pub fn code(&self) -> &'static str {
        match self {
            ChangeError::FromFile(_) => "rule_from_file",
            ChangeError::Invalid(_) => "invalid_rule",
            ChangeError::NotFound(_) => "unknown_rule",
            ChangeError::Persist(_) => "not_saved",
            ChangeError::VersionMismatch { .. } => "version_mismatch",
        }
    }
}

/// An `If-Match` precondition: the change goes ahead only if the rule is now at one of these
/// versions (as [`Entry::tag`] shows them), or, for `*`, exists at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    Any,
    Versions(Vec<String>),
}

impl IfMatch {
    /// Parses the header's value: `*`, or versions as entity tags (quoted or not, weak or not),
    /// separated by commas.
    pub fn parse(header: &str) -> Self {
        let header = header.trim();
        if header == "*" {
            return IfMatch::Any;
        }
        IfMatch::Versions(
            header
                .split(',')
                .map(|t| {
                    let t = t.trim();
                    let t = t.strip_prefix("W/").unwrap_or(t);
                    t.trim_matches('"').to_owned()
                })
                .filter(|t| !t.is_empty())
                .collect(),
        )
    }

    /// Whether `current` (the rule's entry now, `None` or a delete when it does not exist)
    /// meets the precondition.
    fn admits(&self, current: Option<&Entry>) -> bool {
        let Some(e) = current.filter(|e| e.spec.is_some()) else {
            return false;
        };
        match self {
            IfMatch::Any => true,
            IfMatch::Versions(v) => v.contains(&e.tag()),
        }
    }
}

/// API changes counted (`ringlimit_rules_api_*` metrics).
#[derive(Debug, Default)]
pub struct BookStats {
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    /// Entries learnt from peers that changed something here.
    pub merged: AtomicU64,
    /// Saves to `--data-dir` that failed (the change is in force and gossiped, not on disk).
    pub save_failed: AtomicU64,
}

struct Inner {
    file: RuleSet,
    api: ApiRules,
    /// Where each API entry came from, for warnings about it.
    origin: HashMap<String, String>,
    /// The entries that did not validate here and were said so (once each).
    warned: HashSet<(String, Version)>,
}

/// What an entry written through this node's admin API is said to come from.
const WRITTEN_HERE: &str = "written through this node's admin API";

/// The file's rules and the API's, and the rules in force they are put in.
pub struct RuleBook {
    in_force: Arc<InForce>,
    node_id: String,
    data_dir: Option<PathBuf>,
    inner: Mutex<Inner>,
    /// Bumped on every change of the API rules: the gossip publisher follows it.
    changes: tokio::sync::watch::Sender<u64>,
    pub stats: BookStats,
}

impl RuleBook {
    /// A book over `in_force`, whose rules are the file's; API rules are read from `data_dir`
    /// (when set) and put in force at once.
    pub fn open(
        in_force: Arc<InForce>,
        node_id: &str,
        data_dir: Option<PathBuf>,
    ) -> Result<Self, StoreError> {
        let mut origin = HashMap::new();
        let api = match &data_dir {
            Some(dir) => {
                let (api, refused) = ApiRules::load(dir, unix_ms())?;
                let stored = format!("stored in {}", dir.join(api::FILE).display());
                for e in refused {
                    tracing::warn!(error = %e, file = %dir.join(api::FILE).display(), "stored API rule refused: its version is more than a day ahead of this node's clock (a corrupt or forged file would pin every later change's version)");
                }
                origin.extend(
                    api.entries()
                        .map(|(name, _)| (name.clone(), stored.clone())),
                );
                api
            }
            None => ApiRules::default(),
        };
        let file = (*in_force.rules()).clone();
        let book = Self {
            in_force,
            node_id: node_id.to_owned(),
            data_dir,
            inner: Mutex::new(Inner {
                file,
                api,
                origin,
                warned: HashSet::new(),
            }),
            changes: tokio::sync::watch::channel(0).0,
            stats: BookStats::default(),
        };
        book.put_in_force(&mut book.inner.lock());
        Ok(book)
    }

    /// Follows changes of the API rules (a counter).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// New rules from the rules file; returns whether the rules in force changed.
    pub fn set_file(&self, file: RuleSet) -> bool {
        let mut inner = self.inner.lock();
        if inner.file == file {
            return false;
        }
        inner.file = file;
        self.put_in_force(&mut inner);
        true
    }

    /// Creates or replaces API rule `name` with `spec` (the rules file's fields, as JSON), as
    /// the token named `by`, if the rule meets `if_match`.
    pub fn put(
        &self,
        name: &str,
        spec: serde_json::Value,
        now_ms: u64,
        by: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<Entry, ChangeError> {
        api::validate(name, &spec).map_err(ChangeError::Invalid)?;
        let mut inner = self.inner.lock();
        if inner.file.get(name).is_some() {
            return Err(ChangeError::FromFile(name.to_owned()));
        }
        precondition(&inner.api, name, if_match)?;
        let entry = inner
            .api
            .write(name, Some(spec), now_ms, &self.node_id, Some(by));
        inner
            .origin
            .insert(name.to_owned(), WRITTEN_HERE.to_owned());
        self.changed(&mut inner)?;
        Ok(entry)
    }

    /// Deletes API rule `name`, as the token named `by`, if the rule meets `if_match`.
    pub fn delete(
        &self,
        name: &str,
        now_ms: u64,
        by: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<Entry, ChangeError> {
        let mut inner = self.inner.lock();
        if inner.file.get(name).is_some() {
            return Err(ChangeError::FromFile(name.to_owned()));
        }
        if inner.api.get(name).is_none_or(|e| e.spec.is_none()) {
            return Err(ChangeError::NotFound(name.to_owned()));
        }
        precondition(&inner.api, name, if_match)?;
        let entry = inner.api.write(name, None, now_ms, &self.node_id, Some(by));
        inner
            .origin
            .insert(name.to_owned(), WRITTEN_HERE.to_owned());
        self.changed(&mut inner)?;
        Ok(entry)
    }

    /// The API entry of `name` (a rule or a delete), as this node knows it.
    pub fn api_entry(&self, name: &str) -> Option<Entry> {
        self.inner.lock().api.get(name).cloned()
    }

    /// Counts a change taken through this node's admin API (wherever it was decided).
    pub fn count_request(&self, op: &RuleOp) {
        match op {
            RuleOp::Put { .. } => self.stats.puts.fetch_add(1, Ordering::Relaxed),
            RuleOp::Delete => self.stats.deletes.fetch_add(1, Ordering::Relaxed),
            RuleOp::Get => return,
        };
    }

    /// Merges the entry of `name` that the member owning the name answered a request this node
    /// took with (not counted as learnt from peers: it is this node's own request).
    pub fn adopt(&self, name: &str, entry: Entry) {
        let mut inner = self.inner.lock();
        let from = format!(
            "the answer of the member that keeps the name (written by node {})",
            entry.version.node
        );
        match inner.api.merge(name, entry, unix_ms()) {
            Ok(true) => {
                inner.origin.insert(name.to_owned(), from);
                let _ = self.changed(&mut inner);
            }
            Ok(false) => {}
            Err(e) => refused_ahead(&e, &from),
        }
    }

    /// Merges entries learnt from peers; returns how many changed something here.
    pub fn merge(&self, entries: impl IntoIterator<Item = (String, Entry)>) -> usize {
        self.merge_at(entries, unix_ms())
    }

    /// [`RuleBook::merge`] at wall time `now_ms`.
    fn merge_at(&self, entries: impl IntoIterator<Item = (String, Entry)>, now_ms: u64) -> usize {
        let mut inner = self.inner.lock();
        let mut merged = 0;
        for (name, entry) in entries {
            let what = describe(&entry);
            let by = entry.version.node.clone();
            match inner.api.merge(&name, entry, now_ms) {
                Ok(true) => {
                    tracing::info!(rule = %name, change = what, by = %by, "API rule changed by a peer");
                    let from = format!("learnt from peers (written by node {by})");
                    inner.origin.insert(name, from);
                    merged += 1;
                }
                Ok(false) => {}
                Err(e) => refused_ahead(&e, &format!("gossip (written by node {by})")),
            }
        }
        if merged > 0 {
            self.stats
                .merged
                .fetch_add(merged as u64, Ordering::Relaxed);
            // Saving can only fail here: the change is in force and gossiped already.
            let _ = self.changed(&mut inner);
        }
        merged
    }

    /// Forgets deletes older than [`api::TOMBSTONE_KEEP_MS`].
    pub fn prune(&self, now_ms: u64) {
        let mut inner = self.inner.lock();
        if inner.api.prune(now_ms, api::TOMBSTONE_KEEP_MS) > 0 {
            let _ = self.changed(&mut inner);
        }
    }

    /// Every API entry, tombstones included, by name.
    pub fn api_entries(&self) -> Vec<(String, Entry)> {
        let inner = self.inner.lock();
        inner
            .api
            .entries()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    /// The API entries in force, by name: rules (not deletes) whose name the file does not
    /// define.
    pub fn api_in_force(&self) -> HashMap<String, Entry> {
        let inner = self.inner.lock();
        inner
            .api
            .entries()
            .filter(|(name, e)| e.spec.is_some() && inner.file.get(name).is_none())
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    /// Puts the API rules in force, tells the publisher, saves them.
    fn changed(&self, inner: &mut Inner) -> Result<(), ChangeError> {
        self.put_in_force(inner);
        self.changes.send_modify(|n| *n += 1);
        let Some(dir) = &self.data_dir else {
            return Ok(());
        };
        inner.api.save(dir).map_err(|e| {
            self.stats.save_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "API rules not saved");
            ChangeError::Persist(e)
        })
    }

    fn put_in_force(&self, inner: &mut Inner) {
        let (api_rules, invalid) = inner.api.rules();
        for (name, e) in invalid {
            let Some(version) = inner.api.get(name).map(|entry| entry.version.clone()) else {
                continue;
            };
            if inner.warned.insert((name.to_owned(), version)) {
                let from = inner.origin.get(name).map_or("unknown", String::as_str);
                tracing::warn!(error = %e, came_from = from, "an API rule does not validate on this node (written by a newer version, or edited by hand); left out of the rules in force");
            }
        }
        let (rules, shadowed) = inner.file.with_api(api_rules);
        for name in shadowed {
            tracing::warn!(rule = %name, "the rules file defines this API rule's name; the file's rule is in force");
        }
        if *self.in_force.rules() != rules {
            self.in_force.set_rules(rules);
        }
    }
}

/// Refuses a change whose `If-Match` the rule's current entry does not meet.
fn precondition(api: &ApiRules, name: &str, if_match: Option<&IfMatch>) -> Result<(), ChangeError> {
    let current = api.get(name);
    match if_match {
        Some(m) if !m.admits(current) => Err(ChangeError::VersionMismatch {
            name: name.to_owned(),
            current: current.filter(|e| e.spec.is_some()).map(Entry::tag),
        }),
        _ => Ok(()),
    }
}

/// Says that an entry from `from` was refused for its version far ahead.
fn refused_ahead(e: &TooFarAhead, from: &str) {
    tracing::warn!(error = %e, came_from = from, "API rule refused: its version is more than a day ahead of this node's clock (it would pin every later change's version)");
}

fn describe(e: &Entry) -> &'static str {
    if e.spec.is_some() { "put" } else { "delete" }
}

/// The admin API's rule changes as metrics, read at scrape time.
pub const METRICS: &[Family<RuleBook>] = &[
    Family::counter_by(
        "rules_api_changes",
        "Rules changed through this node's admin API, and changes learnt from peers.",
        "op",
        &[
            ("put", |b| load(&b.stats.puts)),
            ("delete", |b| load(&b.stats.deletes)),
            ("merged", |b| load(&b.stats.merged)),
        ],
    ),
    Family::counter(
        "rules_api_save_failed",
        "API rule changes in force but not saved under --data-dir.",
        |b| load(&b.stats.save_failed),
    ),
    Family::gauge(
        "rules_hash",
        "A fingerprint of the rules in force (file and admin API), 53 bits: equal on nodes of one version with the same rules.",
        |b| b.in_force.rules().fingerprint(),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::Local;
    use crate::rules::RuleSpec;
    use ringlimit_core::clock::ManualClock;
    use ringlimit_core::coordinator::Here;
    use serde_json::json;

    fn book(dir: Option<PathBuf>) -> RuleBook {
        let in_force = Arc::new(InForce::new(RuleSet::builtin()));
        RuleBook::open(in_force, "n0", dir).expect("opened")
    }

    #[test]
    fn api_rules_go_in_force_beside_the_file_and_never_over_it() {
        let b = book(None);
        b.put(
            "gold",
            json!({ "limit": 5, "period": "1m" }),
            1,
            "ops",
            None,
        )
        .expect("put");
        assert_eq!(
            b.in_force.rules().get("gold").map(|r| r.rule.limit),
            Some(5)
        );
        assert!(matches!(
            b.put(
                "default",
                json!({ "limit": 5, "period": "1m" }),
                2,
                "ops",
                None
            ),
            Err(ChangeError::FromFile(_))
        ));
        assert!(matches!(
            b.put("bad", json!({ "limit": 5 }), 3, "ops", None),
            Err(ChangeError::Invalid(_))
        ));
        assert!(b.in_force.rules().get("bad").is_none());
        b.delete("gold", 4, "ops", None).expect("deleted");
        assert!(b.in_force.rules().get("gold").is_none());
        assert!(matches!(
            b.delete("gold", 5, "ops", None),
            Err(ChangeError::NotFound(_))
        ));
        assert!(matches!(
            b.delete("default", 6, "ops", None),
            Err(ChangeError::FromFile(_))
        ));
    }

    /// Two operators cannot overwrite each other unknowingly: a change names the version it
    /// read, and one made since refuses it.
    #[test]
    fn if_match_refuses_a_change_over_a_version_not_read() {
        let b = book(None);
        let any = IfMatch::parse("*");
        assert!(matches!(
            b.put(
                "gold",
                json!({ "limit": 5, "period": "1m" }),
                1,
                "a",
                Some(&any)
            ),
            Err(ChangeError::VersionMismatch { current: None, .. })
        ));
        let first = b
            .put(
                "gold",
                json!({ "limit": 5, "period": "1m" }),
                1,
                "alice",
                None,
            )
            .expect("put");
        assert_eq!(first.author(), "alice");
        let read = IfMatch::parse(&format!("\"{}\"", first.tag()));
        let second = b
            .put(
                "gold",
                json!({ "limit": 6, "period": "1m" }),
                2,
                "bob",
                Some(&read),
            )
            .expect("bob read the current version");
        // Alice writes over what she read: refused, naming the version in force.
        let refused = b.put(
            "gold",
            json!({ "limit": 7, "period": "1m" }),
            3,
            "alice",
            Some(&read),
        );
        match refused {
            Err(ChangeError::VersionMismatch { current, .. }) => {
                assert_eq!(current, Some(second.tag()))
            }
            other => panic!("{other:?}"),
        }
        assert!(b.delete("gold", 4, "alice", Some(&read)).is_err());
        assert_eq!(
            b.in_force.rules().get("gold").map(|r| r.rule.limit),
            Some(6)
        );
        let list = IfMatch::parse(&format!("W/\"x\", \"{}\"", second.tag()));
        b.delete("gold", 5, "bob", Some(&list)).expect("deleted");
        assert_eq!(b.api_entry("gold").map(|e| e.by), Some(Some("bob".into())));
    }

    #[test]
    fn the_file_takes_a_name_back_from_the_api() {
        let b = book(None);
        b.put(
            "gold",
            json!({ "limit": 5, "period": "1m" }),
            1,
            "ops",
            None,
        )
        .expect("put");
        let file = RuleSet::from_yaml("rules:\n  - { name: gold, limit: 9, period: 1s }\n")
            .expect("valid");
        assert!(b.set_file(file));
        assert_eq!(
            b.in_force.rules().get("gold").map(|r| r.rule.limit),
            Some(9)
        );
    }

    /// Through the reload path (the file, then the API): a changed rule keeps a used-up key used
    /// up, but never for the old rule's time.
    #[test]
    fn a_changed_rule_keeps_a_used_up_key_used_up_for_the_new_rule_only() {
        const SEC: u64 = 1_000_000_000;
        // 50 minutes into a window of 2 hours (the old hourly windows end at its end).
        let start = 1_700_006_400 * SEC + 50 * 60 * SEC;
        let clock = ManualClock::new(start);
        let local = Local::alone(RuleSet::builtin(), 1000, Arc::new(clock.clone()));
        let b = RuleBook::open(local.rules().clone(), "n0", None).expect("opened");
        let file = |text: &str| RuleSet::from_yaml(text).expect("valid");
        let check = |rule: &str| {
            let p = local.rules().prepare_check("k", RuleSpec::Named(rule), 1);
            local.decide(&p.expect("valid"))
        };
        b.set_file(file(concat!(
            "rules:\n",
            "  - { name: tb, limit: 3, period: 1h }\n",
            "  - { name: sw, limit: 5, period: 1h, algorithm: sliding_window }\n",
        )));
        for rule in ["tb", "sw", "sw"] {
            while check(rule).allowed {}
        }

        clock.advance(SEC);
        assert!(b.set_file(file(concat!(
            "rules:\n",
            "  - { name: tb, limit: 3, period: 1m }\n",
            "  - { name: sw, limit: 5, period: 2h, algorithm: sliding_window }\n",
        ))));
        let tb = check("tb");
        assert!(!tb.allowed, "{tb:?}");
        assert!(tb.retry_after_ms <= 60_000, "{tb:?}");
        let sw = check("sw");
        assert!(!sw.allowed, "{sw:?}");

        // Through the admin API: burst 100 -> 10 at 1 per second.
        b.put(
            "api",
            json!({ "limit": 1, "period": "1s", "burst": 100 }),
            1,
            "ops",
            None,
        )
        .expect("put");
        for _ in 0..100 {
            assert!(check("api").allowed);
        }
        b.put(
            "api",
            json!({ "limit": 1, "period": "1s", "burst": 10 }),
            2,
            "ops",
            None,
        )
        .expect("put");
        let api = check("api");
        assert!(!api.allowed && api.retry_after_ms <= 1_000, "{api:?}");
    }

    fn rogue(ms: u64) -> Entry {
        Entry {
            version: Version {
                ms,
                counter: u32::MAX,
                node: "zzz".into(),
            },
            spec: Some(json!({ "limit": 1_000_000, "period": "1s" })),
            by: Some("alice".into()),
        }
    }

    /// A stored `api-rules.json` whose entry is at `ms = 2^64-1` no longer pins the node's
    /// rule-version clock: the entry is refused, and later changes get this node's time.
    #[test]
    fn a_stored_version_far_ahead_is_refused_and_later_changes_get_this_nodes_time() {
        let dir = tempfile::tempdir().expect("dir");
        let saved = json!({ "format": 1, "rules": {
            "rogue": rogue(u64::MAX),
            "kept": { "version": { "ms": 1_000, "counter": 0, "node": "a" },
                      "spec": { "limit": 7, "period": "1h" } },
        } });
        std::fs::write(dir.path().join(api::FILE), saved.to_string()).expect("written");
        let b = book(Some(dir.path().to_owned()));
        assert!(b.in_force.rules().get("rogue").is_none());
        assert!(b.api_entry("rogue").is_none());
        assert_eq!(
            b.in_force.rules().get("kept").map(|r| r.rule.limit),
            Some(7)
        );
        let now = unix_ms();
        let first = b
            .put(
                "gold",
                json!({ "limit": 5, "period": "1m" }),
                now,
                "ops",
                None,
            )
            .expect("put");
        let second = b
            .put(
                "gold",
                json!({ "limit": 6, "period": "1m" }),
                now + 1,
                "ops",
                None,
            )
            .expect("put");
        assert_eq!(
            (first.version.ms, second.version.ms),
            (now, now + 1),
            "the versions are this node's time"
        );
    }

    /// From gossip too: a version more than a day ahead is refused, one an hour ahead is taken.
    #[test]
    fn a_gossiped_version_far_ahead_is_refused() {
        let b = book(None);
        let now = 1_700_000_000_000;
        assert_eq!(b.merge_at([("rogue".to_owned(), rogue(u64::MAX))], now), 0);
        assert_eq!(
            b.merge_at(
                [("rogue".to_owned(), rogue(now + api::MAX_AHEAD_MS + 1))],
                now
            ),
            0
        );
        assert!(b.in_force.rules().get("rogue").is_none());
        assert_eq!(
            b.merge_at([("soon".to_owned(), rogue(now + 3_600_000))], now),
            1
        );
        assert!(b.in_force.rules().get("soon").is_some());
    }

    /// A stored rule that does not validate here is left out, and its origin is the data dir.
    #[test]
    fn a_stored_rule_that_does_not_validate_is_left_out_naming_the_data_dir() {
        let dir = tempfile::tempdir().expect("dir");
        let saved = json!({ "format": 1, "rules": {
            "future": { "version": { "ms": 1_000, "counter": 0, "node": "a" },
                        "spec": { "limit": 7, "period": "1h", "colour": "blue" } },
        } });
        std::fs::write(dir.path().join(api::FILE), saved.to_string()).expect("written");
        let b = book(Some(dir.path().to_owned()));
        assert!(b.in_force.rules().get("future").is_none());
        let inner = b.inner.lock();
        assert!(
            inner.origin["future"].starts_with("stored in ")
                && inner.origin["future"].ends_with(api::FILE),
            "{:?}",
            inner.origin
        );
        assert_eq!(inner.warned.len(), 1);
    }

    #[test]
    fn rules_survive_a_restart_with_the_data_dir() {
        let dir = std::env::temp_dir().join(format!("ringlimit-book-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let b = book(Some(dir.clone()));
        b.put(
            "gold",
            json!({ "limit": 5, "period": "1m" }),
            1,
            "ops",
            None,
        )
        .expect("put");
        drop(b);
        let again = book(Some(dir.clone()));
        assert_eq!(
            again.in_force.rules().get("gold").map(|r| r.rule.limit),
            Some(5)
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
