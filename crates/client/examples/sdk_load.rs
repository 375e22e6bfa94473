//! Load generator for `bench/sdk.sh`: checks against a running cluster, either through the SDK
//! (straight to each key's owner) or through a random node's HTTP endpoint (what a service does
//! without the SDK), and prints one JSON line of throughput and latency.
//!
//! ```text
//! cargo run --release -p ringlimit-client --example sdk_load -- \
//!     --seeds http://127.0.0.1:8080,http://127.0.0.1:8081 --mode sdk --concurrency 8 --seconds 5
//! ```
//! `--rate N` paces the callers to N checks/s in all (latency at a fixed load); without it each
//! caller sends its next check as soon as the last is answered (throughput).

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use ringlimit_client::{Check, Client};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// `Client::check`, straight to the owner over the peer protocol.
    Sdk,
    /// `POST /v1/check` to a random node (which forwards to the owner).
    Http,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_delimiter = ',', required = true)]
    seeds: Vec<String>,
    #[arg(long, value_enum, default_value = "sdk")]
    mode: Mode,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Checks per second in all (default: as fast as answers come).
    #[arg(long)]
    rate: Option<u64>,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
}

struct Worker {
    latencies_ns: Vec<u64>,
    degraded: u64,
    errors: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    // Circuit and membership events of the client on stderr (one line per event).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let client = Client::builder()
        .seeds(args.seeds.clone())
        .name("sdk_load")
        .cluster_secret(std::env::var("RINGLIMIT_CLUSTER_SECRET").unwrap_or_default())
        .build()
        .await?;
    if client.members().is_empty() {
        bail!("no member reachable through {:?}", args.seeds);
    }
    let bases: Arc<Vec<String>> = Arc::new(
        args.seeds
            .iter()
            .map(|s| format!("http://{}", s.trim_start_matches("http://")))
            .collect(),
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(2))
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let interval = args
        .rate
        .map(|r| Duration::from_secs_f64(args.concurrency as f64 / r.max(1) as f64));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..args.concurrency {
        let (client, http, bases, stop) =
            (client.clone(), http.clone(), bases.clone(), stop.clone());
        let (mode, keys) = (args.mode, args.keys);
        tasks.spawn(async move {
            let mut out = Worker {
                latencies_ns: Vec::with_capacity(1 << 20),
                degraded: 0,
                errors: 0,
            };
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64) << 32;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(i) = interval {
                    next += i;
                    tokio::time::sleep_until(next.into()).await;
                }
                // xorshift: a cheap, reproducible key sequence per worker.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = format!("load:{}", rng % keys);
                let started = Instant::now();
                let degraded = match mode {
                    Mode::Sdk => client
                        .check(&Check::inline(key, 1_000_000, Duration::from_secs(60)))
                        .await
                        .map(|a| a.degraded)
                        .map_err(|e| e.to_string()),
                    Mode::Http => {
                        let base = &bases[(rng >> 32) as usize % bases.len()];
                        http_check(&http, base, &key).await
                    }
                };
                out.latencies_ns
                    .push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
                match degraded {
                    Ok(true) => out.degraded += 1,
                    Ok(false) => {}
                    Err(_) => out.errors += 1,
                }
            }
            out
        });
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let (mut degraded, mut errors) = (0, 0);
    while let Some(w) = tasks.join_next().await {
        let w = w.context("worker")?;
        all.extend(w.latencies_ns);
        degraded += w.degraded;
        errors += w.errors;
    }
    all.sort_unstable();
    let q = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)));
    let us = |v: Option<&u64>| v.map_or(f64::NAN, |n| *n as f64 / 1000.0);
    let stats = client.stats();
    println!(
        "{{\"mode\":\"{}\",\"concurrency\":{},\"rate\":{},\"checks\":{},\"checks_per_s\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},\"degraded\":{},\"errors\":{},\"checks_per_frame\":{:.2}}}",
        match args.mode {
            Mode::Sdk => "sdk",
            Mode::Http => "http",
        },
        args.concurrency,
        args.rate.unwrap_or(0),
        all.len(),
        all.len() as f64 / args.seconds as f64,
        us(q(0.50)),
        us(q(0.99)),
        us(q(0.999)),
        us(all.last()),
        degraded,
        errors,
        stats.checks_sent as f64 / stats.frames.max(1) as f64,
    );
    Ok(())
}

async fn http_check(http: &reqwest::Client, base: &str, key: &str) -> Result<bool, String> {
    let body = format!(r#"{{"key":"{key}","limit":1000000,"period_ms":60000}}"#);
    let r = http
        .post(format!("{base}/v1/check"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !(r.status().is_success() || r.status().as_u16() == 429) {
        return Err(format!("status {}", r.status()));
    }
    let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
    Ok(v["degraded"].as_bool().unwrap_or(false))
}
