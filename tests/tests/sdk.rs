//! The client SDK (`ringlimit-client`) against real clusters on loopback: owner routing, the
//! fallback when an owner dies, membership refresh, misuse errors, and the tower layer.

use anyhow::{Context, Result, ensure};
use ringlimit_client::layer::key;
use ringlimit_client::{Check, Client, ClientError, FailMode, InlineRule, RateLimitLayer};
use ringlimit_node::NodeConfig;
use ringlimit_proto::Algorithm;
use ringlimit_tests::{
    Api, ProcessNode, Progress, TestCluster, TestNode, WAIT, exclusive, metric, owner_of,
    wait_until,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const MINUTE: Duration = Duration::from_secs(60);

fn http_seeds<'a>(addrs: impl IntoIterator<Item = &'a std::net::SocketAddr>) -> Vec<String> {
    addrs.into_iter().map(|a| format!("http://{a}")).collect()
}

/// A client for tests about what answers say, not about deadlines: a deadline far above any
/// answer time. On the default 5 ms, a debug build on a loaded 2-core host sometimes answers
/// late, the client falls back to its own share, and a test of exact counts (the layer's
/// all-or-nothing refund) saw a degraded answer's count instead of the node's.
async fn client_for(seeds: Vec<String>) -> Result<Client> {
    Ok(Client::builder()
        .seeds(seeds)
        .deadline(Duration::from_secs(1))
        .build()
        .await?)
}

#[tokio::test]
async fn owner_routing_is_exact_and_skips_the_http_hop() -> Result<()> {
    let cluster = TestCluster::start(3).await?;
    // One seed is enough: the client learns the others. A deadline far above any answer time:
    // this test is about where checks go, and a debug build on a loaded 2-core host sometimes
    // answers a 300-check group in more than the default 5 ms (which would fall back).
    let client = Client::builder()
        .seeds(http_seeds([&cluster[0].http]))
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    assert_eq!(client.members(), cluster.ids());
    let ids: Vec<String> = cluster.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();

    // 40 keys, 8 checks each, limit 5 per minute: exactly 5 admitted per key.
    let mut owners = std::collections::HashMap::new();
    for k in 0..40 {
        let key = format!("sdk:{k}");
        let check = Check::inline(&key, 5, MINUTE);
        let owner = client.owner_of(&check).context("owner known")?;
        assert_eq!(
            owner,
            owner_of(&ids, &key, 5, 60_000)?,
            "same ring as nodes"
        );
        *owners.entry(owner).or_insert(0) += 1;
        let mut admitted = 0;
        for _ in 0..8 {
            let a = client.check(&check).await?;
            assert!(!a.degraded, "{a:?}");
            assert_eq!(a.limit, 5);
            admitted += usize::from(a.allowed);
        }
        assert_eq!(admitted, 5, "key {key}");
    }
    assert_eq!(owners.len(), 3, "keys spread over every member: {owners:?}");

    // A batch over a named rule (built-in `per-second`: 10/s, burst 20), 30 checks per key:
    // the burst of 20 admitted, and at most a token or two more as the batch runs.
    let checks: Vec<Check> = (0..300)
        .map(|i| Check::named("per-second", format!("batch:{}", i % 10)))
        .collect();
    let answers = client.check_many(&checks).await;
    for k in 0..10 {
        let admitted = answers
            .iter()
            .skip(k)
            .step_by(10)
            .filter(|a| matches!(a, Ok(a) if a.allowed && !a.degraded))
            .count();
        assert!(
            (20..=22).contains(&admitted),
            "key {k}: {admitted} admitted"
        );
    }

    // Nothing went through a node's HTTP hop or a node-to-node forward.
    for node in cluster.iter() {
        let view = node.cluster().await?;
        assert_eq!(view.forwarding("forwarded"), 0, "{}", node.node_id);
        assert_eq!(view.forwarding("fail_open"), 0, "{}", node.node_id);
    }
    let stats = client.stats();
    assert_eq!(stats.direct, 40 * 8 + 300);
    assert_eq!(stats.degraded, 0);
    eprintln!(
        "sdk stats: {stats:?}; checks per frame {:.1}",
        stats.checks_sent as f64 / stats.frames.max(1) as f64
    );
    cluster.stop().await
}

