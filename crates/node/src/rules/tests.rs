//! Rules tests.

use super::*;
use ringlimit_core::limiter::{MAX_LIMIT, MAX_PERIOD_NS, MAX_SLIDING_LOG_LIMIT};
use ringlimit_core::rule::{bucket_id, inline_seed, validate, validate_inline};
use ringlimit_proto::InlineRule;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

const FULL: &str = r#"
# Every field, every algorithm, every unit.
rules:
  - name: free-tier
    limit: 100
    period: 1m
    algorithm: token_bucket
    burst: 150
    mode: owner
    on_owner_unreachable: open
  - name: api.v2:write_ops
    limit: 5
    period: 250ms
    algorithm: leaky_bucket
    burst: 2
    mode: global
    on_owner_unreachable: closed
  - name: fixed
    limit: 1000
    period: 1h
    algorithm: fixed_window
    mode: owner
    on_owner_unreachable: closed
  - name: sliding
    limit: 50000
    period: 1d
    algorithm: sliding_window
    mode: global
  - name: log
    limit: 10000
    period: 10s
    algorithm: sliding_log
    on_owner_unreachable: open
  - name: defaults
    limit: 7
    period: 10s
  - name: null-burst
    limit: 3
    period: 1m
    burst: ~
"#;

/// Parses `yaml`, expecting a rule error; returns (rule, field, reason).
fn rule_err(yaml: &str) -> (String, &'static str, String) {
    match RuleSet::from_yaml(yaml) {
        Err(RulesError::Rule { rule, error }) => (rule, error.field, error.reason),
        other => panic!("expected a rule error for\n{yaml}\ngot {other:?}"),
    }
}

/// A one-rule file named `r` with the given extra lines (each `key: value`).
fn one(lines: &[&str]) -> String {
    let mut s = String::from("rules:\n  - name: r\n");
    for l in lines {
        s.push_str("    ");
        s.push_str(l);
        s.push('\n');
    }
    s
}

fn assert_rule_err(yaml: &str, rule: &str, field: &str, reason_has: &str) {
    let (r, f, reason) = rule_err(yaml);
    assert_eq!(r, rule, "rule for\n{yaml}\nreason: {reason}");
    assert_eq!(f, field, "field for\n{yaml}\nreason: {reason}");
    assert!(
        reason.contains(reason_has),
        "reason {reason:?} does not mention {reason_has:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// A valid file
// ---------------------------------------------------------------------------------------------

#[test]
fn a_full_valid_file_parses() {
    let set = RuleSet::from_yaml(FULL).expect("valid file");
    assert_eq!(set.len(), 7);
    assert!(!set.is_empty());

    let r = set.get("free-tier").expect("free-tier");
    assert_eq!(r.name, "free-tier");
    assert_eq!(
        r.rule,
        Rule {
            algorithm: Algorithm::TokenBucket,
            limit: 100,
            period_ns: 60 * SEC,
            burst: 150,
            calendar: None,
        }
    );
    assert_eq!(r.mode, Mode::Owner);
    assert_eq!(r.on_owner_unreachable, OnOwnerUnreachable::Open);
    assert_eq!(r.seed, named_seed("free-tier", Algorithm::TokenBucket));

    let r = set.get("api.v2:write_ops").expect("leaky");
    assert_eq!(
        r.rule,
        Rule {
            algorithm: Algorithm::LeakyBucket,
            limit: 5,
            period_ns: 250 * MS,
            burst: 2,
            calendar: None,
        }
    );
    assert_eq!(r.mode, Mode::Global);
    assert_eq!(r.on_owner_unreachable, OnOwnerUnreachable::Closed);

    let r = set.get("fixed").expect("fixed");
    assert_eq!(r.rule.algorithm, Algorithm::FixedWindow);
    assert_eq!(r.rule.period_ns, 3600 * SEC);
    assert_eq!(r.rule.burst, 1000, "window algorithms: burst = limit");
    assert_eq!(r.on_owner_unreachable, OnOwnerUnreachable::Closed);

    let r = set.get("sliding").expect("sliding");
    assert_eq!(r.rule.algorithm, Algorithm::SlidingWindow);
    assert_eq!(r.rule.limit, 50_000);
    assert_eq!(r.rule.period_ns, 86_400 * SEC);
    assert_eq!(r.mode, Mode::Global);
    assert_eq!(r.on_owner_unreachable, OnOwnerUnreachable::Open);

    let r = set.get("log").expect("log");
    assert_eq!(r.rule.algorithm, Algorithm::SlidingLog);
    assert_eq!(r.rule.limit, MAX_SLIDING_LOG_LIMIT);
    assert_eq!(r.rule.period_ns, 10 * SEC);

    // Defaults: token bucket, burst = limit, owner mode, fail open.
    let r = set.get("defaults").expect("defaults");
    assert_eq!(
        r.rule,
        Rule {
            algorithm: Algorithm::TokenBucket,
            limit: 7,
            period_ns: 10 * SEC,
            burst: 7,
            calendar: None,
        }
    );
    assert_eq!(r.mode, Mode::Owner);
    assert_eq!(r.on_owner_unreachable, OnOwnerUnreachable::Open);
    assert_eq!(set.get("null-burst").expect("null-burst").rule.burst, 3);

    assert!(set.get("missing").is_none());
    let names: Vec<_> = set.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "api.v2:write_ops",
            "defaults",
            "fixed",
            "free-tier",
            "log",
            "null-burst",
            "sliding"
        ]
    );
}

