//! `openloop`: an open-loop HTTP load generator, for tail latency (bench/tail.sh).
//!
//! A closed-loop tool (wrk) sends the next request only when the previous answer is back, so
//! when the server stalls for 4 ms the tool stalls with it and records one slow request where
//! clients arriving at a fixed rate would have seen dozens: coordinated omission. Here every
//! request has a time fixed in advance (connection `c` of `C` sends its `k`-th at
//! `start + (k*C + c)/rate`), whatever the answers do; a request that must wait for a late
//! answer on its connection still counts its latency from its scheduled time.
//!
//! Each connection is an HTTP/1.1 keep-alive connection with at most one request in flight.
//! Sends are timed by a timerfd per connection, to within the kernel's timer slack (50 µs):
//! tokio's timers round up to the millisecond, which would add up to 1 ms to every latency
//! measured from the schedule.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use clap::Parser;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

/// An answer later than this (from its scheduled time) is a timeout, counted as an error.
const TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed dial, the connection's requests fail at once for this long.
const REDIAL: Duration = Duration::from_millis(100);

#[derive(Parser, Debug, Clone)]
#[command(about = "Open-loop HTTP load generator: fixed-rate POSTs, latency from scheduled send")]
struct Args {
    /// Target URL (http only), e.g. http://127.0.0.1:8080/v1/check.
    #[arg(long)]
    url: Uri,
    /// Requests per second, over all connections.
    #[arg(long)]
    rate: f64,
    /// Measured seconds (after the warmup).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds sent at the rate but not recorded.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Keep-alive connections, each with at most one request in flight.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// Tokio worker threads (1: a current-thread runtime, one core at most).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Number of distinct values of {n} in the body.
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
    /// Request body; {n} is replaced by a random key index in 0..keyspace.
    #[arg(
        long,
        default_value = r#"{"key":"user:{n}","limit":100,"period_ms":1000}"#
    )]
    body_template: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What one connection saw, for requests scheduled after the warmup.
#[derive(Default)]
struct Stats {
    latencies_us: Vec<u64>,
    allowed: u64,
    denied: u64,
    /// Connect failures, broken connections and statuses other than 2xx and 429.
    failed: u64,
    timeouts: u64,
}

/// Everything a connection task needs; shared read-only.
struct Plan {
    addr: String,
    authority: String,
    path: String,
    template: String,
    keyspace: u64,
    rate: f64,
    conns: u64,
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rate <= 0.0 || args.connections == 0 || args.keyspace == 0 || args.duration <= 0.0 {
        bail!("--rate, --connections, --keyspace and --duration must be positive");
    }
    if args.url.scheme_str() != Some("http") {
        bail!("only http:// URLs are supported");
    }
    let host = args.url.host().context("URL without a host")?;
    let port = args.url.port_u16().unwrap_or(80);
    let rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    // Leave 100 ms to spawn the connection tasks before the first scheduled send.
    let start = Instant::now() + Duration::from_millis(100);
    let measure_from = start + Duration::from_secs_f64(args.warmup.max(0.0));
    let plan = Arc::new(Plan {
        addr: format!("{host}:{port}"),
        authority: args
            .url
            .authority()
            .map_or(host.to_owned(), |a| a.to_string()),
        path: args
            .url
            .path_and_query()
            .map_or("/".into(), |p| p.to_string()),
        template: args.body_template.clone(),
        keyspace: args.keyspace,
        rate: args.rate,
        conns: u64::from(args.connections),
        start,
        measure_from,
        end: measure_from + Duration::from_secs_f64(args.duration),
    });
    let all = rt.block_on(async {
        let tasks: Vec<_> = (0..plan.conns)
            .map(|c| tokio::spawn(connection(plan.clone(), c)))
            .collect();
        let mut all = Stats::default();
        for task in tasks {
            let s = task.await.context("connection task")??;
            all.latencies_us.extend(s.latencies_us);
            all.allowed += s.allowed;
            all.denied += s.denied;
            all.failed += s.failed;
            all.timeouts += s.timeouts;
        }
        anyhow::Ok(all)
    })?;
    report(&args, all);
    Ok(())
}

