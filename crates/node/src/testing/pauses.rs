//! A node resumed from a pause (SIGSTOP, a frozen VM): it has heard nothing from its peers for
//! as long as it was stopped, and gossip declares them dead; but it is the one that was gone.
//! Checks that waited in its socket are asked of their owners (and replicas), never answered
//! from fresh fallback shares; a member that really died meanwhile is dropped once the resumed
//! period ends.

use super::{Cluster, NodeClient, Seen, inline, keys_owned_by};
use crate::cluster::pause::RESUMED_FOR;
use serde_json::{Value, json};
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];
/// 1 per day: a key used up stays used up for the whole test.
const LIMIT: u64 = 1;
const PERIOD_MS: u64 = 86_400_000;

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// Uses up every key through `id` (each admitted once, decided by its owner).
async fn use_up(c: &Cluster, id: &str, keys: &[String]) {
    for k in keys {
        let s = c.seen(id, &inline(k, LIMIT, PERIOD_MS)).await;
        assert_eq!(
            (s.allowed, s.degraded),
            (true, false),
            "{k}: first check via {id}"
        );
    }
    for k in keys {
        assert!(
            !c.seen(id, &inline(k, LIMIT, PERIOD_MS)).await.allowed,
            "{k}"
        );
    }
}

/// Sends one batch of checks of `keys` to `client` at once, answered whenever it answers.
fn send_batch(client: NodeClient, keys: &[String]) -> tokio::task::JoinHandle<Vec<Value>> {
    let checks: Vec<Value> = keys.iter().map(|k| inline(k, LIMIT, PERIOD_MS)).collect();
    let body = json!({ "checks": checks }).to_string();
    tokio::spawn(async move {
        let r = client.http("POST", "/v1/check/batch", &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["results"].as_array().cloned().expect("results")
    })
}

/// (admitted, degraded) among a batch's answers.
fn count(results: &[Value]) -> (usize, usize) {
    let seen: Vec<Seen> = results
        .iter()
        .map(|a| Seen::of(if a["allowed"] == true { 200 } else { 429 }, a))
        .collect();
    (
        seen.iter().filter(|s| s.allowed).count(),
        seen.iter().filter(|s| s.degraded).count(),
    )
}

/// The accuracy contract's `through-stopped` row (`bench/accuracy.sh`): 200 used-up keys, one node
/// SIGSTOPped for seconds with a batch waiting in its socket: resumed, it answered the batch from
/// fresh fallback shares (admitted, degraded) while gossip had marked its peers dead
/// (`bench/notes/accuracy.md`). Here the node stays paused until its peers have dropped it and its
/// own gossip has heard nothing from them for seconds; the batch queued meanwhile (keys of every
/// owner, itself included) is answered by the owners: nothing admitted, nothing degraded. Then it
/// is a member like the others again.
#[tokio::test(start_paused = true)]
async fn a_resumed_node_asks_the_owners_of_what_waited_in_its_socket() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let used = keys("used", 90);
    use_up(&c, "n0", &used).await;

    c.pause("n2").await;
    for id in ["n0", "n1"] {
        c.wait(&format!("{id} drops n2"), || async {
            c.alive(id).await == ["n0", "n1"]
        })
        .await;
    }
    // Stopped 4 s in all: far longer than gossip takes to declare a silent member dead.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let batch = send_batch(c.client("n2"), &used);
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.resume("n2").await;
    let results = batch.await.expect("batch");
    assert_eq!(results.len(), used.len());
    assert_eq!(
        count(&results),
        (0, 0),
        "(admitted, degraded) of {} used-up keys through the resumed node",
        used.len()
    );
    assert_eq!(c.forwarding("n2", "fail_open").await, 0);
    assert_eq!(c.forwarding("n2", "minority").await, 0);
    assert_eq!(c.metric("n2", "ringlimit_pauses_total").await, 1);

    c.wait_all_alive(&IDS).await;
    tokio::time::sleep(RESUMED_FOR).await;
    let after = send_batch(c.client("n2"), &used).await.expect("batch");
    assert_eq!(count(&after), (0, 0), "after the resumed period");
}

/// A member that really died while this node was stopped: after the resume its keys are still
/// asked of it (its link is down: at once of its replica, which denies the used-up ones), and
/// it leaves this node's ring once gossip says so after the resumed period (here ~10 s later:
/// the survivor relays the last heartbeat it heard of it, newer than this node's, which makes
/// it alive again for a while in this node's failure detector, as it was before).
#[tokio::test(start_paused = true)]
async fn a_member_that_died_during_the_pause_is_asked_then_dropped() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let gone = keys_owned_by(&IDS, "n1", "gone", 30, (LIMIT, PERIOD_MS));
    use_up(&c, "n0", &gone).await;
    // The owner's copies reach its replica.
    tokio::time::sleep(Duration::from_secs(1)).await;

    c.pause("n2").await;
    c.kill("n1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.resume("n2").await;
    let results = send_batch(c.client("n2"), &gone).await.expect("batch");
    assert_eq!(
        count(&results).0,
        0,
        "used-up keys of the dead owner admitted"
    );
    assert_eq!(c.forwarding("n2", "fail_open").await, 0);
    c.wait("n2 drops n1", || async {
        c.state_of("n2", "n1").await.as_deref() == Some("dead")
    })
    .await;
    let after = send_batch(c.client("n2"), &gone).await.expect("batch");
    assert_eq!(
        count(&after),
        (0, 0),
        "decided by n1's successor after the period"
    );
}
