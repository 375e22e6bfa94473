//! Rules written through the admin API: versioned entries that every node merges the same way,
//! so that the cluster converges whatever order changes arrive in.
//!
//! Each rule name holds one entry: the rule's fields as written (a JSON object), or a tombstone
//! after a delete, and the version of the change. Versions are hybrid logical clock readings —
//! wall milliseconds, a counter for changes within one millisecond or behind a peer's clock, and
//! the writing node's id as the tie-break — so the last writer wins, and two nodes that change
//! one rule at once end with the same entry on every node. A node that learns a version also
//! moves its own clock past it, so its next change wins over what it has seen even if its wall
//! clock is behind. Tombstones are kept for [`TOMBSTONE_KEEP_MS`], so a node returning from a
//! partition shorter than that cannot bring a deleted rule back.
//!
//! Since a node moves its clock past every version it learns, a version far in the future (a
//! corrupt or forged `--data-dir` file, or a peer's entry) would pin it there: every later change
//! would get that same millisecond, ordered only by a counter that saturates, and the rogue
//! entry would win every name it holds for ever. So a version more than [`MAX_AHEAD_MS`] (a day)
//! ahead of this node's wall clock is refused wherever it comes from; members' clocks are kept
//! within `--max-clock-offset-ms` (250 ms by default) of each other, far inside that bound.

use super::{NamedRule, RulesError, parse_rule};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// How long a delete is remembered (7 days).
pub const TOMBSTONE_KEEP_MS: u64 = 7 * 24 * 3600 * 1000;

/// How far ahead of this node's wall clock a version learnt elsewhere may be (a day).
pub const MAX_AHEAD_MS: u64 = 24 * 3600 * 1000;

/// An entry refused because its version is more than [`MAX_AHEAD_MS`] ahead of this node's
/// clock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "API rule {name:?} at version {}.{}.{} is more than a day ahead of this node's clock \
     ({now_ms} ms since 1970): refused",
    version.ms, version.counter, version.node
)]
pub struct TooFarAhead {
    pub name: String,
    pub version: Version,
    pub now_ms: u64,
}

/// When and where a change was made; ordered by clock, then counter, then node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version {
    /// Wall milliseconds (hybrid: never behind a version this node has seen).
    pub ms: u64,
    pub counter: u32,
    pub node: String,
}

/// One rule name's latest change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub version: Version,
    /// The rule's fields as written; `None` once deleted.
    pub spec: Option<serde_json::Value>,
    /// The name of the admin token that made the change (absent in entries written before
    /// tokens had names, and then shown as the writing node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl Entry {
    /// The version as the API shows it (and `If-Match` names it): `ms.counter.node`, ordered
    /// as the versions are.
    pub fn tag(&self) -> String {
        format!(
            "{}.{}.{}",
            self.version.ms, self.version.counter, self.version.node
        )
    }

    /// Who made the change: the token's name, else the node that wrote it.
    pub fn author(&self) -> &str {
        self.by.as_deref().unwrap_or(&self.version.node)
    }
}

/// Every API rule a node knows, tombstones included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiRules {
    entries: BTreeMap<String, Entry>,
    /// The hybrid clock: the latest (ms, counter) made or seen.
    clock: (u64, u32),
}

/// What the file under `--data-dir` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    format: u32,
    rules: BTreeMap<String, Entry>,
}

const FORMAT: u32 = 1;
/// The file under `--data-dir`.
pub const FILE: &str = "api-rules.json";
/// A save's temporary file in `--data-dir`: this prefix, random characters, this suffix.
const TMP_PREFIX: &str = ".api-rules.json.";
const TMP_SUFFIX: &str = ".tmp";

/// Why API rules could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not an API rules file: {reason}")]
    Format { path: String, reason: String },
}

