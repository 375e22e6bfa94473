//! Rules: the rules file, built-in defaults, and the rule set in force.
//!
//! Parameter validation and bucket identities live in [`ringlimit_core::rule`], shared with the
//! SDK; this module adds names, modes and the YAML file.
//!
//! # Layout
//! - this module — [`RuleSet`]: the rules file (YAML), built-in defaults, the rule set in force.
//! - [`spec`] — [`RuleSpec`]: the rule a check names (by name, or inline).
//! - [`in_force`] — [`InForce`]: the rule set checks are decided under, and a check made
//!   ready under it ([`Prepared`]).
//! - [`api`] — rules written through the admin API: validation, versions (hybrid clock).
//! - [`book`] — the rules in force: the file's and the admin API's, kept under `--data-dir`.
//! - [`change`] — one admin API change of a rule, decided where the rule's name is owned.
//! - [`sync`] — the admin API's rules through gossip (publish, merge).
//! - [`reload`] — the rules file's (and the Envoy configuration's) hot reload.
//! - [`request_key`] — forward auth's key templates.
//! - [`envoy_config`] — the envoyproxy/ratelimit configuration (`--envoy-config`).

pub mod api;
pub mod book;
pub mod change;
pub mod envoy_config;
pub mod in_force;
pub mod reload;
pub mod request_key;
pub mod spec;
pub mod sync;

pub use in_force::{InForce, Prepared};
pub use spec::RuleSpec;

use crate::rules::request_key::KeyTemplate;
use ringlimit_core::check::Resolved;
use ringlimit_core::limiter::Rule;
use ringlimit_core::rule::{
    FieldError, LeaseMode, Mode, OnOwnerUnreachable, OnRegionUnreachable, PersistMode, RegionScope,
    calendar_of, field_err, named_seed, validate_calendar,
};
use ringlimit_proto::Algorithm;
use ringlimit_proto::discovery::RuleInfo;
use serde_yaml_ng::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A configured rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedRule {
    pub name: String,
    pub rule: Rule,
    pub mode: Mode,
    pub on_owner_unreachable: OnOwnerUnreachable,
    /// Decided and counted, never denies (`shadow: true`): how an operator tries a new limit
    /// on live traffic.
    pub shadow: bool,
    /// Whether this rule's hot buckets may be leased to other nodes and SDKs (`lease: off`
    /// keeps every check at the owner).
    pub lease: LeaseMode,
    /// Whether this rule's buckets are kept on disk under `--data-dir` (`persist: auto |
    /// always | never`; see `crate::durable`).
    pub persist: PersistMode,
    /// Where a gateway's forwarded request finds its key (`/v1/forward-auth`).
    pub request_key: Option<Arc<KeyTemplate>>,
    /// See [`named_seed`].
    pub seed: u64,
    /// Repeat offenders' blocks (`block: { after, within, for, max }`).
    pub block: Option<crate::blocks::Policy>,
    /// `scope: region | regions`: whether every region (`--region-peers`) shares the limit.
    pub scope: RegionScope,
    /// `on_region_unreachable: share | open` (`scope: regions` only).
    pub on_region_unreachable: OnRegionUnreachable,
}

impl NamedRule {
    /// This rule as checks resolve it.
    pub fn resolved(&self) -> Resolved {
        Resolved {
            rule: self.rule,
            seed: self.seed,
            mode: self.mode,
            on_unreachable: self.on_owner_unreachable,
            shadow: self.shadow,
            lease: self.lease,
            persist: self.persist,
            scope: self.scope,
            on_region_unreachable: self.on_region_unreachable,
        }
    }

    /// This rule as `GET /v1/rules` lists it.
    pub fn info(&self) -> RuleInfo {
        let r = &self.rule;
        RuleInfo {
            name: self.name.clone(),
            limit: r.limit,
            period_ms: r.period_ns.div_ceil(ringlimit_core::clock::NANOS_PER_MS),
            period: match r.calendar {
                Some(c) => c.unit.period().to_owned(),
                None => format_period(r.period_ns),
            },
            algorithm: r.algorithm,
            burst: r.algorithm.has_burst().then_some(r.burst),
            mode: self.mode,
            on_owner_unreachable: self.on_owner_unreachable,
            shadow: self.shadow,
            lease: self.lease,
            persist: self.persist,
            request_key: self.request_key.as_ref().map(|t| t.to_string()),
            calendar: r.calendar.is_some(),
            timezone: r.calendar.map(|c| c.zone.name().to_owned()),
            block: self.block.map(|b| ringlimit_proto::discovery::BlockInfo {
                after: b.after,
                within: format_period(b.within_ms * ringlimit_core::clock::NANOS_PER_MS),
                for_: format_period(b.for_ms * ringlimit_core::clock::NANOS_PER_MS),
                max: format_period(b.max_ms * ringlimit_core::clock::NANOS_PER_MS),
            }),
            scope: self.scope,
            on_region_unreachable: self.on_region_unreachable,
            scope_in_effect: None,
        }
    }
}

