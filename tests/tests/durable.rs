//! Durable buckets: real `ringlimit` processes with `--data-dir`, stopped (SIGTERM or SIGKILL)
//! and started again with the same directory: quotas used up stay used up.
//!
//! Like the cluster tests these take `exclusive()`: they start and stop whole processes, and a
//! starved machine would stretch their waits.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::{
    ProcessNode, ProcessSpec, TempDir, WAIT, exclusive, free_peer_port, keys_owned_by,
    wait_all_alive, wait_until,
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
    let ids: Vec<&str> = specs.iter().map(|s| s.node_id.as_str()).collect();
    wait_links(&nodes, &ids).await?;
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
    // Once every link is up again: a check whose owner's link is still reconnecting is
    // answered from the fail-open share, which for a limit of 1 is the whole limit (the next
    // test checks before the cluster has formed, with a limit that a share is less than).
    wait_all_alive(&nodes, &ids, WAIT).await?;
    wait_links(&nodes, &ids).await?;
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

/// A check of `body` through `node`: whether it was admitted, and whether it was degraded.
async fn answered(node: &ProcessNode, body: &Value) -> Result<(bool, bool)> {
    let r = node.check(body).await?;
    ensure!(
        r.status == 200 || r.status == 429,
        "{} {}",
        r.status,
        r.text
    );
    let degraded = r.json()?["degraded"].as_bool().unwrap_or(false);
    Ok((r.status == 200, degraded))
}

/// `body` with a cost of `cost`.
fn costing(body: &Value, cost: u64) -> Value {
    let mut b = body.clone();
    b["cost"] = json!(cost);
    b
}

/// Waits until every node forwards to every other one, answered by the owner itself (not
/// degraded: no link still reconnecting).
async fn wait_links(nodes: &[ProcessNode], ring: &[&str]) -> Result<()> {
    for n in nodes {
        for owner in ring.iter().filter(|o| **o != n.node_id) {
            let key = &keys_owned_by(
                ring,
                owner,
                &format!("probe-{owner}"),
                1,
                (1_000_000, 1_000),
            )?[0];
            let probe = json!({ "key": key, "limit": 1_000_000, "period_ms": 1_000 });
            wait_until(&format!("{} reaches {owner}", n.node_id), WAIT, || async {
                let r = n.check(&probe).await?;
                let a = r.json()?;
                Ok(r.status == 200 && a["degraded"] == false && a["replica"] != true)
            })
            .await?;
        }
    }
    Ok(())
}

