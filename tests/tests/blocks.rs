//! Blocks through a real node's sockets: the admin API's blocklist (roles, bad input), and a
//! blocked key denied on every edge — HTTP 429 with `Retry-After` and `"blocked": true`, forward
//! auth through a `{client_ip}` rule and a network block, Envoy RLS `OVER_LIMIT`, ringlimit.v1's
//! `blocked` and `block_reason`.

use anyhow::{Context, Result, ensure};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::Method;
use ringlimit_node::NodeConfig;
use ringlimit_node::grpc::ringlimit_v1::pb;
use ringlimit_node::grpc::ringlimit_v1::pb::rate_limiter_client::RateLimiterClient;
use ringlimit_node::rules::RuleSet;
use ringlimit_node::rules::envoy_config::EnvoyConfig;
use ringlimit_tests::{TestNode, envoy_descriptor};
use serde_json::json;

const WRITER: &str = "writer-token-0123456789";
const READER: &str = "reader-token-0123456789";

const RULES: &str = r#"
rules:
  - { name: per-ip, limit: 1000, period: 1m, request_key: "ip:{client_ip}" }
"#;

const ENVOY: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 100 }
"#;

/// A node with the rules above, the Envoy configuration on gRPC, and a write and a read token.
async fn node(dir: &std::path::Path) -> Result<TestNode> {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n  - {{ name: ops, token: {WRITER}, role: write }}\n  - {{ name: viewer, token: {READER}, role: read }}\n"
        ),
    )?;
    let mut config = NodeConfig::local("blocks");
    config.rules = RuleSet::from_yaml(RULES)?;
    config.admin_tokens = Some(tokens);
    config.grpc_addr = Some("127.0.0.1:0".parse()?);
    config.envoy_config =
        EnvoyConfig::from_files([("d.yaml", ENVOY)]).map_err(|e| anyhow::anyhow!("{e}"))?;
    TestNode::start(config).await
}

#[tokio::test]
async fn a_blocked_key_is_denied_on_http_forward_auth_and_envoy_rls() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ringlimit-blocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let node = node(&dir).await?;
    let hour = json!({ "ttl": "1h", "reason": "abuse report" });

    // Roles: a read token lists but cannot write; bad input is a 400 and changes nothing.
    let r = node
        .admin(
            Method::PUT,
            "/v1/admin/blocks/cidr:203.0.113.0%2F24",
            READER,
            Some(&hour),
        )
        .await?;
    ensure!(r.status == 403, "read token wrote: {} {}", r.status, r.text);
    for (path, body, code) in [
        ("cidr:203.0.113.0%2F33", hour.clone(), "invalid_target"),
        ("k", json!({ "ttl": "0s" }), "invalid_ttl"),
        (
            "k",
            json!({ "ttl": "1h", "reason": "x".repeat(257) }),
            "invalid_reason",
        ),
    ] {
        let r = node
            .admin(
                Method::PUT,
                &format!("/v1/admin/blocks/{path}"),
                WRITER,
                Some(&body),
            )
            .await?;
        ensure!(r.status == 400, "{path}: {} {}", r.status, r.text);
        ensure!(r.json()?["error"] == code, "{path}: {}", r.text);
    }
    let listed = node
        .admin(Method::GET, "/v1/admin/blocks", READER, None)
        .await?
        .json()?;
    ensure!(listed["total"] == 0, "{listed}");

    // A network, and the key Envoy's descriptor (domain d, user=alice) is checked under.
    let r = node
        .admin(
            Method::PUT,
            "/v1/admin/blocks/cidr:203.0.113.0%2F24",
            WRITER,
            Some(&hour),
        )
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    ensure!(r.json()?["by"] == "ops", "{}", r.text);
    let r = node
        .admin(
            Method::PUT,
            "/v1/admin/blocks/1:d%7C4:user=5:alice",
            WRITER,
            Some(&hour),
        )
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let listed = node
        .admin(Method::GET, "/v1/admin/blocks?reason=abuse", READER, None)
        .await?
        .json()?;
    ensure!(listed["total"] == 2, "{listed}");

    // HTTP: 429, Retry-After the block's rest (an hour), blocked with its reason code.
    let r = node
        .check(&json!({ "key": "ip:203.0.113.77", "rule": "per-ip" }))
        .await?;
    ensure!(r.status == 429, "{} {}", r.status, r.text);
    let retry: u64 = r.header("retry-after").parse().context("Retry-After")?;
    ensure!((3590..=3600).contains(&retry), "Retry-After {retry}");
    let body = r.json()?;
    ensure!(
        body["blocked"] == true && body["block_reason"] == "managed",
        "{body}"
    );
    let r = node
        .check(&json!({ "key": "ip:198.51.100.1", "rule": "per-ip" }))
        .await?;
    ensure!(
        r.status == 200,
        "outside the network: {} {}",
        r.status,
        r.text
    );

    // Forward auth: the client's address from X-Forwarded-For, in the blocked network.
    let client = reqwest::Client::new();
    let fa = |ip: &'static str| {
        client
            .get(format!("http://{}/v1/forward-auth?rules=per-ip", node.http))
            .header("x-forwarded-for", ip)
            .send()
    };
    let r = fa("203.0.113.9").await?;
    ensure!(r.status() == 429, "forward auth: {}", r.status());
    ensure!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await?;
    ensure!(
        body["blocked"] == true && body["results"][0]["blocked"] == true,
        "{body}"
    );
    ensure!(fa("198.51.100.9").await?.status() == 200);

    // Envoy RLS: OVER_LIMIT for the blocked descriptor, OK for another.
    let addr = node.grpc.context("a gRPC address")?;
    let mut rls = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
    for (user, want) in [("alice", Code::OverLimit), ("bob", Code::Ok)] {
        let r = rls
            .should_rate_limit(RateLimitRequest {
                domain: "d".into(),
                descriptors: vec![envoy_descriptor(&[("user", user)])],
                hits_addend: 1,
            })
            .await?
            .into_inner();
        ensure!(r.overall_code == want as i32, "{user}: {r:?}");
    }

    // ringlimit.v1: denied, blocked, with the reason code (a check, and an all-or-nothing).
    let mut v1 = RateLimiterClient::connect(format!("http://{addr}")).await?;
    let req = |key: &str| pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Rule("per-ip".into())),
        cost: None,
        hold: false,
    };
    let r = v1.check(req("ip:203.0.113.77")).await?.into_inner();
    ensure!(
        !r.allowed && r.blocked && r.block_reason() == pb::BlockReason::Managed,
        "{r:?}"
    );
    ensure!(r.retry_after_ms > 3_500_000, "{r:?}");
    let r = v1.check(req("ip:198.51.100.1")).await?.into_inner();
    ensure!(
        r.allowed && !r.blocked && r.block_reason() == pb::BlockReason::Unspecified,
        "{r:?}"
    );
    let r = v1
        .check_all(pb::CheckAllRequest {
            checks: vec![req("ip:198.51.100.2"), req("ip:203.0.113.78")],
        })
        .await?
        .into_inner();
    ensure!(
        !r.allowed && r.results[1].blocked && !r.results[0].blocked,
        "{r:?}"
    );

    // Lifted: answered by the bucket again.
    let r = node
        .admin(
            Method::DELETE,
            "/v1/admin/blocks/cidr:203.0.113.0%2F24",
            WRITER,
            None,
        )
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let r = node
        .check(&json!({ "key": "ip:203.0.113.77", "rule": "per-ip" }))
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let _ = std::fs::remove_dir_all(&dir);
    node.stop().await
}

