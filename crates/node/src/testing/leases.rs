//! Leases between nodes on whole nodes in memory, under tokio's paused clock: a hot key leased and
//! decided where it arrives; a limit that denies held exactly across holders and the owner, with
//! few false denies; a holder that dies loses only its unspent slice; an owner that dies hands its
//! buckets (and with them what its slices took) to the member that promotes its copies; a reset
//! revokes; a ring change releases; `lease: off` keeps a rule at its owner.

use super::{ADMIN_TOKEN, Cluster, owner_under};
use ringlimit_proto::{Algorithm, InlineRule};
use serde_json::{Value, json};
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];
/// A window: 1,000 per 10 s.
const LIMIT: u64 = 1_000;
const PERIOD_MS: u64 = 10_000;

fn fixed() -> InlineRule {
    fixed_of(LIMIT)
}

fn fixed_of(limit: u64) -> InlineRule {
    InlineRule {
        limit,
        period_ms: PERIOD_MS,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        calendar: None,
    }
}

/// A key that `owner` owns on the full ring under `rule`.
fn key_of(owner: &str, rule: InlineRule) -> String {
    (0..)
        .map(|i| format!("hot:{i}"))
        .find(|k| owner_under(&IDS, k, rule) == owner)
        .expect("a key")
}

fn check(key: &str, rule: InlineRule) -> Value {
    json!({
        "key": key,
        "limit": rule.limit,
        "period_ms": rule.period_ms,
        "algorithm": rule.algorithm.as_str(),
    })
}

/// What a round of checks through some nodes came to.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    allowed: u64,
    denied: u64,
    leased: u64,
}

impl Tally {
    fn add(&mut self, answers: &[Value]) {
        for a in answers {
            if a["allowed"] == true {
                self.allowed += 1;
            } else {
                self.denied += 1;
            }
            if a["leased"] == true {
                self.leased += 1;
            }
        }
    }
}

