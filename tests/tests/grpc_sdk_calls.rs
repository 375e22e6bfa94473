//! ringlimit.v1's calls for client SDKs in other languages, on real nodes: Topology and
//! WatchTopology (members with their gRPC addresses, rules with their seeds), Lease at the
//! owner, held checks and GiveBack under a client credential; and Topology and Lease from
//! Python grpcio with stubs compiled from our `.proto` at test time.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::config::ConnLimits;
use ringlimit_node::grpc::ringlimit_v1::pb;
use ringlimit_node::grpc::ringlimit_v1::pb::rate_limiter_client::RateLimiterClient;
use ringlimit_proto::Ring;
use ringlimit_proto::identity::{bucket_id, named_seed};
use ringlimit_tests::{
    TestCluster, TestNode, WAIT, python_with, run_client_script, wait_until, with_limit_rules,
};
use serde_json::json;
use std::time::Duration;
use tonic::Code;
use tonic::transport::Channel;

const SECRET: &str = "sdk-calls-cluster-secret";
/// The client credential `client` (RINGLIMIT_CLIENT_TOKEN).
const CLIENT_TOKEN: &str = "sdk-calls-client-token-1";
const ADMIN_TOKEN: &str = "sdk-calls-admin-token-01";

fn with_grpc(config: &mut NodeConfig) {
    with_limit_rules(config);
    config.grpc_addr = "127.0.0.1:0".parse().ok();
}

/// [`with_grpc`] on a node with a cluster secret and the client credential [`CLIENT_TOKEN`].
fn guarded(config: &mut NodeConfig) {
    with_grpc(config);
    config.cluster_secret = Some(SECRET.into());
    config.client_token = Some(CLIENT_TOKEN.into());
}

async fn client(node: &TestNode) -> Result<RateLimiterClient<Channel>> {
    let addr = node.grpc.context("a gRPC address")?;
    Ok(RateLimiterClient::connect(format!("http://{addr}")).await?)
}

/// `message` with the client credential `token`.
fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

fn check(rule: &str, key: &str, cost: u64, hold: bool) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Rule(rule.into())),
        cost: Some(cost),
        hold,
    }
}

fn ask(rule: &str, key: &str, want: u64) -> pb::LeaseAsk {
    pb::LeaseAsk {
        key: key.into(),
        rule_spec: Some(pb::lease_ask::RuleSpec::Rule(rule.into())),
        want,
        demand_per_s: 0,
    }
}