#[tokio::test]
async fn misuse_is_a_typed_error_and_touches_no_bucket() -> Result<()> {
    let node = TestNode::single().await?;
    let client = client_for(http_seeds([&node.http])).await?;
    let long = "k".repeat(513);
    assert_eq!(
        client.check(&Check::inline(&long, 5, MINUTE)).await,
        Err(ClientError::InvalidKey(513))
    );
    assert_eq!(
        client.check(&Check::inline("", 5, MINUTE)).await,
        Err(ClientError::InvalidKey(0))
    );
    let e = client
        .check(&Check::inline("k", 0, MINUTE))
        .await
        .err()
        .context("limit 0 refused")?;
    assert_eq!(e.code(), "invalid_limit");
    let e = client
        .check(&Check::inline("k", 5, Duration::ZERO))
        .await
        .err()
        .context("period 0 refused")?;
    assert_eq!(e.code(), "invalid_period");
    let e = client
        .check(
            &Check::inline("k", 5, MINUTE)
                .algorithm(Algorithm::FixedWindow)
                .burst(9),
        )
        .await
        .err()
        .context("burst on a window refused")?;
    assert_eq!(e.code(), "invalid_burst");
    assert_eq!(
        client.check(&Check::named("no-such-rule", "k")).await,
        Err(ClientError::UnknownRule("no-such-rule".into()))
    );
    assert_eq!(
        client.check(&Check::inline("k", 5, MINUTE).cost(6)).await,
        Err(ClientError::CostTooLarge {
            cost: 6,
            capacity: 5
        })
    );
    // None of that consumed anything.
    let a = client.check(&Check::inline("k", 5, MINUTE).cost(0)).await?;
    assert_eq!((a.allowed, a.remaining, a.degraded), (true, 5, false));
    node.stop().await
}

#[tokio::test]
async fn without_a_reachable_cluster_answers_degraded_or_unavailable() -> Result<()> {
    // A port nobody listens on (bound, then released).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let started = Instant::now();
    let client = Client::builder()
        .seeds([format!("http://{dead}")])
        .build()
        .await?;
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "build is bounded"
    );
    assert!(client.members().is_empty());
    let check = Check::inline("offline", 6, MINUTE);
    let answers: Vec<_> = futures::future::join_all((0..5).map(|_| client.check(&check))).await;
    let mut admitted = 0;
    for a in answers {
        let a = a?;
        assert!(a.degraded && a.limit == 6);
        admitted += usize::from(a.allowed);
    }
    assert_eq!(
        admitted, 5,
        "with no member known the whole limit is the share"
    );
    // A named rule cannot be known without the cluster: admitted, degraded, no limit.
    let a = client.check(&Check::named("default", "offline")).await?;
    assert!(a.allowed && a.degraded && a.limit == 0);

    let closed = Client::builder()
        .seeds([format!("http://{dead}")])
        .fail_mode(FailMode::Closed)
        .build()
        .await?;
    assert!(matches!(
        closed.check(&check).await,
        Err(ClientError::Unavailable(_))
    ));
    Ok(())
}

#[tokio::test]
async fn a_joining_node_is_picked_up_by_refresh() -> Result<()> {
    let cluster = TestCluster::start(2).await?;
    // A deadline a loaded CI machine keeps (see the relay test below): this test is about
    // routing to the joiner, not how fast.
    let client = Client::builder()
        .seeds(http_seeds([&cluster[0].http]))
        .refresh_interval(Duration::from_millis(200))
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    assert_eq!(client.members(), ["node-0", "node-1"]);
    let mut config = NodeConfig::local("node-2");
    config.seeds = cluster.seeds();
    let joiner = TestNode::start(config).await?;
    let started = Instant::now();
    wait_until("the client routes to node-2", WAIT, || async {
        Ok(client.members().len() == 3)
    })
    .await?;
    eprintln!(
        "client saw node-2 {:?} after it was ready",
        started.elapsed()
    );
    // Its keys now go straight to it.
    let key = (0..100)
        .map(|i| format!("j:{i}"))
        .find(|k| client.owner_of(&Check::inline(k, 5, MINUTE)).as_deref() == Some("node-2"))
        .context("some key is node-2's")?;
    let a = client.check(&Check::inline(&key, 5, MINUTE)).await?;
    assert!(a.allowed && !a.degraded);
    let peer_checks = joiner.cluster().await?;
    assert_eq!(peer_checks.forwarding("forwarded"), 0);
    joiner.stop().await?;
    cluster.stop().await
}