/// Validates a rule written through the API: the rules file's fields and checks, `name` taken
/// from the path (a `name` field in the body must agree with it).
pub fn validate(name: &str, spec: &serde_json::Value) -> Result<NamedRule, RulesError> {
    let serde_json::Value::Object(fields) = spec else {
        return Err(RulesError::Rule {
            rule: name.to_owned(),
            error: ringlimit_core::rule::field_err("rule", "must be a JSON object of fields"),
        });
    };
    if let Some(body_name) = fields.get("name")
        && body_name.as_str() != Some(name)
    {
        return Err(RulesError::Rule {
            rule: name.to_owned(),
            error: ringlimit_core::rule::field_err(
                "name",
                format!("is {body_name} in the body but {name:?} in the path"),
            ),
        });
    }
    let mut fields = fields.clone();
    fields.insert("name".into(), serde_json::Value::String(name.to_owned()));
    let yaml = serde_yaml_ng::to_value(serde_json::Value::Object(fields)).map_err(|e| {
        RulesError::Rule {
            rule: name.to_owned(),
            error: ringlimit_core::rule::field_err("rule", e.to_string()),
        }
    })?;
    parse_rule(0, &yaml)
}

impl ApiRules {
    /// The latest entry of `name`, tombstone or rule.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Every entry, by name.
    pub fn entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// The rules in force (tombstones left out), validated again: an entry that no longer
    /// validates (written by a newer node, or a file edited by hand) is skipped and returned,
    /// by name, as an error beside them.
    pub fn rules(&self) -> (Vec<NamedRule>, Vec<(&str, RulesError)>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        for (name, e) in &self.entries {
            if let Some(spec) = &e.spec {
                match validate(name, spec) {
                    Ok(r) => rules.push(r),
                    Err(err) => errors.push((name.as_str(), err)),
                }
            }
        }
        (rules, errors)
    }

    /// A new version from this node at wall time `now_ms`: after every version made or seen.
    fn next_version(&mut self, now_ms: u64, node: &str) -> Version {
        let (ms, counter) = if now_ms > self.clock.0 {
            (now_ms, 0)
        } else {
            (self.clock.0, self.clock.1.saturating_add(1))
        };
        self.clock = (ms, counter);
        Version {
            ms,
            counter,
            node: node.to_owned(),
        }
    }

    /// Records a change made here (a rule's fields, or `None` to delete) by the token named
    /// `by`; returns the entry.
    pub fn write(
        &mut self,
        name: &str,
        spec: Option<serde_json::Value>,
        now_ms: u64,
        node: &str,
        by: Option<&str>,
    ) -> Entry {
        let entry = Entry {
            version: self.next_version(now_ms, node),
            spec,
            by: by.map(str::to_owned),
        };
        self.entries.insert(name.to_owned(), entry.clone());
        entry
    }

    /// Merges an entry learnt from a peer (or the data dir) at wall time `now_ms`: kept when
    /// its version is newer than this node's. Returns whether anything changed; refuses a
    /// version more than [`MAX_AHEAD_MS`] ahead of `now_ms` (the clock does not move).
    pub fn merge(&mut self, name: &str, entry: Entry, now_ms: u64) -> Result<bool, TooFarAhead> {
        if entry.version.ms > now_ms.saturating_add(MAX_AHEAD_MS) {
            return Err(TooFarAhead {
                name: name.to_owned(),
                version: entry.version,
                now_ms,
            });
        }
        let seen = (entry.version.ms, entry.version.counter);
        if seen > self.clock {
            self.clock = seen;
        }
        Ok(match self.entries.get(name) {
            Some(mine) if mine.version >= entry.version => false,
            _ => {
                self.entries.insert(name.to_owned(), entry);
                true
            }
        })
    }

    /// Forgets tombstones older than `keep_ms` at `now_ms`; returns how many.
    pub fn prune(&mut self, now_ms: u64, keep_ms: u64) -> usize {
        let before = self.entries.len();
        self.entries
            .retain(|_, e| e.spec.is_some() || now_ms.saturating_sub(e.version.ms) < keep_ms);
        before - self.entries.len()
    }

