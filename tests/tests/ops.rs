//! Operations: `/metrics` names, rules hot reload through a ConfigMap-style symlink swap, the
//! admin API (token, key state, reset across the cluster) and one log line per event.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::config::load_rules;
use ringlimit_node::rules::InForce;
use ringlimit_node::rules::RuleSet;
use ringlimit_node::rules::RuleSpec;
use ringlimit_proto::Ring;
use ringlimit_tests::{
    ProcessNode, Reply, TempDir, TestCluster, TestNode, WAIT, exclusive, inline, owner_of, series,
    wait_until,
};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "admin-test-token";

/// An admin request to `node` with `token` as bearer (none when `None`).
async fn admin(node: &TestNode, post: bool, path: &str, token: Option<&str>) -> Result<Reply> {
    let client = reqwest::Client::builder()
        .timeout(WAIT)
        .no_proxy()
        .build()?;
    let url = node.url(path);
    let mut req = if post {
        client.post(url)
    } else {
        client.get(url)
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    Reply::read(req.send().await?).await
}

async fn scrape(node: &TestNode) -> Result<String> {
    let r = node.get("/metrics").await?;
    ensure!(r.status == 200, "/metrics answered {}", r.status);
    Ok(r.text)
}

/// A key of `prefix` owned by `owner` under the inline rule `limit` per `period_ms`.
fn key_owned_by(ids: &[&str], owner: &str, prefix: &str, limit: u64, period_ms: u64) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| owner_of(ids, k, limit, period_ms).is_ok_and(|o| o == owner))
        .unwrap_or_default()
}

