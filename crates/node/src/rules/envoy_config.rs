//! envoyproxy/ratelimit's configuration files, loaded unchanged (`--envoy-config`), and the
//! matching of a request's descriptors against them — as its README specifies: per domain, a
//! tree of descriptors (`key`, optional `value`, optional `rate_limit`, nested `descriptors`);
//! a request descriptor `(k1, v1), …, (kn, vn)` walks one level per entry, preferring at each
//! level the node with that key and value, then the first (in file order) node whose value
//! has `*` wildcards (each matching any run of characters, anywhere in the value) and matches
//! the entry's value, then the node with the key alone; the limit is the last node's
//! `rate_limit`, if any (no node, or no limit: the descriptor is not limited). `unlimited`,
//! `shadow_mode`, `quota_mode`, `replaces` (by `name`) and `share_threshold` (every value a
//! wildcard matches shares one bucket) are honoured; `detailed_metric`, `value_to_metric`
//! and `metadata` (metrics and Envoy dynamic metadata in envoyproxy/ratelimit) are accepted.
//! Windows are fixed and aligned to the unit, as envoyproxy/ratelimit's; a ringlimit
//! `algorithm` inside `rate_limit` (an extra field no stock file has) picks another.
//!
//! Pure: no gRPC here; the edge that serves `ShouldRateLimit` turns matches into checks.

use ringlimit_proto::Algorithm;
use serde_yaml_ng::{Mapping, Value};
use std::collections::{HashMap, HashSet};

/// One configured limit, as a match returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyLimit {
    /// `requests_per_unit` (0: every request over the limit).
    pub requests_per_unit: u64,
    /// The unit in ms (1 s, 1 min, 1 h, 1 d).
    pub unit_ms: u64,
    pub algorithm: Algorithm,
    /// `unlimited: true`: always OK, never counted.
    pub unlimited: bool,
    pub shadow: bool,
    /// `quota_mode: true`: a request is over only when every quota descriptor in it is (or
    /// any other descriptor is).
    pub quota: bool,
    /// `rate_limit.name`, what `replaces` refers to.
    pub name: Option<String>,
    pub replaces: Vec<String>,
}

/// A request descriptor's limit, and how its bucket is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub limit: EnvoyLimit,
    /// Per entry: the wildcard pattern that names the bucket in place of the entry's value,
    /// where the entry matched a `share_threshold` wildcard (all its values share a bucket).
    pub shared: Vec<Option<String>>,
}

