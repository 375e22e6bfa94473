//! Where a bucket lives, on whole nodes in memory (moved from the hand-wired in-memory cluster):
//! a ring change hands live buckets to their new owner with their consumption; an admin reset
//! reaches every member and reports the one that does not answer.

use super::{ADMIN_TOKEN, Cluster, inline, keys_owned_by};
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;

const LIMIT: u64 = 5;
const PERIOD_MS: u64 = 3_600_000;
const IDS: [&str; 3] = ["n0", "n1", "n2"];
const TWO: [&str; 2] = ["n0", "n1"];
/// How long a reset waits for a member: the peers' request bound for a reset (their connect
/// timeout, `node.rs`), within the service's 2 s for the whole reset (`service::keys`).
const RESET_WAIT: Duration = Duration::from_millis(500);

fn check(key: &str) -> serde_json::Value {
    inline(key, LIMIT, PERIOD_MS)
}

#[tokio::test(start_paused = true)]
async fn a_ring_change_hands_live_buckets_to_their_new_owner() {
    let mut c = Cluster::start(1, |_| {}).await;
    let moving = keys_owned_by(&TWO, "n1", "moving", 1, (LIMIT, PERIOD_MS)).remove(0);
    let staying = keys_owned_by(&TWO, "n0", "staying", 1, (LIMIT, PERIOD_MS)).remove(0);
    for key in [&moving, &staying] {
        for _ in 0..2 {
            assert!(c.seen("n0", &check(key)).await.allowed);
        }
    }
    assert_eq!(c.buckets("n0").await, 2);
    c.join().await;
    c.wait_all_alive(&TWO).await;
    c.wait("n0 hands a bucket over", || async {
        c.forwarding("n0", "handed_over").await >= 1
    })
    .await;
    assert_eq!(c.forwarding("n0", "handed_over").await, 1);
    assert_eq!(c.buckets("n0").await, 1, "n0 keeps only the staying key");
    assert_eq!(c.buckets("n1").await, 1, "n1 holds the moving key");
    // The moved key kept its consumption: two taken at n0, one more at n1.
    let r = c.check("n1", &check(&moving)).await.json();
    assert_eq!(r["remaining"], 2, "{r}");
    let peek = json!({ "key": staying, "limit": LIMIT, "period_ms": PERIOD_MS });
    assert_eq!(c.remaining("n0", &peek).await, 3);
}

/// Was set up by writing the bucket into every node's store by hand; now n0 and n1 each take a
/// fail-open share while their links to the owner n2 are cut, and n2 decides the key itself.
#[tokio::test(start_paused = true)]
async fn a_reset_reaches_every_member_and_reports_one_that_does_not_answer() {
    // No replicas: the stopped member's keys are answered from shares, which a reset clears.
    let c = Cluster::start(3, |c| {
        c.admin_token = Some(ADMIN_TOKEN.into());
        c.replicas = 0;
    })
    .await;
    c.wait_all_alive(&IDS).await;
    let key = keys_owned_by(&IDS, "n2", "reset-me", 1, (LIMIT, PERIOD_MS)).remove(0);
    assert!(!c.seen("n2", &check(&key)).await.degraded);
    for id in ["n0", "n1"] {
        c.cut_link(id, "n2");
        assert!(c.seen(id, &check(&key)).await.degraded, "{id}'s share");
        c.heal_link(id, "n2");
    }
    for id in IDS {
        assert_eq!(c.buckets(id).await, 1, "{id} holds a bucket of the key");
    }
    c.stall_peer("n2");
    let started = Instant::now();
    let path = format!("/v1/admin/keys/{key}/reset?limit={LIMIT}&period_ms={PERIOD_MS}");
    let r = c.admin("n0", "POST", &path).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        started.elapsed(),
        RESET_WAIT,
        "the silent member is waited on for the bound, no more"
    );
    let report = r.json();
    let status: Vec<(&str, &str, Option<u64>)> = report["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["node_id"].as_str().expect("node_id"),
                m["status"].as_str().expect("status"),
                m["removed"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        status,
        [
            ("n0", "ok", Some(1)),
            ("n1", "ok", Some(1)),
            ("n2", "failed", None)
        ]
    );
    assert_eq!(report["complete"], false);
    c.resume_peer("n2");
    for (id, held) in [("n0", 0), ("n1", 0), ("n2", 1)] {
        assert_eq!(c.buckets(id).await, held, "buckets at {id}");
    }
}
