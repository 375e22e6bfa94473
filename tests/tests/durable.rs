//! Durable buckets: real `ringlimit` processes with `--data-dir`, stopped (SIGTERM or SIGKILL)
//! and started again with the same directory: quotas used up stay used up.
//!
//! Like the cluster tests these take `exclusive()`: they start and stop whole processes, and a
//! starved machine would stretch their waits.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::{
    ProcessNode, ProcessSpec, TempDir, WAIT, exclusive, free_peer_port, wait_all_alive, wait_until,
};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "durable-test-token";
/// One a day: used up, a key stays denied until tomorrow unless its count is forgotten.
const DAY_MS: u64 = 86_400_000;

/// A temporary directory per node, removed on drop.
fn temp_dirs(tag: &str, n: usize) -> Result<Vec<TempDir>> {
    (0..n)
        .map(|i| TempDir::new(&format!("durable-{tag}-{i}")))
        .collect()
}

fn spec(node_id: &str, port: u16, dir: &Path) -> ProcessSpec {
    let mut s = ProcessSpec::new(node_id, port);
    s.args = vec!["--data-dir".into(), dir.to_string_lossy().into_owned()];
    s.env = vec![("RINGLIMIT_ADMIN_TOKEN".into(), TOKEN.into())];
    s
}

fn daily(key: &str) -> Value {
    json!({ "key": key, "limit": 1, "period_ms": DAY_MS })
}

/// Whether a check of `body` through `node` is admitted.
async fn admitted(node: &ProcessNode, body: &Value) -> Result<bool> {
    let r = node.check(body).await?;
    ensure!(
        r.status == 200 || r.status == 429,
        "{} {}",
        r.status,
        r.text
    );
    Ok(r.status == 200)
}

/// Uses up `keys` (each admitted once, then denied).
async fn use_up(node: &ProcessNode, keys: &[Value]) -> Result<()> {
    for k in keys {
        ensure!(admitted(node, k).await?, "first check of {k} admitted");
        ensure!(!admitted(node, k).await?, "second check of {k} denied");
    }
    Ok(())
}

/// How many of `keys` are admitted through `node` now.
async fn admitted_of(node: &ProcessNode, keys: &[Value]) -> Result<usize> {
    let mut n = 0;
    for k in keys {
        n += usize::from(admitted(node, k).await?);
    }
    Ok(n)
}

fn keys(tag: &str, n: usize) -> Vec<Value> {
    (0..n).map(|i| daily(&format!("{tag}:{i}"))).collect()
}

