//! Blocks across a cluster: a key that crosses its rule's `after` denials at its owner is
//! blocked on every node one announce round later, through every node, and unblocked when the
//! block ends; managed blocks (a key, a network) put through one node's admin API are answered
//! by every node and lifted everywhere.

use super::{ADMIN_TOKEN, Cluster, Reply};
use crate::blocks_sync::ANNOUNCE_EVERY;
use crate::rules::RuleSet;
use serde_json::json;
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];

const RULES: &str = r#"
rules:
  - name: login
    limit: 1
    period: 1h
    block: { after: 3, within: 1m, for: 10s, max: 40s }
  - name: per-ip
    limit: 1000
    period: 1m
"#;

fn rules() -> RuleSet {
    RuleSet::from_yaml(RULES).expect("valid rules")
}

async fn start() -> Cluster {
    let c = Cluster::start(3, |c| {
        c.rules = rules();
        c.admin_token = Some(ADMIN_TOKEN.into());
    })
    .await;
    c.wait_all_alive(&IDS).await;
    c
}

/// One round of the announcer, and then some (its frames cross the in-memory network).
async fn one_round() {
    tokio::time::sleep(ANNOUNCE_EVERY + Duration::from_millis(50)).await;
}

async fn admin_body(c: &Cluster, id: &str, method: &str, path: &str, body: &str) -> Reply {
    let auth = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
    c.client(id)
        .try_http_with(method, path, &auth, body)
        .await
        .unwrap_or_else(|| panic!("{id} did not answer {method} {path}"))
}

