//! envoyproxy/ratelimit's configuration files, loaded unchanged (`--envoy-config`), and the
//! matching of a request's descriptors against them — as its README specifies: per domain, a
//! tree of descriptors (`key`, optional `value`, optional `rate_limit`, nested `descriptors`);
//! a request descriptor `(k1, v1), …, (kn, vn)` walks one level per entry, preferring at each
//! level the node with that key and value, then a node whose value ends in `*` and prefixes
//! the entry's value, then the node with the key alone; the limit is the last node's
//! `rate_limit`, if any (no node, or no limit: the descriptor is not limited). `unlimited`,
//! `shadow_mode` and `replaces` (by `name`) are honoured; `detailed_metric` is accepted.
//! Windows are fixed and aligned to the unit, as envoyproxy/ratelimit's; a ringlimit
//! `algorithm` inside `rate_limit` (an extra field no stock file has) picks another.
//!
//! Pure: no gRPC here; the edge that serves `ShouldRateLimit` turns matches into checks.

use ringlimit_proto::Algorithm;
use serde_yaml_ng::{Mapping, Value};
use std::collections::HashMap;

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
    /// `rate_limit.name`, what `replaces` refers to.
    pub name: Option<String>,
    pub replaces: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Level {
    /// By `key`, then value: exact values, wildcard prefixes (value without its `*`), and the
    /// key-only node.
    exact: HashMap<(String, String), Node>,
    wildcard: Vec<(String, String, Node)>,
    any: HashMap<String, Node>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    limit: Option<EnvoyLimit>,
    children: Level,
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

const DESCRIPTOR_FIELDS: [&str; 7] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    // Newer envoyproxy/ratelimit files may carry it; read, and for now limited as usual.
    "quota_mode",
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
    ) -> Vec<Option<EnvoyLimit>> {
        let Some(top) = self.domains.get(domain) else {
            return vec![None; descriptors.len()];
        };
        let mut found: Vec<Option<EnvoyLimit>> =
            descriptors.iter().map(|d| find(top, d).cloned()).collect();
        let replaced: Vec<String> = found
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().cloned())
            .collect();
        if !replaced.is_empty() {
            for slot in &mut found {
                if slot
                    .as_ref()
                    .and_then(|l| l.name.as_ref())
                    .is_some_and(|n| replaced.contains(n))
                {
                    *slot = None;
                }
            }
        }
        found
    }
}

fn find<'a>(top: &'a Level, entries: &[(&str, &str)]) -> Option<&'a EnvoyLimit> {
    let mut level = top;
    let mut node = None;
    for (key, value) in entries {
        let next = level
            .exact
            .get(&((*key).to_owned(), (*value).to_owned()))
            .or_else(|| {
                level
                    .wildcard
                    .iter()
                    .find(|(k, prefix, _)| k == key && value.starts_with(prefix.as_str()))
                    .map(|(_, _, n)| n)
            })
            .or_else(|| level.any.get(*key))?;
        node = Some(next);
        level = &next.children;
    }
    node?.limit.as_ref()
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
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => {
                    let dup = level
                        .wildcard
                        .iter()
                        .any(|(k, p, _)| *k == key && p == prefix);
                    level.wildcard.push((key.clone(), prefix.to_owned(), node));
                    dup
                }
                None => level.exact.insert((key.clone(), v), node).is_some(),
            },
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
        None | Some(Value::Null) => None,
        Some(Value::String(v)) => Some(v.clone()),
        // YAML reads `value: 5` or `value: true` as scalars; envoyproxy/ratelimit takes them
        // as their text.
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::Bool(b)) => Some(b.to_string()),
        Some(other) => return Err(err(format!("`value` must be a string, got {other:?}"))),
    };
    let shadow = flag(m, "shadow_mode").map_err(err)?;
    flag(m, "detailed_metric").map_err(err)?;
    flag(m, "quota_mode").map_err(err)?;
    let limit = match m.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(Value::Mapping(r)) => {
            Some(parse_limit(r, shadow).map_err(|r| (format!("{at}.rate_limit"), r))?)
        }
        Some(_) => return Err(err("`rate_limit` must be a mapping".into())),
    };
    let children = match m.get("descriptors") {
        None | Some(Value::Null) => Level::default(),
        Some(v) => parse_level(v, &format!("{at}.descriptors"))?,
    };
    Ok((key, value, Node { limit, children }))
}

fn flag(m: &Mapping, name: &str) -> Result<bool, String> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("`{name}` must be true or false, got {other:?}")),
    }
}

fn parse_limit(r: &Mapping, shadow: bool) -> Result<EnvoyLimit, String> {
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
        Some(other) => return Err(format!("`name` must be a string, got {other:?}")),
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
    let algorithm = match r.get("algorithm") {
        None | Some(Value::Null) => Algorithm::FixedWindow,
        Some(Value::String(a)) => a
            .parse()
            .map_err(|e: ringlimit_proto::UnknownAlgorithm| e.to_string())?,
        Some(other) => return Err(format!("`algorithm` must be a string, got {other:?}")),
    };
    if unlimited {
        return Ok(EnvoyLimit {
            requests_per_unit: 0,
            unit_ms: 1000,
            algorithm,
            unlimited,
            shadow,
            name,
            replaces,
        });
    }
    let unit_ms = match r.get("unit").and_then(Value::as_str) {
        Some("second") => 1_000,
        Some("minute") => 60_000,
        Some("hour") => 3_600_000,
        Some("day") => 86_400_000,
        other => {
            return Err(format!(
                "`unit` must be second, minute, hour or day, got {other:?}"
            ));
        }
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
        name,
        replaces,
    })
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
    fn bad_files_are_refused_naming_the_file_and_the_place() {
        for (text, at, says) in [
            (
                "domain: d\ndescriptors:\n  - value: x\n",
                "descriptors[0]",
                "`key` is missing",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: week, requests_per_unit: 1 }\n",
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