#[tokio::test]
async fn cluster_secret_is_required_on_the_peer_port() -> Result<()> {
    let secret = "sdk-test-secret";
    let node = TestNode::start({
        let mut c = NodeConfig::local("secret-node");
        c.cluster_secret = Some(secret.into());
        c
    })
    .await?;
    let check = Check::inline("s", 5, MINUTE);
    let without = client_for(http_seeds([&node.http])).await?;
    let a = without.check(&check).await?;
    assert!(a.degraded, "a client without the secret is refused: {a:?}");
    // A generous deadline, as for the client tokens below: the first check opens the link,
    // which a loaded machine may take longer than the default 5 ms to do (a CI run saw it
    // answered degraded).
    let with = Client::builder()
        .seeds(http_seeds([&node.http]))
        .cluster_secret(secret)
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    let a = with.check(&check).await?;
    assert!(!a.degraded, "{a:?}");
    node.stop().await
}

/// A service proves a client credential (a `check` token of the tokens file, or
/// RINGLIMIT_CLIENT_TOKEN), not the cluster secret: its checks, all-or-nothing requests and
/// reservations are answered by the owner; a wrong token is refused (degraded), and the token
/// is worth nothing on the admin API.
#[tokio::test]
async fn a_service_checks_with_a_client_token_and_no_secret() -> Result<()> {
    let dir = ringlimit_tests::TempDir::new("client-token")?;
    let tokens = dir.0.join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - { name: ops, token: ops-write-token-0001, role: write }\n  \
         - { name: checkout, token: checkout-client-token-01, role: check }\n",
    )?;
    let node = TestNode::start({
        let mut c = NodeConfig::local("client-token-node");
        c.cluster_secret = Some("members-only-secret".into());
        c.admin_tokens = Some(tokens.clone());
        c.client_token = Some("env-client-token-00001".into());
        c
    })
    .await?;
    let check = Check::inline("ct", 5, MINUTE);
    for token in ["checkout-client-token-01", "env-client-token-00001"] {
        // A generous deadline: the first check opens the link, which a loaded machine may
        // take longer than the default 5 ms to do.
        let client = Client::builder()
            .seeds(http_seeds([&node.http]))
            .client_token(token)
            .deadline(Duration::from_secs(1))
            .build()
            .await?;
        let a = client.check(&check).await?;
        assert!(!a.degraded, "{token}: {a:?}");
        let all = client
            .check_all(&[check.clone(), Check::inline("ct2", 5, MINUTE)])
            .await?;
        assert!(
            all.allowed && all.results.iter().all(|a| !a.degraded),
            "{token}: {all:?}"
        );
    }
    let wrong = Client::builder()
        .seeds(http_seeds([&node.http]))
        .client_token("not-a-known-token-000")
        .build()
        .await?;
    assert!(wrong.check(&check).await?.degraded, "refused");
    let both = Client::builder()
        .seeds(http_seeds([&node.http]))
        .client_token("checkout-client-token-01")
        .cluster_secret("members-only-secret")
        .build()
        .await;
    assert!(both.is_err(), "a secret and a token at once is a mistake");
    let http = reqwest::Client::new();
    let r = http
        .get(format!("http://{}/v1/admin/rules", node.http))
        .bearer_auth("checkout-client-token-01")
        .send()
        .await?;
    assert_eq!(r.status(), 403, "a client credential is not an admin token");
    node.stop().await
}

/// The SDK's checks reach the owner's peer port, past the HTTP and gRPC edges that count the
/// top keys: the owner counts them there (a member's forwarded checks are counted where they
/// arrived, not twice: `testing::operators`).
#[tokio::test]
async fn the_sdks_checks_are_counted_in_the_top_keys() -> Result<()> {
    let token = "sdk-top-token";
    let node = TestNode::start({
        let mut c = NodeConfig::local("top-node");
        c.admin_token = Some(token.into());
        c
    })
    .await?;
    let client = client_for(http_seeds([&node.http])).await?;
    // abuser: 2 admitted, 5 denied; quiet: admitted once.
    for key in ["abuser"; 7].into_iter().chain(["quiet"]) {
        client.check(&Check::inline(key, 2, MINUTE)).await?;
    }
    let r = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/admin/top?rule=2-per-60000ms&by=denied&n=5",
            node.http
        ))
        .bearer_auth(token)
        .send()
        .await?;
    ensure!(r.status() == 200, "top: {}", r.status());
    let top: serde_json::Value = r.json().await?;
    let keys: Vec<(String, u64)> = top["keys"]
        .as_array()
        .context("keys")?
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap_or_default().to_owned(),
                k["count"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(keys, [("abuser".to_owned(), 5)], "{top}");
    node.stop().await
}

