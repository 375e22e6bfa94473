//! One request, several limits (`POST /v1/check/all`) across owners, on whole nodes in memory
//! (moved from the hand-wired in-memory cluster): exact limits with nothing lost, a denial that
//! leaves every algorithm as if the request never came, concurrent requests, shadow limits, an
//! unreachable owner's share given back, a global limit counted only when admitted, and a rule
//! that fails closed.

use super::Cluster;
use crate::rules::InForce;
use crate::rules::RuleSet;
use crate::rules::RuleSpec;
use ringlimit_proto::Ring;
use serde_json::{Value, json};

const IDS: [&str; 3] = ["n0", "n1", "n2"];

const LIMITS: &str = "
rules:
  - { name: per-ip, limit: 10, period: 1h }
  - { name: per-user, limit: 3, period: 1h }
  - { name: trial, limit: 1, period: 1h, shadow: true }
  - { name: tb, limit: 2, period: 1h, algorithm: token_bucket }
  - { name: lb, limit: 2, period: 1h, algorithm: leaky_bucket }
  - { name: fw, limit: 2, period: 1h, algorithm: fixed_window }
  - { name: sw, limit: 2, period: 1h, algorithm: sliding_window }
  - { name: sl, limit: 2, period: 1h, algorithm: sliding_log }
";

const GLOBAL_AND_CLOSED: &str = "
rules:
  - { name: per-user, limit: 3, period: 1h }
  - { name: cap, limit: 4, period: 1h, mode: global }
  - { name: strict, limit: 5, period: 1h, on_owner_unreachable: closed }
";

/// Three nodes with `yaml`'s rules, every one alive in every view; and the rules.
async fn cluster(yaml: &str) -> (Cluster, RuleSet) {
    start(yaml, 1).await
}

/// [`cluster`] with `--replicas 0`: an unreachable owner's checks go straight to the fallback
/// share (with replicas, its replica decides them: `testing::replicas`).
async fn cluster_without_replicas(yaml: &str) -> (Cluster, RuleSet) {
    start(yaml, 0).await
}

async fn start(yaml: &str, replicas: usize) -> (Cluster, RuleSet) {
    let rules = RuleSet::from_yaml(yaml).expect("valid rules");
    let c = Cluster::start(3, |c| {
        c.rules = rules.clone();
        c.replicas = replicas;
    })
    .await;
    c.wait_all_alive(&IDS).await;
    (c, rules)
}

/// A key `{prefix}:{i}` whose bucket under the named `rule` `owner` owns on the ring of [`IDS`].
fn key_of(rules: &RuleSet, rule: &str, prefix: &str, owner: &str) -> String {
    let in_force = InForce::new(rules.clone());
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| {
            let (_, id) = in_force
                .prepare(k, RuleSpec::Named(rule), 1)
                .expect("valid");
            Ring::new(IDS).owner(id) == Some(owner)
        })
        .expect("a key with that owner")
}

fn item(rule: &str, key: &str) -> Value {
    json!({ "key": key, "rule": rule })
}

/// One all-or-nothing request of `(rule, key)` checks of cost 1 on node `id`: whether it was
/// admitted, and each check's answer.
async fn check_all(c: &Cluster, id: &str, checks: &[(&str, &str)]) -> (bool, Vec<Value>) {
    let items: Vec<Value> = checks.iter().map(|(r, k)| item(r, k)).collect();
    let r = c.check_all(id, &items).await;
    assert!(
        r.status == 200 || r.status == 429,
        "{}: {}",
        r.status,
        r.body
    );
    let body = r.json();
    let results = body["results"].as_array().cloned().expect("results");
    (r.status == 200, results)
}

/// What the bucket of (`rule`, `key`) has left, read (cost 0) through node `id`.
async fn remaining(c: &Cluster, id: &str, rule: &str, key: &str) -> u64 {
    c.remaining(id, &item(rule, key)).await
}