#[test]
fn an_empty_rules_list_is_valid_and_empty() {
    let set = RuleSet::from_yaml("rules: []\n").expect("valid");
    assert!(set.is_empty());
    assert_eq!(set.len(), 0);
    assert_eq!(set.iter().count(), 0);
}

#[test]
fn the_same_text_parses_to_the_same_set() {
    assert_eq!(
        RuleSet::from_yaml(FULL).expect("valid"),
        RuleSet::from_yaml(FULL).expect("valid")
    );
}

#[test]
fn builtin_rules_are_non_empty_and_valid() {
    let set = RuleSet::builtin();
    assert!(!set.is_empty());
    let d = set.get("default").expect("a rule named default");
    assert_eq!(d.rule.limit, 100);
    assert_eq!(d.rule.period_ns, 60 * SEC);
    for r in set.iter() {
        assert_eq!(
            validate(
                r.rule.algorithm,
                r.rule.limit,
                r.rule.period_ns,
                Some(r.rule.burst).filter(|_| r.rule.algorithm.has_burst())
            ),
            Ok(r.rule),
            "{}",
            r.name
        );
        assert_eq!(r.seed, named_seed(&r.name, r.rule.algorithm));
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid rules: each names the rule and the field
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_name_is_named_by_position() {
    assert_rule_err(
        "rules:\n  - limit: 1\n    period: 1s\n",
        "#1",
        "name",
        "missing",
    );
    let yaml = "rules:\n  - name: a\n    limit: 1\n    period: 1s\n  - limit: 2\n    period: 1s\n";
    assert_rule_err(yaml, "#2", "name", "missing");
}

#[test]
fn bad_names_are_refused() {
    assert_rule_err(&one_named("\"has space\""), "#1", "name", "has space");
    assert_rule_err(&one_named("\"\""), "#1", "name", "1 to 128");
    assert_rule_err(&one_named(&"x".repeat(129)), "#1", "name", "1 to 128");
    assert_rule_err(&one_named("42"), "#1", "name", "must be a string");
    assert_rule_err(&one_named("[a, b]"), "#1", "name", "must be a string");
    // 128 characters is fine.
    let name = "x".repeat(128);
    let set = RuleSet::from_yaml(&one_named(&name)).expect("128 chars");
    assert!(set.get(&name).is_some());
}

fn one_named(name: &str) -> String {
    format!("rules:\n  - name: {name}\n    limit: 1\n    period: 1s\n")
}

#[test]
fn missing_limit() {
    assert_rule_err(&one(&["period: 1s"]), "r", "limit", "missing");
}

#[test]
fn missing_period() {
    assert_rule_err(&one(&["limit: 1"]), "r", "period", "missing");
}

#[test]
fn bad_limits() {
    assert_rule_err(&one(&["limit: 0", "period: 1s"]), "r", "limit", "got 0");
    assert_rule_err(
        &one(&["limit: -3", "period: 1s"]),
        "r",
        "limit",
        "whole number",
    );
    assert_rule_err(
        &one(&["limit: 2.5", "period: 1s"]),
        "r",
        "limit",
        "whole number",
    );
    assert_rule_err(
        &one(&["limit: ten", "period: 1s"]),
        "r",
        "limit",
        "whole number",
    );
    let over = format!("limit: {}", MAX_LIMIT + 1);
    assert_rule_err(
        &one(&[&over, "period: 1d", "algorithm: fixed_window"]),
        "r",
        "limit",
        "between 1 and",
    );
}

#[test]
fn bad_periods() {
    assert_rule_err(
        &one(&["limit: 1", "period: 10x"]),
        "r",
        "period",
        "unknown unit",
    );
    assert_rule_err(&one(&["limit: 1", "period: 10sec"]), "r", "period", "unit");
    assert_rule_err(
        &one(&["limit: 1", "period: \"10\""]),
        "r",
        "period",
        "no unit",
    );
    // A bare number is not a string at all.
    assert_rule_err(
        &one(&["limit: 1", "period: 10"]),
        "r",
        "period",
        "must be a duration",
    );
    assert_rule_err(&one(&["limit: 1", "period: 0s"]), "r", "period", "zero");
    assert_rule_err(&one(&["limit: 1", "period: 1.5s"]), "r", "period", "");
    assert_rule_err(
        &one(&["limit: 1", "period: 367d"]),
        "r",
        "period",
        "366 days",
    );
    // The longest period is fine.
    assert!(RuleSet::from_yaml(&one(&["limit: 1", "period: 366d"])).is_ok());
}

#[test]
fn unknown_field_is_named() {
    let (rule, field, reason) = rule_err(&one(&["limit: 1", "period: 1s", "brust: 3"]));
    assert_eq!(rule, "r");
    assert_eq!(field, "rule");
    assert!(reason.contains("\"brust\""), "{reason}");
    assert!(reason.contains("burst"), "lists the known fields: {reason}");
}

#[test]
fn bad_algorithm() {
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "algorithm: token-bucket"]),
        "r",
        "algorithm",
        "token-bucket",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "algorithm: 3"]),
        "r",
        "algorithm",
        "must be a string",
    );
}