/// The SDK's checks reach the owner's front door through its peer port, and are counted and
/// timed there like every edge's: `ringlimit_checks_total`, the rule's, the edge's
/// (`edge="peer"`) and the duration histogram (`endpoint="peer"`, a frame at a time).
#[tokio::test]
async fn the_sdks_checks_are_counted_and_timed_like_every_edges() -> Result<()> {
    let node = TestNode::start(NodeConfig::local("counting-node")).await?;
    let client = client_for(http_seeds([&node.http])).await?;
    // 2 admitted, 1 denied.
    for _ in 0..3 {
        client.check(&Check::inline("counted", 2, MINUTE)).await?;
    }
    let text = node.get("/metrics").await?.text;
    for (series, want) in [
        (
            "ringlimit_checks_total{result=\"allowed\",mode=\"owner\"} ",
            2.0,
        ),
        (
            "ringlimit_checks_total{result=\"denied\",mode=\"owner\"} ",
            1.0,
        ),
        (
            "ringlimit_rule_checks_total{rule=\"inline\",result=\"allowed\"} ",
            2.0,
        ),
        ("ringlimit_edge_checks_total{edge=\"peer\"} ", 3.0),
        ("ringlimit_edge_checks_total{edge=\"http\"} ", 0.0),
    ] {
        ensure!(
            metric(&text, series) == want,
            "{series}: {}",
            metric(&text, series)
        );
    }
    let frames = metric(
        &text,
        "ringlimit_check_duration_seconds_count{endpoint=\"peer\"} ",
    );
    ensure!((1.0..=3.0).contains(&frames), "SDK frames timed: {frames}");
    node.stop().await
}

/// One SDK call seen by a load loop.
struct Call {
    at: Duration,
    latency: Duration,
    result: Result<ringlimit_client::CheckAnswer, ClientError>,
}