impl std::ops::Deref for Matched {
    type Target = EnvoyLimit;
    fn deref(&self) -> &EnvoyLimit {
        &self.limit
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Level {
    /// By `key`, then value: exact values, wildcard values (in file order), and the
    /// key-only node.
    exact: HashMap<(String, String), Node>,
    wildcard: Vec<Wildcard>,
    any: HashMap<String, Node>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Wildcard {
    key: String,
    /// The configured value, with its `*`s.
    pattern: String,
    node: Node,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    limit: Option<EnvoyLimit>,
    /// `share_threshold: true` (only on a wildcard value).
    share: bool,
    children: Level,
}

/// Whether `value` matches `pattern`, whose every `*` stands for any run of characters
/// (empty too): the first piece is a prefix, the last a suffix, the others in order between.
pub(crate) fn glob(pattern: &str, value: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let mut pieces: Vec<&str> = pieces.collect();
    let Some(last) = pieces.pop() else {
        // No `*`: the whole value.
        return rest.is_empty();
    };
    for piece in pieces {
        match rest.find(piece) {
            Some(i) => rest = &rest[i + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Every domain's descriptor tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyConfig {
    domains: HashMap<String, Level>,
}

/// Why a file is refused: which file and where, in one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {at}: {reason}")]
pub struct EnvoyConfigError {
    pub file: String,
    /// Where in the file: `domain`, or the descriptor path such as `descriptors[1].descriptors[0]`.
    pub at: String,
    pub reason: String,
}

const DESCRIPTOR_FIELDS: [&str; 10] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "share_threshold",
    // Metrics and Envoy dynamic metadata in envoyproxy/ratelimit: accepted, not used.
    "detailed_metric",
    "value_to_metric",
    "metadata",
];
const LIMIT_FIELDS: [&str; 6] = [
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
];

impl EnvoyConfig {
    /// Parses files given as `(name, text)`; each is one domain (a domain twice is refused).
    pub fn from_files<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, EnvoyConfigError> {
        let mut domains = HashMap::new();
        for (file, text) in files {
            let err = |at: &str, reason: String| EnvoyConfigError {
                file: file.to_owned(),
                at: at.to_owned(),
                reason,
            };
            let doc: Value = serde_yaml_ng::from_str(text)
                .map_err(|e| err("file", format!("is not YAML: {e}")))?;
            let Value::Mapping(m) = doc else {
                return Err(err(
                    "file",
                    "must be a mapping with `domain` and `descriptors`".into(),
                ));
            };
            for (k, _) in &m {
                if !matches!(k.as_str(), Some("domain" | "descriptors")) {
                    return Err(err(
                        "file",
                        format!("unknown field {k:?}; known are domain, descriptors"),
                    ));
                }
            }
            let domain = match m.get("domain") {
                Some(Value::String(d)) if !d.is_empty() => d.clone(),
                _ => return Err(err("domain", "is missing or not a non-empty string".into())),
            };
            if domains.contains_key(&domain) {
                return Err(err("domain", format!("{domain:?} is configured twice")));
            }
            let level = match m.get("descriptors") {
                None | Some(Value::Null) => Level::default(),
                Some(v) => {
                    parse_level(v, "descriptors").map_err(|(at, reason)| err(&at, reason))?
                }
            };
            domains.insert(domain, level);
        }
        Ok(Self { domains })
    }

    /// How many domains are configured.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit of each request descriptor (`None`: not limited), with `replaces` applied
    /// across the request: a limit named by another matched limit's `replaces` is dropped.
    pub fn match_request(
        &self,
        domain: &str,
        descriptors: &[Vec<(&str, &str)>],
    ) -> Vec<Option<Matched>> {
        let Some(top) = self.domains.get(domain) else {
            return vec![None; descriptors.len()];
        };
        let mut found: Vec<Option<Matched>> = descriptors.iter().map(|d| find(top, d)).collect();
        // A set: a request's descriptors are not searched once per descriptor.
        let replaced: HashSet<String> = found
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().cloned())
            .collect();
        if !replaced.is_empty() {
            for slot in &mut found {
                if slot
                    .as_ref()
                    .and_then(|l| l.name.as_ref())
                    .is_some_and(|n| replaced.contains(n.as_str()))
                {
                    *slot = None;
                }
            }
        }
        found
    }
}

fn find(top: &Level, entries: &[(&str, &str)]) -> Option<Matched> {
    let mut level = top;
    let mut node = None;
    let mut shared = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let exact = level.exact.get(&((*key).to_owned(), (*value).to_owned()));
        let (next, share) = match exact {
            Some(n) => (n, None),
            None => match level
                .wildcard
                .iter()
                .find(|w| w.key == *key && glob(&w.pattern, value))
            {
                Some(w) => (&w.node, w.node.share.then(|| w.pattern.clone())),
                None => (level.any.get(*key)?, None),
            },
        };
        shared.push(share);
        node = Some(next);
        level = &next.children;
    }
    Some(Matched {
        limit: node?.limit.clone()?,
        shared,
    })
}

type ParseError = (String, String);

fn parse_level(v: &Value, at: &str) -> Result<Level, ParseError> {
    let Value::Sequence(items) = v else {
        return Err((at.to_owned(), "must be a list of descriptors".into()));
    };
    let mut level = Level::default();
    for (i, item) in items.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let Value::Mapping(m) = item else {
            return Err((here, "must be a mapping".into()));
        };
        let (key, value, node) = parse_descriptor(m, &here)?;
        let duplicate = match value {
            None => level.any.insert(key.clone(), node).is_some(),
            Some(v) if v.contains('*') => {
                let dup = level
                    .wildcard
                    .iter()
                    .any(|w| w.key == key && w.pattern == v);
                level.wildcard.push(Wildcard {
                    key: key.clone(),
                    pattern: v,
                    node,
                });
                dup
            }
            Some(v) => level.exact.insert((key.clone(), v), node).is_some(),
        };
        if duplicate {
            return Err((
                here,
                format!(
                    "duplicates another descriptor with key {key:?} and the same value at this level"
                ),
            ));
        }
    }
    Ok(level)
}

fn parse_descriptor(m: &Mapping, at: &str) -> Result<(String, Option<String>, Node), ParseError> {
    let err = |reason: String| (at.to_owned(), reason);
    for (k, _) in m {
        if !k.as_str().is_some_and(|k| DESCRIPTOR_FIELDS.contains(&k)) {
            return Err(err(format!(
                "unknown field {k:?}; known are {}",
                DESCRIPTOR_FIELDS.join(", ")
            )));
        }
    }
    let key = match m.get("key") {
        Some(Value::String(k)) if !k.is_empty() => k.clone(),
        _ => return Err(err("`key` is missing or not a non-empty string".into())),
    };
    let value = match m.get("value") {
        // An empty value is no value, as in envoyproxy/ratelimit.
        None | Some(Value::Null) => None,
        Some(Value::String(v)) if v.is_empty() => None,
        Some(Value::String(v)) => Some(v.clone()),
        // YAML reads `value: 5` or `value: true` as scalars; envoyproxy/ratelimit takes them
        // as their text.
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::Bool(b)) => Some(b.to_string()),
        Some(other) => {
            return Err(err(format!(
                "`value` must be a string, got {}",
                show(other)
            )));
        }
    };
    let shadow = flag(m, "shadow_mode").map_err(err)?;
    let quota = flag(m, "quota_mode").map_err(err)?;
    let share = flag(m, "share_threshold").map_err(err)?;
    if share && !value.as_ref().is_some_and(|v| v.contains('*')) {
        return Err(err(
            "`share_threshold` needs a wildcard `value` (one with `*`)".into(),
        ));
    }
    flag(m, "detailed_metric").map_err(err)?;
    flag(m, "value_to_metric").map_err(err)?;
    match m.get("metadata") {
        None | Some(Value::Null | Value::Mapping(_)) => {}
        Some(other) => {
            return Err(err(format!(
                "`metadata` must be a mapping, got {}",
                show(other)
            )));
        }
    }
    let limit = match m.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(Value::Mapping(r)) => {
            Some(parse_limit(r, shadow, quota).map_err(|r| (format!("{at}.rate_limit"), r))?)
        }
        Some(_) => return Err(err("`rate_limit` must be a mapping".into())),
    };
    let children = match m.get("descriptors") {
        None | Some(Value::Null) => Level::default(),
        Some(v) => parse_level(v, &format!("{at}.descriptors"))?,
    };
    Ok((
        key,
        value,
        Node {
            limit,
            share,
            children,
        },
    ))
}