/// The rules in force, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    rules: HashMap<String, Arc<NamedRule>>,
}

impl RuleSet {
    pub fn get(&self, name: &str) -> Option<&Arc<NamedRule>> {
        self.rules.get(name)
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rules sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &NamedRule> {
        let mut v: Vec<_> = self.rules.values().map(|r| r.as_ref()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v.into_iter()
    }

    /// A fingerprint of these rules (`ringlimit_rules_hash`): the same on every node of one
    /// version with the same rules in force, whatever order they were loaded in, and another
    /// as soon as any field of any rule differs. FNV-1a over each rule as `GET /v1/rules` lists
    /// it (with its period in ns), in name order; 53 bits, so that Prometheus' float64 holds it
    /// exactly and nodes can be compared with `max != min`.
    pub fn fingerprint(&self) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0100_0000_01b3;
        let mut h = OFFSET;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h = (h ^ u64::from(b)).wrapping_mul(PRIME);
            }
        };
        for r in self.iter() {
            // A RuleInfo of plain fields always serializes; an error would only hash as empty.
            eat(serde_json::to_string(&r.info())
                .unwrap_or_default()
                .as_bytes());
            eat(&r.rule.period_ns.to_le_bytes());
            eat(b"\n");
        }
        h & ((1 << 53) - 1)
    }

    /// These rules and `api`'s (rules written through the admin API), file rules first: an
    /// API rule whose name the file now defines is left out, and its name returned.
    pub fn with_api(&self, api: Vec<NamedRule>) -> (Self, Vec<String>) {
        let mut rules = self.rules.clone();
        let mut shadowed = Vec::new();
        for r in api {
            if rules.contains_key(&r.name) {
                shadowed.push(r.name);
            } else {
                rules.insert(r.name.clone(), Arc::new(r));
            }
        }
        (Self { rules }, shadowed)
    }

    /// The rules a node has when started without `--config`.
    pub fn builtin() -> Self {
        const BUILTIN: &str = r#"
rules:
  - name: default
    limit: 100
    period: 1m
  - name: per-second
    limit: 10
    period: 1s
    burst: 20
  - name: hourly
    limit: 1000
    period: 1h
    algorithm: sliding_window
"#;
        match Self::from_yaml(BUILTIN) {
            Ok(r) => r,
            Err(e) => unreachable!("built-in rules are valid: {e}"),
        }
    }

    /// Parses and validates a rules file.
    pub fn from_yaml(text: &str) -> Result<Self, RulesError> {
        let doc: Value =
            serde_yaml_ng::from_str(text).map_err(|e| RulesError::Syntax(e.to_string()))?;
        let Value::Mapping(top) = doc else {
            return Err(RulesError::Shape(
                "the file must be a mapping with a `rules:` list".into(),
            ));
        };
        for (k, _) in &top {
            if k.as_str() != Some("rules") {
                return Err(RulesError::Shape(format!(
                    "unknown top-level key {}; only `rules` is allowed",
                    describe(k)
                )));
            }
        }
        let Some(Value::Sequence(items)) = top.get("rules") else {
            return Err(RulesError::Shape("`rules` must be a list of rules".into()));
        };
        let mut rules = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let r = parse_rule(i, item)?;
            if rules.contains_key(&r.name) {
                return Err(RulesError::Rule {
                    rule: r.name.clone(),
                    error: field_err("name", "is used by an earlier rule"),
                });
            }
            rules.insert(r.name.clone(), Arc::new(r));
        }
        Ok(Self { rules })
    }
}

/// Why a rules file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("rules file is not valid YAML: {0}")]
    Syntax(String),
    #[error("rules file: {0}")]
    Shape(String),
    #[error("rule {rule:?}: {error}")]
    Rule { rule: String, error: FieldError },
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => serde_yaml_ng::to_string(other)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
    }
}