#[tokio::test]
async fn killed_owner_fails_no_call_and_delays_none_past_the_deadline() -> Result<()> {
    let _one = exclusive().await;
    let mut nodes = ProcessNode::cluster(3, |_, _| {}).await?;
    // Above the 5 ms default: with three nodes, four load loops and other tests on two cores
    // (a debug build), a live owner sometimes answers in more than 5 ms, and such a timeout
    // would read as a degraded answer after the heal. A kill is detected by the lost
    // connection, not by the deadline, so the deadline does not shape this test otherwise.
    let deadline = Duration::from_millis(20);
    let client = Client::builder()
        .seeds(http_seeds(nodes.iter().map(|n| &n.http)))
        .deadline(deadline)
        .build()
        .await?;
    assert_eq!(client.members().len(), 3);
    let victim = nodes.pop().context("three nodes")?;
    let victim_id = victim.node_id.clone();
    let mut victim = victim;

    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let progress = Progress::default();
    let mut loops = tokio::task::JoinSet::new();
    for l in 0..4 {
        let (client, stop, progress) = (client.clone(), stop.clone(), progress.clone());
        loops.spawn(async move {
            let mut calls = Vec::new();
            let mut i = l * 1000;
            while !stop.load(Ordering::Relaxed) {
                let check = Check::inline(format!("kill:{}", i % 300), 1_000_000, MINUTE);
                let at = t0.elapsed();
                let started = Instant::now();
                let result = client.check(&check).await;
                calls.push(Call {
                    at,
                    latency: started.elapsed(),
                    result,
                });
                progress.add();
                i += 1;
                // A sleep is the thing: it paces the load (four loops, a check every 2 ms).
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            calls
        });
    }
    // 1000 calls before the kill and after the heal (under a second at the loops' pace).
    progress.wait_more(1_000, WAIT).await?;
    let killed_at = t0.elapsed();
    victim.kill()?;
    wait_until(
        "the client drops the killed node",
        Duration::from_secs(15),
        || async { Ok(!client.members().contains(&victim_id)) },
    )
    .await?;
    let healed_at = t0.elapsed();
    progress.wait_more(1_000, WAIT).await?;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    while let Some(done) = loops.join_next().await {
        calls.extend(done?);
    }

    let failed = calls.iter().filter(|c| c.result.is_err()).count();
    let degraded = |c: &&Call| matches!(&c.result, Ok(a) if a.degraded);
    let without_owner = |c: &&Call| matches!(&c.result, Ok(a) if a.degraded || a.replica);
    let during = calls
        .iter()
        .filter(|c| c.at >= killed_at && c.at < healed_at)
        .filter(without_owner)
        .count();
    // Answers after the heal plus a refresh's worth of slack come from owners again. A call
    // that waited out the deadline on a live owner (a stall of this 2-core host running a debug
    // build) is answered degraded by design; it says nothing of the heal, so it is counted
    // apart. A client still routing to the dead node would answer degraded without waiting.
    let late: Vec<&Call> = calls
        .iter()
        .filter(|c| c.at > healed_at + Duration::from_millis(300))
        .filter(degraded)
        .collect();
    let timed_out = late.iter().filter(|c| c.latency >= deadline).count();
    let after = late.len() - timed_out;
    if let (Some(first), Some(last)) = (late.first(), late.last()) {
        eprintln!(
            "degraded after the heal: {} from {:?} to {:?} (healed at {healed_at:?}), {timed_out} of them after waiting out the deadline",
            late.len(),
            first.at,
            last.at
        );
    }
    let mut latencies: Vec<Duration> = calls.iter().map(|c| c.latency).collect();
    latencies.sort();
    let max = latencies.last().copied().unwrap_or_default();
    let p99 = latencies[latencies.len() * 99 / 100];
    let over = latencies
        .iter()
        .filter(|l| **l > deadline + Duration::from_millis(1))
        .count();
    eprintln!(
        "{} calls; killed at {killed_at:?}, client healed {:?} later; failed {failed}; without the owner (replica or fallback) during {during} ({} by a replica), degraded after {after}; latency p99 {p99:?} max {max:?}; {over} over deadline+1ms",
        calls.len(),
        healed_at - killed_at,
        client.stats().replica,
    );
    assert_eq!(failed, 0, "no call fails");
    assert!(
        during > 0,
        "the victim's keys were answered without it (by its replica, or the fallback)"
    );
    assert_eq!(after, 0, "owners answer again once the client has healed");
    assert!(
        timed_out <= 5,
        "{timed_out} calls waited out the deadline after the heal"
    );
    // The deadline bounds the wait on an owner; what is left is this 2-core host scheduling
    // four load loops, three nodes and the test (a debug build).
    assert!(
        max < deadline + Duration::from_millis(25),
        "max latency {max:?}"
    );
    for n in &mut nodes {
        n.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn layer_limits_an_axum_service_per_header() -> Result<()> {
    let node = TestNode::single().await?;
    let client = client_for(http_seeds([&node.http])).await?;
    let rule = InlineRule {
        limit: 5,
        period_ms: 10_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "hello\n" }))
        .layer(RateLimitLayer::inline(
            client,
            rule,
            key::header("x-api-key"),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let api = Api::new(addr)?;
    let get = |k: Option<&'static str>| {
        let mut req = reqwest::Client::new().get(api.url("/hello"));
        if let Some(k) = k {
            req = req.header("x-api-key", k);
        }
        req.send()
    };
    for i in 0..5u64 {
        let r = get(Some("alice")).await?;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit"], "5");
        assert_eq!(
            r.headers()["x-ratelimit-remaining"],
            (4 - i).to_string().as_str()
        );
        assert!(r.headers().contains_key("x-ratelimit-reset"));
    }
    let r = get(Some("alice")).await?;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=2).contains(&retry), "one token per 2 s: {retry}");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    let body: serde_json::Value = r.json().await?;
    assert_eq!(body["error"], "rate_limited");
    // Another key is independent; no key is not limited.
    assert_eq!(get(Some("bob")).await?.status(), 200);
    for _ in 0..8 {
        let r = get(None).await?;
        assert_eq!(r.status(), 200);
        assert!(!r.headers().contains_key("x-ratelimit-limit"));
    }
    server.abort();
    node.stop().await
}