#[test]
fn burst_only_for_buckets() {
    for alg in ["fixed_window", "sliding_window", "sliding_log"] {
        let a = format!("algorithm: {alg}");
        assert_rule_err(
            &one(&["limit: 5", "period: 1s", &a, "burst: 5"]),
            "r",
            "burst",
            alg,
        );
    }
    assert_rule_err(
        &one(&["limit: 5", "period: 1s", "burst: 0"]),
        "r",
        "burst",
        "got 0",
    );
    assert_rule_err(
        &one(&["limit: 5", "period: 1s", "burst: lots"]),
        "r",
        "burst",
        "whole number",
    );
}

#[test]
fn sliding_log_limit_is_capped() {
    let over = format!("limit: {}", MAX_SLIDING_LOG_LIMIT + 1);
    assert_rule_err(
        &one(&[&over, "period: 1m", "algorithm: sliding_log"]),
        "r",
        "limit",
        "sliding_window",
    );
    // The same limit is fine for the counter algorithms.
    assert!(RuleSet::from_yaml(&one(&[&over, "period: 1m", "algorithm: sliding_window"])).is_ok());
}

#[test]
fn duplicate_names_are_refused() {
    let yaml = "rules:\n  - name: a\n    limit: 1\n    period: 1s\n  - name: b\n    limit: 1\n    period: 1s\n  - name: a\n    limit: 2\n    period: 1m\n";
    assert_rule_err(yaml, "a", "name", "earlier rule");
}

#[test]
fn bad_mode() {
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "mode: local"]),
        "r",
        "mode",
        "local",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "mode: 1"]),
        "r",
        "mode",
        "owner or global",
    );
}

#[test]
fn shadow_and_request_key_are_validated() {
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "shadow: maybe"]),
        "r",
        "shadow",
        "true or false",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "request_key: plain"]),
        "r",
        "request_key",
        "no placeholder",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "request_key: \"k:{cookie:a}\""]),
        "r",
        "request_key",
        "unknown placeholder",
    );
    let set = RuleSet::from_yaml(&one(&[
        "limit: 1",
        "period: 1s",
        "shadow: true",
        "request_key: \"ip:{client_ip}\"",
    ]))
    .expect("valid");
    let r = set.get("r").expect("the rule");
    assert!(r.shadow && r.resolved().shadow);
    let info = r.info();
    assert!(info.shadow);
    assert_eq!(info.request_key.as_deref(), Some("ip:{client_ip}"));
}

#[test]
fn lease_is_auto_unless_a_rule_says_off() {
    let set = RuleSet::from_yaml(concat!(
        "rules:\n",
        "  - { name: off, limit: 1, period: 1s, lease: off }\n",
        "  - { name: auto, limit: 1, period: 1s, lease: auto }\n",
        "  - { name: unsaid, limit: 1, period: 1s }\n",
    ))
    .expect("valid");
    let lease = |name: &str| {
        let r = set.get(name).expect("the rule");
        assert_eq!(
            r.resolved().lease,
            r.lease,
            "{name}: resolved as configured"
        );
        assert_eq!(r.info().lease, r.lease, "{name}: listed as configured");
        r.lease
    };
    assert_eq!(lease("off"), LeaseMode::Off);
    assert_eq!(lease("auto"), LeaseMode::Auto);
    assert_eq!(lease("unsaid"), LeaseMode::Auto);
}

