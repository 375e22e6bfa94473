//! The RLQS configuration (`--rlqs-config`): per domain, which bucket ids map to which rule
//! (and key), or to a blanket allow or deny. Pure: parsing and matching.
//!
//! ```yaml
//! domains:
//!   - domain: edge
//!     buckets:
//!       - bucket: { name: api, tenant: "*" }  # each listed key must be in the id, its value
//!         rule: api_per_tenant                 #   matching ("*" any, "pre*" a prefix, "*suf",
//!         key: "{tenant}"                      #   "a*b"); other keys of the id are ignored
//!         ttl: 10s                             # assignment_time_to_live (default 10s)
//!         burst: 1s                            # each token bucket holds this much of its rate
//!       - bucket: { name: blocked }
//!         blanket: deny_all
//! ```
//! The first entry that matches decides; a bucket no entry matches is abandoned. `key`
//! names the rule's bucket from the id's values (`{name}` placeholders); without it the key
//! is the id's pairs, sorted, as `k=v,k=v`.

use crate::rules::request_key::bounded_key;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// Assignments live this long unless the entry says otherwise.
pub const DEFAULT_TTL_NS: u64 = 10_000_000_000;
/// Each token bucket holds this much of its rate unless the entry says otherwise.
pub const DEFAULT_BURST_NS: u64 = 1_000_000_000;

/// Why a configuration was refused: the file, the place in it and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum RlqsConfigError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    domains: Vec<DomainSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainSpec {
    domain: String,
    #[serde(default)]
    buckets: Vec<BucketSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketSpec {
    bucket: BTreeMap<String, String>,
    rule: Option<String>,
    key: Option<String>,
    blanket: Option<Blanket>,
    ttl: Option<String>,
    burst: Option<String>,
}

/// A bucket's fixed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blanket {
    AllowAll,
    DenyAll,
}

/// What a matched bucket gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A share of `rule`'s rate for its bucket `key`.
    Rule {
        rule: String,
        key: String,
    },
    Blanket(Blanket),
}

/// A bucket id's entry: what it gets, and for how long assignments live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub target: Target,
    pub ttl_ns: u64,
    pub burst_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    bucket: Vec<(String, String)>,
    target: EntryTarget,
    ttl_ns: u64,
    burst_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum EntryTarget {
    Rule { rule: String, key: Option<String> },
    Blanket(Blanket),
}

/// The configuration in force: entries per domain, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlqsConfig {
    domains: HashMap<String, Vec<Entry>>,
}

impl RlqsConfig {
    /// Parses one file's YAML (`file` names it in errors).
    pub fn parse(file: &str, text: &str) -> Result<Self, RlqsConfigError> {
        let invalid = |message: String| RlqsConfigError::Invalid {
            file: file.to_owned(),
            message,
        };
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let spec: FileSpec = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            invalid(format!("at {path}: {}", e.into_inner()))
        })?;
        let mut domains: HashMap<String, Vec<Entry>> = HashMap::new();
        for (d, domain) in spec.domains.into_iter().enumerate() {
            if domain.domain.is_empty() {
                return Err(invalid(format!("domains[{d}].domain is empty")));
            }
            if domains.contains_key(&domain.domain) {
                return Err(invalid(format!(
                    "domains[{d}]: domain {:?} appears twice",
                    domain.domain
                )));
            }
            let mut entries = Vec::new();
            for (b, spec) in domain.buckets.into_iter().enumerate() {
                let at = format!("domains[{d}].buckets[{b}]");
                entries.push(entry(spec).map_err(|m| invalid(format!("{at}: {m}")))?);
            }
            domains.insert(domain.domain, entries);
        }
        Ok(Self { domains })
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, RlqsConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| RlqsConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Domains configured.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// The first entry of `domain` that `id` (its pairs sorted by key, keys distinct)
    /// matches; `None`: abandon the bucket.
    pub fn matched(&self, domain: &str, id: &[(String, String)]) -> Option<Matched> {
        let entries = self.domains.get(domain)?;
        let e = entries.iter().find(|e| {
            e.bucket.iter().all(|(k, pattern)| {
                value(id, k).is_some_and(|v| crate::rules::envoy_config::glob(pattern, v))
            })
        })?;
        let target = match &e.target {
            EntryTarget::Blanket(b) => Target::Blanket(*b),
            EntryTarget::Rule { rule, key } => Target::Rule {
                rule: rule.clone(),
                // Within the rule keys' limit (a long one cut and hashed), so that the owner
                // takes it.
                key: bounded_key(match key {
                    Some(template) => render(template, id),
                    None => id
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                }),
            },
        };
        Some(Matched {
            target,
            ttl_ns: e.ttl_ns,
            burst_ns: e.burst_ns,
        })
    }
}