#[tokio::test]
async fn a_check_sent_to_a_former_owner_is_relayed_to_the_owner() -> Result<()> {
    let cluster = TestCluster::start(2).await?;
    // A client whose ring will be stale: it does not refresh during the test.
    // A deadline that a loaded CI machine keeps (the default 5 ms fell to the client's own
    // fallback once, degraded): this test is about where the check goes, not how fast.
    let client = Client::builder()
        .seeds(http_seeds([&cluster[0].http]))
        .refresh_interval(Duration::from_secs(3600))
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    let mut config = NodeConfig::local("node-2");
    config.seeds = cluster.seeds();
    let joiner = TestNode::start(config).await?;
    let all = ["node-0", "node-1", "node-2"];
    for node in cluster.iter().chain([&joiner]) {
        wait_until("three members everywhere", WAIT, || async {
            Ok(node.cluster().await?.ring_members() == 3)
        })
        .await?;
    }
    assert_eq!(
        client.members(),
        ["node-0", "node-1"],
        "the client's ring is stale"
    );
    // A key that moved to node-2: the client still sends it to its former owner.
    let key = (0..500)
        .map(|i| format!("moved:{i}"))
        .find(|k| owner_of(&all, k, 5, 60_000).is_ok_and(|o| o == "node-2"))
        .context("some key moved to node-2")?;
    let former = client
        .owner_of(&Check::inline(&key, 5, MINUTE))
        .context("the client routes it")?;
    assert_ne!(former, "node-2");
    // Exhaust it at its owner.
    for _ in 0..5 {
        let r = joiner
            .check(&ringlimit_tests::inline(&key, 5, 60_000))
            .await?;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // The former owner neither owns nor holds the bucket: it relays the check to node-2.
    let a = client.check(&Check::inline(&key, 5, MINUTE)).await?;
    assert!(
        !a.allowed && !a.degraded,
        "{former} must relay to node-2, not decide from a fresh bucket: {a:?}"
    );
    joiner.stop().await?;
    cluster.stop().await
}

#[tokio::test]
async fn check_all_through_the_sdk_is_all_or_nothing_across_owners() -> Result<()> {
    let cluster = TestCluster::start(3).await?;
    let client = Client::builder()
        .seeds(http_seeds([&cluster[1].http]))
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    let hour = Duration::from_secs(3600);
    let ip = Check::inline("ip:203.0.113.7", 10, hour);
    let users: Vec<Check> = (0..4)
        .map(|u| Check::inline(format!("user:{u}"), 3, hour))
        .collect();
    let owners: std::collections::HashSet<String> = users
        .iter()
        .chain([&ip])
        .filter_map(|c| client.owner_of(c))
        .collect();
    assert!(
        owners.len() >= 2,
        "limits owned by different nodes: {owners:?}"
    );

    let mut per_user = [0u64; 4];
    for r in 0..30 {
        let u = r % 4;
        let all = client.check_all(&[users[u].clone(), ip.clone()]).await?;
        assert!(all.results.iter().all(|a| !a.degraded), "{all:?}");
        if all.allowed {
            per_user[u] += 1;
        } else {
            assert!(!all.binding_answer().allowed, "the binding limit denies");
        }
    }
    assert_eq!(per_user.iter().sum::<u64>(), 10, "exactly the IP limit");
    assert_eq!(
        per_user,
        [3, 3, 2, 2],
        "no user over its own, in arrival order"
    );
    // Each user's bucket shows exactly its admitted requests: the denied ones gave theirs back.
    for (u, user) in users.iter().enumerate() {
        let left = client.check(&user.clone().cost(0)).await?;
        assert_eq!(left.remaining, 3 - per_user[u], "user {u}");
    }
    assert_eq!(client.check(&ip.clone().cost(0)).await?.remaining, 0);
    // Through a node's HTTP API the buckets read the same.
    let reply = cluster[0]
        .check(&serde_json::json!({"key": "user:2", "limit": 3, "period_ms": 3_600_000, "cost": 0}))
        .await?;
    assert_eq!(reply.json()?["remaining"], 1);
    // Misuse is refused before anything is taken.
    let dup = client.check_all(&[ip.clone(), ip.clone()]).await;
    assert!(matches!(
        dup,
        Err(ringlimit_core::all_or_nothing::AllError::Duplicate {
            first: 0,
            second: 1
        })
    ));
    cluster.stop().await
}

#[tokio::test]
async fn layer_holds_a_request_to_several_limits_all_or_nothing() -> Result<()> {
    let node = TestNode::single().await?;
    let client = client_for(http_seeds([&node.http])).await?;
    let per_key = InlineRule {
        limit: 3,
        period_ms: 60_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    let per_path = InlineRule {
        limit: 4,
        period_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        calendar: None,
    };
    let layer = RateLimitLayer::inline(client.clone(), per_key, key::header("x-api-key"))
        .and(ringlimit_client::RuleRef::Inline(per_path), key::path());
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let api = Api::new(addr)?;
    let get = |k: &'static str| {
        reqwest::Client::new()
            .get(api.url("/hello"))
            .header("x-api-key", k)
            .send()
    };
    // alice spends her 3; the 4th is denied by her key's limit and takes nothing from the path.
    for i in 0..3u64 {
        let r = get("alice").await?;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["ratelimit-policy"],
            r#""3-per-60000ms";q=3;w=60, "4-per-60000ms-fixed_window";q=4;w=60"#
        );
        let state = r.headers()["ratelimit"].to_str()?;
        assert!(
            state.starts_with(&format!("\"3-per-60000ms\";r={};t=", 2 - i)),
            "{state}"
        );
        assert!(state.contains(&format!("\"4-per-60000ms-fixed_window\";r={};t=", 3 - i)));
    }
    let r = get("alice").await?;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["x-ratelimit-limit"],
        "3",
        "the binding limit: alice's"
    );
    // The path's window still has 1: bob gets it, then the path denies him.
    assert_eq!(get("bob").await?.status(), 200);
    let r = get("bob").await?;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["x-ratelimit-limit"],
        "4",
        "the binding limit: the path's"
    );
    // bob's denied request gave his token back: 2 of 3 left.
    let left = client
        .check(&Check::inline("bob", 3, MINUTE).cost(0))
        .await?;
    assert_eq!(left.remaining, 2);
    server.abort();
    node.stop().await
}

