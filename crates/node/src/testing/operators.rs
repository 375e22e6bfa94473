//! Operating a cluster through any node: admin rule changes are read-your-writes through every node
//! and conditional on `If-Match`; named tokens with roles; the most denied keys of a rule merged
//! across members.

use super::{ADMIN_TOKEN, Cluster, Reply};
use crate::rules::RuleSet;
use serde_json::json;
use std::time::Duration;

const IDS: [&str; 3] = ["n0", "n1", "n2"];

/// A request to node `id`'s admin API with `token` and extra `headers` (lines ending `\r\n`).
async fn admin(c: &Cluster, id: &str, token: &str, method: &str, path: &str, more: &str) -> Reply {
    admin_body(c, id, token, method, path, more, "").await
}

async fn admin_body(
    c: &Cluster,
    id: &str,
    token: &str,
    method: &str,
    path: &str,
    more: &str,
    body: &str,
) -> Reply {
    let headers = format!("authorization: Bearer {token}\r\n{more}");
    c.client(id)
        .try_http_with(method, path, &headers, body)
        .await
        .unwrap_or_else(|| panic!("{id} did not answer {method} {path}"))
}

async fn put(c: &Cluster, id: &str, name: &str, limit: u64, if_match: Option<&str>) -> Reply {
    let more = if_match.map_or(String::new(), |v| format!("if-match: \"{v}\"\r\n"));
    let body = json!({ "limit": limit, "period": "1m" }).to_string();
    let path = format!("/v1/admin/rules/{name}");
    admin_body(c, id, ADMIN_TOKEN, "PUT", &path, &more, &body).await
}

/// The names of the rules node `id` has in force.
async fn in_force(c: &Cluster, id: &str) -> Vec<String> {
    let r = c.http(id, "GET", "/v1/rules", "").await.json();
    let rules = r["rules"].as_array().cloned().unwrap_or_default();
    rules
        .iter()
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect()
}

/// The operator's sequence through a load-balanced Service: PUT on one node, then at once a
/// DELETE on another and a GET on the third. Each behaves as if one node took them all, and
/// the rule is gone everywhere afterwards.
#[tokio::test(start_paused = true)]
async fn admin_writes_through_rotating_nodes_are_read_your_writes() {
    let c = Cluster::start(3, |c| c.admin_token = Some(ADMIN_TOKEN.into())).await;
    c.wait_all_alive(&IDS).await;
    for i in 0..12 {
        let (a, b, d) = (IDS[i % 3], IDS[(i + 1) % 3], IDS[(i + 2) % 3]);
        let name = format!("silver-{i}");
        let path = format!("/v1/admin/rules/{name}");
        let r = put(&c, a, &name, 5, None).await;
        assert_eq!(r.status, 200, "PUT via {a}: {}", r.body);
        let version = r.json()["version"].as_str().expect("version").to_owned();
        let got = admin(&c, d, ADMIN_TOKEN, "GET", &path, "").await;
        assert_eq!(
            got.status, 200,
            "GET via {d} right after the PUT via {a}: {}",
            got.body
        );
        assert_eq!(got.json()["version"], version.as_str());
        let deleted = admin(&c, b, ADMIN_TOKEN, "DELETE", &path, "").await;
        assert_eq!(
            deleted.status, 204,
            "DELETE via {b} right after: {}",
            deleted.body
        );
        let gone = admin(&c, d, ADMIN_TOKEN, "GET", &path, "").await;
        assert_eq!(
            gone.status, 404,
            "GET via {d} after the DELETE: {}",
            gone.body
        );
        let again = admin(&c, a, ADMIN_TOKEN, "DELETE", &path, "").await;
        assert_eq!(again.status, 404, "a second DELETE: {}", again.body);
    }
    // Gossip takes the deletes everywhere: no node keeps any of the rules in force.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in IDS {
        let names = in_force(&c, id).await;
        assert!(
            names.iter().all(|n| !n.starts_with("silver-")),
            "{id}: {names:?}"
        );
    }
}