#[test]
fn bad_lease() {
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "lease: maybe"]),
        "r",
        "lease",
        "auto or off, got \"maybe\"",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "lease: false"]),
        "r",
        "lease",
        "false",
    );
}

#[test]
fn a_listing_from_a_node_that_predates_leases_reads_as_auto() {
    let old = serde_json::json!({
        "name": "r", "limit": 5, "period_ms": 1000, "period": "1s",
        "algorithm": "token_bucket", "burst": 5, "mode": "owner",
        "on_owner_unreachable": "open", "shadow": false,
    });
    let info: RuleInfo = serde_json::from_value(old).expect("decodes");
    assert_eq!(info.lease, LeaseMode::Auto);
    let listed = serde_json::to_value(
        RuleSet::from_yaml(&one(&["limit: 1", "period: 1s", "lease: off"]))
            .expect("valid")
            .get("r")
            .expect("the rule")
            .info(),
    )
    .expect("encodes");
    assert_eq!(listed["lease"], "off");
}

#[test]
fn bad_on_owner_unreachable() {
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "on_owner_unreachable: deny"]),
        "r",
        "on_owner_unreachable",
        "open or closed",
    );
    assert_rule_err(
        &one(&["limit: 1", "period: 1s", "on_owner_unreachable: true"]),
        "r",
        "on_owner_unreachable",
        "true",
    );
}

#[test]
fn bucket_rates_above_one_per_microsecond_are_refused() {
    for alg in ["token_bucket", "leaky_bucket"] {
        let a = format!("algorithm: {alg}");
        // 1001 per ms: 999 ns per token.
        assert_rule_err(
            &one(&["limit: 1001", "period: 1ms", &a]),
            "r",
            "limit",
            "microsecond",
        );
        // 1000 per ms is exactly the finest rate.
        assert!(RuleSet::from_yaml(&one(&["limit: 1000", "period: 1ms", &a])).is_ok());
        assert!(RuleSet::from_yaml(&one(&["limit: 1000000", "period: 1s", &a])).is_ok());
        assert_rule_err(
            &one(&["limit: 1000001", "period: 1s", &a]),
            "r",
            "limit",
            "microsecond",
        );
    }
    // The window algorithms have no such limit.
    assert!(
        RuleSet::from_yaml(&one(&[
            "limit: 5000",
            "period: 1ms",
            "algorithm: fixed_window"
        ]))
        .is_ok()
    );
}

#[test]
fn a_rule_that_is_not_a_mapping() {
    assert_rule_err("rules:\n  - just-a-string\n", "#1", "rule", "mapping");
}