/// The first node of a cluster restarted whole comes back alone (the others still down, as
/// when pods start one after the other): the keys its peers own are theirs (their buckets are
/// on their disks), not decided here from fresh buckets on a ring of one. Each is admitted at
/// most its fail-open share, degraded, and a closed rule's are denied; its own stay used up.
/// Once the others are back, every used-up key is denied everywhere and a new key admits
/// exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_node_back_alone_does_not_admit_its_peers_used_up_keys() -> Result<()> {
    const LIMIT: u64 = 9;
    /// The fail-open share of a limit of 9 among the three members the ring still names.
    const SHARE: usize = 3;
    let _one = exclusive().await;
    let dirs = temp_dirs("first", 3)?;
    let mut nodes = ProcessNode::cluster(3, |i, s| {
        s.args = vec![
            "--data-dir".into(),
            dirs[i].0.to_string_lossy().into_owned(),
        ];
        s.env = vec![("RINGLIMIT_ADMIN_TOKEN".into(), TOKEN.into())];
    })
    .await?;
    for n in &nodes {
        n.wait_ready().await?;
    }
    let specs: Vec<ProcessSpec> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut s = spec(&n.node_id, n.peer.port(), &dirs[i].0);
            s.seeds = nodes.iter().map(|m| m.peer.to_string()).collect();
            s
        })
        .collect();
    let ids: Vec<String> = nodes.iter().map(|n| n.node_id.clone()).collect();
    let ring: Vec<&str> = ids.iter().map(String::as_str).collect();
    wait_links(&nodes, &ring).await?;
    let inline = |key: &String| json!({ "key": key, "limit": LIMIT, "period_ms": DAY_MS });
    let mine: Vec<Value> = keys_owned_by(&ring, ring[0], "mine", 5, (LIMIT, DAY_MS))?
        .iter()
        .map(inline)
        .collect();
    let mut theirs: Vec<Value> = Vec::new();
    for owner in &ring[1..] {
        theirs.extend(
            keys_owned_by(&ring, owner, "theirs", 12, (LIMIT, DAY_MS))?
                .iter()
                .map(inline),
        );
    }
    let rule = json!({ "limit": LIMIT, "period": "1d", "on_owner_unreachable": "closed" });
    let r = nodes[0]
        .admin(
            reqwest::Method::PUT,
            "/v1/admin/rules/closed-daily",
            TOKEN,
            Some(&rule),
        )
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    for n in &nodes {
        wait_until(&format!("{} has the rule", n.node_id), WAIT, || async {
            let r = n
                .admin(reqwest::Method::GET, "/v1/admin/rules", TOKEN, None)
                .await?;
            Ok(r.status == 200 && r.text.contains("closed-daily"))
        })
        .await?;
    }
    let closed: Vec<Value> = (0..30)
        .map(|i| json!({ "key": format!("closed:{i}"), "rule": "closed-daily" }))
        .collect();
    let used: Vec<&Value> = mine.iter().chain(&theirs).chain(&closed).collect();
    for (i, k) in used.iter().enumerate() {
        let n = &nodes[i % nodes.len()];
        ensure!(
            admitted(n, &costing(k, LIMIT)).await?,
            "{k} admitted its whole limit"
        );
        ensure!(!admitted(n, k).await?, "{k} used up");
    }
    for n in nodes.iter_mut() {
        n.terminate()?;
    }
    for n in nodes.iter_mut() {
        let code = n.wait_exit(Duration::from_secs(20)).await?;
        ensure!(code == 0, "{} exited with {code}", n.node_id);
    }
    drop(nodes);

    // Only the first comes back: ready alone, once its wait for peers is over.
    let first = ProcessNode::start(&specs[0]).await?;
    first.wait_ready().await?;
    let cluster = first.cluster().await?;
    let mut over = Vec::new();
    for k in &theirs {
        let mut admitted = 0;
        for _ in 0..LIMIT {
            let (allowed, degraded) = answered(&first, k).await?;
            ensure!(
                !allowed || degraded,
                "{k} admitted, not degraded, by the first node back alone; its view: {cluster:?}"
            );
            admitted += usize::from(allowed);
        }
        if admitted > SHARE {
            over.push((k["key"].clone(), admitted));
        }
    }
    ensure!(
        over.is_empty(),
        "the first node back alone admitted more than the fail-open share ({SHARE}) of keys its \
         peers own and had used up: {over:?}; its view: {cluster:?}\nlog:\n{}",
        first.log()
    );
    let again = admitted_of(&first, &closed).await? + admitted_of(&first, &mine).await?;
    ensure!(
        again == 0,
        "{again} used-up keys of the closed rule or of its own admitted by the first node back alone"
    );

    // The others come back: the limits hold exactly again.
    let mut nodes = vec![first];
    for s in &specs[1..] {
        nodes.push(ProcessNode::start(s).await?);
    }
    for n in &nodes {
        n.wait_ready().await?;
    }
    wait_all_alive(&nodes, &ring, WAIT).await?;
    wait_links(&nodes, &ring).await?;
    let mut over = 0;
    for n in &nodes {
        for k in &used {
            over += usize::from(admitted(n, k).await?);
        }
    }
    ensure!(
        over == 0,
        "{over} checks of used-up keys admitted once the cluster is back"
    );
    let fresh = inline(&"fresh".to_owned());
    let mut admitted_fresh = 0;
    for i in 0..2 * LIMIT as usize {
        let (allowed, degraded) = answered(&nodes[i % nodes.len()], &fresh).await?;
        ensure!(!degraded, "a degraded answer once the cluster is back");
        admitted_fresh += usize::from(allowed);
    }
    ensure!(
        admitted_fresh == LIMIT as usize,
        "a new key admitted {admitted_fresh} of its limit {LIMIT} once the cluster is back"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_foreign_data_dir_is_refused_with_one_clear_line() -> Result<()> {
    let dirs = temp_dirs("refused", 2)?;
    let corrupt = &dirs[0].0;
    std::fs::create_dir_all(corrupt)?;
    std::fs::write(
        corrupt.join("buckets.snap"),
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

/// A reservation taken before a single node's SIGTERM is settled after its restart: the
/// unused estimate is given back to the restored bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_taken_before_a_restart_is_settled_after_it() -> Result<()> {
    let _one = exclusive().await;
    let dirs = temp_dirs("reserve", 1)?;
    let s = spec("solo", free_peer_port()?, &dirs[0].0);
    let mut node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    let body = json!({ "key": "llm:team-1", "limit": 1_000, "period_ms": DAY_MS,
        "algorithm": "fixed_window", "cost": 300, "ttl_ms": 600_000 });
    let reply = node.api().post("/v1/reserve", &body).await?;
    ensure!(reply.status == 200, "{}", reply.text);
    let v = reply.json()?;
    ensure!(v["remaining"] == 700, "{v}");
    let id = v["reservation"].as_str().context("an id")?.to_owned();
    let code = node.stop().await?;
    ensure!(code == 0, "exit {code}");

    let node = ProcessNode::start(&s).await?;
    node.wait_ready().await?;
    let reply = node
        .api()
        .post("/v1/settle", &json!({ "reservation": id, "cost": 100 }))
        .await?;
    ensure!(
        reply.status == 200,
        "the settle after the restart: {} {}; log:\n{}",
        reply.status,
        reply.text,
        node.log()
    );
    let v = reply.json()?;
    ensure!(v["remaining"] == 900, "200 of the 300 given back: {v}");
    // Settled once: a second settle is unknown.
    let again = node
        .api()
        .post("/v1/settle", &json!({ "reservation": id, "cost": 100 }))
        .await?;
    ensure!(again.status == 404, "{} {}", again.status, again.text);
    Ok(())
}
