//! Reservations on whole nodes in memory, under tokio's paused clock: a reservation taken through a
//! node that does not own the key and settled through a third, giving back and taking into debt
//! (which denies, then time repays it); settled once; expiry keeps the estimate; garbage ids and
//! bad bodies are 4xx and change nothing; an owner killed loses its reservations (settles are
//! unknown, the estimates stay taken).

use super::{Cluster, Reply, owner_under};
use ringlimit_proto::{Algorithm, InlineRule};
use serde_json::{Value, json};
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];

/// Tokens per minute, in one fixed window (the simplest to read exactly).
fn per_minute(limit: u64, algorithm: Algorithm) -> InlineRule {
    InlineRule {
        limit,
        period_ms: 60_000,
        algorithm,
        burst: None,
        calendar: None,
    }
}

/// A key that `owner` owns on the full ring under `rule`.
fn key_of(owner: &str, rule: InlineRule) -> String {
    (0..)
        .map(|i| format!("team:{i}"))
        .find(|k| owner_under(&IDS, k, rule) == owner)
        .expect("a key")
}

fn check(key: &str, rule: InlineRule, cost: u64) -> Value {
    json!({
        "key": key,
        "limit": rule.limit,
        "period_ms": rule.period_ms,
        "algorithm": rule.algorithm.as_str(),
        "cost": cost,
    })
}

async fn reserve(c: &Cluster, id: &str, body: &Value) -> Reply {
    c.http(id, "POST", "/v1/reserve", &body.to_string()).await
}

async fn settle(c: &Cluster, id: &str, reservation: &str, cost: u64) -> Reply {
    let body = json!({ "reservation": reservation, "cost": cost });
    c.http(id, "POST", "/v1/settle", &body.to_string()).await
}

/// Reserves `cost` through node `id`, which must admit it; returns the reservation's id.
async fn reserved(c: &Cluster, id: &str, key: &str, rule: InlineRule, cost: u64) -> String {
    let r = reserve(c, id, &check(key, rule, cost)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["allowed"], true, "{v}");
    assert_eq!(v["cost"], cost, "{v}");
    v["reservation"].as_str().expect("an id").to_owned()
}

/// A reservation through n0 of a key n1 owns, settled through n2: below the estimate the
/// difference comes back; above it, what the window admits is taken and the rest is debt,
/// which denies every check until the next window, which admits its limit less the debt; a
/// second settle is unknown.
#[tokio::test(start_paused = true)]
async fn reserved_through_one_node_settled_through_another_gives_back_and_takes_into_debt() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = per_minute(1_000, Algorithm::FixedWindow);
    let key = key_of("n1", rule);
    let peek = check(&key, rule, 0);
    c.next_window(60_000, 10).await;

    let id = reserved(&c, "n0", &key, rule, 300).await;
    assert_eq!(c.remaining("n2", &peek).await, 700);
    let r = settle(&c, "n2", &id, 100).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["remaining"], 900, "200 given back");
    let again = settle(&c, "n0", &id, 100).await;
    assert_eq!(again.status, 404, "{}", again.body);
    assert_eq!(again.json()["error"], "unknown_reservation");

    // 500 reserved, 1,000 used: the 400 left are taken now, 100 are owed.
    let id = reserved(&c, "n2", &key, rule, 500).await;
    let r = settle(&c, "n0", &id, 1_000).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["allowed"].clone(), v["remaining"].clone()),
        (json!(false), json!(0)),
        "{v}"
    );
    assert!(v["retry_after_ms"].as_u64().expect("a wait") > 0, "{v}");
    assert_eq!(
        c.metric("n1", "ringlimit_reservation_debt_owed_tokens_total")
            .await,
        100
    );
    let denied = c.check("n0", &check(&key, rule, 1)).await;
    assert_eq!(denied.status, 429, "{}", denied.body);
    let denied = reserve(&c, "n2", &check(&key, rule, 1)).await;
    assert_eq!(denied.status, 429, "a reserve is a check: {}", denied.body);
    assert!(denied.json().get("reservation").is_none());

    // The next window repays the 100 before anything else.
    c.next_window(60_000, 10).await;
    assert_eq!(c.remaining("n0", &peek).await, 900);
    let text = c.metrics("n1").await;
    for series in [
        "ringlimit_reservation_results_total{result=\"reserved\"} 2",
        "ringlimit_reservation_results_total{result=\"settled\"} 2",
        "ringlimit_reservation_results_total{result=\"denied\"} 1",
        "ringlimit_reservation_results_total{result=\"unknown\"} 1",
        "ringlimit_reservations 0",
    ] {
        assert!(text.lines().any(|l| l == series), "no {series} in:\n{text}");
    }
}

/// A token bucket's debt is repaid from its refill: denied until then, admitted after.
#[tokio::test(start_paused = true)]
async fn a_token_buckets_debt_is_repaid_from_its_refill() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    // 600 a minute: 10 a second.
    let rule = per_minute(600, Algorithm::TokenBucket);
    let key = key_of("n2", rule);
    // 100 reserved, 200 checked, the reservation settled at 500: 300 taken, 100 owed.
    let id = reserved(&c, "n0", &key, rule, 100).await;
    assert_eq!(c.check("n0", &check(&key, rule, 200)).await.status, 200);
    let r = settle(&c, "n1", &id, 500).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let owed = c
        .metric("n2", "ringlimit_reservation_debt_owed_tokens_total")
        .await;
    assert!((95..=100).contains(&owed), "about 100 owed: {owed}");
    let retry = r.json()["retry_after_ms"].as_u64().expect("a wait");
    assert!((9_000..=10_500).contains(&retry), "100 at 10/s: {retry} ms");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.check("n1", &check(&key, rule, 1)).await.status, 429);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r = c.check("n1", &check(&key, rule, 1)).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// No settle within the time to live: the estimate stays taken, the settle is unknown, and
