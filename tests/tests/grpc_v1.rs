//! `ringlimit.v1.RateLimiter` and `grpc.health.v1` on a real node: the HTTP API's three checks
//! as gRPC over the same buckets, with the same validation and error codes (a gRPC status
//! whose message starts with the HTTP API's code), and from Python grpcio with stubs that
//! `grpc_tools` compiles from our `.proto` at test time.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::grpc::ringlimit_v1::pb;
use ringlimit_node::grpc::ringlimit_v1::pb::rate_limiter_client::RateLimiterClient;
use ringlimit_tests::{
    TestCluster, TestNode, WAIT, python_with, run_client_script, wait_until, with_limit_rules,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn with_rules(config: &mut NodeConfig) {
    with_limit_rules(config);
    config.grpc_addr = "127.0.0.1:0".parse().ok();
}

fn named(rule: &str, key: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Rule(rule.into())),
        cost: None,
        hold: false,
    }
}

fn inline(key: &str, limit: u64, period_ms: u64, algorithm: i32) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Inline(pb::InlineRule {
            limit,
            period_ms,
            algorithm,
            burst: None,
            ..Default::default()
        })),
        cost: None,
        hold: false,
    }
}

/// The status's gRPC code and the HTTP API code its message starts with.
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (Code, String) {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => (
            s.code(),
            s.message().split(':').next().unwrap_or("").to_owned(),
        ),
    }
}

async fn client(node: &TestNode) -> Result<RateLimiterClient<Channel>> {
    let addr = node.grpc.context("a gRPC address")?;
    Ok(RateLimiterClient::connect(format!("http://{addr}")).await?)
}