/// A single node restarted with its directory, by SIGTERM or (after the buckets are on disk)
/// SIGKILL: every key used up before is still denied.
async fn single_node_restart(kill: bool) -> Result<()> {
    let _one = exclusive().await;
    let dirs = temp_dirs(if kill { "kill" } else { "term" }, 1)?;
    let port = free_peer_port()?;
    let s = spec("solo", port, &dirs[0].0);
    let mut node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    let keys = keys("solo", 20);
    use_up(&node, &keys).await?;
    if kill {
        // One commit interval (100 ms) and the commit itself: the buckets are on disk.
        wait_until("20 buckets on disk", Duration::from_secs(5), || async {
            Ok(node.series("ringlimit_persist_buckets").await? >= 20.0)
        })
        .await?;
        node.kill()?;
    } else {
        let code = node.stop().await?;
        ensure!(code == 0, "exit {code}");
    }
    let node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    let restored = node.series("ringlimit_persist_restored_buckets").await?;
    let again = admitted_of(&node, &keys).await?;
    ensure!(
        again == 0,
        "{again} of 20 used-up daily keys admitted again after the restart ({restored} restored); log:\n{}",
        node.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_keeps_used_up_daily_quotas_across_a_sigterm_restart() -> Result<()> {
    single_node_restart(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_keeps_used_up_daily_quotas_across_a_sigkill_after_one_interval() -> Result<()>
{
    single_node_restart(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_stopped_together_and_started_again_admit_nothing_over() -> Result<()> {
    let _one = exclusive().await;
    let dirs = temp_dirs("cluster", 3)?;
    let mut nodes = ProcessNode::cluster(3, |i, s| {
        s.args = vec![
            "--data-dir".into(),
            dirs[i].0.to_string_lossy().into_owned(),
        ];
    })
    .await?;
    for n in &nodes {
        n.wait_ready().await?;
    }
    let specs: Vec<ProcessSpec> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut s = ProcessSpec::new(&n.node_id, n.peer.port());
            s.seeds = nodes.iter().map(|m| m.peer.to_string()).collect();
            s.args = vec![
                "--data-dir".into(),
                dirs[i].0.to_string_lossy().into_owned(),
            ];
            s
        })
        .collect();
    let keys = keys("all", 60);
    for (i, chunk) in keys.chunks(20).enumerate() {
        use_up(&nodes[i], chunk).await?;
    }
    // All three at once, as a node pool upgrade or an outage would.
    for n in nodes.iter_mut() {
        n.terminate()?;
    }
    for n in nodes.iter_mut() {
        let code = n.wait_exit(Duration::from_secs(20)).await?;
        ensure!(code == 0, "{} exited with {code}", n.node_id);
    }
    drop(nodes);
    let mut nodes = Vec::new();
    for s in &specs {
        nodes.push(ProcessNode::start(s).await?);
    }
    for n in &nodes {
        n.wait_ready().await?;
    }
    // Once the cluster has formed again: a node that has not yet seen its peers decides their
    // keys on the ring it sees, without their buckets (see the durable buckets page).
    let ids: Vec<&str> = specs.iter().map(|s| s.node_id.as_str()).collect();
    wait_all_alive(&nodes, &ids, WAIT).await?;
    let mut over = 0;
    for n in &nodes {
        over += admitted_of(n, &keys).await?;
    }
    ensure!(
        over == 0,
        "{over} checks admitted over the used-up daily quotas after a whole-cluster restart"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_foreign_data_dir_is_refused_with_one_clear_line() -> Result<()> {
    let dirs = temp_dirs("refused", 2)?;
    let corrupt = &dirs[0].0;
    std::fs::create_dir_all(corrupt)?;
    std::fs::write(
        corrupt.join("buckets.redb"),
        b"not a bucket file".repeat(500),
    )?;
    let e = match ProcessNode::start(&spec("c", free_peer_port()?, corrupt)).await {
        Ok(_) => anyhow::bail!("a node started on a corrupt bucket file"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(e.contains("not a readable bucket file"), "{e}");
    // Another node's directory: stamped by "a", refused to "b".
    let theirs = &dirs[1].0;
    let port = free_peer_port()?;
    let mut a = ProcessNode::start(&spec("a", port, theirs)).await?;
    a.stop().await?;
    let e = match ProcessNode::start(&spec("b", port, theirs)).await {
        Ok(_) => anyhow::bail!("node b started on node a's directory"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(e.contains("holds the buckets of node \"a\""), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_rule_that_says_persist_never_is_not_kept() -> Result<()> {
    let _one = exclusive().await;
    let dirs = temp_dirs("never", 1)?;
    let s = spec("solo", free_peer_port()?, &dirs[0].0);
    let mut node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    for (name, persist) in [("kept", "auto"), ("forgotten", "never")] {
        let body = json!({ "limit": 1, "period": "1d", "persist": persist });
        let r = node
            .admin(
                reqwest::Method::PUT,
                &format!("/v1/admin/rules/{name}"),
                TOKEN,
                Some(&body),
            )
            .await?;
        ensure!(r.status == 200, "{} {}", r.status, r.text);
    }
    let kept = json!({ "key": "k", "rule": "kept" });
    let forgotten = json!({ "key": "k", "rule": "forgotten" });
    use_up(&node, &[kept.clone(), forgotten.clone()]).await?;
    let code = node.stop().await?;
    ensure!(code == 0, "exit {code}");
    let node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    ensure!(
        !admitted(&node, &kept).await?,
        "persist: auto of a 1d rule is kept"
    );
    ensure!(
        admitted(&node, &forgotten)
            .await
            .context("check of the never rule")?,
        "persist: never is not kept"
    );
    Ok(())
}
