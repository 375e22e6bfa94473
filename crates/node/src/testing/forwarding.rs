//! Forwarding to owners on whole nodes in memory (moved from the hand-wired in-memory cluster,
//! whose views were set by hand): a check decided exactly by its owner, a stalled owner failing
//! open at the deadline and then at once (the circuit), a lost link failing open at once, a check
//! sent to a former owner relayed to the owner, and a node without a majority answering from its
//! share.

use super::{Cluster, Seen, keys_owned_by, owner_of};
use crate::rules::RuleSet;
use ringlimit_core::link::client::TIMEOUTS_TO_OPEN;
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;

/// 5 per hour: nothing refills during a test.
const LIMIT: u64 = 5;
const PERIOD_MS: u64 = 3_600_000;
/// The nodes' forward deadline (`NodeConfig::local`'s, stated here for the timing asserts).
const DEADLINE: Duration = Duration::from_millis(25);
/// How long a circuit stays open (`node.rs` builds the peers with it).
const OPEN_FOR: Duration = Duration::from_secs(1);
const IDS: [&str; 3] = ["n0", "n1", "n2"];
const TWO: [&str; 2] = ["n0", "n1"];

fn check(key: &str) -> serde_json::Value {
    super::inline(key, LIMIT, PERIOD_MS)
}

/// A key that `owner` owns on the ring of `members`.
fn key_of(members: &[&str], owner: &str) -> String {
    keys_owned_by(members, owner, "key", 1, (LIMIT, PERIOD_MS)).remove(0)
}

/// A key whose bucket each ring of `rings` places at the owner it names.
fn key_owned(rings: &[(&[&str], &str)]) -> String {
    (0..)
        .map(|i| format!("key:{i}"))
        .find(|k| {
            rings
                .iter()
                .all(|(ring, owner)| owner_of(ring, k, LIMIT, PERIOD_MS) == *owner)
        })
        .expect("a key with those owners")
}

/// `remaining` and `degraded` of one check of `key` on node `id`.
async fn answer(c: &Cluster, id: &str, key: &str) -> (Seen, u64) {
    let r = c.check(id, &check(key)).await;
    let body = r.json();
    let seen = Seen::of(r.status, &body);
    (seen, body["remaining"].as_u64().expect("remaining"))
}

#[tokio::test(start_paused = true)]
async fn a_check_is_decided_exactly_by_its_owner() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let key = key_of(&IDS, "n1");
    let body = check(&key);
    let answers = futures::future::join_all((0..7).map(|i| c.seen(IDS[i % 3], &body))).await;
    assert_eq!(
        answers.iter().filter(|a| a.allowed).count(),
        5,
        "exactly the limit, from whichever node"
    );
    assert!(answers.iter().all(|a| !a.degraded));
    for (id, held) in [("n0", 0), ("n1", 1), ("n2", 0)] {
        assert_eq!(c.buckets(id).await, held, "buckets at {id}");
    }
    assert_eq!(
        c.sum_forwarding(&IDS, "forwarded").await,
        5,
        "the checks that landed on n0 and n2"
    );
}