/// Failover in the SDK: while a key's owner is frozen (SIGSTOP) and still in every ring, the
/// client sends its checks to the member after it on the ring, the owner's replica, which
/// decides them on its copy: `replica: true`, not degraded, and the limit holds.
#[tokio::test]
async fn a_frozen_owners_keys_are_decided_by_its_replica() -> Result<()> {
    let _one = exclusive().await;
    let mut nodes = ProcessNode::cluster(3, |_, _| {}).await?;
    let ids: Vec<String> = nodes.iter().map(|n| n.node_id.clone()).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let client = Client::builder()
        .seeds(http_seeds(nodes.iter().map(|n| &n.http)))
        .deadline(Duration::from_millis(200))
        .build()
        .await?;
    let limit = 5;
    let keys: Vec<String> = (0..)
        .map(|i| format!("frozen:{i}"))
        .filter(|k| owner_of(&ids, k, limit, MINUTE.as_millis() as u64).is_ok_and(|o| o == ids[2]))
        .take(3)
        .collect();
    let check = |k: &str| Check::inline(k.to_owned(), limit, MINUTE);
    // Two rounds of a check per key, each copied to the replicas before the next: with one
    // replica and no other traffic, as many copies acknowledged as keys are this round's.
    const COPIES: &str = "ringlimit_replicated_buckets_total";
    for round in 0..2 {
        let copied = nodes[2].series(COPIES).await?;
        for k in &keys {
            let a = client.check(&check(k)).await?;
            ensure!(a.allowed && !a.degraded && !a.replica, "{k}: {a:?}");
        }
        wait_until(&format!("round {round} copied"), WAIT, || async {
            Ok(nodes[2].series(COPIES).await? >= copied + keys.len() as f64)
        })
        .await?;
    }
    nodes[2].pause()?;
    let mut admitted = 0;
    for k in &keys {
        for _ in 0..limit {
            let a = client.check(&check(k)).await?;
            ensure!(a.replica && !a.degraded, "{k}: {a:?}");
            admitted += u64::from(a.allowed);
        }
    }
    nodes[2].resume()?;
    ensure!(
        admitted == (limit - 2) * keys.len() as u64,
        "{admitted} admitted while the owner was frozen"
    );
    ensure!(client.stats().replica >= limit * keys.len() as u64);
    for n in &mut nodes {
        n.stop().await?;
    }
    Ok(())
}

