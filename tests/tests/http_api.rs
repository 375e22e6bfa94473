//! The HTTP API of one node, against its reference (`docs/src/reference/http-api.md`).

use anyhow::Result;
use ringlimit_node::NodeConfig;
use ringlimit_node::rules::RuleSet;
use ringlimit_tests::{TestNode, WAIT, wait_until};
use serde_json::{Value, json};
use std::time::Duration;

fn inline(key: &str, limit: u64, period_ms: u64) -> Value {
    json!({ "key": key, "limit": limit, "period_ms": period_ms })
}

#[tokio::test]
async fn allows_up_to_limit_then_denies_with_headers() -> Result<()> {
    let node = TestNode::single().await?;
    for i in 0..5u64 {
        let r = node.check(&inline("user:42", 5, 60_000)).await?;
        assert_eq!(r.status, 200, "{}", r.text);
        let body = r.json()?;
        assert_eq!(body["allowed"], true);
        assert_eq!(body["limit"], 5);
        assert_eq!(body["remaining"], 4 - i);
        assert_eq!(body["retry_after_ms"], 0);
        assert_eq!(body["degraded"], false);
        assert_eq!(r.header("x-ratelimit-limit"), "5");
        assert_eq!(r.header("x-ratelimit-remaining"), (4 - i).to_string());
        let reset_s: u64 = r.header("x-ratelimit-reset").parse()?;
        assert_eq!(
            reset_s,
            body["reset_at_ms"].as_u64().unwrap_or(0).div_ceil(1000)
        );
        assert!(r.header("retry-after").is_empty());
    }
    let r = node.check(&inline("user:42", 5, 60_000)).await?;
    assert_eq!(r.status, 429);
    let body = r.json()?;
    assert_eq!(body["allowed"], false);
    assert_eq!(body["remaining"], 0);
    let retry_ms = body["retry_after_ms"].as_u64().unwrap_or(0);
    // One token refills every 12 s.
    assert!(
        retry_ms > 11_000 && retry_ms <= 12_000,
        "retry_after_ms {retry_ms}"
    );
    let retry_after: u64 = r.header("retry-after").parse()?;
    assert_eq!(retry_after, retry_ms.div_ceil(1000));
    // Another key is independent.
    assert_eq!(node.check(&inline("user:43", 5, 60_000)).await?.status, 200);
    node.stop().await
}

#[tokio::test]
async fn every_algorithm_answers_and_limits() -> Result<()> {
    let node = TestNode::single().await?;
    for algo in [
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
    ] {
        let req = json!({ "key": "k", "limit": 3, "period_ms": 60_000, "algorithm": algo });
        let statuses = futures_statuses(&node, &req, 4).await?;
        assert_eq!(statuses, [200, 200, 200, 429], "{algo}");
    }
    node.stop().await
}

async fn futures_statuses(node: &TestNode, req: &Value, n: usize) -> Result<Vec<u16>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(node.check(req).await?.status);
    }
    Ok(out)
}

#[tokio::test]
async fn cost_and_peek() -> Result<()> {
    let node = TestNode::single().await?;
    let mut req = json!({ "key": "c", "limit": 10, "period_ms": 60_000, "cost": 7 });
    assert_eq!(node.check(&req).await?.json()?["remaining"], 3);
    req["cost"] = json!(4);
    let r = node.check(&req).await?;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()?["remaining"], 3, "a denial consumes nothing");
    req["cost"] = json!(0);
    for _ in 0..3 {
        let r = node.check(&req).await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()?["remaining"], 3, "a peek consumes nothing");
    }
    node.stop().await
}

#[tokio::test]
async fn named_rules_builtin_and_unknown() -> Result<()> {
    let node = TestNode::single().await?;
    let r = node
        .check(&json!({ "key": "u", "rule": "default" }))
        .await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()?["limit"], 100);
    let r = node.check(&json!({ "key": "u", "rule": "nope" })).await?;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()?["error"], "unknown_rule");
    node.stop().await
}

