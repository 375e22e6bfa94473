//! Replicas on whole nodes in memory: an owner killed (SIGKILL) after its keys' limits are
//! used up; once the survivors drop it from their rings, the new owner of its keys (its ring
//! successor, which kept their copies) decides them from the copies, not from full buckets:
//! they stay denied. A restarted owner gets its buckets back by handover; a graceful leave
//! counts each admission once (handover and copy overlap); `--replicas 0` is the
//! behaviour before replicas (the new owner starts afresh). Failover: a stalled owner's keys are
//! decided by their replica and handed back; a 2 | 1 partition leaves the cut-off owner's used-up
//! keys denied on the majority side; an all-or-nothing hold at a replica is given back there.

use super::Cluster;
use crate::rules::InForce;
use crate::rules::{RuleSet, RuleSpec};
use ringlimit_proto::{Algorithm, InlineRule, Ring};
use serde_json::{Value, json};
use std::time::Duration;

const LIMIT: u64 = 5;
const PERIOD_MS: u64 = 3_600_000;
const IDS: [&str; 3] = ["n0", "n1", "n2"];
const KEYS: usize = 10;

fn check(key: &str, algorithm: Algorithm) -> Value {
    json!({ "key": key, "limit": LIMIT, "period_ms": PERIOD_MS, "algorithm": algorithm.to_string() })
}

/// Waits until node `id` has dropped `member` from its ring (`ring` members left).
async fn wait_out_of_ring(c: &Cluster, id: &str, member: &str, ring: u64) {
    c.wait(&format!("{id} drops {member} from its ring"), || async {
        let view = c.view(id).await;
        c.state_of(id, member).await.as_deref() != Some("alive") && view["ring_members"] == ring
    })
    .await;
}

/// Uses up the limits of `KEYS` keys owned by n2 through n0 (forwarded to n2), kills n2, waits
/// until n0 and n1 drop it; returns the keys, how many checks of them the survivors admitted
/// afterwards (each key checked `LIMIT` times through each survivor), and the copies n2 had
/// sent before it died.
async fn kill_owner_of_used_up_keys(
    c: &mut Cluster,
    algorithm: Algorithm,
) -> (Vec<String>, u64, u64) {
    c.wait_all_alive(&IDS).await;
    let keys = owned_by_n2(algorithm);
    for k in &keys {
        for _ in 0..LIMIT {
            let s = c.seen("n0", &check(k, algorithm)).await;
            assert!(s.allowed && !s.degraded, "{k}");
        }
        assert!(!c.seen("n0", &check(k, algorithm)).await.allowed, "{k}");
    }
    // The copies reach the replicas within a few drains (virtual time).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let replicated = c.metric("n2", "ringlimit_replicated_buckets_total").await;
    if replicated > 0 {
        assert!(c.metric("n2", "ringlimit_replication_frames_total").await > 0);
    }
    c.kill("n2").await;
    for id in ["n0", "n1"] {
        wait_out_of_ring(c, id, "n2", 2).await;
    }
    let mut admitted = 0;
    for k in &keys {
        for id in ["n0", "n1"] {
            for _ in 0..LIMIT {
                let s = c.seen(id, &check(k, algorithm)).await;
                assert!(!s.degraded, "{k} answered degraded after the ring change");
                admitted += u64::from(s.allowed);
            }
        }
    }
    (keys, admitted, replicated)
}