#[test]
fn errors_display_the_rule_and_the_field() {
    let err = RuleSet::from_yaml(&one(&["limit: 0", "period: 1s"])).expect_err("invalid");
    let msg = err.to_string();
    assert!(msg.contains("\"r\""), "{msg}");
    assert!(msg.contains("`limit`"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "one line: {msg}");
}

// ---------------------------------------------------------------------------------------------
// Syntax and shape
// ---------------------------------------------------------------------------------------------

#[test]
fn syntax_errors() {
    for text in [
        "rules: [unclosed",
        "rules:\n  - name: a\n   limit: 1\n  bad",
        "rules: {a: 1",
        "\"unterminated",
    ] {
        assert!(
            matches!(RuleSet::from_yaml(text), Err(RulesError::Syntax(_))),
            "{text:?}: {:?}",
            RuleSet::from_yaml(text)
        );
    }
    let msg = RuleSet::from_yaml("rules: [").expect_err("bad").to_string();
    assert!(msg.contains("not valid YAML"), "{msg}");
}

#[test]
fn shape_errors() {
    for text in [
        "- name: a\n",
        "just text",
        "",
        "rules: 3\n",
        "rules:\n  name: a\n",
        "rule:\n  - name: a\n    limit: 1\n    period: 1s\n",
        "rules: []\nextra: 1\n",
    ] {
        assert!(
            matches!(RuleSet::from_yaml(text), Err(RulesError::Shape(_))),
            "{text:?}: {:?}",
            RuleSet::from_yaml(text)
        );
    }
    let Err(RulesError::Shape(msg)) = RuleSet::from_yaml("rules: []\nextra: 1\n") else {
        panic!("shape error")
    };
    assert!(msg.contains("extra"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Periods
// ---------------------------------------------------------------------------------------------

#[test]
fn parse_period_units() {
    assert_eq!(parse_period("250ms"), Ok(250 * MS));
    assert_eq!(parse_period("10s"), Ok(10 * SEC));
    assert_eq!(parse_period("1m"), Ok(60 * SEC));
    assert_eq!(parse_period("1h"), Ok(3600 * SEC));
    assert_eq!(parse_period("1d"), Ok(86_400 * SEC));
    assert_eq!(parse_period("  5s "), Ok(5 * SEC));
    assert_eq!(parse_period("1ms"), Ok(MS));
    assert_eq!(parse_period("007s"), Ok(7 * SEC));
}

#[test]
fn parse_period_refusals() {
    for (text, says) in [
        ("", "not a duration"),
        ("s", "not a duration"),
        ("-1s", "not a duration"),
        ("1.5s", "unknown unit"),
        ("10", "no unit"),
        ("10x", "unknown unit"),
        ("10 s", "unknown unit"),
        ("10S", "unknown unit"),
        ("10us", "unknown unit"),
        ("0s", "longer than zero"),
        ("0ms", "longer than zero"),
        ("99999999999999999999s", "not a duration"),
        ("300000000d", "too long"),
    ] {
        let err = parse_period(text).expect_err(text);
        assert!(err.contains(says), "{text:?}: {err}");
    }
}

#[test]
fn format_period_uses_the_largest_exact_unit() {
    for (ns, text) in [
        (250 * MS, "250ms"),
        (MS, "1ms"),
        (1500 * MS, "1500ms"),
        (SEC, "1s"),
        (10 * SEC, "10s"),
        (90 * SEC, "90s"),
        (60 * SEC, "1m"),
        (90 * 60 * SEC, "90m"),
        (3600 * SEC, "1h"),
        (36 * 3600 * SEC, "36h"),
        (86_400 * SEC, "1d"),
        (366 * 86_400 * SEC, "366d"),
    ] {
        assert_eq!(format_period(ns), text, "{ns}");
        assert_eq!(parse_period(text), Ok(ns), "{text}");
    }
}

#[test]
fn format_then_parse_round_trips_whole_milliseconds() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ns = (1 + x % (MAX_PERIOD_NS / MS)) * MS;
        assert_eq!(parse_period(&format_period(ns)), Ok(ns), "{ns}");
    }
}

// ---------------------------------------------------------------------------------------------
// Identities
// ---------------------------------------------------------------------------------------------

#[test]
fn bucket_ids_are_stable() {
    // Fixed values: a change here re-keys every bucket in a running cluster (and makes nodes of
    // two versions disagree on owners), so it must be deliberate.
    let seed = named_seed("free-tier", Algorithm::TokenBucket);
    assert_eq!(seed, 0x1ff7_5c2d_d5a9_be72, "named_seed changed");
    assert_eq!(
        bucket_id(seed, "user:42"),
        0x3d34_311a_df53_5491,
        "bucket_id changed"
    );
    let inline = inline_seed(&Rule {
        algorithm: Algorithm::TokenBucket,
        limit: 5,
        period_ns: 5 * SEC,
        burst: 5,
        calendar: None,
    });
    assert_eq!(inline, 0x68fb_ded8_121a_3805, "inline_seed changed");
    // The published XXH3-64 of empty input with seed 0.
    assert_eq!(bucket_id(0, ""), 0x2d06_8005_38d3_94c2, "xxh3 changed");
}

#[test]
fn bucket_ids_differ_across_rules_and_keys() {
    let a = named_seed("a", Algorithm::TokenBucket);
    let b = named_seed("b", Algorithm::TokenBucket);
    let a_fw = named_seed("a", Algorithm::FixedWindow);
    assert_ne!(a, b);
    assert_ne!(a, a_fw, "a changed algorithm starts fresh buckets");
    assert_ne!(bucket_id(a, "k"), bucket_id(b, "k"));
    assert_ne!(bucket_id(a, "k"), bucket_id(a_fw, "k"));
    assert_ne!(bucket_id(a, "k1"), bucket_id(a, "k2"));
    assert_eq!(bucket_id(a, "k"), bucket_id(a, "k"));

    let base = Rule {
        algorithm: Algorithm::TokenBucket,
        limit: 5,
        period_ns: 5 * SEC,
        burst: 5,
        calendar: None,
    };
    let variants = [
        base,
        Rule { limit: 6, ..base },
        Rule {
            period_ns: 6 * SEC,
            ..base
        },
        Rule { burst: 6, ..base },
        Rule {
            algorithm: Algorithm::LeakyBucket,
            ..base
        },
    ];
    let seeds: std::collections::HashSet<_> = variants.iter().map(inline_seed).collect();
    assert_eq!(seeds.len(), variants.len(), "inline seeds collide");
    // Only the numbers of a named rule do not matter: a reload keeps its buckets.
    let set_a = RuleSet::from_yaml(&one(&["limit: 1", "period: 1s"])).expect("valid");
    let set_b = RuleSet::from_yaml(&one(&["limit: 9", "period: 1h", "burst: 20"])).expect("valid");
    assert_eq!(
        set_a.get("r").expect("r").seed,
        set_b.get("r").expect("r").seed
    );

    // No collisions among many keys.
    let ids: std::collections::HashSet<_> = (0..10_000)
        .map(|i| bucket_id(a, &format!("user:{i}")))
        .collect();
    assert_eq!(ids.len(), 10_000);
}

// ---------------------------------------------------------------------------------------------
// Inline rules
// ---------------------------------------------------------------------------------------------

fn inline(limit: u64, period_ms: u64, algorithm: Algorithm, burst: Option<u64>) -> InlineRule {
    InlineRule {
        limit,
        period_ms,
        algorithm,
        burst,
        calendar: None,
    }
}

#[test]
fn validate_inline_accepts_and_converts() {
    let r = validate_inline(&inline(5, 5000, Algorithm::TokenBucket, None)).expect("valid");
    assert_eq!(
        r,
        Rule {
            algorithm: Algorithm::TokenBucket,
            limit: 5,
            period_ns: 5 * SEC,
            burst: 5,
            calendar: None,
        }
    );
    let r = validate_inline(&inline(5, 250, Algorithm::LeakyBucket, Some(9))).expect("valid");
    assert_eq!(r.burst, 9);
    assert_eq!(r.period_ns, 250 * MS);
    let longest = MAX_PERIOD_NS / MS;
    assert_eq!(longest, 31_622_400_000);
    assert!(validate_inline(&inline(1, longest, Algorithm::SlidingWindow, None)).is_ok());
}

#[test]
fn validate_inline_maps_period_errors_to_period_ms() {
    for period_ms in [0, MAX_PERIOD_NS / MS + 1, u64::MAX] {
        let e = validate_inline(&inline(1, period_ms, Algorithm::TokenBucket, None))
            .expect_err("bad period");
        assert_eq!(e.field, "period_ms", "{period_ms}: {e}");
    }
    let e = validate_inline(&inline(
        1,
        MAX_PERIOD_NS / MS + 1,
        Algorithm::FixedWindow,
        None,
    ))
    .expect_err("too long");
    assert!(e.reason.contains("31622400000"), "{e}");
}

#[test]
fn validate_inline_refuses_like_the_file() {
    // A rule the file would refuse is refused inline with the same words.
    let cases: [(InlineRule, &str, &[&str]); 4] = [
        (
            inline(0, 1000, Algorithm::TokenBucket, None),
            "limit",
            &["limit: 0", "period: 1s"],
        ),
        (
            inline(5, 1000, Algorithm::FixedWindow, Some(5)),
            "burst",
            &[
                "limit: 5",
                "period: 1s",
                "algorithm: fixed_window",
                "burst: 5",
            ],
        ),
        (
            inline(20_000, 60_000, Algorithm::SlidingLog, None),
            "limit",
            &["limit: 20000", "period: 1m", "algorithm: sliding_log"],
        ),
        (
            inline(2000, 1, Algorithm::TokenBucket, None),
            "limit",
            &["limit: 2000", "period: 1ms"],
        ),
    ];
    for (rule, field, lines) in cases {
        let e = validate_inline(&rule).expect_err("invalid");
        assert_eq!(e.field, field, "{e}");
        let (_, file_field, file_reason) = rule_err(&one(lines));
        assert_eq!(file_field, field);
        assert_eq!(file_reason, e.reason);
    }
}

#[test]
fn validate_bounds() {
    assert!(validate(Algorithm::FixedWindow, MAX_LIMIT, SEC, None).is_ok());
    assert_eq!(
        validate(Algorithm::FixedWindow, MAX_LIMIT + 1, SEC, None)
            .expect_err("over")
            .field,
        "limit"
    );
    assert_eq!(
        validate(Algorithm::TokenBucket, 1, SEC, Some(MAX_LIMIT + 1))
            .expect_err("over")
            .field,
        "burst"
    );
    assert!(validate(Algorithm::TokenBucket, 1, SEC, Some(MAX_LIMIT)).is_ok());
    assert_eq!(
        validate(Algorithm::TokenBucket, 1, MS - 1, None)
            .expect_err("short")
            .field,
        "period"
    );
    assert!(validate(Algorithm::TokenBucket, 1, MS, None).is_ok());
    assert!(validate(Algorithm::TokenBucket, 1, MAX_PERIOD_NS, None).is_ok());
    assert_eq!(
        validate(Algorithm::TokenBucket, 1, MAX_PERIOD_NS + 1, None)
            .expect_err("long")
            .field,
        "period"
    );
}

#[test]
fn the_fingerprint_follows_every_field_and_ignores_load_order() {
    let a = RuleSet::from_yaml(
        "rules:\n  - { name: a, limit: 5, period: 1m }\n  - { name: b, limit: 7, period: 1s }\n",
    )
    .expect("valid");
    let same = RuleSet::from_yaml(
        "rules:\n  - { name: b, limit: 7, period: 1s }\n  - { name: a, limit: 5, period: 1m }\n",
    )
    .expect("valid");
    assert_eq!(a.fingerprint(), same.fingerprint());
    assert_eq!(a.fingerprint(), a.clone().fingerprint());
    assert!(a.fingerprint() < 1 << 53, "exact in a float64");
    for other in [
        "rules:\n  - { name: a, limit: 6, period: 1m }\n  - { name: b, limit: 7, period: 1s }\n",
        "rules:\n  - { name: a, limit: 5, period: 2m }\n  - { name: b, limit: 7, period: 1s }\n",
        "rules:\n  - { name: a, limit: 5, period: 1m, shadow: true }\n  - { name: b, limit: 7, period: 1s }\n",
        "rules:\n  - { name: a, limit: 5, period: 1m, mode: global }\n  - { name: b, limit: 7, period: 1s }\n",
        "rules:\n  - { name: c, limit: 5, period: 1m }\n  - { name: b, limit: 7, period: 1s }\n",
        "rules:\n  - { name: a, limit: 5, period: 1m }\n",
    ] {
        let other = RuleSet::from_yaml(other).expect("valid");
        assert_ne!(a.fingerprint(), other.fingerprint(), "{other:?}");
    }
    assert_ne!(RuleSet::default().fingerprint(), a.fingerprint());
}

#[test]
fn calendar_rules_parse_and_list_their_zone() {
    let set = RuleSet::from_yaml(&one(&[
        "limit: 10000",
        "period: 1mo",
        "algorithm: fixed_window",
        "calendar: true",
        "timezone: Europe/Berlin",
    ]))
    .expect("valid");
    let r = set.get("r").expect("rule");
    let c = r.rule.calendar.expect("calendar");
    assert_eq!(c.unit, ringlimit_core::calendar::Unit::Month);
    assert_eq!(c.zone.name(), "Europe/Berlin");
    let info = r.info();
    assert_eq!(info.period, "1mo");
    assert!(info.calendar);
    assert_eq!(info.timezone.as_deref(), Some("Europe/Berlin"));
    // The SDK reads it back the same.
    let back = ringlimit_core::check::Resolved::from_info(&info).expect("resolves");
    assert_eq!(back.rule, r.rule);
    // Default zone UTC; a week without a calendar is seven plain days.
    let set = RuleSet::from_yaml(&one(&[
        "limit: 5",
        "period: 1w",
        "algorithm: fixed_window",
        "calendar: true",
    ]))
    .expect("valid");
    let c = set
        .get("r")
        .and_then(|r| r.rule.calendar)
        .expect("calendar");
    assert_eq!(c.zone.name(), "UTC");
    // Global mode takes calendar windows too (numbered by local date on every node).
    let set = RuleSet::from_yaml(&one(&[
        "limit: 5",
        "period: 1d",
        "algorithm: fixed_window",
        "calendar: true",
        "timezone: Europe/Berlin",
        "mode: global",
    ]))
    .expect("valid");
    assert!(set.get("r").and_then(|r| r.rule.calendar).is_some());
    let set = RuleSet::from_yaml(&one(&["limit: 5", "period: 1w"])).expect("valid");
    let r = &set.get("r").expect("rule").rule;
    assert_eq!((r.period_ns, r.calendar), (7 * 86_400 * SEC, None));
    assert_eq!(set.get("r").expect("rule").info().period, "7d");
}

#[test]
fn calendar_rules_that_make_no_sense_are_refused_with_their_field() {
    let cases: [(&[&str], &str, &str); 6] = [
        (&["limit: 5", "period: 1mo"], "period", "calendar: true"),
        (
            &["limit: 5", "period: 1d", "calendar: true"],
            "calendar",
            "token_bucket",
        ),
        (
            &[
                "limit: 5",
                "period: 1h",
                "algorithm: fixed_window",
                "calendar: true",
            ],
            "calendar",
            "1d, 1w or 1mo",
        ),
        (
            &[
                "limit: 5",
                "period: 1d",
                "algorithm: fixed_window",
                "calendar: true",
                "timezone: Europe/Nowhere",
            ],
            "timezone",
            "Europe/Nowhere",
        ),
        (
            &["limit: 5", "period: 1d", "timezone: UTC"],
            "timezone",
            "calendar: true",
        ),
        (
            &[
                "limit: 5",
                "period: 2mo",
                "algorithm: fixed_window",
                "calendar: true",
            ],
            "period",
            "1mo",
        ),
    ];
    for (lines, field, words) in cases {
        let (rule, f, reason) = rule_err(&one(lines));
        assert_eq!((rule.as_str(), f), ("r", field), "{lines:?}: {reason}");
        assert!(reason.contains(words), "{lines:?}: {reason}");
    }
}

#[test]
fn a_block_policy_is_taken_on_owner_rules_and_refused_on_global_ones() {
    let owner = one(&[
        "limit: 5",
        "period: 1m",
        "block: { after: 20, within: 1m, for: 15m, max: 24h }",
    ]);
    let rules = RuleSet::from_yaml(&owner).expect("an owner rule may block");
    assert!(rules.get("r").and_then(|r| r.block).is_some());
    let global = one(&[
        "limit: 5",
        "period: 1m",
        "mode: global",
        "block: { after: 20, within: 1m, for: 15m }",
    ]);
    assert_rule_err(&global, "r", "block", "mode: owner rules only");
    // Through the admin API the same.
    let body = serde_json::json!({
        "limit": 5, "period": "1m", "mode": "global",
        "block": { "after": 20, "within": "1m", "for": "15m" },
    });
    let err = super::api::validate("r", &body).expect_err("refused");
    assert!(err.to_string().contains("mode: owner rules only"), "{err}");
}

#[test]
fn scope_is_region_unless_a_rule_shares_it_across_regions() {
    let set = RuleSet::from_yaml(concat!(
        "rules:\n",
        "  - { name: mine, limit: 1, period: 1s }\n",
        "  - { name: shared, limit: 9, period: 1m, algorithm: fixed_window, scope: regions }\n",
        "  - { name: open, limit: 9, period: 1m, scope: regions, on_region_unreachable: open }\n",
    ))
    .expect("valid");
    let get = |name: &str| set.get(name).expect("present").resolved();
    assert_eq!(get("mine").scope, RegionScope::Region);
    assert_eq!(get("shared").scope, RegionScope::Regions);
    assert_eq!(
        get("shared").on_region_unreachable,
        OnRegionUnreachable::Share
    );
    assert_eq!(get("open").on_region_unreachable, OnRegionUnreachable::Open);
    let info = set.get("open").expect("present").info();
    assert_eq!(
        (info.scope, info.on_region_unreachable),
        (RegionScope::Regions, OnRegionUnreachable::Open)
    );
}

/// A global rule across regions is one limit counted everywhere: any algorithm global mode
/// takes, from a file or the admin API alike.
#[test]
fn a_global_rule_may_be_shared_across_regions() {
    let set = RuleSet::from_yaml(concat!(
        "rules:\n",
        "  - { name: g, limit: 9, period: 1m, mode: global, scope: regions }\n",
        "  - { name: log, limit: 9, period: 1m, mode: global, scope: regions, \
         algorithm: sliding_log }\n",
    ))
    .expect("valid");
    for name in ["g", "log"] {
        let r = set.get(name).expect("present").resolved();
        assert_eq!((r.mode, r.scope), (Mode::Global, RegionScope::Regions));
    }
    let body = serde_json::json!({
        "limit": 5, "period": "1m", "mode": "global", "scope": "regions",
    });
    let named = super::api::validate("r", &body).expect("accepted");
    assert_eq!(named.resolved().scope, RegionScope::Regions);
}

#[test]
fn an_owner_rule_shared_across_regions_must_be_leasable() {
    let rule =
        |fields: &str| format!("rules:\n  - {{ name: r, limit: 5, period: 1m, {fields} }}\n");
    assert_rule_err(
        &rule("scope: region_s"),
        "r",
        "scope",
        "must be region or regions",
    );
    assert_rule_err(
        &rule("algorithm: leaky_bucket, scope: regions"),
        "r",
        "scope",
        "not leaky_bucket",
    );
    assert_rule_err(
        &rule("algorithm: sliding_log, scope: regions"),
        "r",
        "scope",
        "not sliding_log",
    );
    assert_rule_err(
        &rule("mode: global, scope: regions, on_region_unreachable: open"),
        "r",
        "on_region_unreachable",
        "mode: owner",
    );
    assert_rule_err(
        &rule("on_region_unreachable: open"),
        "r",
        "on_region_unreachable",
        "scope: regions",
    );
    assert_rule_err(
        &rule("scope: regions, on_region_unreachable: closed"),
        "r",
        "on_region_unreachable",
        "share or open",
    );
}