/// Every kind of bad input: a 4xx with the contract's body, and the bucket untouched.
#[tokio::test]
async fn bad_input_gets_4xx_and_never_changes_a_bucket() -> Result<()> {
    let node = TestNode::single().await?;
    let long_key = "k".repeat(513);
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "invalid_json"),
        (b"".to_vec(), 400, "invalid_json"),
        (b"[1,2]".to_vec(), 400, "invalid_request"),
        (
            b"{\"key\":\"b\",\"limit\":2,\"period_ms\":60000} trailing".to_vec(),
            400,
            "invalid_json",
        ),
        (
            br#"{"limit":2,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":"2","period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":2.5,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":-2,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"cost":-1}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"extra":1}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","limit":0,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_limit",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":0}"#.to_vec(),
            400,
            "invalid_period",
        ),
        (br#"{"key":"b","limit":2}"#.to_vec(), 400, "invalid_request"),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"algorithm":"gcra"}"#.to_vec(),
            400,
            "unknown_algorithm",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"cost":3}"#.to_vec(),
            400,
            "invalid_cost",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"burst":0}"#.to_vec(),
            400,
            "invalid_burst",
        ),
        (
            br#"{"key":"b","limit":2,"period_ms":60000,"algorithm":"fixed_window","burst":3}"#
                .to_vec(),
            400,
            "invalid_burst",
        ),
        (
            br#"{"key":"b","limit":20000,"period_ms":60000,"algorithm":"sliding_log"}"#.to_vec(),
            400,
            "invalid_limit",
        ),
        (
            br#"{"key":"b","limit":99999999999,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_limit",
        ),
        (
            br#"{"key":"b","limit":99999999999999999999999,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"b","rule":"default","limit":2,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            br#"{"key":"","limit":2,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_key",
        ),
        (
            format!(r#"{{"key":"{long_key}","limit":2,"period_ms":60000}}"#).into_bytes(),
            400,
            "invalid_key",
        ),
        (
            br#"{"key":"b","rule":"missing"}"#.to_vec(),
            404,
            "unknown_rule",
        ),
        (
            br#"{"key":null,"limit":2,"period_ms":60000}"#.to_vec(),
            400,
            "invalid_request",
        ),
    ];
    for (body, status, code) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let r = node.post_raw("/v1/check", body).await?;
        assert_eq!(r.status, status, "{shown}: {}", r.text);
        let e = r.json()?;
        assert_eq!(e["error"], code, "{shown}: {}", r.text);
        let msg = e["message"].as_str().unwrap_or("");
        assert!(
            msg.len() > 10 && msg.ends_with('.'),
            "{shown}: message {msg:?}"
        );
    }
    // 513 bytes of key is refused; 512 is fine.
    let r = node.check(&inline(&"k".repeat(512), 2, 60_000)).await?;
    assert_eq!(r.status, 200);
    // The bucket all those requests named is still full.
    let r = node
        .check(&json!({ "key": "b", "limit": 2, "period_ms": 60000, "cost": 0 }))
        .await?;
    assert_eq!(r.json()?["remaining"], 2, "bad input changed a bucket");
    node.stop().await
}

#[tokio::test]
async fn oversize_body_is_413() -> Result<()> {
    let node = TestNode::single().await?;
    let body = format!(
        r#"{{"key":"{}","limit":1,"period_ms":1000}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    let r = node.post_raw("/v1/check", body.clone()).await?;
    assert_eq!(r.status, 413, "{}", r.text);
    assert_eq!(r.json()?["error"], "payload_too_large");
    let r = node.post_raw("/v1/check/batch", body).await?;
    assert_eq!(r.status, 413);
    node.stop().await
}

#[tokio::test]
async fn batch_answers_in_order_with_item_errors() -> Result<()> {
    let node = TestNode::single().await?;
    let checks: Vec<Value> = vec![
        inline("b1", 1, 60_000),
        inline("b1", 1, 60_000),
        json!({ "key": "b2" }),
        json!({ "key": "b3", "rule": "nope" }),
        json!({ "key": "b4", "rule": "default", "cost": 2 }),
        json!("not an object"),
    ];
    let r = node
        .post("/v1/check/batch", &json!({ "checks": checks }))
        .await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let results = r.json()?["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 6);
    assert_eq!(results[0]["allowed"], true);
    assert_eq!(results[1]["allowed"], false);
    assert_eq!(results[2]["error"], "invalid_request");
    assert_eq!(results[3]["error"], "unknown_rule");
    assert_eq!(results[4]["remaining"], 98);
    assert_eq!(results[5]["error"], "invalid_request");

    for bad in [json!({ "checks": [] }), json!({}), json!({ "checks": 3 })] {
        let r = node.post("/v1/check/batch", &bad).await?;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
    }
    let too_many: Vec<Value> = (0..1001)
        .map(|i| inline(&format!("m{i}"), 5, 1000))
        .collect();
    let r = node
        .post("/v1/check/batch", &json!({ "checks": too_many }))
        .await?;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()?["error"], "invalid_batch");
    // Nothing of the refused batch was applied.
    let r = node
        .check(&json!({ "key": "m0", "limit": 5, "period_ms": 1000, "cost": 0 }))
        .await?;
    assert_eq!(r.json()?["remaining"], 5);
    let full: Vec<Value> = (0..1000)
        .map(|i| inline(&format!("f{i}"), 5, 1000))
        .collect();
    let r = node
        .post("/v1/check/batch", &json!({ "checks": full }))
        .await?;
    assert_eq!(r.status, 200);
    node.stop().await
}

#[tokio::test]
async fn concurrent_checks_admit_exactly_the_limit() -> Result<()> {
    let node = std::sync::Arc::new(TestNode::single().await?);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            node.check(&inline("hot", 50, 600_000))
                .await
                .map(|r| r.status)
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        if t.await?? == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 50);
    Ok(())
}