/// A key crossing its rule's `after` denials through one node of three is answered blocked
/// through each of the others within a second, and admitted again once the block ends.
#[tokio::test]
async fn an_automatic_block_reaches_every_node_within_a_second_and_ends() -> Result<()> {
    const AUTO: &str = r#"
rules:
  - name: login
    limit: 1
    period: 1s
    block: { after: 3, within: 1m, for: 3s }
"#;
    let c = ringlimit_tests::TestCluster::start_with(3, |config| {
        config.rules = RuleSet::from_yaml(AUTO).unwrap_or_default();
    })
    .await?;
    let check = json!({ "key": "user:7", "rule": "login" });
    // One admitted, then denials through node-0 until one answers blocked (the third
    // denial earns it at the key's owner, which answers it blocked when node-0 forwards).
    let first = c[0].check(&check).await?;
    ensure!(first.status == 200, "{} {}", first.status, first.text);
    for _ in 0..3 {
        let r = c[0].check(&check).await?;
        ensure!(r.status == 429, "{} {}", r.status, r.text);
    }
    let blocked_at = std::time::Instant::now();
    let mut seen = Vec::new();
    for node in &c[1..] {
        ringlimit_tests::wait_until(
            "the block answered through another node",
            std::time::Duration::from_secs(1),
            || async {
                let r = node.check(&check).await?;
                Ok(r.status == 429 && r.json()?["blocked"] == true)
            },
        )
        .await?;
        seen.push(blocked_at.elapsed());
    }
    ensure!(
        seen.iter().all(|s| s.as_millis() <= 1_000),
        "blocked on every node within 1 s: {seen:?}"
    );
    // The block ends 3 s after it was made (watched with reads, which earn no denials): then
    // the bucket (refilled) admits the key.
    let read = json!({ "key": "user:7", "rule": "login", "cost": 0 });
    ringlimit_tests::wait_until(
        "admitted again after the block",
        std::time::Duration::from_secs(5),
        || async {
            for node in c.iter() {
                let r = node.check(&read).await?;
                if r.json()?.get("blocked").is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    let ended = blocked_at.elapsed();
    ensure!(
        ended.as_millis() >= 2_500,
        "not answered before the block ended: {ended:?}"
    );
    eprintln!("blocked through the others after {seen:?}; admitted again after {ended:?}");
    let r = c[1].check(&check).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}