const RULE_FIELDS: [&str; 16] = [
    "name",
    "limit",
    "period",
    "algorithm",
    "burst",
    "mode",
    "on_owner_unreachable",
    "shadow",
    "lease",
    "request_key",
    "calendar",
    "timezone",
    "persist",
    "block",
    "scope",
    "on_region_unreachable",
];

fn parse_rule(index: usize, item: &Value) -> Result<NamedRule, RulesError> {
    let label = format!("#{}", index + 1);
    let Value::Mapping(m) = item else {
        return Err(RulesError::Rule {
            rule: label,
            error: field_err("rule", "must be a mapping of fields"),
        });
    };
    let name = match m.get("name") {
        Some(Value::String(s)) if valid_name(s) => s.clone(),
        Some(Value::String(s)) => {
            return Err(RulesError::Rule {
                rule: label,
                error: field_err(
                    "name",
                    format!(
                        "{s:?} must be 1 to 128 characters of letters, digits, '-', '_', '.' or ':'"
                    ),
                ),
            });
        }
        Some(other) => {
            return Err(RulesError::Rule {
                rule: label,
                error: field_err("name", format!("must be a string, got {}", describe(other))),
            });
        }
        None => {
            return Err(RulesError::Rule {
                rule: label,
                error: field_err("name", "is missing"),
            });
        }
    };
    let fail = |error: FieldError| RulesError::Rule {
        rule: name.clone(),
        error,
    };
    for (k, _) in m {
        if !k.as_str().is_some_and(|k| RULE_FIELDS.contains(&k)) {
            return Err(fail(field_err(
                "rule",
                format!(
                    "has unknown field {}; known fields are {}",
                    describe(k),
                    RULE_FIELDS.join(", ")
                ),
            )));
        }
    }
    let limit = match m.get("limit") {
        Some(v) => v.as_u64().ok_or_else(|| {
            fail(field_err(
                "limit",
                format!("must be a whole number, got {}", describe(v)),
            ))
        })?,
        None => return Err(fail(field_err("limit", "is missing"))),
    };
    let period_ns = match m.get("period") {
        Some(Value::String(s)) => {
            parse_period(s).map_err(|reason| fail(field_err("period", reason)))?
        }
        Some(v) => {
            return Err(fail(field_err(
                "period",
                format!(
                    "must be a duration such as 250ms, 10s, 1m, 1h, 1d, 1w or 1mo, got {}",
                    describe(v)
                ),
            )));
        }
        None => return Err(fail(field_err("period", "is missing"))),
    };
    let algorithm = match m.get("algorithm") {
        None => Algorithm::default(),
        Some(Value::String(s)) => s.parse().map_err(|e: ringlimit_proto::UnknownAlgorithm| {
            fail(field_err("algorithm", e.to_string()))
        })?,
        Some(v) => {
            return Err(fail(field_err(
                "algorithm",
                format!("must be a string, got {}", describe(v)),
            )));
        }
    };
    let burst = match m.get("burst") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            fail(field_err(
                "burst",
                format!("must be a whole number, got {}", describe(v)),
            ))
        })?),
    };
    let mode = match m.get("mode").map(|v| (v.as_str(), v)) {
        None => Mode::Owner,
        Some((Some("owner"), _)) => Mode::Owner,
        Some((Some("global"), _)) => Mode::Global,
        Some((_, v)) => {
            return Err(fail(field_err(
                "mode",
                format!("must be owner or global, got {}", describe(v)),
            )));
        }
    };
    let on_owner_unreachable = match m.get("on_owner_unreachable").map(|v| (v.as_str(), v)) {
        None => OnOwnerUnreachable::Open,
        Some((Some("open"), _)) => OnOwnerUnreachable::Open,
        Some((Some("closed"), _)) => OnOwnerUnreachable::Closed,
        Some((_, v)) => {
            return Err(fail(field_err(
                "on_owner_unreachable",
                format!("must be open or closed, got {}", describe(v)),
            )));
        }
    };
    let shadow = match m.get("shadow") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(fail(field_err(
                "shadow",
                format!("must be true or false, got {}", describe(v)),
            )));
        }
    };
    let lease = match m.get("lease").map(|v| (v.as_str(), v)) {
        None => LeaseMode::Auto,
        Some((Some("auto"), _)) => LeaseMode::Auto,
        Some((Some("off"), _)) => LeaseMode::Off,
        Some((_, v)) => {
            return Err(fail(field_err(
                "lease",
                format!("must be auto or off, got {}", describe(v)),
            )));
        }
    };
    let persist = match m.get("persist").map(|v| (v.as_str(), v)) {
        None => PersistMode::Auto,
        Some((Some("auto"), _)) => PersistMode::Auto,
        Some((Some("always"), _)) => PersistMode::Always,
        Some((Some("never"), _)) => PersistMode::Never,
        Some((_, v)) => {
            return Err(fail(field_err(
                "persist",
                format!("must be auto, always or never, got {}", describe(v)),
            )));
        }
    };
    let request_key = match m.get("request_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Arc::new(
            KeyTemplate::parse(s).map_err(|reason| fail(field_err("request_key", reason)))?,
        )),
        Some(v) => {
            return Err(fail(field_err(
                "request_key",
                format!(
                    "must be a key template such as \"apikey:{{header:x-api-key}}\", got {}",
                    describe(v)
                ),
            )));
        }
    };
    let calendar = match m.get("calendar") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(fail(field_err(
                "calendar",
                format!("must be true or false, got {}", describe(v)),
            )));
        }
    };
    let timezone = match m.get("timezone") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(v) => {
            return Err(fail(field_err(
                "timezone",
                format!(
                    "must be an IANA time zone name such as \"Europe/Berlin\", got {}",
                    describe(v)
                ),
            )));
        }
    };
    let month = matches!(m.get("period"), Some(Value::String(s)) if is_month(s));
    let calendar = calendar_of(algorithm, period_ns, month, calendar, timezone).map_err(&fail)?;
    let rule = validate_calendar(algorithm, limit, period_ns, burst, calendar).map_err(&fail)?;
    let block = match m.get("block") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_block(v).map_err(|reason| fail(field_err("block", reason)))?),
    };
    if block.is_some() && mode == Mode::Global {
        // A global rule's checks are decided on every node from shared counts: no member sees
        // every denial of a key, so none could count them for a block.
        return Err(fail(field_err(
            "block",
            "works with mode: owner rules only (a global rule has no owner to count a key's \
             denials); remove block or the mode",
        )));
    }
    let scope = match m.get("scope").map(|v| (v.as_str(), v)) {
        None => RegionScope::Region,
        Some((Some("region"), _)) => RegionScope::Region,
        Some((Some("regions"), _)) => RegionScope::Regions,
        Some((_, v)) => {
            return Err(fail(field_err(
                "scope",
                format!("must be region or regions, got {}", describe(v)),
            )));
        }
    };
    let on_region_unreachable = match m.get("on_region_unreachable").map(|v| (v.as_str(), v)) {
        None => OnRegionUnreachable::Share,
        Some((Some("share"), _)) => OnRegionUnreachable::Share,
        Some((Some("open"), _)) => OnRegionUnreachable::Open,
        Some((_, v)) => {
            return Err(fail(field_err(
                "on_region_unreachable",
                format!("must be share or open, got {}", describe(v)),
            )));
        }
    };
    if scope == RegionScope::Regions {
        check_regions_scope(algorithm, mode).map_err(&fail)?;
    }
    if m.contains_key("on_region_unreachable") {
        if scope != RegionScope::Regions {
            return Err(fail(field_err(
                "on_region_unreachable",
                "applies only to scope: regions rules (add `scope: regions`)",
            )));
        }
        if mode == Mode::Global {
            // A global rule never waits on another region: it decides from the counts it
            // has, whatever the links' state.
            return Err(fail(field_err(
                "on_region_unreachable",
                "applies only to mode: owner rules (a mode: global rule decides from the \
                 counts it has heard, whatever the links' state); remove it",
            )));
        }
    }
    Ok(NamedRule {
        block,
        scope,
        on_region_unreachable,
        seed: named_seed(&name, algorithm),
        name,
        rule,
        mode,
        on_owner_unreachable,
        shadow,
        lease,
        persist,
        request_key,
    })
}