    /// Reads `dir`/[`FILE`] at wall time `now_ms`; an absent file is an empty set. Entries
    /// whose version is too far ahead are left out and returned beside the set.
    pub fn load(dir: &Path, now_ms: u64) -> Result<(Self, Vec<TooFarAhead>), StoreError> {
        let path = dir.join(FILE);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Self::default(), Vec::new()));
            }
            Err(source) => {
                return Err(StoreError::Io {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        let saved: Saved = serde_json::from_slice(&text).map_err(|e| StoreError::Format {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if saved.format != FORMAT {
            return Err(StoreError::Format {
                path: path.display().to_string(),
                reason: format!("format {} (this node reads {FORMAT})", saved.format),
            });
        }
        let mut rules = Self::default();
        let mut refused = Vec::new();
        for (name, entry) in saved.rules {
            if let Err(e) = rules.merge(&name, entry, now_ms) {
                refused.push(e);
            }
        }
        Ok((rules, refused))
    }

    /// Writes every entry to `dir`/[`FILE`] atomically: a temporary file, synced, renamed over
    /// the old one, and the directory synced, so a crash leaves the old file or the new one (and
    /// perhaps a stray temporary file, which nothing reads).
    pub fn save(&self, dir: &Path) -> Result<(), StoreError> {
        let path = dir.join(FILE);
        let io = |source| StoreError::Io {
            path: path.display().to_string(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(&Saved {
            format: FORMAT,
            rules: self.entries.clone(),
        })
        .map_err(|e| io(std::io::Error::other(e)))?;
        // A fresh random name, created exclusively (O_EXCL, so a link planted in the directory
        // is never followed) with mode 0600; removed if the save fails before the rename.
        let mut tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .suffix(TMP_SUFFIX)
            .tempfile_in(dir)
            .map_err(io)?;
        {
            use std::io::Write;
            tmp.write_all(&bytes).map_err(io)?;
            tmp.as_file().sync_all().map_err(io)?;
        }
        tmp.persist(&path).map_err(|e| io(e.error))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::rule::LeaseMode;
    use serde_json::json;

    #[test]
    fn a_rule_written_through_the_api_is_validated_like_the_file() {
        let r = validate("tier-gold", &json!({ "limit": 1000, "period": "1m" })).expect("valid");
        assert_eq!((r.name.as_str(), r.rule.limit), ("tier-gold", 1000));
        let e = validate("x", &json!({ "limit": 0, "period": "1m" })).expect_err("limit 0");
        assert!(e.to_string().contains("limit"), "{e}");
        let e = validate("x", &json!({ "limit": 1, "period": "1m", "colour": 1 }))
            .expect_err("unknown field");
        assert!(e.to_string().contains("colour"), "{e}");
        let e = validate("x", &json!({ "name": "y", "limit": 1, "period": "1m" }))
            .expect_err("names disagree");
        assert!(e.to_string().contains("path"), "{e}");
        assert!(validate("x", &json!([1])).is_err());
    }

    #[test]
    fn lease_is_written_through_the_api_like_the_file() {
        let r =
            validate("x", &json!({ "limit": 1, "period": "1s", "lease": "off" })).expect("valid");
        assert_eq!(r.lease, LeaseMode::Off);
        let r = validate("x", &json!({ "limit": 1, "period": "1s" })).expect("valid");
        assert_eq!(r.lease, LeaseMode::Auto);
        let e = validate(
            "x",
            &json!({ "limit": 1, "period": "1s", "lease": "maybe" }),
        )
        .expect_err("not a lease mode");
        assert!(e.to_string().contains("`lease` must be auto or off"), "{e}");
    }

    /// A data dir saved (or an entry gossiped) by a node that predates leases: its rules have
    /// no `lease` and are leasable.
    #[test]
    fn an_entry_written_before_leases_loads_as_auto() {
        let dir = std::env::temp_dir().join(format!("ringlimit-api-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let old = r#"{
  "format": 1,
  "rules": {
    "gold": {
      "version": { "ms": 1000, "counter": 0, "node": "a" },
      "spec": { "limit": 7, "period": "1h", "shadow": false }
    }
  }
}"#;
        std::fs::write(dir.join(FILE), old).expect("old file");
        let (loaded, _) = ApiRules::load(&dir, 3_000).expect("loaded");
        let (rules, errors) = loaded.rules();
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rules.len(), 1);
        assert_eq!((rules[0].rule.limit, rules[0].lease), (7, LeaseMode::Auto));

        let gossiped: Entry = serde_json::from_str(
            r#"{"version":{"ms":2000,"counter":0,"node":"b"},"spec":{"limit":3,"period":"1s"}}"#,
        )
        .expect("decodes");
        let mut book = ApiRules::default();
        book.merge("silver", gossiped, 2_000).expect("merged");
        assert_eq!(book.rules().0[0].lease, LeaseMode::Auto);
    }

    #[test]
    fn concurrent_changes_converge_on_the_last_writer_whatever_the_order() {
        let mut a = ApiRules::default();
        let mut b = ApiRules::default();
        // Same millisecond on both nodes: the node id breaks the tie.
        let ea = a.write(
            "r",
            Some(json!({ "limit": 1, "period": "1s" })),
            1_000,
            "node-a",
            None,
        );
        let eb = b.write(
            "r",
            Some(json!({ "limit": 2, "period": "1s" })),
            1_000,
            "node-b",
            None,
        );
        let mut a_then_b = ApiRules::default();
        a_then_b.merge("r", ea.clone(), 1_000).expect("merged");
        a_then_b.merge("r", eb.clone(), 1_000).expect("merged");
        let mut b_then_a = ApiRules::default();
        b_then_a.merge("r", eb.clone(), 1_000).expect("merged");
        b_then_a.merge("r", ea.clone(), 1_000).expect("merged");
        assert_eq!(a_then_b.get("r"), b_then_a.get("r"));
        assert_eq!(a_then_b.get("r"), Some(&eb));
        // a learns b's change, then changes the rule with its wall clock behind: still newer.
        a.merge("r", eb.clone(), 500).expect("merged");
        let later = a.write("r", None, 500, "node-a", None);
        assert!(later.version > eb.version);
        b.merge("r", later.clone(), 1_000).expect("merged");
        assert_eq!(b.get("r"), Some(&later), "the delete wins");
        assert!(b.rules().0.is_empty());
    }

    /// A version at `ms = 2^64-1` (a corrupt or forged file, a rogue peer) is refused: the
    /// hybrid clock is not pinned, later writes get this node's time and order as they come.
    #[test]
    fn a_version_far_ahead_of_the_clock_is_refused_and_pins_nothing() {
        let now = 1_700_000_000_000;
        let mut a = ApiRules::default();
        let rogue = Entry {
            version: Version {
                ms: u64::MAX,
                counter: u32::MAX,
                node: "zzz".into(),
            },
            spec: Some(json!({ "limit": 1_000_000, "period": "1s" })),
            by: Some("alice".into()),
        };
        let e = a.merge("r", rogue, now).expect_err("refused");
        assert!(e.to_string().contains("more than a day ahead"), "{e}");
        assert!(a.get("r").is_none());
        // A day ahead is still taken (a clock a little off), a day and a millisecond is not.
        let at = |ms| Entry {
            version: Version {
                ms,
                counter: 0,
                node: "b".into(),
            },
            spec: None,
            by: None,
        };
        assert!(a.merge("s", at(now + MAX_AHEAD_MS + 1), now).is_err());
        assert_eq!(a.merge("s", at(now + MAX_AHEAD_MS), now), Ok(true));
        let mut b = ApiRules::default();
        let _ = b.merge("x", at(u64::MAX), now);
        let first = b.write("r", None, now, "a", None);
        let second = b.write("r", None, now + 1, "a", None);
        assert_eq!((first.version.ms, second.version.ms), (now, now + 1));
    }

    #[test]
    fn a_delete_outlives_an_old_copy_until_it_is_pruned() {
        let mut a = ApiRules::default();
        let created = a.write(
            "r",
            Some(json!({ "limit": 1, "period": "1s" })),
            1_000,
            "a",
            None,
        );
        let deleted = a.write("r", None, 2_000, "a", None);
        // A node back from a partition offers its old copy: refused.
        assert_eq!(a.merge("r", created.clone(), 2_000), Ok(false));
        assert_eq!(a.get("r"), Some(&deleted));
        assert_eq!(a.prune(2_000 + TOMBSTONE_KEEP_MS - 1, TOMBSTONE_KEEP_MS), 0);
        assert_eq!(a.prune(2_000 + TOMBSTONE_KEEP_MS, TOMBSTONE_KEEP_MS), 1);
    }

    #[test]
    fn saved_rules_come_back_and_a_torn_write_leaves_the_old_file() {
        let dir = std::env::temp_dir().join(format!("ringlimit-api-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut a = ApiRules::default();
        a.write(
            "r",
            Some(json!({ "limit": 7, "period": "1h" })),
            1_000,
            "a",
            None,
        );
        a.write("gone", None, 1_001, "a", None);
        a.save(&dir).expect("saved");
        // A crash between writing the temporary file and the rename leaves the old file.
        std::fs::write(dir.join(format!("{FILE}.tmp")), b"{ torn").expect("tmp");
        let (back, refused) = ApiRules::load(&dir, 2_000).expect("loaded");
        assert!(refused.is_empty());
        assert_eq!(back.entries().count(), 2);
        assert_eq!(back.rules().0[0].rule.limit, 7);
        std::fs::write(dir.join(FILE), b"not json").expect("corrupt");
        assert!(matches!(
            ApiRules::load(&dir, 2_000),
            Err(StoreError::Format { .. })
        ));
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(
            ApiRules::load(&dir, 2_000)
                .expect("no file")
                .0
                .entries()
                .count(),
            0
        );
    }

    #[cfg(unix)]
    #[test]
    fn saving_follows_no_planted_symlink_and_keeps_the_file_private() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let base = std::env::temp_dir().join(format!("ringlimit-api-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (dir, victim) = (base.join("data"), base.join("victim"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(&victim, b"precious").expect("victim");
        // Whoever can write the data dir plants links where a temporary file might go: the
        // name the node once used, and names like the ones it uses now.
        let planted = [
            format!("{FILE}.tmp"),
            format!(".{FILE}.tmp"),
            format!("{TMP_PREFIX}planted{TMP_SUFFIX}"),
        ];
        for name in &planted {
            symlink(&victim, dir.join(name)).expect("link");
        }
        let mut a = ApiRules::default();
        a.write(
            "r",
            Some(json!({ "limit": 7, "period": "1h" })),
            1_000,
            "a",
            None,
        );
        a.save(&dir).expect("saved");
        a.save(&dir).expect("saved again");
        let kept = std::fs::read(&victim).expect("victim");
        assert_eq!(
            String::from_utf8_lossy(&kept),
            "precious",
            "a link was followed"
        );
        for name in &planted {
            assert!(dir.join(name).is_symlink(), "{name} left alone");
        }
        assert_eq!(
            ApiRules::load(&dir, 2_000)
                .expect("loaded")
                .0
                .entries()
                .count(),
            1
        );
        let mode = std::fs::metadata(dir.join(FILE))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "mode {mode:o}: the rules are the node's alone"
        );
        std::fs::remove_dir_all(&base).expect("cleanup");
    }
}
