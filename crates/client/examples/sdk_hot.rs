//! One hot key through the SDK with leases, for `bench/sdk_hot.sh`: one client thread (a
//! current-thread runtime) checks one key as fast as it can. After a warm-up (the key becomes hot
//! and is leased), it measures checks per second, then each check's latency, and, given the nodes'
//! pids, the nodes' CPU time over the measured phases per check. Prints one JSON line.
//!
//! ```text
//! cargo run --release -p ringlimit-client --example sdk_hot -- \
//!     --seeds http://127.0.0.1:8080 --seconds 5 --pids 123,124,125
//! ```

use anyhow::{Context, Result};
use clap::Parser;
use ringlimit_client::{Algorithm, Check, Client};
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    #[arg(long, value_delimiter = ',', required = true)]
    seeds: Vec<String>,
    /// Seconds of each measured phase (throughput, then latency).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// The nodes' pids, for their CPU time (Linux /proc).
    #[arg(long, value_delimiter = ',')]
    pids: Vec<u32>,
    /// The window's limit (fixed window of an hour): checks beyond it are denied.
    #[arg(long, default_value_t = 1_000_000_000)]
    limit: u64,
    /// Leases off: every check goes to its owner (the comparison).
    #[arg(long)]
    no_leases: bool,
    /// With `--no-leases`: one check at a time at this many a second, on `--keys` keys in turn
    /// (an inline token bucket of 1,000,000 an hour each), measured for `--seconds` (no
    /// throughput phase): the other SDKs' one-at-a-time load, for a like-for-like comparison of
    /// the nodes' CPU per check (a node woken for each check costs more per check than one kept
    /// busy).
    #[arg(long, requires = "no_leases")]
    rate: Option<f64>,
    /// Keys of `--rate`'s load.
    #[arg(long, default_value_t = 1_000)]
    keys: u64,
}

/// utime + stime of `pids`, in clock ticks.
fn ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|st| {
            let rest = st.rsplit_once(") ")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

/// The client both loads use (`--rate` requires `--no-leases`).
async fn connect(args: &Args) -> Result<Client> {
    Ok(Client::builder()
        .seeds(args.seeds.clone())
        .cluster_secret(std::env::var("RINGLIMIT_CLUSTER_SECRET").unwrap_or_default())
        .deadline(Duration::from_millis(50))
        .leases(!args.no_leases)
        .build()
        .await?)
}

/// The `q` quantile of the sorted latencies `lat` (0 when there are none).
fn percentile(lat: &[u64], q: f64) -> u64 {
    lat.get(((lat.len() as f64) * q) as usize)
        .copied()
        .unwrap_or(0)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    if let Some(rate) = args.rate {
        return paced(args, rate).await;
    }
    let client = connect(&args).await?;
    let check = Check::inline("bench:hot", args.limit, Duration::from_secs(3600))
        .algorithm(Algorithm::FixedWindow);
    let mut allowed = 0u64;
    let mut total = 0u64;
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(args.warmup) {
        // Yield now and then: the lease's asking task runs on this thread too.
        for _ in 0..1_000 {
            let a = client.check(&check).await.context("check")?;
            allowed += u64::from(a.allowed);
            total += 1;
        }
        tokio::task::yield_now().await;
    }
    let before_stats = client.stats();
    anyhow::ensure!(
        before_stats.degraded == 0,
        "checks were degraded: the cluster was not reached ({before_stats:?})"
    );
    let hz = 100.0; // CLK_TCK on Linux
    let t0 = ticks(&args.pids);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(args.seconds) {
        for _ in 0..1_000 {
            let a = client.check(&check).await.context("check")?;
            allowed += u64::from(a.allowed);
            n += 1;
        }
        tokio::task::yield_now().await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut lat = Vec::with_capacity(4_000_000);
    let start2 = Instant::now();
    while start2.elapsed() < Duration::from_secs(args.seconds) {
        for _ in 0..1_000 {
            let t = Instant::now();
            let a = client.check(&check).await.context("check")?;
            lat.push(t.elapsed().as_nanos() as u64);
            allowed += u64::from(a.allowed);
        }
        tokio::task::yield_now().await;
    }
    let t1 = ticks(&args.pids);
    total += n + lat.len() as u64;
    lat.sort_unstable();
    let pct = |q: f64| percentile(&lat, q);
    let measured = n + lat.len() as u64;
    let server_us = (t1 - t0) as f64 / hz * 1e6 / measured as f64;
    let s = client.stats();
    println!(
        "{{\"checks_per_s\":{:.0},\"p50_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"server_cpu_us_per_check\":{:.4},\"server_ticks\":{},\"measured\":{},\"leased_in_measure\":{},\"direct_in_measure\":{},\"allowed\":{},\"checks\":{},\"lease_asks\":{},\"limit\":{}}}",
        n as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        pct(0.999),
        server_us,
        t1 - t0,
        measured,
        s.leased + s.leased_denied - before_stats.leased - before_stats.leased_denied,
        s.direct - before_stats.direct,
        allowed,
        total,
        s.lease_asks,
        args.limit,
    );
    Ok(())
}

/// `--rate`: one check at a time on schedule, each sent at its time (a late one at once); the
/// thread sleeps between them (this runtime has nothing else to do meanwhile).
async fn paced(args: Args, rate: f64) -> Result<()> {
    anyhow::ensure!(
        rate > 0.0 && args.keys > 0,
        "--rate and --keys must be positive"
    );
    let client = connect(&args).await?;
    let checks: Vec<Check> = (0..args.keys)
        .map(|i| {
            Check::inline(
                format!("bench:rt:{i}"),
                1_000_000,
                Duration::from_secs(3600),
            )
        })
        .collect();
    for c in checks.iter().take(100) {
        client.check(c).await.context("check")?;
    }
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut lat = Vec::new();
    let t0 = ticks(&args.pids);
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(args.seconds) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += gap;
        let c = &checks[lat.len() % checks.len()];
        let t = Instant::now();
        client.check(c).await.context("check")?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let t1 = ticks(&args.pids);
    lat.sort_unstable();
    let pct = |q: f64| percentile(&lat, q);
    let s = client.stats();
    println!(
        "{{\"rate\":{:.0},\"asked_rate\":{rate:.0},\"p50_ns\":{},\"p99_ns\":{},\"server_ticks\":{},\"checks\":{},\"degraded\":{}}}",
        lat.len() as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        t1 - t0,
        lat.len(),
        s.degraded,
    );
    Ok(())
}