/// A key forwarded at thousands of checks a second is counted hot at the forwarding node (and
/// not at its owner, which forwards nothing); once it goes quiet it is demoted.
#[tokio::test(start_paused = true)]
async fn a_key_forwarded_thousands_of_times_a_second_is_hot_there() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let key = key_of(&IDS, "n1");
    let checks = vec![json!({ "key": key, "limit": 1_000_000, "period_ms": 1_000 }); 1_000];
    for _ in 0..4 {
        c.batch("n0", &checks).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(c.metric("n0", "ringlimit_hot_keys").await, 1);
    assert_eq!(c.metric("n1", "ringlimit_hot_keys").await, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.metric("n0", "ringlimit_hot_keys").await,
        0,
        "demoted once quiet"
    );
    let changes = c.metrics("n0").await;
    for change in ["promoted", "demoted"] {
        let line = format!("ringlimit_hot_key_changes_total{{change=\"{change}\"}} 1");
        assert!(changes.contains(&line), "{line} in {changes}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_owner_fails_open_at_the_deadline_then_at_once_until_it_answers_again() {
    // No replicas: the fallback share is what this test is about (`testing::replicas`).
    let c = Cluster::start(2, |c| c.replicas = 0).await;
    c.wait_all_alive(&TWO).await;
    let key = key_of(&TWO, "n1");
    assert!(!c.seen("n0", &check(&key)).await.degraded);
    // Peer RPC to n1 stalls; gossip still flows, so n1 stays n0's owner of the key.
    c.stall_peer("n1");
    for _ in 0..TIMEOUTS_TO_OPEN {
        let started = Instant::now();
        assert!(c.seen("n0", &check(&key)).await.degraded, "fail-open");
        assert_eq!(started.elapsed(), DEADLINE);
    }
    // The circuit is open: no more waiting on n1.
    let started = Instant::now();
    assert!(c.seen("n0", &check(&key)).await.degraded);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        c.forwarding("n0", "fail_open").await,
        u64::from(TIMEOUTS_TO_OPEN) + 1
    );
    // n1 answers again: after `open_for` the circuit closes on n1's first answer.
    c.resume_peer("n1");
    tokio::time::sleep(OPEN_FOR).await;
    let (seen, remaining) = answer(&c, "n0", &key).await;
    assert!(!seen.degraded);
    // n1's bucket: the warm-up, this check, and the first timed-out check, whose frame was on
    // the wire when n1 stalled and which n1 decided when it resumed (as a paused process does
    // with what is in its socket); the two others were dropped unsent, their callers gone.
    assert_eq!(remaining, 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_to_the_owner_fails_open_at_once() {
    // No replicas: the fallback share is what this test is about (`testing::replicas`).
    let c = Cluster::start(2, |c| c.replicas = 0).await;
    c.wait_all_alive(&TWO).await;
    let key = key_of(&TWO, "n1");
    assert!(!c.seen("n0", &check(&key)).await.degraded);
    c.cut_link("n0", "n1");
    tokio::task::yield_now().await;
    let started = Instant::now();
    let first = c.seen("n0", &check(&key)).await;
    assert!(first.degraded);
    assert!(
        started.elapsed() < DEADLINE,
        "not waiting for a deadline: {:?}",
        started.elapsed()
    );
    // A rule that fails closed is denied instead (`all_or_nothing` covers it); here: the share
    // is n0's half of the limit, rounded down: 5 / 2 = 2.
    let body = check(&key);
    let rest = futures::future::join_all((0..5).map(|_| c.seen("n0", &body))).await;
    let admitted = usize::from(first.allowed) + rest.iter().filter(|a| a.allowed).count();
    assert_eq!(admitted, 2);
}

/// Was decided on hand-set views (n1 alone believing it had left); now n1 really leaves while
/// n0 hears no gossip, so n0 still forwards to n1, which relays to the owner in its own view.
#[tokio::test(start_paused = true)]
async fn a_check_sent_to_a_former_owner_is_relayed_to_the_owner() {
    let mut c = Cluster::start(3, |c| c.leave_delay = Duration::from_secs(5)).await;
    c.wait_all_alive(&IDS).await;
    let key = key_owned(&[(&IDS, "n1"), (&["n0", "n2"], "n2")]);
    c.cut_gossip("n0", "n1").await;
    c.cut_gossip("n0", "n2").await;
    c.terminate("n1");
    for id in ["n1", "n2"] {
        c.wait(&format!("{id} drops n1 from its ring"), || async {
            c.view(id).await["ring_members"] == 2
        })
        .await;
    }
    assert_eq!(c.view("n0").await["ring_members"], 3, "n0 has not heard");
    let answers = [answer(&c, "n0", &key).await, answer(&c, "n0", &key).await];
    assert!(answers.iter().all(|(s, _)| s.allowed && !s.degraded));
    assert_eq!(answers[1].1, 3, "both decided on one bucket");
    assert_eq!(c.buckets("n2").await, 1, "decided at n2, the owner");
    assert_eq!(
        c.buckets("n1").await,
        0,
        "not at n1, which no longer owns it"
    );
    assert_eq!(c.forwarding("n0", "forwarded").await, 2, "sent to n1");
    assert_eq!(
        c.metric("n1", "ringlimit_relayed_total").await,
        2,
        "relayed by n1"
    );
}

const LIMITS: &str = "
rules:
  - { name: per-ip, limit: 10, period: 1h }
  - { name: per-user, limit: 3, period: 1h }
";

/// Regression: in a 2 | 1 partition the lone node took ownership of every key and both sides
/// granted each key its whole limit (the docs' benchmarks page, "Network faults"). Without a
/// majority a node owns nothing: the others' keys get a third of the limit, degraded; its own keys
/// the same, and no more than their exact buckets still hold (what was spent before the partition
/// stays spent).
#[tokio::test(start_paused = true)]
async fn a_node_without_a_majority_answers_every_key_from_its_share() {
    let rules = RuleSet::from_yaml(LIMITS).expect("valid rules");
    let c = Cluster::start(3, |c| c.rules = rules.clone()).await;
    c.wait_all_alive(&IDS).await;
    let rest: &[&str] = &["n0", "n2"];
    let of_a = key_owned(&[(&IDS, "n0"), (rest, "n0")]);
    let of_b = key_owned(&[(&IDS, "n1"), (rest, "n2")]);
    let fresh_of_b = keys_owned_by(&IDS, "n1", "fresh", 1, (LIMIT, PERIOD_MS)).remove(0);
    for key in [&of_a, &of_b] {
        for _ in 0..5 {
            assert!(c.seen("n0", &check(key)).await.allowed);
        }
    }
    // n1 is cut off: n0 and n2 declare it dead; n1 sees neither of them.
    c.cut("n0", "n1").await;
    c.cut("n2", "n1").await;
    c.wait_all_alive(rest).await;
    c.wait("n1 without a majority", || async {
        c.view("n1").await["quorate"] == false
    })
    .await;
    for (key, expected) in [(&of_a, 1), (&of_b, 0), (&fresh_of_b, 1)] {
        let answers = futures::future::join_all((0..6).map(|_| async {
            let body = c.check("n1", &check(key)).await.json();
            assert_eq!(body["limit"], LIMIT, "{body}");
            Seen::of(if body["allowed"] == true { 200 } else { 429 }, &body)
        }))
        .await;
        assert!(answers.iter().all(|x| x.degraded));
        let allowed = answers.iter().filter(|x| x.allowed).count();
        assert_eq!(
            allowed, expected,
            "n1's share of 5 among the 3 it last knew, for {key}"
        );
    }
    assert_eq!(c.forwarding("n1", "minority").await, 18);
    // The majority side keeps deciding exactly: n0's key stays spent.
    assert!(!c.seen("n0", &check(&of_a)).await.allowed);
    assert!(!c.seen("n2", &check(&of_a)).await.degraded);
    // An all-or-nothing request at n1 takes from the share and gives it back when denied.
    let both = [
        json!({ "key": "u1", "rule": "per-user" }),
        json!({ "key": "ip", "rule": "per-ip" }),
    ];
    let first = c.check_all("n1", &both).await.json();
    assert_eq!(first["allowed"], true, "{first}");
    assert_eq!(first["degraded"], true, "{first}");
    // per-user's share of 3 among 3 is 1: the second request is denied and gives per-ip back.
    assert_eq!(c.check_all("n1", &both).await.status, 429);
    let mut ip = 0;
    for _ in 0..5 {
        ip += usize::from(c.check_all("n1", &both[1..]).await.status == 200);
    }
    assert_eq!(
        ip, 2,
        "per-ip's share of 10 among 3 is 3, one held by the first request"
    );
    // Healed: n1 sees a majority again and forwards to the owner.
    c.heal("n0", "n1").await;
    c.heal("n2", "n1").await;
    c.wait_all_alive(&IDS).await;
    // (its first forward may still meet the link the cut broke, or the circuit it opened)
    c.wait("n1 forwards n0's key to n0 again", || async {
        !c.seen("n1", &check(&of_a)).await.degraded
    })
    .await;
    assert_eq!(c.view("n1").await["quorate"], true);
    // n1 decided its own key exactly too (one of its 5 taken), and took no ownership of n0's.
    let peek = json!({ "key": fresh_of_b, "limit": LIMIT, "period_ms": PERIOD_MS });
    assert_eq!(c.remaining("n1", &peek).await, 4);
    let peek = json!({ "key": of_a, "limit": LIMIT, "period_ms": PERIOD_MS });
    assert_eq!(c.remaining("n0", &peek).await, 0);
}
