//! Calendar windows through three nodes: a monthly quota admits exactly its limit in the
//! month, denied until the local first of the next month, admitted again from then; a global
//! daily quota admits its limit per local day, days of 23 and 25 hours included.

use super::{Cluster, EPOCH_NS, EngineClock};
use crate::rules::RuleSet;
use ringlimit_core::clock::Clock;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The harness's clock moved to another date, and moved on by jumps: one clock shared by every
/// node, so that a test skips the hours in which nothing happens (a running cluster's virtual
/// hours cost real time).
struct Jumping {
    inner: Arc<dyn Clock>,
    offset_ns: AtomicU64,
}

impl Clock for Jumping {
    fn now(&self) -> u64 {
        self.inner.now() + self.offset_ns.load(Ordering::Relaxed)
    }
}

impl Jumping {
    /// Moves the clock forward to `t` (ns since the epoch).
    fn jump_to(&self, t: u64) {
        let now = self.now();
        assert!(t >= now, "forward only");
        self.offset_ns.fetch_add(t - now, Ordering::Relaxed);
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

/// A global daily quota of 60 on Berlin's calendar, checked through three nodes in turn:
/// `(admitted, reset_at_ms of every answer)` of `n` checks a quarter second apart (every count
/// is published in between, so global mode is exact here).
async fn use_up(c: &Cluster, key: &str, n: usize) -> (u64, Vec<u64>) {
    let mut admitted = 0;
    let mut resets = Vec::new();
    for i in 0..n {
        let r = c
            .check(IDS[i % 3], &json!({ "key": key, "rule": "daily" }))
            .await;
        assert!(r.status == 200 || r.status == 429, "{}", r.body);
        let a = r.json();
        if r.status == 200 {
            admitted += 1;
        }
        resets.push(a["reset_at_ms"].as_u64().expect("reset"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (admitted, resets)
}

/// `mode: global` with calendar windows: each node decides from its own and its peers' counts,
/// numbered by local date, so the quota is the limit per local day in Berlin — the 23-hour day
/// of the spring change and the 25-hour day of the autumn one too (a day counted from the
/// epoch would turn at 01:00 or 02:00 local, and 24 hours from the local midnight would be the
/// wrong end on both of them).
#[tokio::test(start_paused = true)]
async fn a_global_daily_quota_admits_its_limit_per_local_day_across_dst_changes() {
    let ms = |s: &str| at(s) / 1_000_000;
    let start = at("2026-03-28T23:58[Europe/Berlin]");
    let clock: Arc<std::sync::Mutex<Option<Arc<Jumping>>>> = Arc::default();
    let c = Cluster::start(3, |config| {
        config.rules = RuleSet::from_yaml(
            "rules:\n  - { name: daily, limit: 60, period: 1d, algorithm: fixed_window, \
             calendar: true, timezone: Europe/Berlin, mode: global }\n",
        )
        .expect("rules");
        let mut shared = clock.lock().expect("clock");
        let j = shared
            .get_or_insert_with(|| {
                let inner = config.clock.take().expect("the harness's clock").0;
                let offset_ns = AtomicU64::new(start - inner.now());
                Arc::new(Jumping { inner, offset_ns })
            })
            .clone();
        config.clock = Some(EngineClock(j));
    })
    .await;
    let clock = clock.lock().expect("clock").clone().expect("a clock");
    c.wait_all_alive(&IDS).await;

    // The last minutes of Saturday 28 March: 60 admitted, until local midnight.
    let (admitted, resets) = use_up(&c, "tenant", 80).await;
    assert_eq!(admitted, 60);
    assert!(
        resets
            .iter()
            .all(|r| *r == ms("2026-03-29T00:00[Europe/Berlin]"))
    );

    // Sunday 29 March lasts 23 hours: 60 more, and its end is the next local midnight.
    clock.jump_to(at("2026-03-29T00:00:01[Europe/Berlin]"));
    let (admitted, resets) = use_up(&c, "tenant", 80).await;
    assert_eq!(admitted, 60);
    let monday = ms("2026-03-30T00:00[Europe/Berlin]");
    assert_eq!(
        monday - ms("2026-03-29T00:00[Europe/Berlin]"),
        23 * 3_600_000
    );
    assert!(resets.iter().all(|r| *r == monday), "{resets:?}");
    // Late that evening (past 00:00 UTC's day turn, 22 h 30 in): still that day, still none.
    clock.jump_to(at("2026-03-29T23:30[Europe/Berlin]"));
    let (admitted, _) = use_up(&c, "tenant", 6).await;
    assert_eq!(admitted, 0);
    clock.jump_to(at("2026-03-30T00:00:01[Europe/Berlin]"));
    let (admitted, resets) = use_up(&c, "tenant", 70).await;
    assert_eq!(admitted, 60);
    assert!(
        resets
            .iter()
            .all(|r| *r == ms("2026-03-31T00:00[Europe/Berlin]"))
    );

    // Sunday 25 October lasts 25 hours: 24 h 30 after its midnight it is still that day.
    clock.jump_to(at("2026-10-25T00:00:01[Europe/Berlin]"));
    let (admitted, _) = use_up(&c, "tenant", 70).await;
    assert_eq!(admitted, 60);
    clock.jump_to(at("2026-10-25T23:30[Europe/Berlin]"));
    let (admitted, resets) = use_up(&c, "tenant", 6).await;
    assert_eq!(admitted, 0);
    let monday = ms("2026-10-26T00:00[Europe/Berlin]");
    assert_eq!(
        monday - ms("2026-10-25T00:00[Europe/Berlin]"),
        25 * 3_600_000
    );
    assert!(resets.iter().all(|r| *r == monday), "{resets:?}");
    clock.jump_to(at("2026-10-26T00:00:01[Europe/Berlin]"));
    let (admitted, _) = use_up(&c, "tenant", 70).await;
    assert_eq!(admitted, 60);
}