/// Whether a rule of `algorithm` in `mode` may be shared by every region: its buckets must be
/// leasable (handed out in exact slices: token bucket, fixed and sliding window), and a global
/// rule's counts are not allocated (sharing them across regions is not built).
fn check_regions_scope(algorithm: Algorithm, mode: Mode) -> Result<(), FieldError> {
    // A global rule across regions is counted, not sliced: every algorithm global mode takes
    // (see `crate::global`) is shared the same way.
    if mode == Mode::Global {
        return Ok(());
    }
    if !ringlimit_core::lease::leasable(algorithm) {
        return Err(field_err(
            "scope",
            format!(
                "regions applies only to token_bucket, fixed_window and sliding_window (whose \
                 buckets are handed to regions in exact slices), not {algorithm}; or use \
                 mode: global"
            ),
        ));
    }
    Ok(())
}

/// Parses a rule's `block: { after: N, within: D, for: D, max: D }` (`max` optional: `for`).
fn parse_block(v: &Value) -> Result<crate::blocks::Policy, String> {
    const FIELDS: &str = "after, within, for, max";
    let Value::Mapping(m) = v else {
        return Err(format!(
            "must be a mapping such as {{ after: 20, within: 1m, for: 15m, max: 24h }}, got {}",
            describe(v)
        ));
    };
    for (k, _) in m {
        if !k
            .as_str()
            .is_some_and(|k| ["after", "within", "for", "max"].contains(&k))
        {
            return Err(format!(
                "has unknown field {}; known fields are {FIELDS}",
                describe(k)
            ));
        }
    }
    let after = match m.get("after") {
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("after must be a whole number above 0, got {}", describe(v)))?,
        None => return Err("after is missing".into()),
    };
    let ms = |field: &str| -> Result<Option<u64>, String> {
        match m.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => parse_period(s)
                .map(|ns| Some(ns.div_ceil(ringlimit_core::clock::NANOS_PER_MS)))
                .map_err(|e| format!("{field}: {e}")),
            Some(v) => Err(format!(
                "{field} must be a duration such as 1m, got {}",
                describe(v)
            )),
        }
    };
    let within_ms = ms("within")?.ok_or("within is missing")?;
    let for_ms = ms("for")?.ok_or("for is missing")?;
    let max_ms = ms("max")?.unwrap_or(for_ms);
    if max_ms < for_ms {
        return Err("max must be at least for".into());
    }
    Ok(crate::blocks::Policy {
        after,
        within_ms,
        for_ms,
        max_ms,
    })
}