fn give(rule: &str, key: &str, tokens: u64, mark: pb::Mark) -> pb::GiveBackItem {
    pb::GiveBackItem {
        key: key.into(),
        rule_spec: Some(pb::give_back_item::RuleSpec::Rule(rule.into())),
        tokens,
        mark: Some(mark),
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

/// The index in `cluster` of the owner of `key` under the named rule `rule` of `algorithm`
/// (its code), as a client computes it from the topology (the golden file's scheme).
fn owner_of(cluster: &TestCluster, rule: &str, algorithm: u8, key: &str) -> Result<usize> {
    let ring = Ring::new(cluster.ids());
    let id = bucket_id(named_seed(rule, algorithm), key);
    let owner = ring.owner(id).context("an owner")?;
    cluster
        .iter()
        .position(|n| n.node_id == owner)
        .context("the owner is a node")
}

/// Topology from any node: the three members sorted with the addresses they serve on, the
/// ring's scheme, and every rule with the seed the golden file's formula gives; `/v1/cluster`
/// lists the gRPC addresses too.
#[tokio::test]
async fn topology_lists_the_members_with_their_grpc_addresses_and_rules_with_their_seeds()
-> Result<()> {
    let cluster = TestCluster::start_with(3, with_grpc).await?;
    let t = client(&cluster[1])
        .await?
        .topology(pb::TopologyRequest::default())
        .await?
        .into_inner();
    ensure!(t.node_id == "node-1", "{t:?}");
    let ids: Vec<&str> = t.members.iter().map(|m| m.node_id.as_str()).collect();
    ensure!(ids == ["node-0", "node-1", "node-2"], "{ids:?}");
    for (m, node) in t.members.iter().zip(cluster.iter()) {
        let grpc = node.grpc.context("gRPC")?.to_string();
        ensure!(m.grpc_addr == grpc, "{m:?} serves gRPC on {grpc}");
        ensure!(m.http_addr == node.http.to_string(), "{m:?}");
        ensure!(m.peer_addr == node.peer.to_string(), "{m:?}");
    }
    let ring = t.ring.context("ring params")?;
    ensure!(ring.scheme == "xxh3-64-v1" && ring.vnodes_per_member == 160);
    let names: Vec<&str> = t.rules.iter().map(|r| r.name.as_str()).collect();
    ensure!(names == ["per-ip", "per-user", "trial"], "{names:?}");
    for r in &t.rules {
        // token_bucket (the rules file's default): code 1.
        ensure!(r.algorithm == pb::Algorithm::TokenBucket as i32, "{r:?}");
        ensure!(r.seed == named_seed(&r.name, 1), "{r:?}");
        ensure!(r.mode == pb::RuleMode::Owner as i32 && r.leasable, "{r:?}");
    }
    ensure!(t.rules[2].shadow && t.rules[0].limit == 10 && t.rules[0].period_ms == 3_600_000);
    // The same version from every node of one build (the same members and rules).
    let again = client(&cluster[2])
        .await?
        .topology(pb::TopologyRequest::default())
        .await?
        .into_inner();
    ensure!(
        again.version == t.version,
        "{} != {}",
        again.version,
        t.version
    );
    let view = cluster[0].get("/v1/cluster").await?.json()?;
    for (m, node) in view["members"]
        .as_array()
        .context("members")?
        .iter()
        .zip(cluster.iter())
    {
        let grpc = node.grpc.context("gRPC")?.to_string();
        ensure!(m["grpc_addr"] == grpc.as_str(), "{m}");
    }
    cluster.stop().await
}

/// WatchTopology sends the topology at once, then a new version when an admin API rule is
/// added and when a node leaves; a heartbeat out of bounds is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_topology_sends_a_new_version_when_a_rule_is_added_and_a_node_leaves() -> Result<()> {
    let mut cluster = TestCluster::start_with(3, |c| {
        with_grpc(c);
        c.admin_token = Some(ADMIN_TOKEN.into());
    })
    .await?;
    let mut c = client(&cluster[0]).await?;
    let bad = c
        .watch_topology(pb::TopologyRequest {
            heartbeat_ms: Some(10),
        })
        .await;
    ensure!(refused(bad) == (Code::InvalidArgument, "invalid_request".into()));
    // A heartbeat longer than the test: every message after the first is a change.
    let mut stream = c
        .watch_topology(pb::TopologyRequest {
            heartbeat_ms: Some(60_000),
        })
        .await?
        .into_inner();
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .context("the first topology in time")??
        .context("a first topology")?;
    ensure!(first.members.len() == 3, "{first:?}");
    let r = cluster[1]
        .admin(
            reqwest::Method::PUT,
            "/v1/admin/rules/gold",
            ADMIN_TOKEN,
            Some(&json!({ "limit": 2, "period": "1h" })),
        )
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let with_gold = tokio::time::timeout(WAIT, stream.message())
        .await
        .context("a topology with the new rule in time")??
        .context("a topology")?;
    ensure!(with_gold.version != first.version, "a new version");
    let gold = with_gold
        .rules
        .iter()
        .find(|r| r.name == "gold")
        .context("gold listed")?;
    ensure!(
        gold.seed == named_seed("gold", 1) && gold.limit == 2,
        "{gold:?}"
    );
    let node2 = cluster.nodes.pop().context("a third node")?;
    node2.stop().await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = with_gold;
    while last.members.len() != 2 {
        let t = tokio::time::timeout_at(deadline, stream.message())
            .await
            .context("a topology without node-2 in time")??
            .context("a topology")?;
        ensure!(t.version != last.version, "sent only on a change: {t:?}");
        last = t;
    }
    let ids: Vec<&str> = last.members.iter().map(|m| m.node_id.as_str()).collect();
    ensure!(ids == ["node-0", "node-1"], "{ids:?}");
    cluster.stop().await
}

/// A quiet node's WatchTopology stream outlives `--grpc-request-timeout-ms` and says it is
/// alive every heartbeat (the same version); streams beyond `--grpc-max-connections` are
/// refused RESOURCE_EXHAUSTED until one ends.
#[tokio::test]
async fn watch_topology_heartbeats_past_the_request_timeout_and_is_bounded() -> Result<()> {
    let mut config = NodeConfig::local("watch-alone");
    with_grpc(&mut config);
    config.grpc_limits = ConnLimits::grpc(Duration::from_secs(60), Duration::from_millis(300), 2);
    let node = TestNode::start(config).await?;
    let c = client(&node).await?;
    let watch = |c: &RateLimiterClient<Channel>| {
        let mut c = c.clone();
        async move {
            c.watch_topology(pb::TopologyRequest {
                heartbeat_ms: Some(1_000),
            })
            .await
        }
    };
    let mut first = watch(&c).await?.into_inner();
    let mut versions = Vec::new();
    let started = tokio::time::Instant::now();
    while versions.len() < 3 {
        let t = tokio::time::timeout(WAIT, first.message())
            .await
            .context("a heartbeat in time")??
            .context("the stream went on")?;
        versions.push(t.version);
    }
    ensure!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");
    ensure!(
        started.elapsed() >= Duration::from_millis(1_500),
        "two heartbeats a second apart after the first message"
    );
    let second = watch(&c).await?;
    ensure!(refused(watch(&c).await) == (Code::ResourceExhausted, "too_many_watchers".into()));
    drop(second);
    wait_until("a watcher's place is free again", WAIT, || async {
        Ok(watch(&c).await.is_ok())
    })
    .await?;
    drop(first);
    node.stop().await
}

/// Lease on a node with a cluster secret: refused without the client credential (and with a
/// token that is not one); granted at the key's owner, `not_owner` elsewhere; an invalid ask
/// answered in its place.
#[tokio::test]
async fn lease_grants_at_the_owner_not_elsewhere_and_needs_a_credential() -> Result<()> {
    let cluster = TestCluster::start_with(3, guarded).await?;
    let key = "sdk:lease";
    let owner = owner_of(&cluster, "per-ip", 1, key)?;
    let lease = |asks: Vec<pb::LeaseAsk>| pb::LeaseRequest {
        holder: "4b1d-client-uuid".into(),
        asks,
    };
    let mut at_owner = client(&cluster[owner]).await?;
    ensure!(
        refused(at_owner.lease(lease(vec![ask("per-ip", key, 3)])).await)
            == (Code::Unauthenticated, "unauthorized".into())
    );
    ensure!(
        refused(
            at_owner
                .lease(with_token(
                    lease(vec![ask("per-ip", key, 3)]),
                    "not-a-token"
                ))
                .await
        ) == (Code::Unauthenticated, "unauthorized".into())
    );
    ensure!(
        refused(at_owner.give_back(pb::GiveBackRequest::default()).await)
            == (Code::Unauthenticated, "unauthorized".into())
    );
    let asks = vec![
        ask("per-ip", key, 3),
        ask("no-such-rule", key, 1),
        ask("per-ip", "", 1),
    ];
    let r = at_owner
        .lease(with_token(lease(asks.clone()), CLIENT_TOKEN))
        .await?
        .into_inner();
    use pb::lease_grant::Result as G;
    let Some(G::Granted(g)) = &r.grants[0].result else {
        anyhow::bail!("not granted at the owner: {r:?}");
    };
    ensure!(
        g.tokens >= 1 && g.tokens <= 3 && g.valid_ns > 0 && g.mark.is_some(),
        "{g:?}"
    );
    let error = |i: usize| match &r.grants[i].result {
        Some(G::Error(e)) => e.error.clone(),
        other => format!("{other:?}"),
    };
    ensure!(
        error(1) == "unknown_rule" && error(2) == "invalid_key",
        "{r:?}"
    );
    for (i, node) in cluster.iter().enumerate().filter(|(i, _)| *i != owner) {
        let r = client(node)
            .await?
            .lease(with_token(lease(vec![ask("per-ip", key, 3)]), CLIENT_TOKEN))
            .await?
            .into_inner();
        ensure!(
            matches!(&r.grants[0].result, Some(G::Error(e)) if e.error == "not_owner"),
            "node-{i}: {r:?}"
        );
    }
    // Bounds of the call itself.
    let mut too_long = lease(vec![ask("per-ip", key, 1)]);
    too_long.holder = "h".repeat(65);
    ensure!(
        refused(at_owner.lease(with_token(too_long, CLIENT_TOKEN)).await)
            == (Code::InvalidArgument, "invalid_request".into())
    );
    ensure!(
        refused(
            at_owner
                .lease(with_token(lease(vec![]), CLIENT_TOKEN))
                .await
        ) == (Code::InvalidArgument, "invalid_request".into())
    );
    // The slice's unspent tokens go back once under its mark.
    let mark = g.mark.context("a mark")?;
    let back = at_owner
        .give_back(with_token(
            pb::GiveBackRequest {
                items: vec![give("per-ip", key, g.tokens, mark)],
            },
            CLIENT_TOKEN,
        ))
        .await?
        .into_inner();
    ensure!(back.honoured == [g.tokens], "{back:?}");
    cluster.stop().await
}

fn stream_request(id: u64, checks: Vec<pb::CheckRequest>) -> pb::CheckStreamRequest {
    pb::CheckStreamRequest { id, checks }
}

/// CheckStream under a client credential: refused without one (UNAUTHENTICATED) or with one
/// of another role (PERMISSION_DENIED); with one, every request is answered once under its
/// id, an invalid check gets its error in its place, a request of no or too many checks gets
/// its error, the stream goes on after each, a held check carries its mark, and requests
/// sent far past the in-flight bound all get their answer (each decided once).
#[tokio::test]
async fn check_stream_answers_every_request_by_id_and_goes_on_past_invalid_ones() -> Result<()> {
    use futures::StreamExt as _;
    let cluster = TestCluster::start_with(1, |c| {
        guarded(c);
        c.admin_token = Some(ADMIN_TOKEN.into());
    })
    .await?;
    let mut c = client(&cluster[0]).await?;
    let none = || futures::stream::empty::<pb::CheckStreamRequest>();
    ensure!(
        refused(c.check_stream(none()).await).0 == Code::Unauthenticated,
        "no credential"
    );
    ensure!(
        refused(c.check_stream(with_token(none(), "not-a-token")).await)
            == (Code::Unauthenticated, "unauthorized".into())
    );
    ensure!(
        refused(c.check_stream(with_token(none(), ADMIN_TOKEN)).await)
            == (Code::PermissionDenied, "forbidden".into())
    );

    const MANY: u64 = 1_000;
    const LIMIT: u64 = 1_000_000;
    let inline = |key: &str| pb::CheckRequest {
        key: key.into(),
        rule_spec: Some(pb::check_request::RuleSpec::Inline(pb::InlineRule {
            limit: LIMIT,
            // A day's window: its count is exact (a token bucket refills as the test runs).
            period_ms: 86_400_000,
            algorithm: pb::Algorithm::FixedWindow as i32,
            ..Default::default()
        })),
        cost: None,
        hold: false,
    };
    let mut requests = vec![
        stream_request(7, vec![check("per-user", "s:a", 1, false)]),
        stream_request(
            8,
            vec![
                check("no-such-rule", "s:a", 1, false),
                check("per-user", "", 1, false),
                check("per-user", "s:a", 1, false),
            ],
        ),
        stream_request(9, vec![]),
        stream_request(10, vec![inline("s:big"); 1_001]),
        stream_request(11, vec![check("per-user", "s:a", 1, true)]),
    ];
    requests.extend((0..MANY).map(|i| stream_request(1_000 + i, vec![inline("s:many")])));
    let sent = requests.len();
    let mut answers = c
        .check_stream(with_token(futures::stream::iter(requests), CLIENT_TOKEN))
        .await?
        .into_inner();
    let mut by_id = std::collections::HashMap::new();
    while let Some(r) = answers.next().await {
        let r = r?;
        ensure!(by_id.insert(r.id, r).is_none(), "an id answered twice");
    }
    ensure!(by_id.len() == sent, "{} of {sent} answered", by_id.len());

    use pb::check_batch_result::Result as R;
    let results = |id: u64| {
        by_id
            .get(&id)
            .map(|r| r.results.clone())
            .unwrap_or_default()
    };
    let allowed = |r: &pb::CheckBatchResult| matches!(&r.result, Some(R::Answer(a)) if a.allowed);
    let error = |r: &pb::CheckBatchResult| match &r.result {
        Some(R::Error(e)) => e.error.clone(),
        other => format!("{other:?}"),
    };
    let seven = results(7);
    ensure!(seven.len() == 1 && allowed(&seven[0]), "{seven:?}");
    let eight = results(8);
    ensure!(
        eight.len() == 3
            && error(&eight[0]) == "unknown_rule"
            && error(&eight[1]) == "invalid_key"
            && allowed(&eight[2]),
        "{eight:?}"
    );
    for id in [9, 10] {
        let r = by_id.get(&id).context("answered")?;
        ensure!(
            r.results.is_empty()
                && r.error.as_ref().map(|e| e.error.as_str()) == Some("invalid_batch"),
            "{r:?}"
        );
    }
    let eleven = results(11);
    ensure!(
        matches!(&eleven[..], [pb::CheckBatchResult { result: Some(R::Answer(a)) }] if a.allowed && a.hold.is_some()),
        "{eleven:?}"
    );
    // Each of the many was decided once: their `remaining` are LIMIT - 1 down to LIMIT - MANY.
    let mut remaining: Vec<u64> = (0..MANY)
        .map(|i| match &results(1_000 + i)[..] {
            [
                pb::CheckBatchResult {
                    result: Some(R::Answer(a)),
                },
            ] if a.allowed => a.remaining,
            _ => 0,
        })
        .collect();
    remaining.sort_unstable();
    ensure!(
        remaining == ((LIMIT - MANY)..LIMIT).collect::<Vec<_>>(),
        "{:?}..",
        &remaining[..4]
    );
    cluster.stop().await
}

/// Held checks and GiveBack at the owner: a forged mark gives back nothing and leaves the
/// bucket as it was; the real one gives back once; another credential cannot give back a
/// hold that is not its own.
#[tokio::test]
async fn a_hold_given_back_once_restores_and_forged_or_repeated_marks_honour_nothing() -> Result<()>
{
    let dir = tempfile_dir()?;
    let tokens = dir.join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - { name: other, token: other-client-token-01, role: check }\n  - { name: ops, token: ops-read-token-000001, role: read }\n",
    )?;
    let cluster = TestCluster::start_with(3, |c| {
        guarded(c);
        c.admin_tokens = Some(tokens.clone());
    })
    .await?;
    let key = "sdk:held";
    let owner = owner_of(&cluster, "per-ip", 1, key)?;
    let mut c = client(&cluster[owner]).await?;
    let remaining = |c: &RateLimiterClient<Channel>| {
        let mut c = c.clone();
        async move {
            let r = c.check(check("per-ip", key, 0, false)).await?.into_inner();
            Ok::<u64, anyhow::Error>(r.remaining)
        }
    };
    let held = c
        .check(with_token(check("per-ip", key, 3, true), CLIENT_TOKEN))
        .await?
        .into_inner();
    ensure!(held.allowed && held.remaining == 7, "{held:?}");
    let mark = held.hold.context("a held check carries its mark")?;
    // Not held: without `hold`, and at a node that does not own the key.
    let plain = c
        .check(with_token(check("per-ip", key, 1, false), CLIENT_TOKEN))
        .await?
        .into_inner();
    ensure!(plain.hold.is_none(), "{plain:?}");
    let elsewhere = (owner + 1) % 3;
    let forwarded = client(&cluster[elsewhere])
        .await?
        .check(with_token(check("per-ip", key, 1, true), CLIENT_TOKEN))
        .await?
        .into_inner();
    ensure!(
        forwarded.allowed && forwarded.hold.is_none(),
        "{forwarded:?}"
    );
    ensure!(remaining(&c).await? == 5);
    let giver = c.clone();
    let give_back = move |token: &'static str, items: Vec<pb::GiveBackItem>| {
        let mut c = giver.clone();
        async move {
            let r = c
                .give_back(with_token(pb::GiveBackRequest { items }, token))
                .await?
                .into_inner();
            Ok::<Vec<u64>, anyhow::Error>(r.honoured)
        }
    };
    // Forged: another instant, another reset, a mark never given.
    let forged = [
        pb::Mark {
            at_ns: mark.at_ns + 1,
            ..mark
        },
        pb::Mark {
            reset_ns: mark.reset_ns + 1,
            ..mark
        },
        pb::Mark {
            reset_ns: 1,
            at_ns: 1,
        },
    ];
    let items = forged.iter().map(|m| give("per-ip", key, 3, *m)).collect();
    ensure!(give_back(CLIENT_TOKEN, items).await? == [0, 0, 0]);
    ensure!(
        remaining(&c).await? == 5,
        "a forged give-back changed the bucket"
    );
    // Another credential's give-back of this hold honours nothing; a read token may not.
    ensure!(give_back("other-client-token-01", vec![give("per-ip", key, 3, mark)]).await? == [0]);
    let read = c
        .give_back(with_token(
            pb::GiveBackRequest {
                items: vec![give("per-ip", key, 3, mark)],
            },
            "ops-read-token-000001",
        ))
        .await;
    ensure!(refused(read) == (Code::PermissionDenied, "forbidden".into()));
    ensure!(remaining(&c).await? == 5);
    // The real one: at most what it took (3 of 10 asked), once.
    ensure!(give_back(CLIENT_TOKEN, vec![give("per-ip", key, 10, mark)]).await? == [3]);
    ensure!(remaining(&c).await? == 8);
    ensure!(give_back(CLIENT_TOKEN, vec![give("per-ip", key, 3, mark)]).await? == [0]);
    ensure!(remaining(&c).await? == 8);
    // Holds in a batch: each admitted one marked.
    let batch = c
        .check_batch(with_token(
            pb::CheckBatchRequest {
                checks: vec![
                    check("per-ip", key, 1, true),
                    check("per-ip", key, 1, false),
                ],
            },
            CLIENT_TOKEN,
        ))
        .await?
        .into_inner();
    use pb::check_batch_result::Result as B;
    let marks: Vec<bool> = batch
        .results
        .iter()
        .map(|r| matches!(&r.result, Some(B::Answer(a)) if a.hold.is_some()))
        .collect();
    ensure!(marks == [true, false], "{batch:?}");
    cluster.stop().await
}