/// A YAML value as the file spells it, for an error.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => serde_yaml_ng::to_string(other)
            .map(|t| t.trim_end().replace('\n', " "))
            .unwrap_or_else(|_| "?".into()),
    }
}

fn flag(m: &Mapping, name: &str) -> Result<bool, String> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "`{name}` must be true or false, got {}",
            show(other)
        )),
    }
}

/// A unit's length in ms, by its name in envoyproxy/ratelimit's files (any case, as there);
/// a month is 30 days and a year 365, as there.
pub fn unit_ms(unit: &str) -> Option<u64> {
    const DAY: u64 = 86_400_000;
    Some(match unit.to_ascii_lowercase().as_str() {
        "second" => 1_000,
        "minute" => 60_000,
        "hour" => 3_600_000,
        "day" => DAY,
        "week" => 7 * DAY,
        "month" => 30 * DAY,
        "year" => 365 * DAY,
        _ => return None,
    })
}

fn parse_limit(r: &Mapping, shadow: bool, quota: bool) -> Result<EnvoyLimit, String> {
    for (k, _) in r {
        if !k.as_str().is_some_and(|k| LIMIT_FIELDS.contains(&k)) {
            return Err(format!(
                "unknown field {k:?}; known are {}",
                LIMIT_FIELDS.join(", ")
            ));
        }
    }
    let unlimited = flag(r, "unlimited")?;
    let name = match r.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => Some(n.clone()),
        Some(other) => return Err(format!("`name` must be a string, got {}", show(other))),
    };
    let replaces = match r.get("replaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| match i.get("name") {
                Some(Value::String(n)) => Ok(n.clone()),
                _ => Err("each of `replaces` must be a mapping with a string `name`".to_owned()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`replaces` must be a list".into()),
    };
    if replaces.iter().any(String::is_empty) {
        return Err("`replaces` must not hold an empty `name`".into());
    }
    if let Some(n) = name.as_ref().filter(|n| replaces.contains(n)) {
        return Err(format!("`replaces` names this limit's own name {n:?}"));
    }
    let algorithm = match r.get("algorithm") {
        None | Some(Value::Null) => Algorithm::FixedWindow,
        Some(Value::String(a)) => a
            .parse()
            .map_err(|e: ringlimit_proto::UnknownAlgorithm| e.to_string())?,
        Some(other) => return Err(format!("`algorithm` must be a string, got {}", show(other))),
    };
    let unit = r.get("unit").and_then(Value::as_str).and_then(unit_ms);
    if unlimited {
        if unit.is_some() {
            return Err("an `unlimited` limit must not have a `unit`".into());
        }
        return Ok(EnvoyLimit {
            requests_per_unit: 0,
            unit_ms: 1000,
            algorithm,
            unlimited,
            shadow,
            quota,
            name,
            replaces,
        });
    }
    let Some(unit_ms) = unit else {
        return Err(format!(
            "`unit` must be second, minute, hour, day, week, month or year, got {}",
            r.get("unit").map_or_else(|| "none".to_owned(), show)
        ));
    };
    let requests_per_unit = r
        .get("requests_per_unit")
        .and_then(Value::as_u64)
        .ok_or_else(|| "`requests_per_unit` must be a whole number".to_owned())?;
    if requests_per_unit > ringlimit_core::limiter::MAX_LIMIT {
        return Err(format!(
            "`requests_per_unit` {requests_per_unit} is over the largest limit, {}",
            ringlimit_core::limiter::MAX_LIMIT
        ));
    }
    Ok(EnvoyLimit {
        requests_per_unit,
        unit_ms,
        algorithm,
        unlimited,
        shadow,
        quota,
        name,
        replaces,
    })
}