#[tokio::test]
async fn health_ready_metrics_and_unknown_paths() -> Result<()> {
    let node = TestNode::single().await?;
    assert_eq!(node.get("/healthz").await?.status, 200);
    assert_eq!(node.get("/readyz").await?.status, 200);
    node.check(&inline("m", 1, 1000)).await?;
    let m = node.get("/metrics").await?;
    assert_eq!(m.status, 200);
    assert!(
        m.text
            .contains("ringlimit_checks_total{result=\"allowed\",mode=\"owner\"} 1"),
        "{}",
        m.text
    );
    assert!(m.text.contains("ringlimit_buckets 1"), "{}", m.text);
    let r = node.get("/v2/nothing").await?;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()?["error"], "not_found");
    node.stop().await
}

/// `POST /v1/check` is answered before the router (`http::fast`); the paths around it must
/// still behave as routes do.
#[tokio::test]
async fn check_path_edges_behave_like_routes() -> Result<()> {
    let node = TestNode::single().await?;
    let r = node.get("/v1/check").await?;
    assert_eq!(r.status, 405, "{}", r.text);
    let r = node
        .post("/v1/check?trace=1", &inline("q", 1, 60_000))
        .await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()?["remaining"], 0);
    let r = node.post("/v1/check/", &inline("q", 1, 60_000)).await?;
    assert_eq!(r.status, 404, "{}", r.text);
    // The query-string check was the one that spent the bucket.
    let r = node.check(&inline("q", 1, 60_000)).await?;
    assert_eq!(r.status, 429, "{}", r.text);
    node.stop().await
}

#[tokio::test]
async fn rules_file_reload_applies_valid_and_refuses_invalid() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ringlimit-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("rules.yaml");
    std::fs::write(&path, "rules:\n  - name: a\n    limit: 1\n    period: 1m\n")?;
    let mut config = NodeConfig::local("reload");
    config.rules = RuleSet::from_yaml(&std::fs::read_to_string(&path)?)?;
    config.rules_path = Some(path.clone());
    config.rules_poll = Duration::from_millis(20);
    let node = TestNode::start(config).await?;
    assert_eq!(
        node.check(&json!({ "key": "k", "rule": "a" }))
            .await?
            .status,
        200
    );
    assert_eq!(
        node.check(&json!({ "key": "k", "rule": "b" }))
            .await?
            .status,
        404
    );

    std::fs::write(
        &path,
        "rules:\n  - name: a\n    limit: 1\n    period: 1m\n  - name: b\n    limit: 2\n    period: 1m\n",
    )?;
    wait_until("rule b in force", WAIT, || async {
        Ok(node
            .check(&json!({ "key": "k", "rule": "b", "cost": 0 }))
            .await?
            .status
            == 200)
    })
    .await?;

    // An invalid file is refused: rule b stays.
    std::fs::write(&path, "rules:\n  - name: b\n    limit: 0\n    period: 1m\n")?;
    wait_until("the invalid file refused", WAIT, || async {
        Ok(node
            .series(r#"ringlimit_rules_reload_total{result="error"}"#)
            .await?
            >= 1.0)
    })
    .await?;
    let r = node.check(&json!({ "key": "k", "rule": "b" })).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()?["limit"], 2);
    node.stop().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::test]
async fn rules_endpoint_lists_the_rules_in_force() -> Result<()> {
    let node = TestNode::single().await?;
    let r = node.api().get("/v1/rules").await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let body = r.json()?;
    let rules = body["rules"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["default", "hourly", "per-second"]);
    let per_second = &rules[2];
    assert_eq!(per_second["limit"], 10);
    assert_eq!(per_second["period_ms"], 1000);
    assert_eq!(per_second["period"], "1s");
    assert_eq!(per_second["algorithm"], "token_bucket");
    assert_eq!(per_second["burst"], 20);
    assert_eq!(per_second["mode"], "owner");
    assert_eq!(per_second["on_owner_unreachable"], "open");
    assert_eq!(per_second["lease"], "auto");
    assert_eq!(
        rules[1]["burst"],
        Value::Null,
        "sliding_window has no burst"
    );
    node.stop().await
}
