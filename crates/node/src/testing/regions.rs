//! Regions on whole nodes in memory, under tokio's paused clock: two single-node clusters,
//! each its own region, share a `scope: regions` limit through both; a region cut off decides
//! on its slices until its allowance expires and only then on its fallback share (`degraded`),
//! and the two together stay within the limit.

use super::Cluster;
use crate::config::RegionsConfig;
use crate::rules::RuleSet;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const LIMIT: u64 = 60;
/// One exchange every 200 ms: an allowance lasts 600 ms past its ask.
const INTERVAL: Duration = Duration::from_millis(200);

fn regions(c: &mut crate::NodeConfig) {
    let (ours, other, other_ip) = if c.node_id == "n0" {
        ("eu", "us", [10, 0, 0, 2])
    } else {
        ("us", "eu", [10, 0, 0, 1])
    };
    // Two clusters: each node seeds itself only.
    c.cluster_id = ours.to_owned();
    c.seeds = vec![c.peer_addr.to_string()];
    c.rules = RuleSet::from_yaml(&format!(
        "rules:\n  - {{ name: shared, limit: {LIMIT}, period: 10s, algorithm: fixed_window, \
         scope: regions }}\n"
    ))
    .expect("rules");
    c.regions = Some(RegionsConfig {
        name: ours.to_owned(),
        peers: vec![(
            other.to_owned(),
            std::net::SocketAddr::from((other_ip, 7000)).to_string(),
        )],
        interval: INTERVAL,
        secret: Some(Arc::from(b"the region secret".as_slice())),
    });
}

fn check(key: &str) -> Value {
    json!({ "key": key, "rule": "shared" })
}

async fn answer(cluster: &Cluster, id: &str, key: &str) -> Value {
    let r = cluster.check(id, &check(key)).await;
    assert!(
        r.status == 200 || r.status == 429,
        "{} {}",
        r.status,
        r.body
    );
    r.json()
}

#[tokio::test(start_paused = true)]
async fn two_regions_share_a_limit_and_a_cut_off_region_falls_back_after_its_allowance() {
    assert_eq!(
        super::ip(0),
        [10, 0, 0, 1],
        "addresses as regions() assumes"
    );
    let cluster = Cluster::start(2, regions).await;
    // The whole test in one 10 s window.
    cluster.next_window(10_000, 50).await;
    // Shared through both regions, a check every 50 ms in each for 3 s: within the limit.
    let mut admitted = [0u64; 2];
    for _ in 0..60 {
        for (i, id) in ["n0", "n1"].into_iter().enumerate() {
            let a = answer(&cluster, id, "k").await;
            assert_eq!(a["degraded"], false, "{a}");
            admitted[i] += u64::from(a["allowed"] == true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted.iter().sum::<u64>() <= LIMIT, "{admitted:?}");
    assert!(admitted.iter().all(|&n| n > 0), "{admitted:?}");

    // Both regions' /v1/cluster: up, with a round trip.
    let c = cluster.http("n0", "GET", "/v1/cluster", "").await.json();
    assert_eq!(c["region"], "eu", "{c}");
    assert_eq!(c["regions"][1]["name"], "us", "{c}");
    assert_eq!(c["regions"][1]["state"], "up", "{c}");

    // Cut: each keeps deciding on its allowance (never degraded) until it expires, then on
    // its fallback share, degraded.
    cluster.cut_link("n0", "n1");
    let cut_at = tokio::time::Instant::now();
    let mut first_degraded: [Option<Duration>; 2] = [None, None];
    let mut after = [0u64; 2];
    for _ in 0..30 {
        for (i, id) in ["n0", "n1"].into_iter().enumerate() {
            let a = answer(&cluster, id, "k").await;
            if a["degraded"] == true && first_degraded[i].is_none() {
                first_degraded[i] = Some(cut_at.elapsed());
            }
            after[i] += u64::from(a["allowed"] == true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One of them is the key's home, which renews its own allowance: never degraded. The
    // other falls back, not before its allowance (three intervals from its last ask) ran out.
    let degraded: Vec<Duration> = first_degraded.iter().flatten().copied().collect();
    assert_eq!(degraded.len(), 1, "{first_degraded:?}");
    assert!(
        degraded[0] >= INTERVAL * 2,
        "degraded {:?} after the cut",
        degraded[0]
    );
    assert!(
        degraded[0] <= INTERVAL * 4,
        "degraded {:?} after the cut",
        degraded[0]
    );
    let total: u64 = admitted.iter().chain(after.iter()).sum();
    eprintln!("admitted {admitted:?}, after the cut {after:?}, degraded from {first_degraded:?}");
    assert!(total <= LIMIT, "{admitted:?} then {after:?} over {LIMIT}");
}

/// Node `id`'s state of the other region in `/v1/cluster`.
async fn other_region_state(cluster: &Cluster, id: &str) -> Value {
    cluster.http(id, "GET", "/v1/cluster", "").await.json()["regions"][1]["state"].clone()
}

/// Waits (at most 30 `step`s) until node `id` shows the other region in `state`.
async fn wait_for_state(cluster: &Cluster, id: &str, state: &str, step: Duration) {
    for _ in 0..30 {
        if other_region_state(cluster, id).await == state {
            return;
        }
        tokio::time::sleep(step).await;
    }
    assert_eq!(other_region_state(cluster, id).await, state);
}

#[tokio::test(start_paused = true)]
async fn a_late_answer_or_a_slow_handshake_costs_a_region_link_no_redial() {
    let cluster = Cluster::start(2, regions).await;
    wait_for_state(&cluster, "n0", "up", INTERVAL / 2).await;
    let dials = cluster.dials_to("n1");
    // The other region's entry node answers nothing until an exchange goes unanswered (the
    // link is down); then its answer comes late, before the next one's.
    cluster.stall_peer("n1");
    wait_for_state(&cluster, "n0", "unreachable", INTERVAL / 10).await;
    cluster.resume_peer("n1");
    tokio::time::sleep(INTERVAL * 2).await;
    assert_eq!(other_region_state(&cluster, "n0").await, "up");
    assert_eq!(
        cluster.dials_to("n1"),
        dials,
        "the link was dialled again for a late answer"
    );

    // A handshake that takes longer than an interval (its two round trips on a long link) is
    // waited for, not given up and dialled again.
    cluster.cut_link("n0", "n1");
    wait_for_state(&cluster, "n0", "unreachable", INTERVAL / 10).await;
    cluster.stall_peer("n1");
    cluster.heal_link("n0", "n1");
    let dials = cluster.dials_to("n1");
    tokio::time::sleep(INTERVAL * 4).await;
    cluster.resume_peer("n1");
    tokio::time::sleep(INTERVAL * 2).await;
    assert_eq!(other_region_state(&cluster, "n0").await, "up");
    // One dial each for the asks' link and the counts' link.
    assert!(
        cluster.dials_to("n1") <= dials + 2,
        "{} dials for two links",
        cluster.dials_to("n1") - dials
    );
}