/// Two operators cannot overwrite each other unknowingly: a change names the version it read
/// (If-Match), wherever it is sent.
#[tokio::test(start_paused = true)]
async fn if_match_refuses_a_change_over_a_version_not_read_through_any_node() {
    let c = Cluster::start(3, |c| c.admin_token = Some(ADMIN_TOKEN.into())).await;
    c.wait_all_alive(&IDS).await;
    let v1 = put(&c, "n0", "gold", 5, None).await.json()["version"]
        .as_str()
        .expect("v1")
        .to_owned();
    let r = put(&c, "n1", "gold", 6, Some(&v1)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v2 = r.json()["version"].as_str().expect("v2").to_owned();
    let stale = put(&c, "n2", "gold", 7, Some(&v1)).await;
    assert_eq!(stale.status, 412, "{}", stale.body);
    assert_eq!(stale.json()["error"], "version_mismatch");
    let path = "/v1/admin/rules/gold";
    let stale_delete = admin(
        &c,
        "n2",
        ADMIN_TOKEN,
        "DELETE",
        path,
        &format!("if-match: \"{v1}\"\r\n"),
    )
    .await;
    assert_eq!(stale_delete.status, 412, "{}", stale_delete.body);
    let got = admin(&c, "n2", ADMIN_TOKEN, "GET", path, "").await.json();
    assert_eq!(
        (got["limit"].as_u64(), got["version"].as_str()),
        (Some(6), Some(v2.as_str()))
    );
    let deleted = admin(
        &c,
        "n0",
        ADMIN_TOKEN,
        "DELETE",
        path,
        &format!("if-match: {v2}\r\n"),
    )
    .await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    let absent = put(&c, "n1", "gold", 8, Some("*")).await;
    assert_eq!(
        absent.status, 412,
        "If-Match: * needs the rule to exist: {}",
        absent.body
    );
}

const TOKENS: &str = "tokens:\n  - { name: alice, token: alice-writes-rules-0001, role: write }\n  - { name: grafana, token: grafana-reads-only-0001, role: read }\n";

/// Named tokens: a read token reads and is refused changes (403), a write token changes and is
/// named as the change's author everywhere; the variable's token is `admin`; the file reloads.
#[tokio::test(start_paused = true)]
async fn named_tokens_have_roles_and_name_who_changed_a_rule() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("tokens.yaml");
    std::fs::write(&file, TOKENS).expect("tokens");
    let c = Cluster::start(3, |c| {
        c.admin_token = Some(ADMIN_TOKEN.into());
        c.admin_tokens = Some(file.clone());
    })
    .await;
    c.wait_all_alive(&IDS).await;
    let (alice, grafana) = ("alice-writes-rules-0001", "grafana-reads-only-0001");
    let body = json!({ "limit": 5, "period": "1m" }).to_string();
    let path = "/v1/admin/rules/bronze";
    let refused = admin_body(&c, "n0", grafana, "PUT", path, "", &body).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.json()["error"], "forbidden");
    let reset = admin(
        &c,
        "n0",
        grafana,
        "POST",
        "/v1/admin/keys/k/reset?rule=default",
        "",
    )
    .await;
    assert_eq!(reset.status, 403, "a reset is a write: {}", reset.body);
    let unknown = admin(
        &c,
        "n0",
        "not-a-token-at-all-01",
        "GET",
        "/v1/admin/rules",
        "",
    )
    .await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);
    let r = admin_body(&c, "n1", alice, "PUT", path, "", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let read = admin(&c, "n2", grafana, "GET", path, "").await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.json()["updated_by"], "alice");
    let by_env = put(&c, "n2", "bronze", 6, None).await.json();
    assert_eq!(by_env["updated_by"], "admin", "{by_env}");

    // The file changes: grafana may write now, alice's token is gone.
    std::fs::write(
        &file,
        TOKENS.replace("role: read", "role: write").replace(
            "  - { name: alice, token: alice-writes-rules-0001, role: write }\n",
            "",
        ),
    )
    .expect("tokens");
    c.wait("the tokens file reloaded everywhere", || async {
        let mut all = true;
        for id in IDS {
            all &= admin(&c, id, alice, "GET", "/v1/admin/rules", "")
                .await
                .status
                == 401;
        }
        all
    })
    .await;
    let r = admin_body(&c, "n0", grafana, "DELETE", path, "", "").await;
    assert_eq!(r.status, 204, "{}", r.body);
}

/// The most denied keys of a rule, counted where checks arrive and merged across members.
#[tokio::test(start_paused = true)]
async fn the_most_denied_keys_are_merged_across_members() {
    let rules =
        RuleSet::from_yaml("rules:\n  - { name: tight, limit: 1, period: 1h }\n").expect("rules");
    let c = Cluster::start(3, |c| {
        c.admin_token = Some(ADMIN_TOKEN.into());
        c.rules = rules.clone();
    })
    .await;
    c.wait_all_alive(&IDS).await;
    let check = |key: &str| json!({ "key": key, "rule": "tight" });
    // abuser: 1 admitted, then 9 denied through n0 and 6 through n1; noisy: 3 denied via n2;
    // quiet: admitted once.
    for (id, key, times) in [
        ("n0", "abuser", 10),
        ("n1", "abuser", 6),
        ("n2", "noisy", 4),
        ("n2", "quiet", 1),
    ] {
        for _ in 0..times {
            c.check(id, &check(key)).await;
        }
    }
    let r = c
        .admin("n1", "GET", "/v1/admin/top?rule=tight&by=denied&n=5")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let top = r.json();
    let keys: Vec<(&str, u64)> = top["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("key"),
                k["count"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(keys, [("abuser", 15), ("noisy", 3)], "{top}");
    assert_eq!(top["complete"], true, "{top}");
    assert_eq!(top["members"].as_array().map(Vec::len), Some(3));
    let checks = c
        .admin("n1", "GET", "/v1/admin/top?rule=tight&by=checks")
        .await
        .json();
    assert_eq!(checks["by"], "checks");
    for bad in [
        "rule=tight&by=nope",
        "rule=tight&n=0",
        "rule=tight&n=1001",
        "by=denied",
        "rule=tight&x=1",
    ] {
        let r = c.admin("n0", "GET", &format!("/v1/admin/top?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    let metrics = c.metrics("n0").await;
    assert!(
        metrics.contains("ringlimit_top_denied{rule=\"tight\",key=\"abuser\"} 9"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("top_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
