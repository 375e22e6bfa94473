//! Clock skew: one node's wall clock off by seconds. Offsets are measured and shown, global windows
//! stay on the cluster's clock, and rule versions stay in the order written.

use super::{ADMIN_TOKEN, Cluster, EngineClock};
use crate::rules::RuleSet;
use ringlimit_core::clock::Clock;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];

/// A node's wall clock `offset_ns` off the harness's (the monotonic clock is tokio's, unskewed).
struct Skewed {
    inner: Arc<dyn Clock>,
    offset_ns: i64,
}

impl Clock for Skewed {
    fn now(&self) -> u64 {
        (i128::from(self.inner.now()) + i128::from(self.offset_ns)) as u64
    }
}

fn skew(config: &mut crate::config::NodeConfig, offset_ms: i64) {
    let inner = config.clock.take().expect("the harness's clock").0;
    config.clock = Some(EngineClock(Arc::new(Skewed {
        inner,
        offset_ns: offset_ms * 1_000_000,
    })));
}

fn rules() -> RuleSet {
    RuleSet::from_yaml(
        "rules:\n  - { name: g, limit: 300, period: 10s, algorithm: fixed_window, mode: global }\n",
    )
    .expect("rules")
}

/// Starts 3 nodes, `n2`'s clock `offset_ms` off, and waits for a few clock samples.
async fn skewed_cluster(offset_ms: i64) -> Cluster {
    let c = Cluster::start(3, |config| {
        config.rules = rules();
        config.admin_token = Some(ADMIN_TOKEN.into());
        if config.node_id == "n2" {
            skew(config, offset_ms);
        }
    })
    .await;
    c.wait_all_alive(&IDS).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c
}

/// Each node measures the others' offsets (on the paused clock a round trip takes no time, so
/// they are exact), shows them in `/v1/cluster` and the metrics, and the wrong node says so.
#[tokio::test(start_paused = true)]
async fn every_peers_offset_is_measured_and_the_wrong_clock_says_so() {
    let c = skewed_cluster(10_000).await;
    let view = c.view("n0").await;
    let peers = view["clock"]["peers"].as_array().expect("peers").clone();
    let offset = |id: &str| {
        peers
            .iter()
            .find(|p| p["node_id"] == id)
            .and_then(|p| p["offset_ms"].as_f64())
            .unwrap_or_else(|| panic!("{id} in {peers:?}"))
    };
    assert!((offset("n2") - 10_000.0).abs() <= 10.0, "{peers:?}");
    assert!(offset("n1").abs() <= 10.0, "{peers:?}");
    assert_eq!(view["clock"]["correction_ms"].as_f64(), Some(0.0), "{view}");
    assert_eq!(view["clock"]["off"], false);
    let wrong = c.view("n2").await;
    let correction = wrong["clock"]["correction_ms"]
        .as_f64()
        .expect("correction");
    assert!((correction + 10_000.0).abs() <= 10.0, "{wrong}");
    assert_eq!(wrong["clock"]["off"], true);
    let ready = c.http("n2", "GET", "/readyz", "").await;
    assert_eq!(ready.status, 200);
    assert!(
        ready
            .body
            .contains("clock: this node's clock is 10000 ms off"),
        "{}",
        ready.body
    );
    let metrics = c.metrics("n0").await;
    assert!(
        metrics.contains("ringlimit_clock_offset_seconds{peer=\"n2\"} 10"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("clock"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The clock-skew benchmark's table (`bench/skew.sh`) in memory: a global fixed window of 300
/// per 10 s, 180 checks/s spread over the nodes, node 2's clock off. Each true 10 s window
/// admits at most 5% over the limit (before the cluster clock, up to twice the limit: the docs'
/// benchmarks page, "Clock skew").
#[tokio::test(start_paused = true)]
async fn global_windows_stay_on_the_cluster_clock_with_one_clock_off() {
    for offset_ms in [3_000, 10_000, -7_000, 60_000] {
        let c = skewed_cluster(offset_ms).await;
        // Load from a little after a true window starts, for four windows.
        let start = c.next_window(10_000, 1_000).await - 10_000;
        let mut admitted = [0u64; 4];
        let step = Duration::from_millis(1000 / 60);
        for _ in 0..(4 * 10 * 60) {
            let window = ((c.now_ms() - start) / 10_000) as usize;
            for id in IDS {
                let r = c.check(id, &json!({ "key": "tenant", "rule": "g" })).await;
                if r.status == 200 && window < 4 {
                    admitted[window] += 1;
                }
            }
            tokio::time::sleep(step).await;
        }
        for (w, n) in admitted.iter().enumerate() {
            assert!(
                *n <= 315,
                "n2 {offset_ms} ms off: window {w} admitted {n}: {admitted:?}"
            );
        }
        assert!(
            admitted.iter().all(|n| *n >= 285),
            "{offset_ms}: {admitted:?}"
        );
    }
}

/// API rule versions stay in the order written with a node 30 s ahead: every change of a name
/// is decided at its owner, whose hybrid clock only moves forward.
#[tokio::test(start_paused = true)]
async fn rule_versions_keep_the_order_written_with_a_node_30_s_ahead() {
    for ahead in IDS {
        let c = Cluster::start(3, |config| {
            config.admin_token = Some(ADMIN_TOKEN.into());
            if config.node_id == ahead {
                skew(config, 30_000);
            }
        })
        .await;
        c.wait_all_alive(&IDS).await;
        for (i, via) in ["n1", "n0", "n2", "n1"].into_iter().enumerate() {
            let body = json!({ "limit": 10 + i, "period": "1m" }).to_string();
            let auth = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
            let r = c
                .client(via)
                .try_http_with("PUT", "/v1/admin/rules/tier", &auth, &body)
                .await
                .expect("answered");
            assert_eq!(r.status, 200, "{}", r.body);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for id in IDS {
            let r = c.admin(id, "GET", "/v1/admin/rules/tier").await.json();
            assert_eq!(r["limit"], 13, "{ahead} ahead, seen at {id}: {r}");
        }
    }
}