/// `KEYS` keys whose bucket (limit `LIMIT` per `PERIOD_MS` under `algorithm`) n2 owns on the
/// ring of all three.
fn owned_by_n2(algorithm: Algorithm) -> Vec<String> {
    let in_force = InForce::new(RuleSet::builtin());
    let ring = Ring::new(IDS);
    let rule = InlineRule {
        limit: LIMIT,
        period_ms: PERIOD_MS,
        algorithm,
        burst: None,
        calendar: None,
    };
    (0..)
        .map(|i| format!("{algorithm}:{i}"))
        .filter(|k| {
            let (_, id) = in_force
                .prepare(k, RuleSpec::Inline(rule), 1)
                .expect("a valid check");
            ring.owner(id) == Some("n2")
        })
        .take(KEYS)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_killed_owners_used_up_keys_stay_denied_at_the_new_owner() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        let mut c = Cluster::start(3, |_| {}).await;
        let (keys, admitted, replicated) = kill_owner_of_used_up_keys(&mut c, algorithm).await;
        assert!(
            replicated >= keys.len() as u64,
            "{algorithm}: {replicated} sent"
        );
        assert_eq!(admitted, 0, "{algorithm}: the new owner admitted again");
        let promoted: u64 = [
            c.metric("n0", "ringlimit_promoted_buckets_total").await,
            c.metric("n1", "ringlimit_promoted_buckets_total").await,
        ]
        .iter()
        .sum();
        assert!(
            promoted >= keys.len() as u64,
            "{algorithm}: {promoted} promoted"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_restarted_owner_gets_its_buckets_back_by_handover() {
    let mut c = Cluster::start(3, |_| {}).await;
    let (keys, admitted, _) = kill_owner_of_used_up_keys(&mut c, Algorithm::TokenBucket).await;
    assert_eq!(admitted, 0);
    c.restart("n2").await;
    c.wait_all_alive(&IDS).await;
    for k in &keys {
        for id in IDS {
            let s = c.seen(id, &check(k, Algorithm::TokenBucket)).await;
            assert!(!s.allowed && !s.degraded, "{k} through {id}");
        }
    }
    assert!(c.buckets("n2").await >= keys.len() as u64);
}

/// An owner killed and started again before the survivors declare it dead: its new life
/// gossips `joining`, which takes it out of their rings at once (its successor promotes the
/// copies), and back in once it is ready (the successor hands the buckets over). Its used-up
/// keys stay denied through every node, the restarted owner itself included.
#[tokio::test(start_paused = true)]
async fn a_quickly_restarted_owner_is_out_of_the_rings_until_ready() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = owned_by_n2(Algorithm::TokenBucket);
    for k in &keys {
        for _ in 0..LIMIT {
            assert!(
                c.seen("n0", &check(k, Algorithm::TokenBucket))
                    .await
                    .allowed
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.kill("n2").await;
    c.restart("n2").await;
    c.wait_all_alive(&IDS).await;
    let promoted = c.metric("n0", "ringlimit_promoted_buckets_total").await
        + c.metric("n1", "ringlimit_promoted_buckets_total").await;
    assert!(promoted >= keys.len() as u64, "{promoted} promoted");
    for k in &keys {
        for id in ["n2", "n0", "n1"] {
            let s = c.seen(id, &check(k, Algorithm::TokenBucket)).await;
            assert!(!s.allowed && !s.degraded, "{k} through {id}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn without_replicas_the_new_owner_starts_afresh() {
    let mut c = Cluster::start(3, |config| config.replicas = 0).await;
    let (keys, admitted, replicated) =
        kill_owner_of_used_up_keys(&mut c, Algorithm::TokenBucket).await;
    assert_eq!(replicated, 0);
    // Today's behaviour, which replicas fix: the limit again, on every key.
    assert_eq!(admitted, LIMIT * keys.len() as u64);
    assert_eq!(c.metric("n1", "ringlimit_replica_buckets").await, 0);
    assert_eq!(
        c.metric("n0", "ringlimit_replicated_buckets_total").await,
        0
    );
}

/// A graceful leave both hands the owner's buckets over and lets the successor promote its
/// copies: one history read twice, which must not be counted twice (a false denial).
#[tokio::test(start_paused = true)]
async fn a_graceful_leave_counts_each_admission_once() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = owned_by_n2(Algorithm::TokenBucket);
    for k in &keys {
        for _ in 0..2 {
            assert!(
                c.seen("n0", &check(k, Algorithm::TokenBucket))
                    .await
                    .allowed
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.stop("n2").await;
    for id in ["n0", "n1"] {
        wait_out_of_ring(&c, id, "n2", 2).await;
    }
    for k in &keys {
        let mut admitted = 0;
        for turn in 0..LIMIT {
            let id = ["n0", "n1"][turn as usize % 2];
            let s = c.seen(id, &check(k, Algorithm::TokenBucket)).await;
            assert!(!s.degraded, "{k}");
            admitted += u64::from(s.allowed);
        }
        assert_eq!(
            admitted,
            LIMIT - 2,
            "{k}: what is left of the limit, exactly"
        );
    }
}

/// Failover: while an owner does not answer (its peer port stalled, as under SIGSTOP; gossip
/// still keeps it in every ring), its keys are decided by their replica on its copies, not
/// from fallback shares; once it answers again it gets those decisions back, so across the
/// whole run each key admits its limit exactly once.
#[tokio::test(start_paused = true)]
async fn a_stalled_owners_keys_are_decided_by_its_replica_and_handed_back() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = owned_by_n2(Algorithm::TokenBucket);
    let mut admitted = 0;
    for k in &keys {
        for _ in 0..2 {
            let s = c.seen("n0", &check(k, Algorithm::TokenBucket)).await;
            assert!(s.allowed && !s.degraded, "{k}");
            admitted += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.stall_peer("n2");
    let mut by_replica = 0;
    for k in &keys {
        for i in 0..LIMIT {
            let id = IDS[(i % 2) as usize];
            let body = c.check(id, &check(k, Algorithm::TokenBucket)).await.json();
            assert_eq!(body["degraded"], false, "{k} through {id}: {body}");
            if body["replica"] == true {
                by_replica += 1;
            }
            admitted += u64::from(body["allowed"] == true);
        }
    }
    assert_eq!(
        by_replica,
        LIMIT * keys.len() as u64,
        "every check decided by a replica"
    );
    assert_eq!(admitted, LIMIT * keys.len() as u64, "the limit, once");
    let rescued = c.metric("n0", "ringlimit_replica_checks_total").await
        + c.metric("n1", "ringlimit_replica_checks_total").await;
    assert_eq!(rescued, by_replica);
    // The owner answers again: the replicas' decisions reach it (within a hand-back period)
    // before the callers' circuits to it close (a second).
    c.resume_peer("n2");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for k in &keys {
        for id in IDS {
            let body = c.check(id, &check(k, Algorithm::TokenBucket)).await.json();
            assert_eq!(body["allowed"], false, "{k} through {id}: {body}");
            assert!(body.get("replica").is_none(), "the owner decides: {body}");
        }
    }
}

/// A 2 | 1 partition: the majority decides the cut-off owner's used-up keys through their
/// replicas (before its rings drop the owner) and then their promoted copies: never from
/// shares or full buckets; after the heal they stay denied everywhere.
#[tokio::test(start_paused = true)]
async fn a_partitioned_owners_keys_stay_denied_on_the_majority_side() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = owned_by_n2(Algorithm::FixedWindow);
    for k in &keys {
        for _ in 0..LIMIT {
            assert!(
                c.seen("n0", &check(k, Algorithm::FixedWindow))
                    .await
                    .allowed
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.cut("n2", "n0").await;
    c.cut("n2", "n1").await;
    // Right after the cut (n2 still in every ring), then once the majority dropped it.
    let mut seen = Vec::new();
    for round in 0..2 {
        if round == 1 {
            for id in ["n0", "n1"] {
                wait_out_of_ring(&c, id, "n2", 2).await;
            }
        }
        for k in &keys {
            for id in ["n0", "n1"] {
                let body = c.check(id, &check(k, Algorithm::FixedWindow)).await.json();
                assert_eq!(
                    body["allowed"], false,
                    "{k} through {id} (round {round}): {body}"
                );
                assert_eq!(body["degraded"], false, "{k} through {id}: {body}");
                seen.push(body["replica"] == true);
            }
        }
    }
    assert!(
        seen.iter().any(|r| *r),
        "some answered by a replica before the ring changed"
    );
    c.heal("n2", "n0").await;
    c.heal("n2", "n1").await;
    c.wait_all_alive(&IDS).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for k in &keys {
        for id in IDS {
            let s = c.seen(id, &check(k, Algorithm::FixedWindow)).await;
            assert!(!s.allowed, "{k} through {id} after the heal");
        }
    }
}

/// All-or-nothing through a failover: a request's check whose owner does not answer is held
/// at the owner's replica, and given back there when another check of the request denies;
/// the owner, answering again, holds no more of it than before, but for the stalled group
/// itself: its frame waited at the owner, which decided it when it resumed, after the sender
/// had gone on without it (a cost nobody gives back: a false deny, never an admission).
#[tokio::test(start_paused = true)]
async fn an_all_or_nothing_hold_at_a_replica_is_given_back_there() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let a = &super::keys_owned_by(&IDS, "n2", "held", 1, (LIMIT, PERIOD_MS))[0];
    let b = &super::keys_owned_by(&IDS, "n0", "tight", 1, (1, PERIOD_MS))[0];
    let tight = json!({ "key": b, "limit": 1, "period_ms": PERIOD_MS });
    assert!(c.seen("n1", &tight).await.allowed);
    // a's bucket exists at n2 (one spent), and its copy at the replica.
    assert!(
        c.seen("n1", &check(a, Algorithm::TokenBucket))
            .await
            .allowed
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.stall_peer("n2");
    let reply = c
        .check_all("n1", &[check(a, Algorithm::TokenBucket), tight.clone()])
        .await;
    let body = reply.json();
    assert_eq!(reply.status, 429, "{body}");
    assert_eq!(body["results"][0]["replica"], true, "{body}");
    assert_eq!(
        body["results"][0]["remaining"],
        LIMIT - 1,
        "reads as if the request never came: {body}"
    );
    let peek = json!({ "key": a, "limit": LIMIT, "period_ms": PERIOD_MS, "cost": 0 });
    let at_replica = c.check("n0", &peek).await.json();
    assert_eq!(
        at_replica["remaining"],
        LIMIT - 1,
        "given back on the copy: {at_replica}"
    );
    c.resume_peer("n2");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let at_owner = c.check("n0", &peek).await.json();
    assert!(at_owner.get("replica").is_none(), "{at_owner}");
    let left = at_owner["remaining"].as_u64().expect("remaining");
    assert!((LIMIT - 2..=LIMIT - 1).contains(&left), "{at_owner}");
}

/// A key owing 99 on a 100-per-10-s window, its owner stalled across the window boundary: the
/// replica standing in (not degraded) admits 1 in the next window, as the owner would, not 100. The
/// debt is part of the bucket, so it is in the copy.
#[tokio::test(start_paused = true)]
async fn a_replica_standing_in_denies_what_the_owner_owes() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = InlineRule {
        limit: 100,
        period_ms: 10_000,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        calendar: None,
    };
    let key = (0..)
        .map(|i| format!("owing:{i}"))
        .find(|k| super::owner_under(&IDS, k, rule) == "n2")
        .expect("a key of n2");
    let body = |cost: u64| {
        json!({ "key": key, "limit": rule.limit, "period_ms": rule.period_ms, "cost": cost,
            "algorithm": "fixed_window" })
    };
    c.next_window(rule.period_ms, 10).await;
    let reply = c
        .http("n0", "POST", "/v1/reserve", &body(1).to_string())
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let id = reply.json()["reservation"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert!(c.seen("n0", &body(rule.limit - 1)).await.allowed);
    let settle = json!({ "reservation": id, "cost": 100 }).to_string();
    let settled = c.http("n1", "POST", "/v1/settle", &settle).await;
    assert_eq!(settled.status, 200, "{}", settled.body);
    assert_eq!(settled.json()["allowed"], false, "{}", settled.body);
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.stall_peer("n2");
    c.next_window(rule.period_ms, 10).await;
    let mut admitted = 0;
    for i in 0..20 {
        let id = IDS[i % 2];
        let answer = c.check(id, &body(1)).await.json();
        assert_eq!(answer["degraded"], false, "{answer}");
        assert_eq!(answer["replica"], true, "decided by the replica: {answer}");
        admitted += u64::from(answer["allowed"] == true);
    }
    assert_eq!(admitted, 1, "the limit less what was owed");
    c.resume_peer("n2");
}
