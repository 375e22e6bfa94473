//! The golden file `clients/golden/owners.json`: worked examples of rule seeds, bucket ids and
//! owners for client SDKs in other languages, computed here by the functions the nodes use.
//!
//! `golden_file_is_what_the_code_computes` fails when the file and the code disagree (an SDK
//! that agrees with the file would then route to the wrong owner); `UPDATE_GOLDEN=1 cargo test
//! -p ringlimit-core --test golden` rewrites it. `golden_scheme_is_the_documented_one` computes
//! every case again from the written scheme (the README's and the proto's), with xxh3 alone.

use ringlimit_core::calendar::{Calendar, Unit, Zone};
use ringlimit_core::rule::{inline_seed, validate_inline};
use ringlimit_proto::identity::{bucket_id, named_seed};
use ringlimit_proto::ring::{Ring, VNODES_PER_MEMBER};
use ringlimit_proto::{Algorithm, InlineRule};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const SCHEME: &str = "xxh3-64-v1";

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/golden/owners.json")
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Golden {
    scheme: String,
    vnodes_per_member: u32,
    rings: BTreeMap<String, Vec<String>>,
    /// Per ring, samples `[member, i, point]` of its points.
    ring_points: BTreeMap<String, Vec<(String, u32, String)>>,
    cases: Vec<Case>,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Case {
    rule: CaseRule,
    seed: String,
    key: String,
    bucket_id: String,
    owners: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
#[serde(untagged)]
enum CaseRule {
    Named { name: String, algorithm: String },
    Inline { inline: InlineJson },
}

/// An inline rule as a client sends it (the fields of ringlimit.v1's `InlineRule`; `algorithm`
/// by its wire name).
#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct InlineJson {
    algorithm: String,
    limit: u64,
    period_ms: u64,
    burst: Option<u64>,
    period: String,
    calendar: bool,
    timezone: String,
}

fn rings() -> BTreeMap<String, Vec<String>> {
    let ring = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    BTreeMap::from([
        ("one".into(), ring(&["solo"])),
        ("three".into(), ring(&["node-a", "node-b", "node-c"])),
        (
            "five".into(),
            ring(&[
                "ringlimit-0",
                "ringlimit-1",
                "ringlimit-2",
                "ringlimit-3",
                "edge-eu-west-1a",
            ]),
        ),
    ])
}

fn algorithm(name: &str) -> Algorithm {
    Algorithm::ALL
        .into_iter()
        .find(|a| a.as_str() == name)
        .unwrap_or_else(|| panic!("no algorithm {name}"))
}

fn rules() -> Vec<CaseRule> {
    let named = |name: &str, algorithm: Algorithm| CaseRule::Named {
        name: name.into(),
        algorithm: algorithm.as_str().into(),
    };
    let inline = |algorithm: Algorithm,
                  limit: u64,
                  period_ms: u64,
                  burst: Option<u64>,
                  period: &str,
                  timezone: &str| CaseRule::Inline {
        inline: InlineJson {
            algorithm: algorithm.as_str().into(),
            limit,
            period_ms,
            burst,
            period: period.into(),
            calendar: !period.is_empty(),
            timezone: timezone.into(),
        },
    };
    use Algorithm::*;
    vec![
        named("api", TokenBucket),
        named("api", FixedWindow),
        named("login", FixedWindow),
        named("search", SlidingWindow),
        named("payments", SlidingLog),
        named("uploads", LeakyBucket),
        named("per-ip", TokenBucket),
        named("tenant.daily", FixedWindow),
        named("graphql_heavy", SlidingWindow),
        named("egress/smtp", LeakyBucket),
        inline(FixedWindow, 10, 1_000, None, "", ""),
        inline(TokenBucket, 100, 60_000, None, "", ""),
        inline(TokenBucket, 100, 60_000, Some(150), "", ""),
        inline(LeakyBucket, 50, 1_000, Some(10), "", ""),
        inline(SlidingWindow, 1_000, 3_600_000, None, "", ""),
        inline(SlidingLog, 20, 10_000, None, "", ""),
        inline(FixedWindow, 1_000, 0, None, "1d", ""),
        inline(FixedWindow, 1_000, 0, None, "1d", "Europe/Berlin"),
        inline(FixedWindow, 5_000, 0, None, "1w", "Europe/Berlin"),
        inline(FixedWindow, 100_000, 0, None, "1mo", "UTC"),
        inline(FixedWindow, 100_000, 0, None, "1mo", "europe/berlin"),
    ]
}

fn keys() -> Vec<String> {
    vec![
        "user:42".into(),
        "203.0.113.7".into(),
        "2001:db8::ff00:42:8329".into(),
        "::ffff:192.0.2.1".into(),
        "a".into(),
        "Zürich/café ☕".into(),
        "ключ-🔑".into(),
        "tenant=acme;route=GET /v1/items".into(),
        "k".repeat(512),
        "é".repeat(256),
    ]
}

/// The inline rule a client's message means, and its calendar's unit and zone: the ringlimit.v1
/// edge's reading (`period` names a calendar unit here; `period_ms` a plain window).
fn inline_rule(j: &InlineJson) -> InlineRule {
    let algorithm = algorithm(&j.algorithm);
    let calendar = j.calendar.then(|| {
        let unit = [Unit::Day, Unit::Week, Unit::Month]
            .into_iter()
            .find(|u| u.period() == j.period)
            .unwrap_or_else(|| panic!("no calendar unit {}", j.period));
        let zone = if j.timezone.is_empty() {
            Zone::UTC
        } else {
            Zone::parse(&j.timezone).unwrap_or_else(|e| panic!("{e}"))
        };
        Calendar { unit, zone }
    });
    InlineRule {
        limit: j.limit,
        period_ms: calendar.map_or(j.period_ms, |c| c.unit.nominal_ns() / 1_000_000),
        algorithm,
        burst: j.burst,
        calendar,
    }
}

/// A rule's seed by the functions the nodes use.
fn seed(rule: &CaseRule) -> u64 {
    match rule {
        CaseRule::Named { name, algorithm: a } => named_seed(name, algorithm(a).code()),
        CaseRule::Inline { inline } => {
            let r = inline_rule(inline);
            let valid = validate_inline(&r).unwrap_or_else(|e| panic!("{inline:?}: {e}"));
            inline_seed(&valid)
        }
    }
}

/// The point of member `id`'s `i`th virtual node (the documented scheme).
fn point(id: &str, i: u32) -> u64 {
    let mut bytes = id.as_bytes().to_vec();
    bytes.extend_from_slice(&i.to_le_bytes());
    xxh3_64(&bytes)
}

fn compute() -> Golden {
    let rings = rings();
    let built: BTreeMap<&String, Ring> = rings.iter().map(|(k, v)| (k, Ring::new(v))).collect();
    let ring_points = rings
        .iter()
        .map(|(name, members)| {
            let samples = members
                .iter()
                .flat_map(|m| [0, 1, VNODES_PER_MEMBER - 1].map(|i| (m.clone(), i)))
                .map(|(m, i)| {
                    let p = point(&m, i).to_string();
                    (m, i, p)
                })
                .collect();
            (name.clone(), samples)
        })
        .collect();
    let mut cases = Vec::new();
    for rule in rules() {
        let seed = seed(&rule);
        for key in keys() {
            let id = bucket_id(seed, &key);
            let owners = built
                .iter()
                .map(|(name, ring)| {
                    let owner = ring.owner(id).unwrap_or_else(|| panic!("{name} is empty"));
                    ((*name).clone(), owner.to_string())
                })
                .collect();
            cases.push(Case {
                rule: rule.clone(),
                seed: seed.to_string(),
                key,
                bucket_id: id.to_string(),
                owners,
            });
        }
    }
    Golden {
        scheme: SCHEME.into(),
        vnodes_per_member: VNODES_PER_MEMBER,
        rings,
        ring_points,
        cases,
    }
}

fn render(g: &Golden) -> String {
    let mut text = serde_json::to_string_pretty(g).unwrap_or_else(|e| panic!("{e}"));
    text.push('\n');
    text
}

#[test]
fn golden_file_is_what_the_code_computes() {
    let want = render(&compute());
    let path = golden_path();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (UPDATE_GOLDEN=1 cargo test -p ringlimit-core --test golden)",
            path.display()
        )
    });
    assert!(
        have == want,
        "{} differs from what the code computes: bucket identities or owners changed, which \
         breaks every SDK and mixed-version cluster. If that is meant, rewrite it with \
         UPDATE_GOLDEN=1 cargo test -p ringlimit-core --test golden",
        path.display()
    );
}

