//! Clock skew with real processes: one node started under libfaketime (Debian's `faketime` package;
//! its wall clock moved, its monotonic clock left alone), as an operator whose NTP failed on one
//! host would see it. Its offset is measured within 10 ms by the others, it says its clock is off,
//! and a global rule's windows stay on the cluster's clock.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::{ProcessNode, WAIT, faketime, faketime_available as available, wait_until};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_faketime_is_measured_and_global_windows_stay_on_the_cluster_clock()
-> Result<()> {
    if !available()? {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("ringlimit-skew-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - { name: g, limit: 60, period: 2s, algorithm: fixed_window, mode: global }\n",
    )?;
    let config = rules.to_string_lossy().into_owned();
    let nodes = ProcessNode::cluster(3, |i, spec| {
        spec.args = vec!["--config".into(), config.clone()];
        if i == 2 {
            spec.env = faketime("+10s");
        }
    })
    .await?;
    // The others see node-2 10 s ahead, within 10 ms; node-2 sees itself off.
    wait_until("node-0 measured node-2's clock", WAIT, || async {
        let v = nodes[0].api().get("/v1/cluster").await?.json()?;
        let peers = v["clock"]["peers"].as_array().cloned().unwrap_or_default();
        Ok(peers.iter().any(|p| p["node_id"] == "node-2"))
    })
    .await?;
    let v = nodes[0].api().get("/v1/cluster").await?.json()?;
    let offset = v["clock"]["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["node_id"] == "node-2"))
        .and_then(|p| p["offset_ms"].as_f64())
        .context("node-2's offset")?;
    ensure!(
        (offset - 10_000.0).abs() <= 10.0,
        "node-2 offset {offset} ms: {v}"
    );
    wait_until("node-2 says its clock is off", WAIT, || async {
        let v = nodes[2].api().get("/v1/cluster").await?.json()?;
        Ok(v["clock"]["off"] == true)
    })
    .await?;
    let ready = nodes[2].api().get("/readyz").await?;
    ensure!(
        ready.status == 200 && ready.text.contains("clock: this node's clock is"),
        "{}",
        ready.text
    );
    ensure!(
        nodes[2]
            .log()
            .contains("this node's clock is off the cluster's"),
        "{}",
        nodes[2].log()
    );

    // A global rule of 60 per 2 s, ~90 checks/s over the three nodes for three windows of the
    // cluster clock: each admits at most 5% over (before the cluster clock, the node 10 s ahead
    // counted into windows of its own: up to twice the limit).
    let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let into = Duration::from_millis(2_000 - (epoch.as_millis() % 2_000) as u64 + 200);
    // A sleep is the thing: the load starts just past a boundary of the wall clock's windows.
    tokio::time::sleep(into).await;
    let first = (epoch + into).as_millis() / 2_000;
    let mut admitted = [0u32; 3];
    let started = Instant::now();
    let mut i = 0usize;
    while started.elapsed() < Duration::from_millis(5_600) {
        let node = &nodes[i % 3];
        let r = node
            .api()
            .check(&json!({ "key": "tenant", "rule": "g" }))
            .await?;
        // The window it was counted in: a fixed window's answer resets at its end (on the
        // cluster clock, here the right one).
        let reset_ms = r.json()?["reset_at_ms"].as_u64().context("reset_at_ms")?;
        let w = u128::from(reset_ms / 2_000).saturating_sub(first + 1) as usize;
        if r.status == 200 && w < 3 {
            admitted[w] += 1;
        }
        i += 1;
        // A sleep is the thing: it paces the load at ~90 checks/s, the rate under test.
        tokio::time::sleep(Duration::from_millis(11)).await;
    }
    ensure!(
        admitted.iter().all(|n| *n <= 63),
        "admitted per window {admitted:?}"
    );
    ensure!(
        admitted.iter().all(|n| *n >= 45),
        "admitted per window {admitted:?}"
    );
    Ok(())
}