/// Connection `c`: sends its share of the schedule, re-dialling whenever the connection breaks.
async fn connection(plan: Arc<Plan>, c: u64) -> Result<Stats> {
    let fd = rustix::time::timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    // SAFETY: an OwnedFd is open and keeps the same descriptor until the AsyncFd drops it.
    let timer = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (c + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let mut stats = Stats::default();
    // After a failed dial, the next waits REDIAL: no connect storm while the server is down.
    let mut redial_at = plan.start;
    let mut told = false; // the connection's first failure goes to stderr
    for k in 0.. {
        let due = plan.start + Duration::from_secs_f64((k * plan.conns + c) as f64 / plan.rate);
        if due >= plan.end {
            break;
        }
        sleep_until(&timer, due).await?;
        let measured = due >= plan.measure_from;
        let deadline = due + TIMEOUT;
        let now = Instant::now();
        let dialling = sender.is_none();
        let backoff = dialling && now < redial_at;
        // A backlog older than the timeout is not sent: it is already a timeout.
        let outcome = if now >= deadline {
            None
        } else if backoff {
            Some(Err(anyhow!("not connected (waiting to re-dial)")))
        } else {
            let n = next(&mut rng) % plan.keyspace;
            let body = plan.template.replace("{n}", &n.to_string());
            tokio::time::timeout_at(deadline.into(), send(&plan, &mut sender, body))
                .await
                .ok()
        };
        let done = Instant::now();
        if !matches!(outcome, Some(Ok(_))) {
            // Broken, refused or with a request still in flight: dial afresh next time.
            sender = None;
            if dialling && !backoff {
                redial_at = done + REDIAL;
            }
        }
        let failure = match &outcome {
            Some(Ok(s)) if s.is_success() || *s == StatusCode::TOO_MANY_REQUESTS => None,
            Some(Ok(s)) => Some(format!("status {s}")),
            Some(Err(e)) => Some(format!("{e:#}")),
            None => Some("timeout".to_owned()),
        };
        if let Some(f) = &failure
            && !told
        {
            eprintln!("openloop: connection {c}: first failure: {f}");
            told = true;
        }
        if !measured {
            continue;
        }
        match outcome {
            Some(Ok(s)) if failure.is_none() => {
                stats.latencies_us.push((done - due).as_micros() as u64);
                if s.is_success() {
                    stats.allowed += 1;
                } else {
                    stats.denied += 1;
                }
            }
            Some(_) => stats.failed += 1,
            None => stats.timeouts += 1,
        }
    }
    Ok(stats)
}

/// One request on the connection, dialled first if there is none; the answer's status.
async fn send(
    plan: &Plan,
    sender: &mut Option<SendRequest<Full<Bytes>>>,
    body: String,
) -> Result<StatusCode> {
    let conn = match sender {
        Some(s) if !s.is_closed() => s,
        _ => sender.insert(dial(&plan.addr).await?),
    };
    conn.ready().await?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(plan.path.as_str())
        .header(header::HOST, plan.authority.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let resp = conn.send_request(req).await?;
    let status = resp.status();
    resp.into_body().collect().await?;
    Ok(status)
}

async fn dial(addr: &str) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    // The connection's I/O; it ends when the connection closes or the sender is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Waits until `due` on the connection's timerfd (returns at once if it is past).
async fn sleep_until(timer: &AsyncFd<OwnedFd>, due: Instant) -> Result<()> {
    let wait = due.saturating_duration_since(Instant::now());
    if wait.is_zero() {
        return Ok(());
    }
    let spec = Itimerspec {
        it_interval: Timespec::default(),
        it_value: Timespec::try_from(wait)?,
    };
    rustix::time::timerfd_settime(timer.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
    loop {
        let mut ready = timer.readable().await?;
        let mut expirations = [0u8; 8];
        match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
            Ok(result) => return Ok(result.map(drop)?),
            Err(_would_block) => continue,
        }
    }
}

/// splitmix64: random key indices without a dependency.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn report(args: &Args, mut all: Stats) {
    all.latencies_us.sort_unstable();
    let lat = &all.latencies_us;
    let pct = |q: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    let count = lat.len() as u64;
    let errors = all.failed + all.timeouts;
    let achieved = count as f64 / args.duration;
    let (p50, p90, p99, p999, max) = (pct(0.5), pct(0.9), pct(0.99), pct(0.999), pct(1.0));
    if args.json {
        let out = serde_json::json!({
            "rate": args.rate, "achieved": achieved, "count": count,
            "allowed": all.allowed, "denied": all.denied,
            "errors": errors, "timeouts": all.timeouts,
            "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "p999_ms": p999, "max_ms": max,
            "connections": args.connections, "duration_s": args.duration, "warmup_s": args.warmup,
        });
        println!("{out}");
    } else {
        println!(
            "rate {:.0}/s scheduled, {achieved:.0}/s achieved over {} s, {} connections",
            args.rate, args.duration, args.connections
        );
        println!(
            "count {count} (allowed {}, denied {}), errors {errors} (timeouts {})",
            all.allowed, all.denied, all.timeouts
        );
        println!(
            "latency from scheduled send, ms: p50 {p50:.3} p90 {p90:.3} p99 {p99:.3} \
             p99.9 {p999:.3} max {max:.3}"
        );
    }
}
