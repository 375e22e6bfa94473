//! A monthly quota on calendar windows through three nodes: exactly its limit in the month,
//! denied until the local first of the next month, admitted again from then.

use super::{Cluster, EPOCH_NS, EngineClock};
use crate::rules::RuleSet;
use ringlimit_core::clock::Clock;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];

/// The harness's clock moved to another date (every node alike).
struct Shifted {
    inner: Arc<dyn Clock>,
    offset_ns: u64,
}

impl Clock for Shifted {
    fn now(&self) -> u64 {
        self.inner.now() + self.offset_ns
    }
}

fn at(s: &str) -> u64 {
    let z: jiff::Zoned = s.parse().expect("instant");
    u64::try_from(z.timestamp().as_nanosecond()).expect("after 1970")
}

#[tokio::test(start_paused = true)]
async fn a_monthly_quota_admits_exactly_its_limit_and_resets_at_the_local_first() {
    // Three minutes before March starts in Berlin (23:00 UTC): every virtual second of a
    // running cluster costs real time, so the test keeps to a few minutes of it.
    let start = at("2026-02-28T23:57[Europe/Berlin]");
    let march = at("2026-03-01T00:00[Europe/Berlin]");
    let april = at("2026-04-01T00:00[Europe/Berlin]");
    // Every node's clock and the test's own reading: the harness's `now_ms` is not shifted (a
    // wait computed from it would sleep two months of virtual time, gossip ticking throughout).
    let offset_ns = start - EPOCH_NS;
    let c = Cluster::start(3, |config| {
        config.rules = RuleSet::from_yaml(
            "rules:\n  - { name: monthly, limit: 10000, period: 1mo, algorithm: fixed_window, \
             calendar: true, timezone: Europe/Berlin }\n",
        )
        .expect("rules");
        let inner = config.clock.take().expect("the harness's clock").0;
        config.clock = Some(EngineClock(Arc::new(Shifted { inner, offset_ns })));
    })
    .await;
    let now_ms = || c.now_ms() + offset_ns / 1_000_000;
    c.wait_all_alive(&IDS).await;
    assert!(
        now_ms() * 1_000_000 < march - 60_000_000_000,
        "{}",
        now_ms()
    );

    // 10,500 checks of each of two keys in batches of 100 through every node in turn, a second
    // apart: exactly 10,000 of each key's admitted in February.
    let mut admitted = [0u64; 2];
    let mut denied_resets = Vec::new();
    for round in 0..105 {
        let id = IDS[round % 3];
        for (k, key) in ["acct-a", "acct-b"].iter().enumerate() {
            let checks: Vec<_> = (0..100)
                .map(|_| json!({ "key": key, "rule": "monthly" }))
                .collect();
            for a in c.batch(id, &checks).await {
                if a["allowed"] == json!(true) {
                    admitted[k] += 1;
                } else {
                    denied_resets.push((
                        a["reset_at_ms"].as_u64().expect("reset"),
                        a["retry_after_ms"].as_u64().expect("retry"),
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(now_ms() * 1_000_000 < march, "still February");
    assert_eq!(admitted, [10_000, 10_000]);
    assert_eq!(denied_resets.len(), 1_000);
    let end_ms = now_ms();
    for (reset, retry) in denied_resets {
        assert_eq!(reset, march / 1_000_000);
        assert!(retry <= march / 1_000_000 - (end_ms - 120_000), "{retry}");
    }
    let r = c
        .check("n1", &json!({ "key": "acct-a", "rule": "monthly" }))
        .await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["reset_at_ms"], json!(march / 1_000_000));

    // From the first of March (local midnight, 23:00 UTC on the 28th) each key admits again,
    // until April.
    let wait = march / 1_000_000 - now_ms();
    tokio::time::sleep(Duration::from_millis(wait + 1_000)).await;
    for id in IDS {
        let r = c
            .check(id, &json!({ "key": "acct-a", "rule": "monthly" }))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let a = r.json();
        assert_eq!(a["reset_at_ms"], json!(april / 1_000_000));
    }
    assert_eq!(
        c.remaining(
            "n2",
            &json!({ "key": "acct-b", "rule": "monthly", "cost": 0 })
        )
        .await,
        10_000
    );
}