/// Reservations through the SDK, at the bucket's owner: a reservation given back and settled
/// once; ids cross between the SDK and the HTTP API (any node) both ways; above the estimate
/// the bucket goes into debt and denies; dropped unsettled, the estimate stays; a string that
/// is not an id is unknown.
#[tokio::test]
async fn reservations_through_the_sdk_are_kept_at_the_owner_and_settled_once() -> Result<()> {
    use ringlimit_client::{Reserve, ReserveError, RuleRef};
    let cluster = TestCluster::start(3).await?;
    let client = Client::builder()
        .seeds(http_seeds([&cluster[0].http]))
        .deadline(Duration::from_secs(1))
        .build()
        .await?;
    // A day's window: no boundary within the test.
    let inline = InlineRule {
        limit: 1_000,
        period_ms: 86_400_000,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        calendar: None,
    };
    let rule = RuleRef::Inline(inline);
    let key = "llm:team-1";
    let granted = |r: Reserve| match r {
        Reserve::Granted(r) => Ok(r),
        Reserve::Denied(a) => Err(anyhow::anyhow!("denied: {a:?}")),
    };
    let r = granted(client.reserve(key, rule.clone(), 300, MINUTE).await?)?;
    ensure!(r.answer.remaining == 700, "{:?}", r.answer);
    let id = r.id().to_owned();
    let after = r.settle(100).await?;
    ensure!(after.remaining == 900, "{after:?}");
    ensure!(client.settle(&id, 100).await == Err(ReserveError::Unknown));

    // Reserved over HTTP at one node, settled through the SDK; and the other way round.
    let body = serde_json::json!({ "key": key, "limit": 1_000, "period_ms": 86_400_000,
        "algorithm": "fixed_window", "cost": 200 });
    let reply = cluster[1].api().post("/v1/reserve", &body).await?;
    ensure!(reply.status == 200, "{}", reply.text);
    let http_id = reply.json()?["reservation"]
        .as_str()
        .context("an id")?
        .to_owned();
    ensure!(client.settle(&http_id, 50).await?.remaining == 850);
    let r = granted(client.reserve(key, rule.clone(), 100, MINUTE).await?)?;
    let reply = cluster[2]
        .api()
        .post(
            "/v1/settle",
            &serde_json::json!({ "reservation": r.id(), "cost": 1_000 }),
        )
        .await?;
    ensure!(reply.status == 200, "{}", reply.text);
    // 100 reserved, 1,000 used with 750 left: 750 taken now, 150 owed.
    let v = reply.json()?;
    ensure!(v["allowed"] == false && v["remaining"] == 0, "{v}");
    match client.reserve(key, rule.clone(), 1, MINUTE).await? {
        Reserve::Denied(a) => ensure!(a.retry_after_ms > 0, "{a:?}"),
        Reserve::Granted(r) => anyhow::bail!("a bucket in debt reserved: {:?}", r.answer),
    }

    // Dropped unsettled: the estimate stays taken.
    let other = "llm:team-2";
    drop(granted(
        client.reserve(other, rule.clone(), 400, MINUTE).await?,
    )?);
    let peek = client
        .check(
            &Check::inline(other, 1_000, Duration::from_secs(86_400))
                .algorithm(Algorithm::FixedWindow)
                .cost(0),
        )
        .await?;
    ensure!(peek.remaining == 600, "{peek:?}");
    ensure!(client.settle("not an id", 1).await == Err(ReserveError::Unknown));
    ensure!(matches!(
        client.reserve(key, rule, 1, Duration::ZERO).await,
        Err(ReserveError::Ttl { ttl_ms: 0, .. })
    ));
    Ok(())
}

/// With leases on, a key this client checks thousands of times a second is leased from its
/// owner and decided in-process (`leased: true`, no round trip); a window that denies admits
/// its limit and never more, with few false denies.
#[tokio::test]
async fn a_hot_key_is_decided_in_process_on_a_lease() -> Result<()> {
    let cluster = TestCluster::start(3).await?;
    let client = Client::builder()
        .seeds(http_seeds([&cluster[0].http]))
        .deadline(Duration::from_secs(1))
        .leases(true)
        .build()
        .await?;
    const LIMIT: u64 = 20_000;
    // A 10-minute window: the test stays inside one (or at worst crosses one boundary).
    let check = Check::inline("sdk:hot", LIMIT, 10 * MINUTE).algorithm(Algorithm::FixedWindow);
    let started = Instant::now();
    let (mut allowed, mut leased, mut checks) = (0u64, 0u64, 0u64);
    let mut first_window = None;
    while checks < 2 * LIMIT && started.elapsed() < WAIT {
        let a = client.check(&check).await?;
        ensure!(!a.degraded, "{a:?}");
        let window = *first_window.get_or_insert(a.reset_at_ms);
        if a.reset_at_ms != window && !a.leased {
            // The window turned during the test: what the first admitted is what counts.
            break;
        }
        checks += 1;
        allowed += u64::from(a.allowed);
        leased += u64::from(a.leased);
    }
    let stats = client.stats();
    eprintln!(
        "hot key through the SDK: {allowed} admitted, {leased} leased of {checks} in {:?}; {stats:?}",
        started.elapsed()
    );
    ensure!(allowed <= LIMIT, "over the limit: {allowed} of {LIMIT}");
    ensure!(
        allowed >= LIMIT - LIMIT / 50,
        "false denies beyond 2%: {allowed} of {LIMIT} ({checks} checks, {stats:?})"
    );
    ensure!(
        leased > LIMIT / 2 && stats.leased > 0 && stats.lease_grants > 0,
        "decided in-process: {leased} of {checks} ({stats:?})"
    );
    Ok(())
}