/// A directory for a test's files, removed when the process ends (under the system's temp).
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ringlimit-sdk-calls-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Topology and Lease from a client we did not write: Python grpcio, stubs compiled by
/// grpc_tools from our `.proto` when the script starts, against three nodes with a secret.
#[tokio::test]
async fn a_python_grpcio_client_calls_topology_and_lease() -> Result<()> {
    let Some(python) = python_with("grpc, grpc_tools") else {
        eprintln!("no Python with grpcio and grpc_tools (made by .ci/run): skipping");
        return Ok(());
    };
    let cluster = TestCluster::start_with(3, guarded).await?;
    let key = "py:lease";
    let owner = owner_of(&cluster, "per-ip", 1, key)?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/v1_sdk_calls.py");
    let protos = concat!(env!("CARGO_MANIFEST_DIR"), "/../crates/proto/proto");
    let args = vec![
        script.into(),
        protos.into(),
        cluster.grpc_addrs()?,
        CLIENT_TOKEN.into(),
        key.into(),
    ];
    let calls = run_client_script(python, args).await?;
    let topology = calls.by("topology");
    let members = topology["members"].as_array().context("members")?;
    ensure!(members.len() == 3, "{topology}");
    for (m, node) in members.iter().zip(cluster.iter()) {
        let grpc = node.grpc.context("gRPC")?.to_string();
        ensure!(m["grpc_addr"] == grpc.as_str(), "{m}");
    }
    // fixed64 is a string in protobuf's JSON mapping.
    let seed = named_seed("per-user", 1).to_string();
    ensure!(
        topology["rules"][1]["name"] == "per-user" && topology["rules"][1]["seed"] == seed.as_str(),
        "{topology}"
    );
    ensure!(calls.by("lease-anonymous")["error"] == "UNAUTHENTICATED");
    for i in 0..3 {
        let line = calls.by(&format!("lease-{i}"));
        let grant = &line["grants"][0];
        if i == owner {
            ensure!(grant["granted"]["tokens"] == "2", "node-{i}: {line}");
        } else {
            ensure!(grant["error"]["error"] == "not_owner", "node-{i}: {line}");
        }
    }
    cluster.stop().await
}