fn valid_name(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// An inline rule's period given as `period` (the rules file's words, which wins over
/// `period_ms`) or `period_ms`, with a calendar: its length in ms (a calendar unit's nominal
/// length) and its calendar, refused as the rules file refuses them. For the HTTP API's and
/// `ringlimit.v1`'s inline rules alike.
pub fn inline_period(
    algorithm: Algorithm,
    period_ms: u64,
    period: Option<&str>,
    calendar: bool,
    timezone: Option<&str>,
) -> Result<(u64, Option<ringlimit_core::calendar::Calendar>), FieldError> {
    let (period_ns, month) = match period {
        Some(p) => (
            parse_period(p).map_err(|reason| field_err("period", reason))?,
            is_month(p),
        ),
        None => (
            period_ms.saturating_mul(ringlimit_core::clock::NANOS_PER_MS),
            false,
        ),
    };
    let cal = calendar_of(algorithm, period_ns, month, calendar, timezone)?;
    let period_ns = cal.map_or(period_ns, |c| c.unit.nominal_ns());
    Ok((period_ns.div_ceil(ringlimit_core::clock::NANOS_PER_MS), cal))
}

/// Whether a period is written as a month (`1mo`), which has no fixed length.
pub fn is_month(s: &str) -> bool {
    s.trim().ends_with("mo")
}

/// Parses `250ms`, `10s`, `1m`, `1h`, `1d`, `1w` (a whole number and a unit) into nanoseconds;
/// `1mo` into a calendar month's nominal length (see [`is_month`]: only calendar rules take it).
pub fn parse_period(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("{s:?} is not a duration such as 250ms, 10s, 1m, 1h, 1d, 1w or 1mo")
    })?;
    let unit_ns: u64 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "d" => 86_400 * 1_000_000_000,
        "w" => 7 * 86_400 * 1_000_000_000,
        "mo" if n == 1 => return Ok(ringlimit_core::calendar::Unit::Month.nominal_ns()),
        "mo" => return Err(format!("{s:?}: a calendar period is one month, 1mo")),
        "" => return Err(format!("{s:?} has no unit; write e.g. {n}ms or {n}s")),
        _ => {
            return Err(format!(
                "{s:?} has unknown unit {unit:?}; use ms, s, m, h, d, w or mo"
            ));
        }
    };
    let ns = n
        .checked_mul(unit_ns)
        .ok_or_else(|| format!("{s:?} is too long"))?;
    if ns == 0 {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(ns)
}

/// Formats a period back to the rules-file notation (largest exact unit).
pub fn format_period(ns: u64) -> String {
    let d = Duration::from_nanos(ns);
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests;