#[tokio::test]
async fn metrics_name_every_operations_series() -> Result<()> {
    let _one = exclusive().await;
    let cluster = TestCluster::start(3).await?;
    let ids = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let entry = &cluster[0];
    // Checks decided here and checks forwarded to node-1, single and batched.
    let here = key_owned_by(&ids, "node-0", "m", 1, 60_000);
    let there = key_owned_by(&ids, "node-1", "m", 1, 60_000);
    assert_eq!(entry.check(&inline(&here, 1, 60_000)).await?.status, 200);
    assert_eq!(entry.check(&inline(&here, 1, 60_000)).await?.status, 429);
    assert_eq!(entry.check(&inline(&there, 1, 60_000)).await?.status, 200);
    let batch = entry
        .batch(&[inline(&there, 1, 60_000), inline(&here, 1, 60_000)])
        .await?;
    assert_eq!(batch.status, 200, "{}", batch.text);

    let text = scrape(entry).await?;
    let want = |name: &str| series(&text, name).with_context(|| format!("no {name} in:\n{text}"));
    assert_eq!(
        want(r#"ringlimit_checks_total{result="allowed",mode="owner"}"#)?,
        2.0
    );
    assert_eq!(
        want(r#"ringlimit_checks_total{result="denied",mode="owner"}"#)?,
        3.0
    );
    want(r#"ringlimit_checks_total{result="allowed",mode="global"}"#)?;
    want(r#"ringlimit_checks_total{result="denied",mode="global"}"#)?;
    assert_eq!(
        want(r#"ringlimit_check_duration_seconds_count{endpoint="check"}"#)?,
        3.0
    );
    assert_eq!(
        want(r#"ringlimit_check_duration_seconds_count{endpoint="batch"}"#)?,
        1.0
    );
    assert_eq!(
        want(r#"ringlimit_check_duration_seconds_bucket{le="+Inf",endpoint="check"}"#)?,
        3.0
    );
    want(r#"ringlimit_check_duration_seconds_bucket{le="0.000025",endpoint="check"}"#)?;
    want(r#"ringlimit_check_duration_seconds_bucket{le="0.1",endpoint="batch"}"#)?;
    assert_eq!(want("ringlimit_buckets")?, 1.0, "only `here` is held here");
    want("ringlimit_evictions_total")?;
    want("ringlimit_evictions_limiting_total")?;
    assert_eq!(want(r#"ringlimit_members{state="alive"}"#)?, 3.0);
    assert_eq!(want(r#"ringlimit_members{state="leaving"}"#)?, 0.0);
    assert_eq!(want(r#"ringlimit_members{state="dead"}"#)?, 0.0);
    assert_eq!(want("ringlimit_forwarded_total")?, 2.0);
    assert_eq!(want("ringlimit_fail_open_total")?, 0.0);
    assert_eq!(want("ringlimit_fail_closed_total")?, 0.0);
    // Two groups went to node-1 (one single check, one from the batch), both answered.
    assert_eq!(want("ringlimit_peer_rpc_duration_seconds_count")?, 2.0);
    want(r#"ringlimit_peer_rpc_duration_seconds_bucket{le="0.000025"}"#)?;
    assert_eq!(want("ringlimit_peer_batch_checks_count")?, 2.0);
    assert_eq!(want("ringlimit_peer_batch_checks_sum")?, 2.0);
    assert_eq!(
        want(r#"ringlimit_peer_batch_checks_bucket{le="1.0"}"#)?,
        2.0
    );
    want("ringlimit_peer_frames_total")?;
    want("ringlimit_peer_checks_total")?;
    assert_eq!(want(r#"ringlimit_rules_reload_total{result="ok"}"#)?, 0.0);
    assert_eq!(
        want(r#"ringlimit_rules_reload_total{result="error"}"#)?,
        0.0
    );
    assert_eq!(want("ringlimit_rules_generation")?, 1.0);
    assert!(want("ringlimit_rules_last_reload_timestamp_seconds")? > 1.7e9);
    cluster.stop().await
}

/// Publishes `text` the way the kubelet updates a mounted ConfigMap: a new timestamped
/// directory, a `..data_tmp` symlink to it renamed over `..data` (atomic), the old one removed.
/// Every `rules.yaml` gets the same mtime, so a reload cannot be relying on it.
fn publish(dir: &Path, version: &str, text: &str) -> Result<()> {
    let data = dir.join(format!("..2026_01_01_00_00_0{version}"));
    std::fs::create_dir(&data)?;
    let file = data.join("rules.yaml");
    std::fs::write(&file, text)?;
    std::fs::File::options()
        .write(true)
        .open(&file)?
        .set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600))?;
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(data.file_name().context("no name")?, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old))?;
    }
    if !dir.join("rules.yaml").exists() {
        std::os::unix::fs::symlink("..data/rules.yaml", dir.join("rules.yaml"))?;
    }
    Ok(())
}

fn rule_names(body: &Value) -> Vec<String> {
    body["rules"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter_map(|r| r["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn rules_reload_follows_a_configmap_symlink_swap() -> Result<()> {
    let dir = TempDir::new("configmap")?;
    // Same length, so that neither size nor mtime tells the versions apart.
    let v1 = "rules:\n  - name: one\n    limit: 5\n    period: 1m\n";
    let v2 = "rules:\n  - name: two\n    limit: 7\n    period: 1m\n";
    let bad = "rules:\n  - name: two\n    limit: 0\n    period: 1m\n";
    publish(&dir.0, "1", v1)?;
    let path = dir.0.join("rules.yaml");
    let mut config = NodeConfig::local("reload");
    config.rules = load_rules(&path)?;
    config.rules_path = Some(path.clone());
    config.rules_poll = Duration::from_millis(20);
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    assert_eq!(rule_names(&node.get("/v1/rules").await?.json()?), ["one"]);

    publish(&dir.0, "2", v2)?;
    wait_until("the swapped rules are in force", WAIT, || async {
        Ok(rule_names(&node.get("/v1/rules").await?.json()?) == ["two"])
    })
    .await?;
    let text = scrape(&node).await?;
    assert_eq!(
        series(&text, r#"ringlimit_rules_reload_total{result="ok"}"#),
        Some(1.0)
    );
    assert_eq!(series(&text, "ringlimit_rules_generation"), Some(2.0));
    assert_eq!(
        series(&text, "ringlimit_rules_last_reload_successful"),
        Some(1.0)
    );
    let hash = series(&text, "ringlimit_rules_hash").context("no ringlimit_rules_hash")?;

    // An invalid file: refused once, counted, and the rules in force stay.
    publish(&dir.0, "3", bad)?;
    wait_until("the invalid file is refused", WAIT, || async {
        let text = scrape(&node).await?;
        Ok(series(&text, r#"ringlimit_rules_reload_total{result="error"}"#) == Some(1.0))
    })
    .await?;
    let body = node.get("/v1/rules").await?.json()?;
    assert_eq!(rule_names(&body), ["two"]);
    assert_eq!(body["rules"][0]["limit"], 7);
    let r = node
        .check(&json!({ "key": "k", "rule": "two", "cost": 0 }))
        .await?;
    assert_eq!(r.status, 200, "{}", r.text);

    // The admin view says where the rules came from and why the last reload was refused.
    let a = admin(&node, false, "/v1/admin/rules", Some(TOKEN)).await?;
    assert_eq!(a.status, 200, "{}", a.text);
    let a = a.json()?;
    assert_eq!(a["source"], path.display().to_string());
    assert_eq!(a["generation"], 2);
    assert_eq!(a["reloads_ok"], 1);
    assert_eq!(a["reloads_error"], 1);
    assert_eq!(a["last_reload"]["result"], "error");
    let why = a["last_reload"]["error"].as_str().unwrap_or_default();
    assert!(why.contains("\"two\"") && why.contains("`limit`"), "{why}");
    assert_eq!(rule_names(&a), ["two"]);
    // Polling the same invalid file again is not another refusal. A sleep is the thing: a poll
    // of an unchanged file leaves no trace to wait for; this is five of them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let text = scrape(&node).await?;
    assert_eq!(
        series(&text, r#"ringlimit_rules_reload_total{result="error"}"#),
        Some(1.0)
    );
    // Failing until the file is fixed (the alert's signal); the rules in force, and so their
    // fingerprint, unchanged.
    assert_eq!(
        series(&text, "ringlimit_rules_last_reload_successful"),
        Some(0.0)
    );
    assert_eq!(series(&text, "ringlimit_rules_hash"), Some(hash));
    // The file put back as it is in force: nothing new in force, and nothing failing.
    publish(&dir.0, "4", v2)?;
    wait_until("the fixed file is accepted", WAIT, || async {
        let text = scrape(&node).await?;
        Ok(series(&text, "ringlimit_rules_last_reload_successful") == Some(1.0))
    })
    .await?;
    let text = scrape(&node).await?;
    assert_eq!(series(&text, "ringlimit_rules_generation"), Some(2.0));
    assert_eq!(series(&text, "ringlimit_rules_hash"), Some(hash));
    node.stop().await
}

#[tokio::test]
async fn admin_api_is_off_without_a_token() -> Result<()> {
    let node = TestNode::single().await?;
    for (post, path) in [
        (false, "/v1/admin/rules"),
        (false, "/v1/admin/keys/k?rule=default"),
        (true, "/v1/admin/keys/k/reset?rule=default"),
    ] {
        let r = admin(&node, post, path, Some(TOKEN)).await?;
        assert_eq!(r.status, 404, "{path}: {}", r.text);
        assert_eq!(r.json()?["error"], "not_found");
    }
    node.stop().await
}

#[tokio::test]
async fn admin_api_needs_the_bearer_token() -> Result<()> {
    let mut config = NodeConfig::local("admin");
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    for (post, path) in [
        (false, "/v1/admin/rules"),
        (false, "/v1/admin/keys/k?rule=default"),
        (true, "/v1/admin/keys/k/reset?rule=default"),
    ] {
        for token in [None, Some("wrong"), Some("")] {
            let r = admin(&node, post, path, token).await?;
            assert_eq!(r.status, 401, "{path} with {token:?}: {}", r.text);
            let body = r.json()?;
            assert_eq!(body["error"], "unauthorized");
            assert!(body["message"].as_str().is_some_and(|m| m.ends_with('.')));
            assert!(r.header("www-authenticate").starts_with("Bearer"));
        }
        let r = admin(&node, post, path, Some(TOKEN)).await?;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
    }
    // Bad input: the contract's 4xx, and no bucket changes.
    for (path, status, code) in [
        ("/v1/admin/keys/k", 400, "invalid_request"),
        ("/v1/admin/keys/k?rule=nope", 404, "unknown_rule"),
        (
            "/v1/admin/keys/k?rule=default&limit=5",
            400,
            "invalid_request",
        ),
        (
            "/v1/admin/keys/k?rule=default&typo=1",
            400,
            "invalid_request",
        ),
        (
            "/v1/admin/keys/k?limit=x&period_ms=1000",
            400,
            "invalid_request",
        ),
        (
            "/v1/admin/keys/k?limit=0&period_ms=1000",
            400,
            "invalid_limit",
        ),
        (
            "/v1/admin/keys/k?limit=5&period_ms=1000&algorithm=magic",
            400,
            "unknown_algorithm",
        ),
    ] {
        let (base, query) = path.split_once('?').unwrap_or((path, ""));
        for p in [path.to_owned(), format!("{base}/reset?{query}")] {
            let r = admin(&node, p.contains("/reset"), &p, Some(TOKEN)).await?;
            assert_eq!(r.status, status, "{p}: {}", r.text);
            assert_eq!(r.json()?["error"], code, "{p}");
        }
    }
    let long = format!("/v1/admin/keys/{}?rule=default", "k".repeat(513));
    let r = admin(&node, false, &long, Some(TOKEN)).await?;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()?["error"], "invalid_key");
    assert_eq!(
        series(&scrape(&node).await?, "ringlimit_buckets"),
        Some(0.0)
    );
    node.stop().await
}

/// Admin-enabled 3-node cluster with a global rule besides the built-in ones.
fn admin_rules() -> Result<RuleSet> {
    Ok(RuleSet::from_yaml(
        "rules:\n  - name: hourly-3\n    limit: 3\n    period: 1h\n  - name: everywhere\n    limit: 5\n    period: 1h\n    mode: global\n",
    )?)
}

async fn admin_cluster() -> Result<TestCluster> {
    let rules = admin_rules()?;
    TestCluster::start_with(3, |c| {
        c.admin_token = Some(TOKEN.into());
        c.rules = rules.clone();
    })
    .await
}

#[tokio::test]
async fn admin_key_state_shows_the_owner_and_does_not_consume() -> Result<()> {
    let _one = exclusive().await;
    let cluster = admin_cluster().await?;
    let ids = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let key = "user:42";
    let owner = owner_of(&ids, key, 3, 60_000)?;
    let path = format!("/v1/admin/keys/{key}?limit=3&period_ms=60000");
    assert_eq!(cluster[0].check(&inline(key, 3, 60_000)).await?.status, 200);
    let mut bucket_ids = Vec::new();
    // Read from every node, several times: each shows the same owner and nothing is consumed.
    for _ in 0..3 {
        for node in cluster.iter() {
            let r = admin(node, false, &path, Some(TOKEN)).await?;
            assert_eq!(r.status, 200, "{}", r.text);
            let body = r.json()?;
            assert_eq!(body["key"], key);
            assert_eq!(body["rule"], Value::Null);
            assert_eq!(body["mode"], "owner");
            assert_eq!(body["owner"], owner.as_str(), "{body}");
            assert_eq!(body["node_id"], node.node_id.as_str());
            assert_eq!(body["is_owner"], node.node_id == owner);
            assert_eq!(body["state"]["allowed"], true);
            assert_eq!(body["state"]["remaining"], 2, "{body}");
            assert_eq!(body["state"]["limit"], 3);
            assert_eq!(body["state"]["degraded"], false);
            assert!(body["state"]["reset_at_ms"].as_u64().unwrap_or(0) > 0);
            bucket_ids.push(body["bucket_id"].as_str().unwrap_or_default().to_owned());
        }
    }
    bucket_ids.dedup();
    assert_eq!(bucket_ids.len(), 1, "{bucket_ids:?}");
    assert_eq!(bucket_ids[0].len(), 16);
    // The two remaining requests are still there.
    assert_eq!(cluster[1].check(&inline(key, 3, 60_000)).await?.status, 200);
    assert_eq!(cluster[2].check(&inline(key, 3, 60_000)).await?.status, 200);
    assert_eq!(cluster[0].check(&inline(key, 3, 60_000)).await?.status, 429);
    let body = admin(&cluster[1], false, &path, Some(TOKEN))
        .await?
        .json()?;
    assert_eq!(body["state"]["allowed"], false);
    assert_eq!(body["state"]["remaining"], 0);

    // A named rule, and a global one (no owner: decided on every node).
    let body = admin(
        &cluster[0],
        false,
        "/v1/admin/keys/k?rule=hourly-3",
        Some(TOKEN),
    )
    .await?
    .json()?;
    assert_eq!(body["rule"], "hourly-3");
    assert_eq!(body["state"]["remaining"], 3);
    let body = admin(
        &cluster[0],
        false,
        "/v1/admin/keys/k?rule=everywhere",
        Some(TOKEN),
    )
    .await?
    .json()?;
    assert_eq!(body["mode"], "global");
    assert_eq!(body["owner"], Value::Null);
    assert_eq!(body["is_owner"], false);
    assert_eq!(body["state"]["remaining"], 5);
    cluster.stop().await
}

#[tokio::test]
async fn admin_reset_readmits_an_exhausted_key_across_the_cluster() -> Result<()> {
    let _one = exclusive().await;
    let cluster = admin_cluster().await?;
    let ids = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    // A key owned by node-2 under the named rule, exhausted through node-0 (forwarded).
    let rules = admin_rules()?;
    let engine = InForce::new(rules);
    let key = (0..10_000)
        .map(|i| format!("reset:{i}"))
        .find(|k| {
            engine
                .prepare(k, RuleSpec::Named("hourly-3"), 1)
                .ok()
                .and_then(|(_, id)| Ring::new(&ids).owner(id).map(str::to_owned))
                .is_some_and(|o| o == "node-2")
        })
        .context("no key owned by node-2")?;
    let named = json!({ "key": key, "rule": "hourly-3" });
    for _ in 0..3 {
        assert_eq!(cluster[0].check(&named).await?.status, 200);
    }
    assert_eq!(cluster[0].check(&named).await?.status, 429);
    assert_eq!(cluster[2].check(&named).await?.status, 429);

    // Reset through node-1, which neither took the checks nor owns the key.
    let r = admin(
        &cluster[1],
        true,
        &format!("/v1/admin/keys/{key}/reset?rule=hourly-3"),
        Some(TOKEN),
    )
    .await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let body = r.json()?;
    assert_eq!(body["owner"], "node-2");
    assert_eq!(body["complete"], true, "{body}");
    assert_eq!(body["removed"], 1, "{body}");
    let members = body["members"].as_array().cloned().unwrap_or_default();
    let acked: Vec<(&str, &str, u64)> = members
        .iter()
        .map(|m| {
            (
                m["node_id"].as_str().unwrap_or(""),
                m["status"].as_str().unwrap_or(""),
                m["removed"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    assert_eq!(
        acked,
        [
            ("node-0", "ok", 0),
            ("node-1", "ok", 0),
            ("node-2", "ok", 1)
        ]
    );
    assert!(body.get("global_reset").is_none());

    // The owner admits the key again, exactly the limit.
    for _ in 0..3 {
        let r = cluster[0].check(&named).await?;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json()?["degraded"], false);
    }
    assert_eq!(cluster[1].check(&named).await?.status, 429);

    // A global rule's counters cannot be reset, and the answer says so.
    let r = admin(
        &cluster[0],
        true,
        "/v1/admin/keys/k/reset?rule=everywhere",
        Some(TOKEN),
    )
    .await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let body = r.json()?;
    assert!(
        body["global_reset"]
            .as_str()
            .is_some_and(|s| s.starts_with("not supported:")),
        "{body}"
    );
    assert_eq!(body["removed"], 0);
    cluster.stop().await
}

/// Counts the lines of `log` (from line `from` on) that contain every one of `parts`.
fn count(log: &str, from: usize, parts: &[&str]) -> usize {
    log.lines()
        .skip(from)
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

/// Membership and circuit transitions each give exactly one line, and checks give none.
#[tokio::test]
async fn one_log_line_per_event() -> Result<()> {
    let _one = exclusive().await;
    // No replicas: the frozen owner's checks fail open (degraded), which is what is logged.
    let mut nodes = ProcessNode::cluster(2, |_, spec| {
        spec.args = vec!["--replicas".into(), "0".into()];
    })
    .await?;
    let ids = ["node-0", "node-1"];
    let key = key_owned_by(&ids, "node-1", "log", 1_000, 60_000);
    assert_eq!(
        nodes[0].check(&inline(&key, 1_000, 60_000)).await?.status,
        200
    );
    let joined = count(&nodes[0].log(), 0, &["member joined", "member=node-1"]);
    assert_eq!(joined, 1, "{}", nodes[0].log());

    // node-1 freezes: forwarded checks time out and the circuit opens — once.
    let before = nodes[0].log().lines().count();
    nodes[1].pause()?;
    for _ in 0..6 {
        let r = nodes[0].check(&inline(&key, 1_000, 60_000)).await?;
        assert_eq!(r.json()?["degraded"], true);
    }
    nodes[1].resume()?;
    // Once the circuit lets a check through again, it closes — once.
    wait_until("the owner answers again", WAIT, || async {
        Ok(nodes[0].check(&inline(&key, 1_000, 60_000)).await?.json()?["degraded"] == false)
    })
    .await?;
    for _ in 0..20 {
        nodes[0].check(&inline(&key, 1_000, 60_000)).await?;
    }
    let log = nodes[0].log();
    assert_eq!(
        count(&log, before, &["WARN", "peer too slow; circuit opened"]),
        1,
        "{log}"
    );
    assert_eq!(
        count(&log, before, &["INFO", "peer circuit closed"]),
        1,
        "{log}"
    );

    // node-1 leaves: one line for leaving, and one when it is declared dead after it exits.
    let before = nodes[0].log().lines().count();
    assert_eq!(nodes[1].stop().await?, 0);
    wait_until("node-0 declares node-1 dead", WAIT, || async {
        Ok(nodes[0].cluster().await?.state_of("node-1").as_deref() == Some("dead"))
    })
    .await?;
    let log = nodes[0].log();
    assert_eq!(
        count(&log, before, &["INFO", "member leaving", "member=node-1"]),
        1,
        "{log}"
    );
    assert_eq!(
        count(
            &log,
            before,
            &["WARN", "member declared dead", "member=node-1"]
        ),
        1,
        "{log}"
    );
    // No line per check: ~30 checks above, and far fewer lines in all.
    assert!(log.lines().count() < 30, "{log}");
    Ok(())
}

/// The top-keys table cannot be blinded: 128 inline rules (anyone's to name) counted twice each
/// fill the node's 128 places, yet a later rule's 47 denials show in `/v1/admin/top`, and the
/// rule it replaced is counted in `ringlimit_top_rules_replaced_total`.
#[tokio::test]
async fn top_keys_show_a_rule_denied_after_the_table_filled() -> Result<()> {
    let mut config = NodeConfig::local("top-full");
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    for r in 0..128u64 {
        let checks: Vec<Value> = (0..2).map(|_| inline("filler", 1, 60_000 + r)).collect();
        let b = node.batch(&checks).await?;
        ensure!(b.status == 200, "{}", b.text);
    }
    for _ in 0..48 {
        node.check(&inline("victim", 1, 3_600_000)).await?;
    }
    let r = admin(
        &node,
        false,
        "/v1/admin/top?rule=1-per-3600000ms&by=denied",
        Some(TOKEN),
    )
    .await?;
    ensure!(r.status == 200, "{}", r.text);
    let top = r.json()?;
    ensure!(
        top["keys"][0]["key"] == "victim" && top["keys"][0]["count"].as_u64() >= Some(40),
        "{top}"
    );
    let metrics = scrape(&node).await?;
    ensure!(
        series(&metrics, "ringlimit_top_rules") == Some(128.0)
            && series(&metrics, "ringlimit_top_rules_replaced_total") == Some(1.0),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("top_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    node.stop().await?;
    Ok(())
}

/// An operator removing a token sees it stop working: the `--admin-tokens` file deleted, or
/// left listing no token, revokes its tokens within a poll (RINGLIMIT_ADMIN_TOKEN's stays); put
/// back, they work again.
#[tokio::test]
async fn deleting_or_emptying_the_admin_tokens_file_revokes_its_tokens() -> Result<()> {
    const ALICE: &str = "alice-token-0123456789";
    let dir = TempDir::new("admin-tokens")?;
    let path = dir.0.join("tokens.yaml");
    let file = format!("tokens: [{{ name: alice, token: {ALICE}, role: write }}]\n");
    std::fs::write(&path, &file)?;
    let mut config = NodeConfig::local("tokens-revoked");
    config.admin_token = Some(TOKEN.into());
    config.admin_tokens = Some(path.clone());
    config.rules_poll = Duration::from_millis(50);
    let node = TestNode::start(config).await?;
    let status = |token: &'static str| {
        let node = &node;
        async move {
            Ok::<u16, anyhow::Error>(
                admin(node, false, "/v1/admin/rules", Some(token))
                    .await?
                    .status,
            )
        }
    };
    ensure!(status(ALICE).await? == 200);
    for (what, emptied) in [
        ("deleted", None),
        ("emptied", Some("")),
        ("no token", Some("tokens: []\n")),
    ] {
        match emptied {
            None => std::fs::remove_file(&path)?,
            Some(text) => std::fs::write(&path, text)?,
        }
        wait_until(&format!("alice's token revoked ({what})"), WAIT, || async {
            Ok(status(ALICE).await? == 401)
        })
        .await?;
        ensure!(status(TOKEN).await? == 200, "{what}: the variable's token");
        std::fs::write(&path, &file)?;
        wait_until(&format!("alice's token back ({what})"), WAIT, || async {
            Ok(status(ALICE).await? == 200)
        })
        .await?;
    }
    node.stop().await?;
    Ok(())
}