/// `per_node` checks of `body` through each of `nodes` every 50 ms, `rounds` times.
async fn load(c: &Cluster, nodes: &[&str], body: &Value, per_node: usize, rounds: usize) -> Tally {
    let checks = vec![body.clone(); per_node];
    let mut tally = Tally::default();
    for _ in 0..rounds {
        for id in nodes {
            tally.add(&c.batch(id, &checks).await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tally
}

/// A series of node `id`'s metrics, labels and all (`ringlimit_leases{side="held"}`).
async fn series(c: &Cluster, id: &str, name: &str) -> u64 {
    let text = c.metrics(id).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {id}'s metrics"))
}

/// A key checked thousands of times a second through a node that does not own it is leased
/// within a second: its checks are decided there (`"leased": true`), and the owner sees a
/// forward only for the asks.
#[tokio::test(start_paused = true)]
async fn a_hot_key_is_leased_and_decided_where_it_arrives() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = InlineRule {
        limit: 1_000_000,
        period_ms: 1_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    let key = key_of("n1", rule);
    let body = check(&key, rule);
    // 4,000 a second: promoted at the first tick past 1,000, then leased.
    let warm = load(&c, &["n0"], &body, 200, 20).await;
    assert_eq!(warm.allowed, 4_000);
    assert!(warm.leased > 0, "leased within a second: {warm:?}");
    let forwarded = c.forwarding("n0", "forwarded").await;
    let hot = load(&c, &["n0"], &body, 200, 20).await;
    assert_eq!(hot.allowed, 4_000);
    assert!(
        hot.leased >= 3_900,
        "decided on the lease once leased: {hot:?}"
    );
    assert!(
        c.forwarding("n0", "forwarded").await - forwarded <= 100,
        "a few checks while a renewal is on its way"
    );
    assert_eq!(series(&c, "n0", "ringlimit_leases{side=\"held\"}").await, 1);
    assert!(series(&c, "n1", "ringlimit_leases{side=\"granted\"}").await >= 1);
    assert!(series(&c, "n0", "ringlimit_lease_asks_total{result=\"granted\"}").await >= 2);
    assert!(
        series(
            &c,
            "n0",
            "ringlimit_leased_checks_total{result=\"allowed\"}"
        )
        .await
            >= 3_900
    );
    // Quiet: demoted, released, what was left given back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(series(&c, "n0", "ringlimit_leases{side=\"held\"}").await, 0);
    assert!(series(&c, "n0", "ringlimit_lease_tokens_total{what=\"returned\"}").await > 0);
}

/// A limit that denies, checked far beyond it through every node (two holders and the owner):
/// the window admits exactly its limit — never more — and the slices left unspent when it ends
/// (false denies) are under 2% of it.
#[tokio::test(start_paused = true)]
async fn leases_admit_a_windows_limit_exactly_through_every_node() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let key = key_of("n1", fixed());
    let body = check(&key, fixed());
    c.next_window(PERIOD_MS, 10).await;
    // 2,000 a second through n0 and n2 each, 400 through the owner, for 8 s of the window.
    let t = load(&c, &IDS, &body, 100, 160).await;
    eprintln!("window through every node: {t:?}");
    assert!(t.allowed <= LIMIT, "over the limit: {t:?}");
    assert!(
        t.allowed >= LIMIT - LIMIT / 50,
        "false denies beyond 2% of the limit: {t:?}"
    );
    assert!(t.leased > LIMIT / 2, "most admitted on leases: {t:?}");
    let denied_here = series(&c, "n0", "ringlimit_leased_checks_total{result=\"denied\"}").await
        + series(&c, "n2", "ringlimit_leased_checks_total{result=\"denied\"}").await;
    assert!(denied_here > 0, "denials decided where they arrived");
}

/// A key of a 10,000 window that `n1` owns, leased by `n0` and `n2` (2,000 checks/s each for a
/// second), then `victim` killed and the window checked far beyond its limit through
/// `survivors`: what the window admitted in all.
async fn leased_then_killed(victim: &str, survivors: &[&str]) -> (u64, Tally, Tally) {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = fixed_of(10 * LIMIT);
    let key = key_of("n1", rule);
    let body = check(&key, rule);
    c.next_window(PERIOD_MS, 10).await;
    let before = load(&c, &["n0", "n2"], &body, 100, 20).await;
    assert!(before.leased > 0, "leased: {before:?}");
    c.kill(victim).await;
    let after = load(&c, survivors, &body, 100, 100).await;
    (before.allowed + after.allowed, before, after)
}

/// A holder that dies takes only its unspent slice with it: the survivors never admit more
/// than the window's limit.
#[tokio::test(start_paused = true)]
async fn a_holder_that_dies_loses_only_its_slice() {
    let (admitted, before, after) = leased_then_killed("n0", &["n1", "n2"]).await;
    assert!(
        admitted <= 10 * LIMIT,
        "over the limit: {before:?} then {after:?}"
    );
}

/// An owner that dies: the member that promotes its copy of the bucket starts from what the
/// owner had taken, slices included, and what the holders give back reaches it. The window
/// never admits more than its limit.
#[tokio::test(start_paused = true)]
async fn an_owner_that_dies_hands_its_leased_buckets_on() {
    let (admitted, before, after) = leased_then_killed("n1", &["n0", "n2"]).await;
    assert!(
        admitted <= 10 * LIMIT,
        "over the limit: {before:?} then {after:?}"
    );
    assert!(
        admitted >= 9 * LIMIT,
        "the survivors go on to the limit: {before:?} then {after:?}"
    );
}

/// An operator's reset of a leased key revokes its leases on every member.
#[tokio::test(start_paused = true)]
async fn a_reset_revokes_the_keys_leases() {
    let c = Cluster::start(3, |c| c.admin_token = Some(ADMIN_TOKEN.into())).await;
    c.wait_all_alive(&IDS).await;
    let key = key_of("n1", fixed());
    let body = check(&key, fixed());
    let t = load(&c, &["n0"], &body, 100, 20).await;
    assert!(t.leased > 0, "leased: {t:?}");
    let path = format!(
        "/v1/admin/keys/{key}/reset?limit={LIMIT}&period_ms={PERIOD_MS}&algorithm=fixed_window"
    );
    let r = c.admin("n2", "POST", &path).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        series(
            &c,
            "n0",
            "ringlimit_lease_revocations_total{reason=\"reset\"}"
        )
        .await,
        1
    );
    assert_eq!(series(&c, "n0", "ringlimit_leases{side=\"held\"}").await, 0);
}

/// A rule with `lease: off` keeps every check at its owner, however hot.
#[tokio::test(start_paused = true)]
async fn a_rule_with_lease_off_is_never_leased() {
    let c = Cluster::start(3, |cfg| {
        cfg.rules = crate::rules::RuleSet::from_yaml(
            "rules:\n  - name: kept\n    limit: 1000000\n    period: 1s\n    lease: off\n",
        )
        .expect("rules");
    })
    .await;
    c.wait_all_alive(&IDS).await;
    // Whichever member owns it, two of the three forward it.
    let body = json!({ "key": "hot:0", "rule": "kept" });
    let t = load(&c, &IDS, &body, 200, 20).await;
    assert_eq!(t.allowed, 12_000);
    assert_eq!(t.leased, 0, "{t:?}");
    for id in IDS {
        let granted = series(&c, id, "ringlimit_lease_asks_total{result=\"granted\"}").await;
        assert_eq!(granted, 0, "{id}");
    }
}

/// A member that joins changes the ring: every lease is released (what the slices had left
/// goes back), and a key still hot is leased again from its owner under the new ring.
#[tokio::test(start_paused = true)]
async fn a_ring_change_releases_leases_and_hot_keys_lease_again() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = InlineRule {
        limit: 1_000_000,
        period_ms: 1_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    let key = key_of("n1", rule);
    let body = check(&key, rule);
    let t = load(&c, &["n0"], &body, 200, 20).await;
    assert!(t.leased > 0, "leased: {t:?}");
    let joined = c.join().await;
    c.wait(&format!("n0 sees {joined}"), || async {
        c.alive("n0").await.len() == 4
    })
    .await;
    let again = load(&c, &["n0"], &body, 200, 20).await;
    assert_eq!(again.allowed, 4_000);
    assert!(
        series(
            &c,
            "n0",
            "ringlimit_lease_revocations_total{reason=\"ring\"}"
        )
        .await
            >= 1,
        "released on the ring change"
    );
    assert!(again.leased > 0, "leased again: {again:?}");
}