#[tokio::test(start_paused = true)]
async fn a_shared_ip_limit_and_user_limits_across_owners_admit_exactly_and_lose_nothing() {
    let (c, rules) = cluster(LIMITS).await;
    // The IP's bucket on n0, the users' on n1 and n2.
    let ip = key_of(&rules, "per-ip", "ip", "n0");
    let users: Vec<String> = ["n1", "n2", "n1", "n2"]
        .iter()
        .enumerate()
        .map(|(i, owner)| key_of(&rules, "per-user", &format!("user{i}"), owner))
        .collect();
    let mut per_user = [0u64; 4];
    let mut total = 0;
    for r in 0..30 {
        let u = r % 4;
        let (admitted, answers) =
            check_all(&c, IDS[r % 3], &[("per-user", &users[u]), ("per-ip", &ip)]).await;
        assert!(answers.iter().all(|a| a["degraded"] == false));
        if admitted {
            per_user[u] += 1;
            total += 1;
        }
    }
    assert_eq!(total, 10, "exactly the IP limit");
    assert_eq!(
        per_user,
        [3, 3, 2, 2],
        "no user over its 3, in arrival order"
    );
    // Users 2 and 3 were denied by the IP after their own limit admitted: given back.
    for (u, user) in users.iter().enumerate() {
        assert_eq!(
            remaining(&c, IDS[u % 3], "per-user", user).await,
            3 - per_user[u],
            "user {u}'s bucket shows exactly its admitted requests"
        );
    }
    assert_eq!(remaining(&c, "n1", "per-ip", &ip).await, 0);
    let mut refunded = 0;
    for id in IDS {
        refunded += c.metric(id, "ringlimit_refunded_requests_total").await;
    }
    assert_eq!(refunded, 20, "every denied request gave back");
}

