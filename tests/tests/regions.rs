//! Regions: two `ringlimit` processes on 127.0.0.1, each its own region (`--region`,
//! `--region-peers`), sharing one `scope: regions` limit; and a region with the wrong
//! region secret, refused.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::{ProcessNode, ProcessSpec, TempDir, WAIT, free_peer_port, wait_until};
use serde_json::{Value, json};
use std::time::Duration;

const SECRET: &str = "the-region-secret-of-every-region";
/// Twenty an hour: what the regions admit together in the test's few seconds.
const LIMIT: u64 = 20;

fn rules(dir: &TempDir) -> Result<String> {
    let path = dir.0.join("rules.yaml");
    std::fs::write(
        &path,
        format!(
            "rules:\n  - {{ name: shared, limit: {LIMIT}, period: 1h, algorithm: token_bucket, \
             scope: regions }}\n"
        ),
    )?;
    Ok(path.to_string_lossy().into_owned())
}

fn spec(region: &str, port: u16, peers: &str, rules: &str, secret: &str) -> ProcessSpec {
    let mut s = ProcessSpec::new(&format!("{region}-0"), port);
    s.args = [
        "--config",
        rules,
        "--region",
        region,
        "--region-peers",
        peers,
        "--region-interval-ms",
        "200",
    ]
    .map(String::from)
    .to_vec();
    s.env = vec![("RINGLIMIT_REGION_SECRET".into(), secret.into())];
    s
}

async fn cluster(node: &ProcessNode) -> Result<Value> {
    node.get("/v1/cluster").await?.json()
}

/// The state of region `name` in `node`'s `/v1/cluster`.
async fn state(node: &ProcessNode, name: &str) -> Result<String> {
    let c = cluster(node).await?;
    let regions = c["regions"].as_array().context("regions")?;
    let r = regions
        .iter()
        .find(|r| r["name"] == name)
        .with_context(|| format!("no region {name} in {c}"))?;
    Ok(r["state"].as_str().unwrap_or_default().to_owned())
}

async fn allowed(node: &ProcessNode, key: &str) -> Result<bool> {
    let r = node.check(&json!({ "key": key, "rule": "shared" })).await?;
    ensure!(
        r.status == 200 || r.status == 429,
        "status {}: {}",
        r.status,
        r.text
    );
    let body = r.json()?;
    ensure!(body["degraded"] == false, "degraded: {body}");
    Ok(body["allowed"] == true)
}

#[tokio::test]
async fn two_regions_share_one_limit_and_a_wrong_secret_is_refused() -> Result<()> {
    let dir = TempDir::new("regions")?;
    let rules = rules(&dir)?;
    let (p_eu, p_us, p_ap) = (free_peer_port()?, free_peer_port()?, free_peer_port()?);
    let eu = ProcessNode::start(&spec(
        "eu",
        p_eu,
        &format!("us=127.0.0.1:{p_us}"),
        &rules,
        SECRET,
    ))
    .await?;
    let us = ProcessNode::start(&spec(
        "us",
        p_us,
        &format!("eu=127.0.0.1:{p_eu}"),
        &rules,
        SECRET,
    ))
    .await?;
    eu.wait_ready().await?;
    us.wait_ready().await?;

    // Checks through both regions, a few seconds long: together never above the limit, and
    // both regions admitted some.
    let (mut in_eu, mut in_us) = (0u64, 0u64);
    for _ in 0..40 {
        in_eu += u64::from(allowed(&eu, "api-key-1").await?);
        in_us += u64::from(allowed(&us, "api-key-1").await?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("admitted: eu {in_eu}, us {in_us} of {LIMIT}");
    ensure!(
        in_eu + in_us <= LIMIT,
        "eu {in_eu} + us {in_us} over {LIMIT}"
    );
    ensure!(in_eu > 0 && in_us > 0, "eu {in_eu}, us {in_us}");
    ensure!(
        in_eu + in_us >= LIMIT / 2,
        "only {} of {LIMIT}",
        in_eu + in_us
    );

    // /v1/cluster: our region, and each region's link state, allowance, demand, round trip.
    for (node, ours, other) in [(&eu, "eu", "us"), (&us, "us", "eu")] {
        wait_until(&format!("{ours} sees {other} up"), WAIT, || async {
            Ok(state(node, other).await? == "up")
        })
        .await?;
        let c = cluster(node).await?;
        ensure!(c["region"] == ours, "{c}");
        let regions = c["regions"].as_array().context("regions")?;
        ensure!(regions.len() == 2 && regions[0]["name"] == ours, "{c}");
        for r in regions {
            for field in ["allowance", "demand"] {
                ensure!(r[field].is_number(), "{field} in {r}");
            }
        }
        ensure!(regions[1]["rtt_ms"].is_number(), "{c}");
    }

    // A region with another secret: its link is refused, said clearly, and it shows the
    // other region unreachable.
    let ap = ProcessNode::start(&spec(
        "ap",
        p_ap,
        &format!("eu=127.0.0.1:{p_eu}"),
        &rules,
        "not-the-region-secret",
    ))
    .await?;
    ap.wait_ready().await?;
    for i in 0..8 {
        allowed(&ap, &format!("key-{i}")).await?;
    }
    wait_until("ap sees eu unreachable", WAIT, || async {
        Ok(state(&ap, "eu").await? == "unreachable")
    })
    .await?;
    wait_until("ap logs why", WAIT, || async {
        Ok(ap.log().contains("RINGLIMIT_REGION_SECRET"))
    })
    .await?;
    Ok(())
}

/// A region of two nodes: the other region's link reaches one of them, which relays the asks
/// of buckets its peer owns; every key is shared through all three nodes, within its limit,
/// never degraded, and admitted in both regions.
#[tokio::test]
async fn a_region_of_two_nodes_relays_to_the_owner() -> Result<()> {
    let dir = TempDir::new("regions-relay")?;
    let rules = rules(&dir)?;
    let p_us = free_peer_port()?;
    let eu = ProcessNode::cluster(2, |_, s| {
        let mut r = spec(
            "eu",
            s.peer_port,
            &format!("us=127.0.0.1:{p_us}"),
            &rules,
            SECRET,
        );
        r.node_id = s.node_id.clone();
        r.seeds = s.seeds.clone();
        *s = r;
    })
    .await?;
    let entry = eu[0].peer.to_string();
    let us = ProcessNode::start(&spec("us", p_us, &format!("eu={entry}"), &rules, SECRET)).await?;
    for n in eu.iter().chain([&us]) {
        n.wait_ready().await?;
    }
    for k in 0..6 {
        let key = format!("relayed-{k}");
        let mut admitted = [0u64; 3];
        for _ in 0..25 {
            for (i, n) in [&eu[0], &eu[1], &us].into_iter().enumerate() {
                admitted[i] += u64::from(allowed(n, &key).await?);
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        let total: u64 = admitted.iter().sum();
        eprintln!(
            "{key}: eu-0 {} eu-1 {} us {} of {LIMIT}",
            admitted[0], admitted[1], admitted[2]
        );
        ensure!(total <= LIMIT, "{key}: {admitted:?} over {LIMIT}");
        ensure!(
            admitted[2] > 0 && admitted[0] + admitted[1] > 0,
            "{key}: {admitted:?}"
        );
    }
    Ok(())
}