fn entry(spec: BucketSpec) -> Result<Entry, String> {
    if spec.bucket.is_empty() {
        return Err("`bucket` lists no key (it would match every id: write `name: \"*\"`)".into());
    }
    let target = match (spec.rule, spec.blanket) {
        (Some(_), Some(_)) => return Err("give `rule` or `blanket`, not both".into()),
        (None, None) => return Err("give `rule` (a rule's name) or `blanket`".into()),
        (None, Some(b)) => {
            if spec.key.is_some() {
                return Err("`key` goes with `rule`, not `blanket`".into());
            }
            EntryTarget::Blanket(b)
        }
        (Some(rule), None) => {
            if rule.is_empty() {
                return Err("`rule` is empty".into());
            }
            if let Some(t) = &spec.key {
                check_template(t)?;
            }
            EntryTarget::Rule {
                rule,
                key: spec.key,
            }
        }
    };
    let duration = |what: &str, v: Option<String>, default: u64| match v {
        None => Ok(default),
        Some(s) => crate::rules::parse_period(&s).map_err(|e| format!("`{what}`: {e}")),
    };
    let ttl_ns = duration("ttl", spec.ttl, DEFAULT_TTL_NS)?;
    if ttl_ns % 1_000_000_000 != 0 {
        // Envoy's filter reads the whole seconds of an assignment's TTL.
        return Err("`ttl` must be whole seconds (Envoy reads only the seconds)".into());
    }
    let burst_ns = duration("burst", spec.burst, DEFAULT_BURST_NS)?;
    Ok(Entry {
        bucket: spec.bucket.into_iter().collect(),
        target,
        ttl_ns,
        burst_ns,
    })
}

/// A key template's placeholders are closed and named.
fn check_template(t: &str) -> Result<(), String> {
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("`key` {t:?}: a `{{` is not closed"));
        };
        if close == 1 {
            return Err(format!("`key` {t:?}: an empty placeholder"));
        }
        rest = &rest[open + close + 1..];
    }
    if t.is_empty() {
        return Err("`key` is empty".into());
    }
    Ok(())
}

/// The value of `key` in `id` (sorted by key).
fn value<'a>(id: &'a [(String, String)], key: &str) -> Option<&'a str> {
    id.binary_search_by(|(k, _)| k.as_str().cmp(key))
        .ok()
        .map(|i| id[i].1.as_str())
}

/// `template` with each `{name}` replaced by the id's value of `name` (empty when absent).
fn render(template: &str, id: &[(String, String)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + close];
        out.push_str(value(id, name).unwrap_or(""));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
domains:
  - domain: edge
    buckets:
      - bucket: { name: api, tenant: "*" }
        rule: per_tenant
        key: "t:{tenant}"
        ttl: 5s
      - bucket: { name: "intern*" }
        blanket: allow_all
      - bucket: { name: blocked }
        blanket: deny_all
      - bucket: { name: plain }
        rule: per_id
"#;

    fn id(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut id: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        id.sort();
        id
    }

    #[test]
    fn ids_match_the_first_entry_in_file_order() {
        let c = RlqsConfig::parse("rlqs.yaml", FILE).expect("valid");
        let m = c
            .matched(
                "edge",
                &id(&[("name", "api"), ("tenant", "acme"), ("x", "y")]),
            )
            .expect("matched");
        assert_eq!(
            m.target,
            Target::Rule {
                rule: "per_tenant".into(),
                key: "t:acme".into()
            }
        );
        assert_eq!(m.ttl_ns, 5_000_000_000);
        assert_eq!(m.burst_ns, DEFAULT_BURST_NS);
        let m = c
            .matched("edge", &id(&[("name", "internal")]))
            .expect("matched");
        assert_eq!(m.target, Target::Blanket(Blanket::AllowAll));
        let m = c
            .matched("edge", &id(&[("name", "blocked")]))
            .expect("matched");
        assert_eq!(m.target, Target::Blanket(Blanket::DenyAll));
        let m = c
            .matched("edge", &id(&[("name", "plain"), ("b", "2"), ("a", "1")]))
            .expect("matched");
        assert_eq!(
            m.target,
            Target::Rule {
                rule: "per_id".into(),
                key: "a=1,b=2,name=plain".into()
            }
        );
        // No entry, no tenant, another domain: abandoned.
        assert!(c.matched("edge", &id(&[("name", "other")])).is_none());
        assert!(c.matched("edge", &id(&[("name", "api")])).is_none());
        assert!(c.matched("other", &id(&[("name", "api")])).is_none());
    }

    #[test]
    fn refusals_name_the_place_and_the_fault() {
        for (text, says) in [
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}}]}]",
                "buckets[0]: give `rule`",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, rule: r, blanket: deny_all}]}]",
                "not both",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {}, rule: r}]}]",
                "lists no key",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, rule: r, ttl: 5}]}]",
                "`ttl`",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, rule: r, ttl: 0s}]}]",
                "longer than zero",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, rule: r, ttl: 1500ms}]}]",
                "whole seconds",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, rule: r, key: \"{a\"}]}]",
                "not closed",
            ),
            (
                "domains: [{domain: e, buckets: [{bucket: {a: b}, blanket: maybe}]}]",
                "blanket",
            ),
            ("domains: [{domain: e}, {domain: e}]", "twice"),
            ("domains: [{domain: e, typo: 1}]", "typo"),
            ("domains: [{domain: \"\"}]", "empty"),
        ] {
            let e = RlqsConfig::parse("f.yaml", text)
                .expect_err(text)
                .to_string();
            assert!(e.starts_with("f.yaml: ") && e.contains(says), "{text}: {e}");
        }
    }
}