#[test]
fn golden_cases_cover_what_the_sdks_must_agree_on() {
    let g = compute();
    assert!((200..=260).contains(&g.cases.len()), "{}", g.cases.len());
    for a in Algorithm::ALL {
        for inline in [false, true] {
            assert!(
                g.cases.iter().any(|c| match &c.rule {
                    CaseRule::Named { algorithm, .. } => !inline && algorithm == a.as_str(),
                    CaseRule::Inline { inline: i } => inline && i.algorithm == a.as_str(),
                }),
                "{a} inline={inline}"
            );
        }
    }
    let lens: Vec<usize> = g.cases.iter().map(|c| c.key.len()).collect();
    assert!(lens.contains(&1) && lens.contains(&512));
    // Every member of the larger rings owns some case.
    for (name, members) in &g.rings {
        for m in members {
            assert!(
                g.cases.iter().any(|c| c.owners.get(name) == Some(m)),
                "{name}: {m} owns nothing"
            );
        }
    }
}

/// Every case again, from the scheme as written (xxh3 over explicit bytes), not from the
/// nodes' functions: what an SDK in another language implements.
#[test]
fn golden_scheme_is_the_documented_one() {
    let g = compute();
    let code = |a: &str| u64::from(algorithm(a).code());
    for c in &g.cases {
        let seed = match &c.rule {
            CaseRule::Named { name, algorithm } => {
                xxh3_64_with_seed(name.as_bytes(), 0x6e61_6d65_6400 | code(algorithm))
            }
            CaseRule::Inline { inline } => {
                let r = inline_rule(inline);
                let mut b = vec![algorithm(&inline.algorithm).code()];
                b.extend_from_slice(&r.limit.to_le_bytes());
                b.extend_from_slice(&(r.period_ms * 1_000_000).to_le_bytes());
                b.extend_from_slice(&r.burst.unwrap_or(r.limit).to_le_bytes());
                let plain = xxh3_64_with_seed(&b, 0x696e_6c69_6e65);
                match r.calendar {
                    None => plain,
                    Some(cal) => {
                        // The zone as the IANA database spells it ("europe/berlin" is
                        // "Europe/Berlin"); empty is "UTC".
                        let mut b = vec![cal.unit.code()];
                        b.extend_from_slice(cal.zone.name().as_bytes());
                        xxh3_64_with_seed(&b, plain ^ 0x6361_6c65_6e64)
                    }
                }
            }
        };
        assert_eq!(seed.to_string(), c.seed, "{:?}", c.rule);
        let id = xxh3_64_with_seed(c.key.as_bytes(), seed);
        assert_eq!(id.to_string(), c.bucket_id);
        for (name, members) in &g.rings {
            let mut points: Vec<(u64, &str)> = members
                .iter()
                .flat_map(|m| (0..g.vnodes_per_member).map(move |i| (point(m, i), m.as_str())))
                .collect();
            points.sort_unstable();
            let at = xxh3_64(&id.to_le_bytes());
            let owner = points
                .iter()
                .find(|(p, _)| *p >= at)
                .or(points.first())
                .map(|(_, m)| *m);
            assert_eq!(
                owner,
                c.owners.get(name).map(String::as_str),
                "{name} {c:?}"
            );
        }
    }
    // The calendar's zone in the seed is the database's spelling.
    let lower = Zone::parse("europe/berlin").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lower.name(), "Europe/Berlin");
}