#[tokio::test(start_paused = true)]
async fn a_key_denied_after_times_is_blocked_on_every_node_until_its_end() {
    let c = start().await;
    let check = json!({ "key": "user:7", "rule": "login" });
    // One admitted, then three denials (counted at the key's owner, whichever node they
    // reach): the third earns the block.
    assert_eq!(c.check("n0", &check).await.status, 200);
    for id in IDS {
        let r = c.check(id, &check).await;
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            r.json().get("blocked").is_none(),
            "not blocked yet: {}",
            r.body
        );
    }
    one_round().await;
    let mut until = 0;
    for id in IDS {
        let r = c.check(id, &check).await;
        assert_eq!(r.status, 429, "{}", r.body);
        let body = r.json();
        assert_eq!(body["blocked"], true, "{id}: {}", r.body);
        assert_eq!(body["block_reason"], "auto", "{id}: {}", r.body);
        let retry = body["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(retry > 9_000 && retry <= 10_000, "{id}: {retry}");
        until = body["reset_at_ms"].as_u64().expect("reset_at_ms");
        assert_eq!(
            c.metric(
                id,
                "ringlimit_blocked_checks_total{rule=\"login\",source=\"auto\"}"
            )
            .await,
            1,
            "{id} counted its blocked check"
        );
    }
    // Under another rule the key is not blocked.
    let other = json!({ "key": "user:7", "rule": "per-ip" });
    assert_eq!(c.check("n1", &other).await.status, 200);
    // Still blocked just before its end, answered by the bucket (not blocked) after it.
    tokio::time::sleep(Duration::from_millis(until - 100 - c.now_ms())).await;
    for id in IDS {
        let r = c.check(id, &check).await;
        assert_eq!(r.json()["blocked"], true, "{id} before the end: {}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(until + 1 - c.now_ms())).await;
    for id in IDS {
        let r = c.check(id, &check).await;
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            r.json().get("blocked").is_none(),
            "{id} after the end: {}",
            r.body
        );
    }
}

#[tokio::test(start_paused = true)]
async fn managed_blocks_through_one_node_are_answered_by_every_node_and_lifted_everywhere() {
    let c = start().await;
    let put = |target: &str| format!("/v1/admin/blocks/{target}");
    let body = json!({ "ttl": "1h", "reason": "scraper" }).to_string();
    let r = admin_body(&c, "n0", "PUT", &put("apikey:bad"), &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["by"], "admin");
    let r = admin_body(&c, "n1", "PUT", &put("cidr:203.0.113.0/24"), &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = admin_body(&c, "n2", "PUT", &put("cidr:2001:db8::/32"), &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    one_round().await;
    for id in IDS {
        for key in ["apikey:bad", "ip:203.0.113.9", "ip:2001:db8::7"] {
            let r = c.check(id, &json!({ "key": key, "rule": "per-ip" })).await;
            assert_eq!(r.status, 429, "{id} {key}: {}", r.body);
            assert_eq!(r.json()["block_reason"], "managed", "{id} {key}");
        }
        let r = c
            .check(id, &json!({ "key": "ip:198.51.100.1", "rule": "per-ip" }))
            .await;
        assert_eq!(r.status, 200, "{id}: {}", r.body);
        let listed = admin_body(&c, id, "GET", "/v1/admin/blocks?limit=2", "")
            .await
            .json();
        assert_eq!(listed["total"], 3, "{id}: {listed}");
        assert_eq!(listed["blocks"].as_array().map(Vec::len), Some(2));
        let cursor = listed["next_cursor"].as_str().expect("a next page");
        let rest = admin_body(
            &c,
            id,
            "GET",
            &format!("/v1/admin/blocks?cursor={cursor}"),
            "",
        )
        .await
        .json();
        assert_eq!(rest["blocks"].as_array().map(Vec::len), Some(1), "{rest}");
        assert!(rest.get("next_cursor").is_none());
    }
    // Bad input changes nothing.
    for (target, body) in [
        ("cidr:203.0.113.0/33", json!({ "ttl": "1h" })),
        ("k", json!({ "ttl": "0s" })),
        ("k", json!({ "ttl": "soon" })),
        ("k", json!({ "ttl": "1h", "reason": "x".repeat(300) })),
        ("k", json!({ "ttl": "1h", "nope": 1 })),
    ] {
        let r = admin_body(&c, "n0", "PUT", &put(target), &body.to_string()).await;
        assert_eq!(r.status, 400, "{target} {body}: {}", r.body);
    }
    let r = admin_body(&c, "n0", "DELETE", &put("never-blocked"), "").await;
    assert_eq!(r.status, 404, "{}", r.body);
    // Lifted through one node, lifted on all.
    let r = admin_body(&c, "n2", "DELETE", &put("cidr:203.0.113.0/24"), "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    one_round().await;
    for id in IDS {
        let r = c
            .check(id, &json!({ "key": "ip:203.0.113.9", "rule": "per-ip" }))
            .await;
        assert_eq!(r.status, 200, "{id}: {}", r.body);
        let listed = admin_body(&c, id, "GET", "/v1/admin/blocks", "")
            .await
            .json();
        assert_eq!(listed["total"], 2, "{id}: {listed}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_that_joins_learns_every_block() {
    let mut c = start().await;
    let body = json!({ "ttl": "1h", "reason": "scraper" }).to_string();
    let r = admin_body(&c, "n0", "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let joined = c.join().await;
    c.wait("the new member learns the block", || async {
        let r = c
            .check(&joined, &json!({ "key": "apikey:bad", "rule": "per-ip" }))
            .await;
        r.json()["blocked"] == true
    })
    .await;
}

/// Blocks node `id` lists.
async fn held(c: &Cluster, id: &str) -> u64 {
    let listed = admin_body(c, id, "GET", "/v1/admin/blocks", "")
        .await
        .json();
    listed["total"].as_u64().unwrap_or(u64::MAX)
}

#[tokio::test(start_paused = true)]
async fn a_member_that_missed_a_lift_converges_to_lifted_once_it_is_reached_again() {
    let c = start().await;
    let body = json!({ "ttl": "1h", "reason": "scraper" }).to_string();
    let r = admin_body(&c, "n0", "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // An automatic block too (decided at the key's owner), lifted through n0 below.
    let login = json!({ "key": "user:7", "rule": "login" });
    for _ in 0..4 {
        c.check("n1", &login).await;
    }
    one_round().await;
    let per_ip = json!({ "key": "apikey:bad", "rule": "per-ip" });
    for id in IDS {
        assert_eq!(c.check(id, &per_ip).await.json()["blocked"], true, "{id}");
        assert_eq!(c.check(id, &login).await.json()["blocked"], true, "{id}");
    }
    // n2 misses both lifts: the frames from n0 do not reach it.
    c.cut_link("n0", "n2");
    let r = admin_body(&c, "n0", "DELETE", "/v1/admin/blocks/apikey:bad", "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = admin_body(&c, "n0", "DELETE", "/v1/admin/blocks/user:7?rule=login", "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // (Listed, not checked: a check through n1 may be forwarded to n2 and answered there.)
    assert_eq!(held(&c, "n1").await, 0, "n1 took the lifts");
    assert_eq!(held(&c, "n2").await, 2, "n2 missed the lifts");
    c.heal_link("n0", "n2");
    c.wait("n2 learns the lifts", || async {
        held(&c, "n2").await == 0
    })
    .await;
    // And n2's own announcements never bring the lifted blocks back anywhere.
    one_round().await;
    one_round().await;
    for id in IDS {
        assert_eq!(c.check(id, &per_ip).await.status, 200, "{id}");
        assert!(
            c.check(id, &login).await.json().get("blocked").is_none(),
            "{id}"
        );
    }
    // A newer block wins over the lift.
    let r = admin_body(&c, "n0", "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    one_round().await;
    for id in IDS {
        assert_eq!(c.check(id, &per_ip).await.json()["blocked"], true, "{id}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_answered_is_in_force_on_every_live_member_or_names_those_that_did_not_confirm() {
    let c = start().await;
    let body = json!({ "ttl": "1h", "reason": "scraper" }).to_string();
    let per_ip = json!({ "key": "apikey:bad", "rule": "per-ip" });
    let r = admin_body(&c, "n0", "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["unconfirmed"], json!([]), "{}", r.body);
    // No announce round waited for: every member holds it when the answer leaves.
    for id in IDS {
        assert_eq!(held(&c, id).await, 1, "{id}");
        assert_eq!(c.check(id, &per_ip).await.json()["blocked"], true, "{id}");
    }
    let r = admin_body(&c, "n1", "DELETE", "/v1/admin/blocks/apikey:bad", "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["unconfirmed"], json!([]), "{}", r.body);
    assert_eq!(r.json()["lifted"], true, "{}", r.body);
    for id in IDS {
        assert_eq!(held(&c, id).await, 0, "{id}");
    }
    // A member the change cannot reach is named, within the bound.
    c.cut_link("n0", "n2");
    let started = c.now_ms();
    let r = admin_body(&c, "n0", "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["unconfirmed"], json!(["n2"]), "{}", r.body);
    assert!(c.now_ms() - started <= 1_100, "answered within the bound");
    assert_eq!(held(&c, "n1").await, 1);
    c.heal_link("n0", "n2");
    c.wait("n2 gets it from the announcer", || async {
        held(&c, "n2").await == 1
    })
    .await;
}

/// The member that owns `key`'s bucket under `rule`, as node `via` sees it.
async fn owner(c: &Cluster, via: &str, key: &str, rule: &str) -> String {
    let path = format!("/v1/admin/keys/{key}?rule={rule}");
    let state = admin_body(c, via, "GET", &path, "").await.json();
    state["owner"].as_str().expect("an owner").to_owned()
}

/// A cluster where `apikey:bad` (rule `per-ip`) is blocked through the admin API of a node
/// that is not its owner, while a third node `x` (not the owner either) cannot hear of it (its
/// link to the writer is cut): returns the cluster, the owner, `x`, and the PUT's reply.
async fn blocked_unknown_to_one_node() -> (Cluster, String, &'static str, Reply) {
    let c = start().await;
    let o = owner(&c, "n0", "apikey:bad", "per-ip").await;
    let others: Vec<&str> = IDS.iter().copied().filter(|id| *id != o).collect();
    let (x, y) = (others[0], others[1]);
    c.cut_link(x, y);
    let body = json!({ "ttl": "1h", "reason": "scraper" }).to_string();
    let r = admin_body(&c, y, "PUT", "/v1/admin/blocks/apikey:bad", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(held(&c, x).await, 0);
    (c, o, x, r)
}

#[tokio::test(start_paused = true)]
async fn an_all_or_nothing_group_reaching_the_owner_is_checked_for_blocks_too() {
    // x does not learn the block; the owner does.
    let (c, o, x, r) = blocked_unknown_to_one_node().await;
    assert_eq!(r.json()["unconfirmed"], json!([x]), "{}", r.body);
    // Through x, the group goes to the owner, which holds the block: denied whole, nothing taken.
    let other = json!({ "key": "apikey:good", "rule": "per-ip" });
    let before = c.remaining(&o, &other).await;
    let r = c
        .check_all(
            x,
            &[
                json!({ "key": "apikey:bad", "rule": "per-ip" }),
                other.clone(),
            ],
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(
        c.remaining(&o, &other).await,
        before,
        "nothing taken: {}",
        r.body
    );
}

#[tokio::test(start_paused = true)]
async fn a_check_forwarded_to_an_owner_that_knows_the_block_answers_blocked() {
    // x does not learn the block; the owner does.
    let (c, _, x, _) = blocked_unknown_to_one_node().await;
    // Through x, the check goes to the owner, which answers it by the block: blocked at x too.
    let r = c
        .check(x, &json!({ "key": "apikey:bad", "rule": "per-ip" }))
        .await;
    assert_eq!(r.status, 429, "{}", r.body);
    let answer = r.json();
    assert_eq!(answer["blocked"], true, "{}", r.body);
    assert_eq!(answer["block_reason"], "managed", "{}", r.body);
    // A key not blocked is still answered by its bucket.
    let r = c
        .check(x, &json!({ "key": "apikey:good", "rule": "per-ip" }))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json().get("blocked").is_none(), "{}", r.body);
}

#[tokio::test(start_paused = true)]
async fn batch_items_and_all_or_nothing_groups_forwarded_to_an_owner_that_knows_the_block_answer_blocked()
 {
    // x does not learn the block; the owner does.
    let (c, _, x, _) = blocked_unknown_to_one_node().await;
    let bad = json!({ "key": "apikey:bad", "rule": "per-ip" });
    let good = json!({ "key": "apikey:good", "rule": "per-ip" });

    // A batch through x: the blocked item comes back from its owner blocked, with the block's
    // reason and rest; the other is answered by its bucket.
    let got = c.batch(x, &[good.clone(), bad.clone()]).await;
    assert_eq!(got[0]["allowed"], true, "{got:?}");
    assert!(got[0].get("blocked").is_none(), "{got:?}");
    assert_eq!(got[1]["allowed"], false, "{got:?}");
    assert_eq!(got[1]["blocked"], true, "{got:?}");
    assert_eq!(got[1]["block_reason"], "managed", "{got:?}");
    let rest = got[1]["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(rest > 3_000_000 && rest <= 3_600_000, "{got:?}");

    // An all-or-nothing request through x: denied whole, its blocked check marked so, and the
    // request's answer says why.
    let r = c.check_all(x, &[good, bad]).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let all = r.json();
    assert_eq!(all["blocked"], true, "{}", r.body);
    assert_eq!(all["block_reason"], "managed", "{}", r.body);
    let results = all["results"].as_array().expect("results");
    assert!(results[0].get("blocked").is_none(), "{}", r.body);
    assert_eq!(results[1]["blocked"], true, "{}", r.body);
    assert_eq!(results[1]["block_reason"], "managed", "{}", r.body);
}