/// the table empties.
#[tokio::test(start_paused = true)]
async fn an_expired_reservation_keeps_its_estimate() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = per_minute(1_000, Algorithm::SlidingWindow);
    let key = key_of("n1", rule);
    c.next_window(60_000, 10).await;
    let mut body = check(&key, rule, 300);
    body["ttl_ms"] = 1_000.into();
    let r = reserve(&c, "n0", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["reservation"].as_str().expect("an id").to_owned();
    assert_eq!(c.metric("n1", "ringlimit_reservations").await, 1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(c.metric("n1", "ringlimit_reservations").await, 0, "swept");
    let r = settle(&c, "n2", &id, 0).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(c.remaining("n0", &check(&key, rule, 0)).await, 700);
}

/// Bad input is a 4xx with the contract's body, never a 5xx, and changes no bucket.
#[tokio::test(start_paused = true)]
async fn garbage_ids_and_bad_bodies_are_refused_and_change_nothing() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = per_minute(1_000, Algorithm::FixedWindow);
    let key = key_of("n1", rule);
    c.next_window(60_000, 10).await;
    let forged = ringlimit_proto::reservation::ReservationId {
        key: key.clone(),
        rule: ringlimit_proto::RuleRef::Inline(rule),
        nonce: 42,
    }
    .encode();
    for (reservation, status) in [
        ("garbage!".to_owned(), 404),
        (String::new(), 404),
        ("AAAAAAAAAAAAAAAA".to_owned(), 404),
        ("x".repeat(10_000), 404),
        (forged, 404),
    ] {
        let r = settle(&c, "n0", &reservation, 5).await;
        assert_eq!(r.status, status, "{reservation:.40}: {}", r.body);
        assert_eq!(r.json()["error"], "unknown_reservation", "{}", r.body);
    }
    let mut ttl_zero = check(&key, rule, 1);
    ttl_zero["ttl_ms"] = 0.into();
    let mut ttl_long = check(&key, rule, 1);
    ttl_long["ttl_ms"] = 3_600_001u64.into();
    // Beyond the node's bound (--max-reservation-ttl-ms, 10 minutes unless raised).
    let mut ttl_over_bound = check(&key, rule, 1);
    ttl_over_bound["ttl_ms"] = 600_001u64.into();
    let mut unknown_field = check(&key, rule, 1);
    unknown_field["ttl"] = 5.into();
    for (path, body, code) in [
        ("/v1/reserve", ttl_zero.to_string(), "invalid_request"),
        ("/v1/reserve", ttl_long.to_string(), "invalid_request"),
        ("/v1/reserve", ttl_over_bound.to_string(), "invalid_request"),
        ("/v1/reserve", unknown_field.to_string(), "invalid_request"),
        (
            "/v1/reserve",
            check(&key, rule, 1_001).to_string(),
            "invalid_cost",
        ),
        ("/v1/reserve", "{".to_owned(), "invalid_json"),
        (
            "/v1/settle",
            json!({ "reservation": "x" }).to_string(),
            "invalid_request",
        ),
        (
            "/v1/settle",
            json!({ "reservation": "x", "cost": -1 }).to_string(),
            "invalid_request",
        ),
        ("/v1/settle", "[]".to_owned(), "invalid_request"),
    ] {
        let r = c.http("n2", "POST", path, &body).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"], code, "{path} {body}: {v}");
        if body.contains("ttl_ms") {
            let message = v["message"].as_str().expect("a message");
            assert!(
                message.contains("ttl_ms") && message.contains("600000"),
                "names the bound: {v}"
            );
        }
    }
    // A settle above the rule's capacity could never be admitted: refused like a check.
    let id = reserved(&c, "n0", &key, rule, 10).await;
    let r = settle(&c, "n0", &id, 1_001).await;
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (400, json!("invalid_cost"))
    );
    assert_eq!(
        c.remaining("n0", &check(&key, rule, 0)).await,
        990,
        "only the 10 reserved"
    );
    assert_eq!(settle(&c, "n0", &id, 10).await.status, 200, "still live");
}

/// An owner killed loses its table: once the ring has dropped it, a settle of its
/// reservation goes to the new owner, which does not know it.
#[tokio::test(start_paused = true)]
async fn an_owner_killed_loses_its_reservations() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let rule = per_minute(1_000, Algorithm::FixedWindow);
    let key = key_of("n1", rule);
    let id = reserved(&c, "n0", &key, rule, 300).await;
    c.kill("n1").await;
    for id in ["n0", "n2"] {
        c.wait(&format!("{id} drops n1"), || async {
            c.alive(id).await == ["n0", "n2"]
        })
        .await;
    }
    let r = settle(&c, "n2", &id, 100).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"], "unknown_reservation");
}
