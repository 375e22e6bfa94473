//! The `/metrics` contract as a test: every family's `# HELP` and `# TYPE` line and every
//! series' name and labels, from a node that has done some work, must be those listed in
//! `names.txt` (a metric added is a line added there; none may change or go).

use crate::testing::Cluster;
use serde_json::json;
use std::collections::BTreeSet;

/// What the contract fixes of a `/metrics` text: descriptor lines whole, sample lines without
/// their value.
fn shape(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| *l != "# EOF")
        .map(|l| match l.strip_prefix('#') {
            Some(_) => l.to_owned(),
            None => l.rsplit_once(' ').map_or(l, |(series, _)| series).to_owned(),
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn metrics_names_types_and_help_stay_those_of_the_contract() {
    let c = Cluster::start(2, |_| {}).await;
    c.wait("n0 sees two", || async { c.alive("n0").await.len() == 2 })
        .await;
    // Checks decided here and forwarded, single and batched, and one all-or-nothing request.
    for i in 0..8 {
        let key = format!("m:{i}");
        let r = c
            .check("n0", &json!({ "key": key, "limit": 1, "period_ms": 60_000 }))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let batch = json!({ "checks": [
        { "key": "m:0", "limit": 1, "period_ms": 60_000 },
        { "key": "m:1", "limit": 1, "period_ms": 60_000 },
    ] });
    let r = c
        .http("n0", "POST", "/v1/check/batch", &batch.to_string())
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = c
        .http("n0", "POST", "/v1/check/all", &batch.to_string())
        .await;
    assert!(r.status == 200 || r.status == 429, "{}", r.body);

    let r = c.http("n0", "GET", "/metrics", "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let got = shape(&r.body);
    let want: BTreeSet<String> = include_str!("names.txt")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing from /metrics: {missing:#?}\nnot in names.txt: {extra:#?}"
    );
}
