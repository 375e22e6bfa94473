//! The cluster's protocol behaviour on whole nodes in memory (moved from the process tests of
//! `tests/tests/cluster.rs`, which ran in wall time): forming, exact limits across owners,
//! an owner killed, a graceful leave and a restart with the same id, a partition healed.

use super::Cluster;
use serde_json::json;

/// `allowed` of `key` (limit 5 per minute) checked on node `id`; the answer must not be
/// degraded (an owner answered it).
async fn allowed(c: &Cluster, id: &str, key: &str) -> (bool, bool) {
    let r = c
        .check(id, &json!({ "key": key, "limit": 5, "period_ms": 60_000 }))
        .await;
    assert!(
        r.status == 200 || r.status == 429,
        "{}: {}",
        r.status,
        r.body
    );
    let body = r.json();
    let allowed = body["allowed"].as_bool().expect("allowed");
    assert_eq!(allowed, r.status == 200, "{body}");
    (allowed, body["degraded"].as_bool().unwrap_or(false))
}

/// Checks each key 12 times round-robin over `ids`; returns how many each key was allowed.
async fn admitted(c: &Cluster, ids: &[&str], keys: &[String]) -> Vec<usize> {
    let mut counts = vec![0; keys.len()];
    let mut turn = 0;
    for _ in 0..12 {
        for (i, k) in keys.iter().enumerate() {
            let (ok, degraded) = allowed(c, ids[turn % ids.len()], k).await;
            assert!(!degraded, "{k} answered degraded");
            counts[i] += usize::from(ok);
            turn += 1;
        }
    }
    counts
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// Replaces `three_nodes_admit_exactly_the_limit_per_key` (process test): three nodes form a
/// cluster, and whichever node a check lands on, each key admits exactly its limit.
#[tokio::test(start_paused = true)]
async fn three_nodes_form_and_admit_exactly_the_limit_per_key() {
    let c = Cluster::start(3, |_| {}).await;
    for id in ["n0", "n1", "n2"] {
        c.wait(&format!("{id} sees three"), || async {
            c.alive(id).await.len() == 3
        })
        .await;
    }
    let keys = keys("exact", 20);
    assert_eq!(admitted(&c, &["n0", "n1", "n2"], &keys).await, vec![5; 20]);
}

/// Replaces `owner_killed_survivors_fail_open`: a killed node is declared dead by the others
/// and leaves their rings; the survivors own all keys again and stay exact on new keys.
#[tokio::test(start_paused = true)]
async fn owner_killed_survivors_take_over() {
    let mut c = Cluster::start(3, |_| {}).await;
    for id in ["n0", "n1"] {
        c.wait("three alive", || async { c.alive(id).await.len() == 3 })
            .await;
    }
    c.kill("n2").await;
    for id in ["n0", "n1"] {
        c.wait(&format!("{id} drops n2"), || async {
            c.alive(id).await == ["n0", "n1"]
        })
        .await;
    }
    let view = c.view("n0").await;
    let n2 = view["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["node_id"] == "n2"))
        .cloned();
    assert_eq!(n2.map(|m| m["state"].clone()), Some(json!("dead")));
    let keys = keys("after-kill", 10);
    assert_eq!(admitted(&c, &["n0", "n1"], &keys).await, vec![5; 10]);
}

/// Replaces `graceful_leave_and_rejoin`: a node stopped gracefully leaves the others' rings
/// (as leaving, not dead), and restarted with the same id it joins again.
#[tokio::test(start_paused = true)]
async fn graceful_leave_and_rejoin() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait("three alive", || async { c.alive("n0").await.len() == 3 })
        .await;
    c.stop("n1").await;
    c.wait("n1 out of n0's ring", || async {
        c.alive("n0").await == ["n0", "n2"]
    })
    .await;
    let leave_keys = keys("during-leave", 10);
    assert_eq!(admitted(&c, &["n0", "n2"], &leave_keys).await, vec![5; 10]);
    c.restart("n1").await;
    for id in ["n0", "n1", "n2"] {
        c.wait(&format!("{id} sees n1 back"), || async {
            c.alive(id).await.len() == 3
        })
        .await;
    }
    let keys = keys("after-rejoin", 10);
    assert_eq!(admitted(&c, &["n0", "n1", "n2"], &keys).await, vec![5; 10]);
}

/// A node cut off from the others (gossip and peer RPC) is dropped from their rings; healed,
/// it is seen again.
#[tokio::test(start_paused = true)]
async fn partitioned_node_is_dropped_and_returns_when_healed() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait("three alive", || async { c.alive("n0").await.len() == 3 })
        .await;
    c.cut("n2", "n0").await;
    c.cut("n2", "n1").await;
    c.wait("n2 dropped", || async {
        c.alive("n0").await == ["n0", "n1"]
    })
    .await;
    c.heal("n2", "n0").await;
    c.heal("n2", "n1").await;
    c.wait("n2 back", || async { c.alive("n0").await.len() == 3 })
        .await;
}
