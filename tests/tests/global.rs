//! Global rules across a cluster of real `ringlimit` processes: a smoke test of the binary.
//! A rolling restart (SIGTERM, and SIGKILL for one node) forgets no count: each restarted node
//! learns every node's counts, its own previous life's included, before it is ready.
//!
//! The protocol behaviour of global rules (accuracy within 10% of the limit, a node killed
//! mid-window, a 2 | 1 partition and its healing, a node that joins mid-window, the rolling
//! restart) is tested on whole nodes in memory under tokio's paused clock:
//! `crates/node/src/testing/global.rs`. Like the cluster tests this one takes `exclusive()` and
//! runs in real time.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::{Api, ProcessNode, ProcessSpec, exclusive, wait_until};
use serde_json::{Value, json};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sleeps until `margin_ms` after the next window boundary of `period_ms`.
async fn next_window(period_ms: u64, margin_ms: u64) {
    let now = unix_ms();
    let start = now - now % period_ms + period_ms;
    // A sleep is the thing: windows are on the wall clock, and a test starts at a boundary.
    tokio::time::sleep(Duration::from_millis(start + margin_ms - now)).await;
}

/// Whether a check was allowed (a 200 or 429 whose body agrees).
async fn check(api: &Api, body: &Value) -> Result<bool> {
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
    Ok(allowed)
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

/// Three real nodes, a global rule of 100 a day, 30 admitted through each; then a rolling restart —
/// each node in turn stopped (SIGTERM, SIGKILL for node-1), started again as a new incarnation, and
/// waited for until ready, as a deploy does. Every node must then still count all 90 (the day
/// admitted 190 of 100 when restarted nodes forgot them), and the cluster admit at most 10 more.
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
            ensure!(check(n.api(), &daily).await?);
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
            admitted += u64::from(check(n.api(), &daily).await?);
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
