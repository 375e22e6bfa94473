//! An open-loop load of checks: requests leave at a steady rate whatever the answers take (a
//! slow answer does not slow the load), spread over the nodes given, and every answer is counted.
//!
//! Prints JSON lines: `{"start_ms": ...}` first, then one per tick of answers that arrived in it
//! (`t_ms` the tick's start, unix ms; `allowed`, `denied`, `degraded`, `errors`, `skipped`),
//! and last `{"summary": {...}, "latency_ms": {"p50", "p99", "max"}}` (latency from each
//! request's scheduled time, so a stall counts in full).

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::{Instant, MissedTickBehavior};

#[derive(clap::Args)]
pub struct Args {
    /// A node's HTTP address (`HOST:PORT`); repeated, used in turn.
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// The check sent, as JSON (e.g. `{"key":"k","rule":"shared"}`).
    #[arg(long)]
    body: String,
    /// Checks per second.
    #[arg(long)]
    rate: f64,
    /// How long to send, in seconds (0: until standard input closes).
    #[arg(long, default_value_t = 0.0)]
    seconds: f64,
    /// A line of counts every this many milliseconds.
    #[arg(long, default_value_t = 250)]
    tick_ms: u64,
    /// Requests in flight at most; a request due beyond it is skipped and counted.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
}

#[derive(Default)]
struct Counts {
    allowed: AtomicU64,
    denied: AtomicU64,
    degraded: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
}

impl Counts {
    fn take(&self) -> [u64; 5] {
        [
            self.allowed.swap(0, Ordering::Relaxed),
            self.denied.swap(0, Ordering::Relaxed),
            self.degraded.swap(0, Ordering::Relaxed),
            self.errors.swap(0, Ordering::Relaxed),
            self.skipped.swap(0, Ordering::Relaxed),
        ]
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub async fn run(a: Args) -> Result<()> {
    ensure!(a.rate > 0.0, "a rate above 0");
    let body: Value = serde_json::from_str(&a.body)?;
    let body = Arc::new(serde_json::to_vec(&body)?);
    if a.seconds <= 0.0 {
        crate::exit_with_stdin();
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?;
    let urls: Vec<String> = a
        .nodes
        .iter()
        .map(|n| format!("http://{n}/v1/check"))
        .collect();
    let counts = Arc::new(Counts::default());
    let total = Arc::new(Counts::default());
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let in_flight = Arc::new(AtomicUsize::new(0));

    let start = Instant::now();
    println!("{}", json!({ "start_ms": unix_ms() }));
    let reporter = {
        let counts = counts.clone();
        let tick = Duration::from_millis(a.tick_ms.max(10));
        tokio::spawn(async move {
            let mut every = tokio::time::interval_at(start + tick, tick);
            let mut from = unix_ms();
            loop {
                every.tick().await;
                let [allowed, denied, degraded, errors, skipped] = counts.take();
                println!(
                    "{}",
                    json!({ "t_ms": from, "allowed": allowed, "denied": denied,
                            "degraded": degraded, "errors": errors, "skipped": skipped })
                );
                from = unix_ms();
            }
        })
    };

    let period = Duration::from_secs_f64(1.0 / a.rate);
    let mut every = tokio::time::interval_at(start, period);
    // Open loop: requests missed by a late timer leave at once, not later.
    every.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let end = (a.seconds > 0.0).then(|| start + Duration::from_secs_f64(a.seconds));
    let mut n = 0usize;
    loop {
        let due = every.tick().await;
        if end.is_some_and(|e| due >= e) {
            break;
        }
        let url = urls[n % urls.len()].clone();
        n += 1;
        if in_flight.load(Ordering::Relaxed) >= a.max_in_flight {
            counts.skipped.fetch_add(1, Ordering::Relaxed);
            total.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (client, body, counts, total, latencies, in_flight) = (
            client.clone(),
            body.clone(),
            counts.clone(),
            total.clone(),
            latencies.clone(),
            in_flight.clone(),
        );
        tokio::spawn(async move {
            let answer = send(&client, &url, body.as_ref().clone()).await;
            let ms = due.elapsed().as_secs_f64() * 1000.0;
            for c in [&*counts, &*total] {
                match answer {
                    Some((allowed, degraded)) => {
                        if allowed {
                            c.allowed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            c.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        if degraded {
                            c.degraded.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        c.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if let Ok(mut l) = latencies.lock() {
                l.push(ms);
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    // The last answers, at most the client's timeout.
    let drain = Instant::now() + Duration::from_secs(3);
    while in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(a.tick_ms.max(10))).await;
    reporter.abort();
    let [allowed, denied, degraded, errors, skipped] = total.take();
    let mut ms = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| -> f64 {
        if ms.is_empty() {
            f64::NAN
        } else {
            ms[((ms.len() - 1) as f64 * p).round() as usize]
        }
    };
    println!(
        "{}",
        json!({
            "summary": { "allowed": allowed, "denied": denied, "degraded": degraded,
                         "errors": errors, "skipped": skipped },
            "latency_ms": { "p50": q(0.5), "p99": q(0.99), "max": q(1.0) },
        })
    );
    Ok(())
}

/// One check: `(allowed, degraded)`, or `None` when no answer came or it was neither 200 nor 429.
async fn send(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Option<(bool, bool)> {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    if status != 200 && status != 429 {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    Some((
        v.get("allowed")?.as_bool()?,
        v.get("degraded").and_then(Value::as_bool).unwrap_or(false),
    ))
}