#[tokio::test]
async fn health_reports_serving_for_every_service() -> Result<()> {
    let mut config = NodeConfig::local("grpc-health");
    with_rules(&mut config);
    let node = TestNode::start(config).await?;
    let addr = node.grpc.context("a gRPC address")?;
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut health = HealthClient::new(channel);
    for service in [
        "",
        "ringlimit.v1.RateLimiter",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        wait_until(&format!("{service:?} SERVING"), WAIT, || {
            let mut health = health.clone();
            async move {
                let r = health
                    .check(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await?
                    .into_inner();
                Ok(r.status == ServingStatus::Serving as i32)
            }
        })
        .await?;
    }
    let (code, _) = refused(
        health
            .check(HealthCheckRequest {
                service: "no.such.Service".into(),
            })
            .await,
    );
    assert_eq!(code, Code::NotFound);
    node.stop().await
}

#[tokio::test]
async fn check_batch_and_all_share_the_http_apis_buckets_and_errors() -> Result<()> {
    let mut config = NodeConfig::local("grpc-v1");
    with_rules(&mut config);
    let node = TestNode::start(config).await?;
    let mut c = client(&node).await?;

    // Check: the same bucket as POST /v1/check.
    let a = c.check(named("per-user", "u1")).await?.into_inner();
    assert!(a.allowed);
    assert_eq!((a.limit, a.remaining, a.retry_after_ms), (3, 2, 0));
    assert_eq!(a.shadow_denied, None);
    let http = node
        .api()
        .check(&json!({ "rule": "per-user", "key": "u1", "cost": 0 }))
        .await?
        .json()?;
    assert_eq!(http["remaining"], 2, "gRPC and HTTP share the bucket");
    let mut heavy = named("per-user", "u1");
    heavy.cost = Some(2);
    assert!(c.check(heavy.clone()).await?.into_inner().allowed);
    let denied = c.check(named("per-user", "u1")).await?.into_inner();
    assert!(!denied.allowed);
    assert!(denied.retry_after_ms > 0);
    // Inline rules, every algorithm.
    for algorithm in 0..=5 {
        let key = format!("inline-{algorithm}");
        let r = c
            .check(inline(&key, 2, 60_000, algorithm))
            .await?
            .into_inner();
        assert!(r.allowed, "algorithm {algorithm}");
        assert_eq!(r.limit, 2);
    }

    // Errors: the HTTP API's codes, as statuses.
    let mut no_rule = named("per-user", "u1");
    no_rule.rule_spec = None;
    let mut zero_period = inline("k", 1, 0, 0);
    zero_period.cost = Some(1);
    let mut too_costly = named("per-user", "u9");
    too_costly.cost = Some(4);
    let cases = [
        (named("per-user", ""), Code::InvalidArgument, "invalid_key"),
        (named("nope", "k"), Code::NotFound, "unknown_rule"),
        (no_rule, Code::InvalidArgument, "invalid_request"),
        (
            inline("k", 1, 1000, 99),
            Code::InvalidArgument,
            "unknown_algorithm",
        ),
        (
            inline("k", 0, 1000, 0),
            Code::InvalidArgument,
            "invalid_limit",
        ),
        (zero_period, Code::InvalidArgument, "invalid_period"),
        (too_costly, Code::InvalidArgument, "invalid_cost"),
    ];
    for (request, grpc, code) in cases {
        let got = refused(c.check(request.clone()).await);
        assert_eq!(got, (grpc, code.to_owned()), "{request:?}");
    }
    let u9 = c.check(named("per-user", "u9")).await?.into_inner();
    assert_eq!(u9.remaining, 2, "a refused check changed nothing");

    // CheckBatch: in order, an invalid item's error in its place.
    let mut bad = named("per-user", "u2");
    bad.rule_spec = None;
    let batch = c
        .check_batch(pb::CheckBatchRequest {
            checks: vec![
                named("per-user", "u2"),
                bad,
                named("nope", "u2"),
                named("per-ip", "ip"),
            ],
        })
        .await?
        .into_inner();
    use pb::check_batch_result::Result as R;
    let kinds: Vec<String> = batch
        .results
        .iter()
        .map(|r| match &r.result {
            Some(R::Answer(a)) => format!("remaining {}", a.remaining),
            Some(R::Error(e)) => e.error.clone(),
            None => "none".into(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "remaining 2",
            "invalid_request",
            "unknown_rule",
            "remaining 9"
        ]
    );
    let empty = refused(
        c.check_batch(pb::CheckBatchRequest { checks: vec![] })
            .await,
    );
    assert_eq!(empty, (Code::InvalidArgument, "invalid_batch".into()));
    let huge = pb::CheckBatchRequest {
        checks: vec![named("per-ip", "x"); 1001],
    };
    assert_eq!(
        refused(c.check_batch(huge).await),
        (Code::InvalidArgument, "invalid_batch".into())
    );

    // CheckAll: all-or-nothing; the denied request leaves the IP's bucket as it was.
    let all = |user: &str| pb::CheckAllRequest {
        checks: vec![
            named("per-ip", "ip-a"),
            named("per-user", user),
            named("trial", user),
        ],
    };
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(c.check_all(all("u3")).await?.into_inner());
    }
    let allowed: Vec<bool> = answers.iter().map(|a| a.allowed).collect();
    assert_eq!(allowed, [true, true, true, false]);
    let last = &answers[3];
    assert_eq!(last.binding_index, 1, "per-user binds");
    assert_eq!(last.binding.as_ref().map(|b| b.limit), Some(3));
    assert_eq!(last.results.len(), 3);
    assert_eq!(last.results[2].shadow_denied, Some(true));
    assert!(last.results[2].allowed, "a shadow rule never denies");
    assert_eq!(answers[0].results[2].shadow_denied, Some(false));
    let ip = c
        .check(pb::CheckRequest {
            cost: Some(0),
            ..named("per-ip", "ip-a")
        })
        .await?
        .into_inner();
    assert_eq!(ip.remaining, 7, "three admitted, the denied one refunded");
    // Bad requests: nothing consumed, the index named.
    let mut bad = all("u4");
    bad.checks[1].key = String::new();
    let status = c.check_all(bad).await.expect_err("an empty key is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    ensure!(
        status.message().starts_with("invalid_key: check 1:"),
        "{}",
        status.message()
    );
    let mut dup = all("u4");
    dup.checks.push(named("per-ip", "ip-a"));
    assert_eq!(
        refused(c.check_all(dup).await),
        (Code::InvalidArgument, "duplicate_check".into())
    );
    assert_eq!(
        refused(c.check_all(pb::CheckAllRequest { checks: vec![] }).await),
        (Code::InvalidArgument, "invalid_batch".into())
    );
    let ip = c
        .check(pb::CheckRequest {
            cost: Some(0),
            ..named("per-ip", "ip-a")
        })
        .await?
        .into_inner();
    assert_eq!(ip.remaining, 7, "refused requests consumed nothing");
    node.stop().await
}

#[tokio::test]
async fn a_python_grpcio_client_compiled_from_our_proto_against_three_nodes() -> Result<()> {
    let Some(python) = python_with("grpc, grpc_tools") else {
        eprintln!("no Python with grpcio and grpc_tools (made by .ci/run): skipping");
        return Ok(());
    };
    let cluster = TestCluster::start_with(3, with_rules).await?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/v1_client.py");
    let protos = concat!(env!("CARGO_MANIFEST_DIR"), "/../crates/proto/proto");
    let args = vec![script.into(), protos.into(), cluster.grpc_addrs()?];
    let calls = run_client_script(python, args).await?;
    let by = |name: &str| calls.by(name);
    // uint64 fields are strings in protobuf's JSON mapping.
    let allowed: Vec<bool> = (0..4)
        .map(|i| by(&format!("user-{i}"))["answer"]["allowed"] == true)
        .collect();
    assert_eq!(allowed, [true, true, true, false], "exact across nodes");
    assert_eq!(by("user-0")["answer"]["remaining"], "2");
    assert_eq!(by("inline")["answer"]["remaining"], "3");
    let all: Vec<bool> = (0..4)
        .map(|i| by(&format!("all-{i}"))["allowed"] == true)
        .collect();
    assert_eq!(all, [true, true, true, false]);
    let denied = by("all-3");
    assert_eq!(denied["binding_index"], 1);
    assert_eq!(denied["results"][2]["shadow_denied"], true);
    assert_eq!(
        by("ip-after")["answer"]["remaining"],
        "7",
        "the denial refunded"
    );
    let batch = by("batch");
    assert_eq!(batch["results"][0]["answer"]["remaining"], "9");
    assert_eq!(batch["results"][1]["error"]["error"], "invalid_request");
    assert_eq!(batch["results"][2]["error"]["error"], "unknown_rule");
    for (call, code, prefix) in [
        ("empty-key", "INVALID_ARGUMENT", "invalid_key:"),
        ("unknown-rule", "NOT_FOUND", "unknown_rule:"),
        ("bad-algorithm", "INVALID_ARGUMENT", "unknown_algorithm:"),
        ("all-empty", "INVALID_ARGUMENT", "invalid_batch:"),
    ] {
        let line = by(call);
        assert_eq!(line["error"], code, "{line}");
        assert!(
            line["message"].as_str().unwrap_or("").starts_with(prefix),
            "{line}"
        );
    }
    for node in cluster.iter() {
        node.wait_ready().await?;
    }
    cluster.stop().await
}

/// `Reserve` and `Settle` over gRPC, through different nodes of three: a denied reserve is an
/// answer with no reservation; a settle gives back; a second settle and a garbage id are
/// NOT_FOUND unknown_reservation; a bad ttl_ms is INVALID_ARGUMENT; an id taken over gRPC
/// settles over HTTP.
#[tokio::test]
async fn reserve_and_settle_over_grpc_route_to_the_owner() -> Result<()> {
    let cluster = TestCluster::start_with(3, with_rules).await?;
    let (mut a, mut b) = (client(&cluster[0]).await?, client(&cluster[1]).await?);
    // A day's fixed window of 1,000 (no boundary within the test).
    let mut check = inline(
        "grpc:llm",
        1_000,
        86_400_000,
        pb::Algorithm::FixedWindow as i32,
    );
    check.cost = Some(600);
    let reserve = |check: &pb::CheckRequest, ttl_ms| pb::ReserveRequest {
        check: Some(check.clone()),
        ttl_ms,
    };
    let r = a.reserve(reserve(&check, None)).await?.into_inner();
    let answer = r.answer.context("an answer")?;
    ensure!(
        answer.allowed && answer.remaining == 400 && r.cost == 600,
        "{r:?}"
    );
    ensure!(!r.reservation.is_empty());
    // 600 more do not fit: denied, nothing kept.
    let denied = b.reserve(reserve(&check, Some(5_000))).await?.into_inner();
    ensure!(
        denied.reservation.is_empty() && !denied.answer.context("an answer")?.allowed,
        "{denied:?}"
    );
    let settled = b
        .settle(pb::SettleRequest {
            reservation: r.reservation.clone(),
            cost: 100,
        })
        .await?
        .into_inner();
    ensure!(settled.remaining == 900, "{settled:?}");
    let again = pb::SettleRequest {
        reservation: r.reservation,
        cost: 100,
    };
    ensure!(refused(a.settle(again).await) == (Code::NotFound, "unknown_reservation".into()));
    let garbage = pb::SettleRequest {
        reservation: "not-an-id".into(),
        cost: 1,
    };
    ensure!(refused(b.settle(garbage).await) == (Code::NotFound, "unknown_reservation".into()));
    ensure!(
        refused(a.reserve(reserve(&check, Some(0))).await)
            == (Code::InvalidArgument, "invalid_request".into())
    );
    ensure!(
        refused(
            a.reserve(pb::ReserveRequest {
                check: None,
                ttl_ms: None
            })
            .await
        ) == (Code::InvalidArgument, "invalid_request".into())
    );
    // Taken over gRPC, settled over HTTP through the third node.
    let r = a.reserve(reserve(&check, None)).await?.into_inner();
    let reply = cluster[2]
        .api()
        .post(
            "/v1/settle",
            &json!({ "reservation": r.reservation, "cost": 600 }),
        )
        .await?;
    ensure!(reply.status == 200, "{}", reply.text);
    ensure!(reply.json()?["remaining"] == 300, "{}", reply.text);
    Ok(())
}

/// A change to an inline rule message.
type Edit = fn(&mut pb::InlineRule);

/// An inline rule in the rules file's words: `period`, `calendar`, `timezone`.
fn calendar_inline(key: &str, limit: u64, f: impl FnOnce(&mut pb::InlineRule)) -> pb::CheckRequest {
    let mut rule = pb::InlineRule {
        limit,
        algorithm: pb::Algorithm::FixedWindow as i32,
        ..Default::default()
    };
    f(&mut rule);
    pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Inline(rule)),
        cost: None,
        hold: false,
    }
}

fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

/// The first instant (Unix ms) of the calendar month after the one holding `ms` in `zone`.
fn next_month_start(ms: u64, zone: &str) -> Result<u64> {
    let tz = jiff::tz::TimeZone::get(zone)?;
    let ts = jiff::Timestamp::from_millisecond(i64::try_from(ms)?)?;
    let first = ts
        .to_zoned(tz.clone())
        .date()
        .first_of_month()
        .checked_add(jiff::Span::new().months(1))?;
    let start = first.to_zoned(tz)?.start_of_day()?;
    Ok(u64::try_from(start.timestamp().as_millisecond())?)
}

#[tokio::test]
async fn inline_calendar_windows_over_grpc_reset_at_the_local_boundary() -> Result<()> {
    let mut config = NodeConfig::local("grpc-calendar");
    with_rules(&mut config);
    let node = TestNode::start(config).await?;
    let mut c = client(&node).await?;

    let monthly = calendar_inline("acct", 2, |r| {
        r.period = "1mo".into();
        r.calendar = true;
        r.timezone = "Europe/Berlin".into();
    });
    let before = now_ms();
    for _ in 0..2 {
        assert!(c.check(monthly.clone()).await?.into_inner().allowed);
    }
    let denied = c.check(monthly.clone()).await?.into_inner();
    let after = now_ms();
    assert!(!denied.allowed);
    let ends = [
        next_month_start(before, "Europe/Berlin")?,
        next_month_start(after, "Europe/Berlin")?,
    ];
    assert!(
        ends.contains(&denied.reset_at_ms),
        "reset {} expected {ends:?}",
        denied.reset_at_ms
    );
    assert!(denied.retry_after_ms <= denied.reset_at_ms - before);
    // The same over HTTP: one bucket for one rule.
    let http = node
        .api()
        .check(&json!({
            "key": "acct", "limit": 2, "period": "1mo", "algorithm": "fixed_window",
            "calendar": true, "timezone": "Europe/Berlin", "cost": 0,
        }))
        .await?
        .json()?;
    assert_eq!(
        http["remaining"], 0,
        "gRPC and HTTP share the bucket: {http}"
    );

    // `period` with a `period_ms` that agrees, and a calendar day given by `period_ms`.
    let agreeing = calendar_inline("day", 1, |r| {
        r.period = "1d".into();
        r.period_ms = 86_400_000;
    });
    assert!(c.check(agreeing).await?.into_inner().allowed);
    let by_ms = calendar_inline("day-utc", 1, |r| {
        r.period_ms = 86_400_000;
        r.calendar = true;
    });
    let a = c.check(by_ms).await?.into_inner();
    assert!(a.allowed);
    assert_eq!(a.reset_at_ms % 86_400_000, 0, "a UTC day ends at midnight");

    // Bad input: INVALID_ARGUMENT with the HTTP API's codes, and no bucket changed.
    let cases: [(Edit, &str, &str); 6] = [
        (
            |r| {
                r.period = "1d".into();
                r.calendar = true;
                r.timezone = "Mars/Olympus".into();
            },
            "invalid_rule",
            "Mars/Olympus",
        ),
        (
            |r| r.period = "1mo".into(),
            "invalid_period",
            "calendar: true",
        ),
        (
            |r| {
                r.period = "1d".into();
                r.calendar = true;
                r.algorithm = pb::Algorithm::TokenBucket as i32;
            },
            "invalid_rule",
            "fixed_window",
        ),
        (
            |r| {
                r.period = "1h".into();
                r.calendar = true;
            },
            "invalid_rule",
            "1d, 1w or 1mo",
        ),
        (
            |r| {
                r.period = "1d".into();
                r.period_ms = 1000;
            },
            "invalid_request",
            "disagree",
        ),
        (
            |r| {
                r.period_ms = 60_000;
                r.timezone = "Europe/Berlin".into();
            },
            "invalid_rule",
            "calendar: true",
        ),
    ];
    for (f, code, words) in cases {
        let request = calendar_inline("bad", 1, f);
        let status = match c.check(request.clone()).await {
            Ok(a) => panic!("{request:?} was answered: {a:?}"),
            Err(s) => s,
        };
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{request:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(&format!("{code}: ")) && status.message().contains(words),
            "{request:?}: {}",
            status.message()
        );
    }
    // Nothing was taken: the valid daily calendar rule of the same numbers admits its one.
    let fine = calendar_inline("bad", 1, |r| {
        r.period = "1d".into();
        r.calendar = true;
    });
    assert!(c.check(fine).await?.into_inner().allowed);
    node.stop().await
}
