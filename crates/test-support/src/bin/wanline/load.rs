//! An open-loop load of checks: requests leave at a steady rate whatever the answers take (a
//! slow answer does not slow the load), spread over the nodes given, and every answer is counted.
//!
//! Prints JSON lines: `{"start_ms": ...}` first, then one per tick of answers that arrived in it
//! (`t_ms` the tick's start, unix ms; `allowed`, `denied`, `degraded`, `errors`, `skipped`),
//! and last `{"summary": {...}, "latency_ms": {"p50", "p99", "max"}, "windows": [...]}`
//! (latency from each request's scheduled time, so a stall counts in full; with `--window-ms`,
//! the answers of each window aligned on the epoch, as the node's fixed windows are).

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A node's HTTP address (`HOST:PORT`); repeated, used in turn.
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// The check sent, as JSON (e.g. `{"key":"k","rule":"shared"}`).
    #[arg(long)]
    body: String,
    /// Checks per second (at first).
    #[arg(long)]
    rate: f64,
    /// Changes of rate: `SECONDS=RATE,...`, seconds from the start (0 stops sending until the
    /// next change).
    #[arg(long, value_delimiter = ',')]
    schedule: Vec<String>,
    /// Start at this unix time in ms (so that loads in several regions move together).
    #[arg(long)]
    t0_ms: Option<u64>,
    /// Count answers per window of this many ms, aligned on the epoch.
    #[arg(long)]
    window_ms: Option<u64>,
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

/// `(seconds from the start, rate)`, in order, the first at 0.
fn parse_schedule(first: f64, entries: &[String]) -> Result<Vec<(f64, f64)>> {
    let mut steps = vec![(0.0, first)];
    for e in entries {
        let (at, rate) = e
            .split_once('=')
            .with_context(|| format!("a change is SECONDS=RATE, not {e:?}"))?;
        let (at, rate): (f64, f64) = (at.trim().parse()?, rate.trim().parse()?);
        ensure!(at >= 0.0 && rate >= 0.0, "bad change {e:?}");
        steps.push((at, rate));
    }
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(steps)
}

/// The rate at `t` s, and when the next change comes (if one does).
fn rate_at(steps: &[(f64, f64)], t: f64) -> (f64, Option<f64>) {
    let i = steps.iter().rposition(|&(at, _)| at <= t).unwrap_or(0);
    (steps[i].1, steps.get(i + 1).map(|s| s.0))
}

pub async fn run(a: Args) -> Result<()> {
    let steps = parse_schedule(a.rate, &a.schedule)?;
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
    let windows = Arc::new(Mutex::new(BTreeMap::<u64, [u64; 4]>::new()));

    let start = match a.t0_ms {
        Some(t0) => Instant::now() + Duration::from_millis(t0.saturating_sub(unix_ms())),
        None => Instant::now(),
    };
    tokio::time::sleep_until(start).await;
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

    let end = (a.seconds > 0.0).then(|| start + Duration::from_secs_f64(a.seconds));
    let mut due = start;
    let mut n = 0usize;
    loop {
        if end.is_some_and(|e| due >= e) {
            break;
        }
        let (rate, next) = rate_at(&steps, (due - start).as_secs_f64());
        if rate <= 0.0 {
            match next {
                Some(at) => {
                    due = start + Duration::from_secs_f64(at);
                    continue;
                }
                None if end.is_none() => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    continue;
                }
                None => break,
            }
        }
        // Open loop: a request the timer woke late for leaves at once, and the next keeps its
        // own time.
        tokio::time::sleep_until(due).await;
        let this = due;
        due += Duration::from_secs_f64(1.0 / rate);
        let url = urls[n % urls.len()].clone();
        n += 1;
        if in_flight.load(Ordering::Relaxed) >= a.max_in_flight {
            counts.skipped.fetch_add(1, Ordering::Relaxed);
            total.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (client, body, counts, total, latencies, in_flight, windows) = (
            client.clone(),
            body.clone(),
            counts.clone(),
            total.clone(),
            latencies.clone(),
            in_flight.clone(),
            windows.clone(),
        );
        let window_ms = a.window_ms;
        tokio::spawn(async move {
            let answer = send(&client, &url, body.as_ref().clone()).await;
            let ms = this.elapsed().as_secs_f64() * 1000.0;
            if let (Some(w), Ok(mut windows)) = (window_ms, windows.lock()) {
                let c = windows.entry(unix_ms() / w.max(1)).or_default();
                match answer {
                    Some((true, d)) => {
                        c[0] += 1;
                        c[2] += u64::from(d);
                    }
                    Some((false, d)) => {
                        c[1] += 1;
                        c[2] += u64::from(d);
                    }
                    None => c[3] += 1,
                }
            }
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
    let w = a.window_ms.unwrap_or(1).max(1);
    let windows: Vec<Value> = windows
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(i, [allowed, denied, degraded, errors])| {
            json!({ "start_ms": i * w, "allowed": allowed, "denied": denied,
                    "degraded": degraded, "errors": errors })
        })
        .collect();
    println!(
        "{}",
        json!({
            "summary": { "allowed": allowed, "denied": denied, "degraded": degraded,
                         "errors": errors, "skipped": skipped },
            "latency_ms": { "p50": q(0.5), "p99": q(0.99), "max": q(1.0) },
            "windows": windows,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_changes_the_rate_at_its_times() {
        let steps = parse_schedule(5.0, &["10=0".into(), "4=40".into()]).unwrap();
        assert_eq!(rate_at(&steps, 0.0), (5.0, Some(4.0)));
        assert_eq!(rate_at(&steps, 4.5), (40.0, Some(10.0)));
        assert_eq!(rate_at(&steps, 11.0), (0.0, None));
        assert!(parse_schedule(1.0, &["x".into()]).is_err());
    }
}