#[tokio::test(start_paused = true)]
async fn a_denied_request_leaves_every_algorithm_as_if_it_never_came() {
    let (c, rules) = cluster(LIMITS).await;
    let algorithms = ["tb", "lb", "fw", "sw", "sl"];
    let keys: Vec<String> = algorithms
        .iter()
        .zip(["n0", "n1", "n2", "n0", "n1"])
        .map(|(rule, owner)| key_of(&rules, rule, "k", owner))
        .collect();
    let blocker = key_of(&rules, "per-user", "blocked", "n2");
    for _ in 0..3 {
        assert!(check_all(&c, "n0", &[("per-user", &blocker)]).await.0);
    }
    let mut request: Vec<(&str, &str)> = algorithms
        .iter()
        .zip(&keys)
        .map(|(r, k)| (*r, k.as_str()))
        .collect();
    request.push(("per-user", &blocker));
    for through in 0..3 {
        let (admitted, answers) = check_all(&c, IDS[through], &request).await;
        assert!(!admitted);
        assert_eq!(answers[5]["allowed"], false, "denied by the exhausted user");
        for a in &answers[..5] {
            assert!(a["allowed"] == true && a["remaining"] == 2, "{a}");
        }
        for (rule, key) in algorithms.iter().zip(&keys) {
            assert_eq!(
                remaining(&c, IDS[(through + 1) % 3], rule, key).await,
                2,
                "{rule}: nothing taken"
            );
        }
    }
    // Without the blocker, the same limits admit twice, then deny.
    request.pop();
    for expected in [true, true, false] {
        assert_eq!(check_all(&c, "n2", &request).await.0, expected);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_all_or_nothing_requests_never_admit_more_than_a_limit() {
    let (c, rules) = cluster(LIMITS).await;
    let ip = key_of(&rules, "per-ip", "ip", "n1");
    let users: Vec<String> = (0..8)
        .map(|i| key_of(&rules, "per-user", &format!("u{i}"), IDS[i % 3]))
        .collect();
    let requests = (0..48).map(|r| {
        let (c, user, ip) = (&c, &users[r % 8], &ip);
        async move {
            let (admitted, _) =
                check_all(c, IDS[r % 3], &[("per-user", user), ("per-ip", ip)]).await;
            (r % 8, admitted)
        }
    });
    let results = futures::future::join_all(requests).await;
    let total = results.iter().filter(|(_, ok)| *ok).count();
    assert!(total <= 10, "never over the IP limit: {total}");
    for u in 0..8 {
        let n = results.iter().filter(|(v, ok)| *v == u && *ok).count();
        assert!(n <= 3, "user {u}: {n}");
    }
    // Whatever was admitted is exactly what the buckets show.
    assert_eq!(remaining(&c, "n0", "per-ip", &ip).await, 10 - total as u64);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_limit_is_decided_and_reported_but_never_blocks() {
    let (c, rules) = cluster(LIMITS).await;
    let user = key_of(&rules, "per-user", "s", "n1");
    let trial = key_of(&rules, "trial", "s", "n2");
    for (r, id) in IDS.iter().enumerate() {
        let (admitted, answers) =
            check_all(&c, id, &[("per-user", &user), ("trial", &trial)]).await;
        // A shadow denial does not deny the request: the user's limit took its cost every
        // time; the trial's answer is allowed and says what it would have decided.
        assert!(admitted);
        assert_eq!(answers[0]["allowed"], true);
        assert_eq!(answers[1]["allowed"], true);
        assert_eq!(
            answers[1]["shadow_denied"],
            r != 0,
            "the trial limit admits one"
        );
    }
    assert_eq!(remaining(&c, "n0", "per-user", &user).await, 0);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_owner_answers_from_the_share_and_a_denial_gives_the_share_back() {
    let (c, rules) = cluster_without_replicas(LIMITS).await;
    let user = key_of(&rules, "per-user", "cut", "n2");
    let blocker = key_of(&rules, "per-ip", "blocker", "n1");
    for _ in 0..10 {
        assert!(check_all(&c, "n0", &[("per-ip", &blocker)]).await.0);
    }
    c.cut_link("n0", "n2");
    // n0's share of per-user (3 over 3 members: 1) is taken, then given back on the denial.
    for _ in 0..3 {
        let (_, answers) = check_all(&c, "n0", &[("per-user", &user), ("per-ip", &blocker)]).await;
        assert!(
            answers[0]["degraded"] == true && answers[0]["allowed"] == true,
            "from n0's share: {}",
            answers[0]
        );
        assert_eq!(answers[1]["allowed"], false);
    }
    let (_, alone) = check_all(&c, "n0", &[("per-user", &user)]).await;
    assert!(
        alone[0]["degraded"] == true && alone[0]["allowed"] == true,
        "the share was given back each time"
    );
    assert!(
        !check_all(&c, "n0", &[("per-user", &user)]).await.0,
        "then the share of 1 is spent"
    );
    // n2 itself never saw any of it.
    assert_eq!(remaining(&c, "n2", "per-user", &user).await, 3);
}

#[tokio::test(start_paused = true)]
async fn a_global_limit_counts_only_when_the_request_is_admitted() {
    let (c, rules) = cluster(GLOBAL_AND_CLOSED).await;
    let user = key_of(&rules, "per-user", "g", "n1");
    // Three admitted: the global cap counts each (on n0, where they land).
    for _ in 0..3 {
        assert!(
            check_all(&c, "n0", &[("per-user", &user), ("cap", "all")])
                .await
                .0
        );
    }
    // The user's limit denies: the cap is asked, never counted.
    for _ in 0..5 {
        let (_, answers) = check_all(&c, "n0", &[("per-user", &user), ("cap", "all")]).await;
        assert!(answers[0]["allowed"] == false && answers[1]["allowed"] == true);
    }
    assert_eq!(
        remaining(&c, "n0", "cap", "all").await,
        1,
        "4 - the 3 admitted requests"
    );
}

#[tokio::test(start_paused = true)]
async fn a_closed_rule_whose_owner_is_unreachable_denies_the_request_and_takes_nothing() {
    let (c, rules) = cluster_without_replicas(GLOBAL_AND_CLOSED).await;
    let user = key_of(&rules, "per-user", "c", "n1");
    let strict = key_of(&rules, "strict", "c", "n2");
    c.cut_link("n0", "n2");
    let (admitted, answers) =
        check_all(&c, "n0", &[("per-user", &user), ("strict", &strict)]).await;
    assert!(!admitted);
    assert!(
        answers[0]["allowed"] == true
            && answers[1]["allowed"] == false
            && answers[1]["degraded"] == true,
        "{answers:?}"
    );
    assert_eq!(
        remaining(&c, "n1", "per-user", &user).await,
        3,
        "the user's cost was given back"
    );
}
