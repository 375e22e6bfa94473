//! Global rules across a cluster: every node answers `mode: global` checks at once, from its own
//! count plus its peers' gossiped counts, and the cluster admits close to the limit.
//!
//! - accuracy: 3 nodes, ~250 checks/s round-robin for one window; admitted within 10% of the
//!   limit, every answer local (nothing forwarded), not degraded, fast. The issue's figure
//!   (300 per 20 s) is the `#[ignore]`d `accuracy_300_per_20s` (run it with `--ignored`); the
//!   default run keeps the same limit and rate over a 4 s window.
//! - a node SIGKILLed mid-window (real binaries, product defaults): the survivors keep
//!   answering, and the next window stays within the bound.
//! - a 2 | 1 partition of the gossip path (the transport's test-only blocklist drops datagrams
//!   between the two sides; peer RPC is untouched, but global checks never use it): each side
//!   admits at most the limit; after healing, the counts converge within a few gossip rounds.
//! - a node that joins mid-window learns the counts made before it came.
//! - a rolling restart (real binaries, SIGTERM and SIGKILL) forgets no count: each restarted
//!   node learns every node's counts, its own previous life's included, before it is ready.
//!
//! Windows are aligned to the Unix epoch, so the tests start their load just after a window
//! boundary and tell windows apart by each answer's `reset_at_ms` (the window's end). Like the
//! cluster tests they take `exclusive()` and measure real time on a small machine.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::cluster::transport::GossipBlocklist;
use ringlimit_node::rules::RuleSet;
use ringlimit_tests::{
    Api, ProcessNode, ProcessSpec, TestCluster, exclusive, wait_all_alive, wait_until,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// About 250 checks/s in all.
const EVERY: Duration = Duration::from_millis(4);

/// A rules file with one global fixed-window rule `hot` and a wide one for reading counts.
fn rules_yaml(limit: u64, period: &str) -> String {
    format!(
        r#"
rules:
  - name: hot
    limit: {limit}
    period: {period}
    algorithm: fixed_window
    mode: global
  - name: wide
    limit: 1000000
    period: 1h
    algorithm: fixed_window
    mode: global
"#
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sleeps until `margin_ms` after the next window boundary of `period_ms` (or of the current
/// one, when that is still `margin_ms` away at most); returns that window's end (Unix ms).
async fn next_window(period_ms: u64, margin_ms: u64) -> u64 {
    let now = unix_ms();
    let start = now - now % period_ms + period_ms;
    tokio::time::sleep(Duration::from_millis(start + margin_ms - now)).await;
    start + period_ms
}

/// One answer seen by the load.
#[derive(Debug, Clone)]
struct Sample {
    node: usize,
    latency: Duration,
    result: Result<Answer, String>,
}

#[derive(Debug, Clone, Copy)]
struct Answer {
    allowed: bool,
    degraded: bool,
    /// The window's end for a fixed window.
    reset_at_ms: u64,
}

async fn check(api: &Api, body: &Value) -> Result<Answer> {
    let r = api.check(body).await?;
    ensure!(
        r.status == 200 || r.status == 429,
        "{}: {}",
        r.status,
        r.text
    );
    let v = r.json()?;
    let allowed = v["allowed"].as_bool().context("no allowed")?;
    ensure!(allowed == (r.status == 200), "status {} but {v}", r.status);
    Ok(Answer {
        allowed,
        degraded: v["degraded"].as_bool().context("no degraded")?,
        reset_at_ms: v["reset_at_ms"].as_u64().context("no reset_at_ms")?,
    })
}

/// Sends `body` every `EVERY` for `run`, round-robin over the nodes whose `up` flag is set,
/// each check on its own task so that a slow answer never slows the rate.
async fn drive(apis: &[Api], up: &[Arc<AtomicBool>], body: &Value, run: Duration) -> Vec<Sample> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(EVERY);
    let end = Instant::now() + run;
    let mut turn = 0usize;
    while Instant::now() < end {
        tick.tick().await;
        let Some(node) = (0..apis.len())
            .map(|k| (turn + k) % apis.len())
            .find(|&n| up[n].load(Ordering::Relaxed))
        else {
            break;
        };
        turn = node + 1;
        let (api, body) = (apis[node].clone(), body.clone());
        tasks.spawn(async move {
            let started = Instant::now();
            let result = check(&api, &body).await.map_err(|e| format!("{e:#}"));
            Sample {
                node,
                latency: started.elapsed(),
                result,
            }
        });
    }
    let mut samples = Vec::new();
    while let Some(s) = tasks.join_next().await {
        if let Ok(s) = s {
            samples.push(s);
        }
    }
    samples
}

/// Admitted checks per window end, over the samples of `nodes`.
fn admitted_by_window(samples: &[Sample], nodes: &[usize]) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| nodes.contains(&s.node)) {
        if let Ok(a) = &s.result {
            *out.entry(a.reset_at_ms).or_default() += u64::from(a.allowed);
        }
    }
    out
}

fn percentile(samples: &[&Sample], p: f64) -> Duration {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    l.sort();
    if l.is_empty() {
        return Duration::ZERO;
    }
    l[((l.len() - 1) as f64 * p).round() as usize]
}

/// Every answer of these samples succeeded and is not degraded; returns (p50, p99, max).
fn all_local_and_fast(samples: &[&Sample]) -> Result<(Duration, Duration, Duration)> {
    let failed: Vec<_> = samples.iter().filter(|s| s.result.is_err()).collect();
    ensure!(failed.is_empty(), "failed checks: {failed:?}");
    let degraded = samples
        .iter()
        .filter(|s| matches!(s.result, Ok(Answer { degraded: true, .. })))
        .count();
    ensure!(degraded == 0, "{degraded} degraded answers");
    let max = samples.iter().map(|s| s.latency).max().unwrap_or_default();
    Ok((percentile(samples, 0.5), percentile(samples, 0.99), max))
}

/// The sum of one `forwarding` counter over nodes.
async fn forwarded(apis: &[Api]) -> Result<u64> {
    let mut n = 0;
    for a in apis {
        let v = a.cluster().await?;
        n += v.forwarding("forwarded") + v.forwarding("fail_open");
    }
    Ok(n)
}

/// Three in-process nodes with the global rules, gossip and publishing every `interval`.
async fn cluster(limit: u64, period: &str, interval: Duration) -> Result<TestCluster> {
    let rules = RuleSet::from_yaml(&rules_yaml(limit, period))?;
    TestCluster::start_with(3, |c: &mut NodeConfig| {
        c.rules = rules.clone();
        c.gossip_interval = interval;
        c.global_publish = interval;
    })
    .await
}

/// One window of ~250 checks/s round-robin over three nodes; returns (admitted, checks).
async fn accuracy(limit: u64, period_ms: u64, interval: Duration) -> Result<(u64, usize)> {
    let period = format!("{period_ms}ms");
    let c = cluster(limit, &period, interval).await?;
    let apis: Vec<Api> = c.iter().map(|n| n.api().clone()).collect();
    let up: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    let body = json!({ "key": "hot-key", "rule": "hot" });
    let window_end = next_window(period_ms, 50).await;
    // Stop short of the window's end so that every check falls in this window.
    let samples = drive(&apis, &up, &body, Duration::from_millis(period_ms - 300)).await;
    let all: Vec<&Sample> = samples.iter().collect();
    let (p50, p99, max) = all_local_and_fast(&all)?;
    let by_window = admitted_by_window(&samples, &[0, 1, 2]);
    let admitted = by_window.get(&window_end).copied().unwrap_or(0);
    let per_node: Vec<u64> = (0..3)
        .map(|n| admitted_by_window(&samples, &[n]).values().sum())
        .collect();
    let over = admitted as f64 / limit as f64 - 1.0;
    eprintln!(
        "global accuracy: limit {limit} per {period}, publish/gossip every {interval:?}: \
         {admitted} admitted of {} checks ({:+.1}% of the limit; per node {per_node:?}); \
         latency p50 {p50:?} p99 {p99:?} max {max:?}; windows seen {by_window:?}",
        samples.len(),
        over * 100.0
    );
    ensure!(
        by_window.len() == 1,
        "checks fell in several windows: {by_window:?}"
    );
    ensure!(forwarded(&apis).await? == 0, "global checks were forwarded");
    ensure!(max < Duration::from_millis(100), "slowest check {max:?}");
    ensure!(
        admitted >= limit && admitted as f64 <= limit as f64 * 1.10,
        "admitted {admitted} for a limit of {limit}"
    );

    // Operators see the counters and each peer's last merge.
    let view = c[0].cluster().await?;
    let g = &view.0["global"];
    ensure!(g["counters"].as_u64().unwrap_or(0) >= 1, "{g}");
    ensure!(g["published"].as_u64() == Some(1), "{g}");
    let peers = g["peers"].as_array().context("no peers")?;
    ensure!(peers.len() == 2, "{g}");
    for p in peers {
        // Peers publish only while they admit: their last merge is from before the limit.
        let age = p["last_merge_ms_ago"]
            .as_u64()
            .context("peer never merged")?;
        ensure!(age < period_ms + 2_000, "{g}");
    }
    let metrics = c[0].get("/metrics").await?.text;
    ensure!(
        metrics.contains(r#"ringlimit_checks_total{result="allowed",mode="global"}"#),
        "no global check metric"
    );
    c.stop().await?;
    Ok((admitted, samples.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rule_admits_the_limit_within_10_percent() -> Result<()> {
    let _one = exclusive().await;
    // The product's default publish interval (100 ms) and gossip round (100 ms).
    accuracy(300, 4_000, Duration::from_millis(100)).await?;
    Ok(())
}

/// The issue's figure: 300 per 20 s at ~250 checks/s. About 25 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: the issue's 300 per 20 s figure; run with --ignored"]
async fn accuracy_300_per_20s() -> Result<()> {
    let _one = exclusive().await;
    accuracy(300, 20_000, Duration::from_millis(100)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_mid_window_survivors_keep_the_bound() -> Result<()> {
    let _one = exclusive().await;
    let (limit, period_ms) = (300u64, 4_000u64);
    let dir = std::env::temp_dir().join(format!("ringlimit-global-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, rules_yaml(limit, "4s"))?;
    let rules_arg = rules.to_string_lossy().into_owned();
    // Real binaries with the product's defaults (gossip and publish every 100 ms).
    let mut nodes = ProcessNode::cluster(3, |_, spec| {
        spec.args = vec!["--config".into(), rules_arg.clone()];
    })
    .await?;
    let apis: Vec<Api> = nodes
        .iter()
        .map(|n| Api::with_timeout(n.http, Duration::from_secs(2)))
        .collect::<Result<_>>()?;
    let up: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    let body = json!({ "key": "hot-key", "rule": "hot" });

    let first_end = next_window(period_ms, 50).await;
    let second_end = first_end + period_ms;
    let load = {
        let (apis, up, body) = (apis.clone(), up.clone(), body.clone());
        // Through the first window and most of the second.
        tokio::spawn(async move {
            drive(
                &apis,
                &up,
                &body,
                Duration::from_millis(2 * period_ms - 300),
            )
            .await
        })
    };
    // Halfway through the first window (after the limit is reached), SIGKILL node-2.
    tokio::time::sleep(Duration::from_millis(period_ms / 2)).await;
    up[2].store(false, Ordering::Relaxed);
    let killed_at_ms = unix_ms();
    nodes[2].kill()?;
    let samples = load.await?;

    let survivors: Vec<&Sample> = samples.iter().filter(|s| s.node != 2).collect();
    let (p50, p99, max) = all_local_and_fast(&survivors)?;
    let victim_failed = samples
        .iter()
        .filter(|s| s.node == 2 && s.result.is_err())
        .count();
    let by_window = admitted_by_window(&samples, &[0, 1, 2]);
    let first = by_window.get(&first_end).copied().unwrap_or(0);
    let second = by_window.get(&second_end).copied().unwrap_or(0);
    let victim_first = admitted_by_window(&samples, &[2])
        .get(&first_end)
        .copied()
        .unwrap_or(0);
    let view = apis[0].cluster().await?;
    eprintln!(
        "node killed {} ms into the window: window 1 admitted {first} ({victim_first} by the \
         victim), window 2 (survivors only) admitted {second}, limit {limit}; {} survivor \
         checks, p50 {p50:?} p99 {p99:?} max {max:?}; {victim_failed} checks in flight to the \
         victim failed; node-2 shown as {:?}",
        killed_at_ms + period_ms - first_end,
        survivors.len(),
        view.state_of("node-2"),
    );
    ensure!(max < Duration::from_millis(100), "slowest check {max:?}");
    ensure!(first as f64 <= limit as f64 * 1.10, "window 1: {first}");
    ensure!(
        second >= limit && second as f64 <= limit as f64 * 1.10,
        "window 2: {second}"
    );
    ensure!(forwarded(&apis[..2]).await? == 0, "global checks forwarded");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Blocks gossip between the two sides of a 2 | 1 split.
fn partition(cluster: &TestCluster, lists: &[Arc<GossipBlocklist>]) {
    for i in 0..2 {
        lists[i].block(cluster[2].peer);
        lists[2].block(cluster[i].peer);
    }
}

/// The cost-0 answer's `remaining` for `key` under the wide rule.
async fn remaining(api: &Api, key: &str) -> Result<u64> {
    let r = api
        .check(&json!({ "key": key, "rule": "wide", "cost": 0 }))
        .await?;
    r.json()?["remaining"].as_u64().context("no remaining")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_each_side_admits_at_most_the_limit_then_converges() -> Result<()> {
    let _one = exclusive().await;
    let (limit, period_ms) = (200u64, 4_000u64);
    let interval = Duration::from_millis(50);
    let rules = RuleSet::from_yaml(&rules_yaml(limit, "4s"))?;
    let mut lists: Vec<Arc<GossipBlocklist>> = Vec::new();
    let c = TestCluster::start_with(3, |cfg: &mut NodeConfig| {
        let list = Arc::new(GossipBlocklist::default());
        lists.push(list.clone());
        cfg.rules = rules.clone();
        cfg.gossip_interval = interval;
        cfg.global_publish = interval;
        cfg.gossip_blocklist = Some(list);
    })
    .await?;
    let apis: Vec<Api> = c.iter().map(|n| n.api().clone()).collect();

    partition(&c, &lists);
    let split = Instant::now();
    for (i, api) in apis.iter().enumerate() {
        let others: Vec<String> = if i == 2 {
            vec!["node-0".into(), "node-1".into()]
        } else {
            vec!["node-2".into()]
        };
        wait_until(
            &format!("node-{i} sees the other side gone"),
            Duration::from_secs(15),
            || async {
                let v = api.cluster().await?;
                Ok(others
                    .iter()
                    .all(|o| v.state_of(o).as_deref() != Some("alive")))
            },
        )
        .await?;
    }
    eprintln!("partition seen by every node after {:?}", split.elapsed());

    // One window of load on both sides: each admits at most the limit.
    let up: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    let body = json!({ "key": "hot-key", "rule": "hot" });
    let window_end = next_window(period_ms, 50).await;
    let samples = drive(&apis, &up, &body, Duration::from_millis(period_ms - 300)).await;
    let all: Vec<&Sample> = samples.iter().collect();
    let (p50, p99, max) = all_local_and_fast(&all)?;
    let side_a = admitted_by_window(&samples, &[0, 1]);
    let side_b = admitted_by_window(&samples, &[2]);
    let (a, b) = (
        side_a.get(&window_end).copied().unwrap_or(0),
        side_b.get(&window_end).copied().unwrap_or(0),
    );
    eprintln!(
        "partitioned window: side of 2 admitted {a}, lone node admitted {b}, limit {limit}; \
         {} checks, p50 {p50:?} p99 {p99:?} max {max:?}",
        samples.len()
    );
    ensure!(side_a.len() == 1 && side_b.len() == 1, "several windows");
    ensure!(
        a >= limit && a as f64 <= limit as f64 * 1.10,
        "side of 2 admitted {a}"
    );
    ensure!(b == limit, "lone node admitted {b}");
    ensure!(max < Duration::from_millis(100), "slowest check {max:?}");

    // Counts made on each side while split, then the heal: every node must come to see both.
    // (The wide rule's window is an hour: start in one with a minute to spare.)
    let hour = 3_600_000;
    if hour - unix_ms() % hour < 60_000 {
        next_window(hour, 100).await;
    }
    let key = format!("converge-{}", unix_ms());
    let wide = json!({ "key": key, "rule": "wide" });
    let (n_a, n_b) = (40u64, 25u64);
    for i in 0..n_a {
        ensure!(check(&apis[(i % 2) as usize], &wide).await?.allowed);
    }
    for _ in 0..n_b {
        ensure!(check(&apis[2], &wide).await?.allowed);
    }
    let full = 1_000_000u64;
    for (i, want) in [(0, full - n_a), (1, full - n_a), (2, full - n_b)] {
        wait_until(
            &format!("node-{i} sees its side's count"),
            Duration::from_secs(5),
            || async { Ok(remaining(&apis[i], &key).await? == want) },
        )
        .await?;
    }
    // Still split: the other side's counts have not crossed.
    tokio::time::sleep(interval * 4).await;
    ensure!(remaining(&apis[0], &key).await? == full - n_a);
    ensure!(remaining(&apis[2], &key).await? == full - n_b);

    for l in &lists {
        l.clear();
    }
    let healed = Instant::now();
    let want = full - n_a - n_b;
    let mut converged = Vec::new();
    for (i, api) in apis.iter().enumerate() {
        wait_until(
            &format!("node-{i} sees both sides' counts"),
            Duration::from_secs(10),
            || async { Ok(remaining(api, &key).await? == want) },
        )
        .await?;
        converged.push(healed.elapsed());
    }
    let converged_after = healed.elapsed();
    let ids = ["node-0", "node-1", "node-2"];
    wait_all_alive(&c.nodes, &ids, Duration::from_secs(15)).await?;
    let rejoined_after = healed.elapsed();
    eprintln!(
        "healed: counts converged on every node after {converged_after:?} (per node \
         {converged:?}, {:.1} gossip rounds of {interval:?}); all alive again after \
         {rejoined_after:?}",
        converged_after.as_secs_f64() / interval.as_secs_f64()
    );
    ensure!(
        converged_after < Duration::from_secs(3),
        "converged after {converged_after:?}"
    );
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_mid_window_sees_the_counts_so_far() -> Result<()> {
    let _one = exclusive().await;
    let rules = RuleSet::from_yaml(&rules_yaml(100, "4s"))?;
    let c = TestCluster::start_with(2, |cfg: &mut NodeConfig| cfg.rules = rules.clone()).await?;
    let hour = 3_600_000;
    if hour - unix_ms() % hour < 60_000 {
        next_window(hour, 100).await;
    }
    let key = format!("join-{}", unix_ms());
    let wide = json!({ "key": key, "rule": "wide" });
    for i in 0..30 {
        ensure!(check(c[i % 2].api(), &wide).await?.allowed);
    }
    let mut config = NodeConfig::local("node-late");
    config.rules = rules.clone();
    config.seeds = c.seeds();
    let joined = Instant::now();
    let late = ringlimit_tests::TestNode::start(config).await?;
    wait_until(
        "the late node sees the 30 hits",
        Duration::from_secs(5),
        || async { Ok(remaining(late.api(), &key).await? == 1_000_000 - 30) },
    )
    .await?;
    eprintln!(
        "a node joining mid-window saw the counts so far {:?} after it started",
        joined.elapsed()
    );
    late.stop().await?;
    c.stop().await
}

/// One global rule for a day's quota.
const DAILY_RULES: &str = r#"
rules:
  - name: daily
    limit: 100
    period: 1d
    algorithm: fixed_window
    mode: global
"#;

/// The cost-0 answer's `remaining` for `key` under the daily rule.
async fn daily_remaining(api: &Api, key: &str) -> Result<u64> {
    let r = api
        .check(&json!({ "key": key, "rule": "daily", "cost": 0 }))
        .await?;
    r.json()?["remaining"].as_u64().context("no remaining")
}

/// Issue 29, item 1: three real nodes, a global rule of 100 a day, 30 admitted through each;
/// then a rolling restart — each node in turn stopped (SIGTERM, SIGKILL for node-1), started
/// again as a new incarnation, and waited for until ready, as a deploy does. Every node must
/// then still count all 90 (the day admitted 190 of 100 when restarted nodes forgot them), and
/// the cluster admit at most 10 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_keeps_the_global_counts() -> Result<()> {
    let _one = exclusive().await;
    let day = 86_400_000;
    // The test must not straddle midnight (UTC), when the day's window turns.
    if day - unix_ms() % day < 60_000 {
        next_window(day, 100).await;
    }
    let dir = std::env::temp_dir().join(format!("ringlimit-global-roll-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, DAILY_RULES)?;
    let args = vec!["--config".to_owned(), rules.to_string_lossy().into_owned()];
    let mut nodes = ProcessNode::cluster(3, |_, spec| spec.args = args.clone()).await?;
    for n in &nodes {
        n.wait_ready().await?;
    }
    let seeds: Vec<String> = nodes.iter().map(|n| n.peer.to_string()).collect();
    let key = format!("roll-{}", unix_ms());
    let daily = json!({ "key": key, "rule": "daily" });
    for n in &nodes {
        for _ in 0..30 {
            ensure!(check(n.api(), &daily).await?.allowed);
        }
    }
    for n in &nodes {
        wait_until(
            &format!("{} counts the 90", n.node_id),
            Duration::from_secs(5),
            || async { Ok(daily_remaining(n.api(), &key).await? == 10) },
        )
        .await?;
    }

    for (i, node) in nodes.iter_mut().enumerate() {
        let stopped = Instant::now();
        let how = if i == 1 { "SIGKILL" } else { "SIGTERM" };
        if i == 1 {
            node.kill()?;
        } else {
            let code = node.stop().await?;
            ensure!(code == 0, "{} exited with {code}", node.node_id);
        }
        let mut spec = ProcessSpec::new(&node.node_id, node.peer.port());
        spec.seeds = seeds.clone();
        spec.args = args.clone();
        *node = ProcessNode::start(&spec).await?;
        node.wait_ready().await?;
        let seen = daily_remaining(node.api(), &key).await?;
        eprintln!(
            "{} restarted ({how}), ready after {:?}: remaining {seen}",
            node.node_id,
            stopped.elapsed()
        );
    }
    // Nothing else to wait for: once ready, a node counts what the cluster admitted.
    let mut left = Vec::new();
    for n in &nodes {
        left.push(daily_remaining(n.api(), &key).await?);
    }
    ensure!(
        left.iter().all(|&r| r <= 10),
        "remaining after the rolling restart, per node: {left:?} (10 expected)"
    );

    // The rest of the day's quota, through each node in turn: 10 at most in all.
    let mut admitted = 0u64;
    for n in &nodes {
        for _ in 0..10 {
            admitted += u64::from(check(n.api(), &daily).await?.allowed);
        }
        let want = 10u64.saturating_sub(admitted);
        for m in &nodes {
            wait_until(
                &format!("{} counts {admitted} more", m.node_id),
                Duration::from_secs(5),
                || async { Ok(daily_remaining(m.api(), &key).await? == want) },
            )
            .await?;
        }
    }
    eprintln!("after the rolling restart: remaining {left:?}, then {admitted} more admitted");
    ensure!(admitted <= 10, "{admitted} more admitted after the restart");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