/// A configuration file or directory that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read envoy config {path}: {source}")]
pub struct ReadError {
    pub path: std::path::PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Reads envoyproxy/ratelimit configuration files as `(name, text)`: one YAML file, or every
/// `*.yaml`/`*.yml` file of a directory (hidden files skipped: a ConfigMap's `..data`), in name
/// order.
pub fn read_files(path: &std::path::Path) -> Result<Vec<(String, String)>, ReadError> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|source| ReadError {
            path: p.to_owned(),
            source,
        })
    };
    let mut files = Vec::new();
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| ReadError {
            path: path.to_owned(),
            source,
        })?;
        let mut names: Vec<std::path::PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
            })
            .collect();
        names.sort();
        for p in names {
            let text = read(&p)?;
            files.push((p.display().to_string(), text));
        }
    } else {
        files.push((path.display().to_string(), read(path)?));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(files: &[&str]) -> EnvoyConfig {
        EnvoyConfig::from_files(files.iter().enumerate().map(|(i, t)| {
            let name: &'static str = Box::leak(format!("f{i}.yaml").into_boxed_str());
            (name, *t)
        }))
        .expect("valid")
    }

    fn limit_of(c: &EnvoyConfig, domain: &str, d: &[(&str, &str)]) -> Option<u64> {
        c.match_request(domain, &[d.to_vec()])[0]
            .as_ref()
            .map(|l| l.requests_per_unit)
    }

    const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

    #[test]
    fn nested_descriptors_match_one_level_per_entry() {
        let c = config(&[MESSAGING]);
        let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
        assert_eq!(limit_of(&c, "messaging", &marketing), Some(5));
        assert_eq!(
            limit_of(&c, "messaging", &[("to_number", "2061111111")]),
            Some(100)
        );
        // A placeholder without a limit, or more entries than levels: not limited.
        assert_eq!(
            limit_of(&c, "messaging", &[("message_type", "marketing")]),
            None
        );
        assert_eq!(
            limit_of(&c, "messaging", &[("to_number", "1"), ("x", "y")]),
            None
        );
        assert_eq!(limit_of(&c, "other", &[("to_number", "1")]), None);
        let l = &c.match_request("messaging", &[marketing.to_vec()])[0];
        assert_eq!(l.as_ref().map(|l| l.unit_ms), Some(86_400_000));
        assert_eq!(
            l.as_ref().map(|l| l.algorithm),
            Some(Algorithm::FixedWindow)
        );
    }

    #[test]
    fn key_and_value_beat_a_wildcard_which_beats_the_key_alone() {
        let c = config(&["
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: remote_address
    value: 50.0.0.5
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: remote_address
    value: 10.*
    rate_limit: { unit: second, requests_per_unit: 50 }
  - key: ldap
    rate_limit: { unlimited: true }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1, algorithm: sliding_window }
"]);
        assert_eq!(
            limit_of(&c, "edge", &[("remote_address", "50.0.0.5")]),
            Some(0)
        );
        assert_eq!(
            limit_of(&c, "edge", &[("remote_address", "10.1.2.3")]),
            Some(50)
        );
        assert_eq!(
            limit_of(&c, "edge", &[("remote_address", "50.0.0.1")]),
            Some(10)
        );
        let m = c.match_request("edge", &[vec![("ldap", "x")], vec![("soft", "y")]]);
        assert!(m[0].as_ref().is_some_and(|l| l.unlimited));
        let soft = m[1].as_ref().expect("matched");
        assert!(soft.shadow);
        assert_eq!(soft.algorithm, Algorithm::SlidingWindow);
    }

    #[test]
    fn replaces_drops_the_named_limit_when_both_match() {
        let c = config(&["
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: { name: specific_limit, requests_per_unit: 5, unit: second }
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"]);
        let one = vec![("key_1", "value_1"), ("user", "bkthomps")];
        let two = vec![("key_2", "value_2"), ("user", "bkthomps")];
        let both = c.match_request("example7", &[one.clone(), two.clone()]);
        assert_eq!(both[0], None);
        assert_eq!(both[1].as_ref().map(|l| l.requests_per_unit), Some(10));
        let alone = c.match_request("example7", &[one]);
        assert_eq!(alone[0].as_ref().map(|l| l.requests_per_unit), Some(5));
    }

    #[test]
    fn a_file_in_the_shape_of_envoyproxy_ratelimits_example_loads() {
        let c = config(&[
            "
---
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: foo
    rate_limit: { unit: minute, requests_per_unit: 2 }
    descriptors:
      - key: bar
        rate_limit: { unit: minute, requests_per_unit: 3 }
      - key: bar
        value: banned
        rate_limit: { unit: minute, requests_per_unit: 0 }
      - key: bay
        rate_limit: { unlimited: true }
      - key: baz
        value: shady
        shadow_mode: true
        quota_mode: true
        rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: qux
    rate_limit: { unlimited: true }
",
            "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: { unit: minute, requests_per_unit: 5 }
",
        ]);
        assert_eq!(limit_of(&c, "rl", &[("foo", "x")]), Some(2));
        assert_eq!(limit_of(&c, "rl", &[("foo", "x"), ("bar", "y")]), Some(3));
        assert_eq!(
            limit_of(&c, "rl", &[("foo", "x"), ("bar", "banned")]),
            Some(0)
        );
        assert_eq!(
            limit_of(
                &c,
                "rl",
                &[("source_cluster", "proxy"), ("destination_cluster", "mock")]
            ),
            Some(1)
        );
        assert_eq!(limit_of(&c, "mongo_cps", &[("database", "users")]), Some(5));
        assert_eq!(limit_of(&c, "mongo_cps", &[("database", "other")]), None);
        assert!(c.has_domain("rl") && !c.has_domain("nope"));
    }

    #[test]
    fn wildcards_match_anywhere_in_order() {
        for (pattern, value, want) in [
            ("value*", "value", true),
            ("value*", "valueXYZ", true),
            ("value*", "valu", false),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api/123/other", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("*x", "yyx", true),
        ] {
            assert_eq!(super::glob(pattern, value), want, "{pattern} ~ {value}");
        }
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_the_place() {
        for (text, at, says) in [
            (
                "domain: d\ndescriptors:\n  - value: x\n",
                "descriptors[0]",
                "`key` is missing",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
                "descriptors[0].rate_limit",
                "`unit` must be",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: a\n        bogus: 1\n",
                "descriptors[0].descriptors[0]",
                "unknown field",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
                "descriptors[1]",
                "duplicates",
            ),
            ("descriptors: []\n", "domain", "missing"),
            ("domain: d\nextra: 1\n", "file", "unknown field"),
        ] {
            let e = EnvoyConfig::from_files([("bad.yaml", text)]).expect_err(text);
            assert_eq!(e.file, "bad.yaml");
            assert_eq!(e.at, at, "{e}");
            assert!(e.reason.contains(says), "{e}");
        }
        let twice = EnvoyConfig::from_files([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
            .expect_err("one domain twice");
        assert!(twice.to_string().starts_with("b.yaml: domain:"), "{twice}");
    }
}
