//! What one small one-way frame costs on this machine, with none of ringlimit's code on its way:
//! the floor under the replica sender's cost, which writes each replica member one frame per
//! `--replica-flush-ms`.
//!
//! ```text
//! cargo run --release -p ringlimit-node --example frame_floor -- [EVERY_US] [BYTES] [SECS]
//! ```
//!
//! It starts two child processes of its own, each a multi-threaded tokio runtime like a node's: a
//! writer that writes `BYTES` (default 760, a replica frame's median at 30,000 SDK checks/s) to
//! loopback TCP every `EVERY_US` (default 1,333: 750 frames a second, what the three nodes of
//! `bench/replica_cost.sh` send at the default 8 ms), and a reader that reads them. After a
//! second of warm-up the writer reads both processes' CPU time from `/proc/PID/task/*/schedstat`
//! (nanoseconds on a CPU, not sampled ticks) over `SECS` (default 6) and prints one JSON line:
//! the frames it wrote and each side's CPU per frame, in microseconds.
//!
//! `bench/frame_floor.sh` runs it alone and beside a loaded cluster.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("reader") => reader(),
        Some("writer") => writer(&args[1..]),
        _ => parent(&args),
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T, Error> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("bad argument {s:?}").into()),
    }
}

fn parent(args: &[String]) -> Result<(), Error> {
    let every_us: u64 = arg(args, 0, 1_333)?;
    let bytes: usize = arg(args, 1, 760)?;
    let secs: u64 = arg(args, 2, 6)?;
    if every_us == 0 || bytes == 0 || secs == 0 {
        return Err("EVERY_US, BYTES and SECS must be positive".into());
    }
    // The reader binds an ephemeral port and says which on its first line.
    let exe = std::env::current_exe()?;
    let mut reader = Reader(
        Command::new(&exe)
            .arg("reader")
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let mut line = String::new();
    {
        let out = reader.0.stdout.as_mut().ok_or("no reader stdout")?;
        let mut b = [0u8; 1];
        while out.read(&mut b)? == 1 && b[0] != b'\n' {
            line.push(b[0] as char);
        }
    }
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| format!("reader said {line:?}"))?;
    // The writer measures: it knows how many frames it wrote in the window.
    let status = Command::new(&exe)
        .args(["writer", &port.to_string(), &reader.0.id().to_string()])
        .args([every_us, bytes as u64, secs].map(|v| v.to_string()))
        .status()?;
    if !status.success() {
        return Err(format!("the writer failed: {status}").into());
    }
    Ok(())
}

/// The reader process, stopped however the parent ends (it would wait for a writer for ever).
struct Reader(std::process::Child);

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's CPU time so far, summed over its threads.
fn cpu_ns(pid: &str) -> Result<u64, Error> {
    let mut sum = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        sum += stat
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("bad schedstat")?;
    }
    Ok(sum)
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn reader() -> Result<(), Error> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let mut out = std::io::stdout();
    writeln!(out, "{port}")?;
    out.flush()?;
    runtime()?.block_on(async move {
        use tokio::io::AsyncReadExt;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; 64 * 1024];
        while s.read(&mut buf).await? > 0 {}
        Ok(())
    })
}

fn writer(args: &[String]) -> Result<(), Error> {
    let port: u16 = arg(args, 0, 0)?;
    let reader: String = arg(args, 1, String::new())?;
    let every_us: u64 = arg(args, 2, 1_333)?;
    let bytes: usize = arg(args, 3, 760)?;
    let secs: u64 = arg(args, 4, 6)?;
    runtime()?.block_on(async move {
        use tokio::io::AsyncWriteExt;
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nonblocking(true)?;
        let mut s = tokio::net::TcpStream::from_std(s)?;
        s.set_nodelay(true)?;
        let frame = vec![7u8; bytes];
        let mut tick = tokio::time::interval(Duration::from_micros(every_us));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A second of warm-up, then the window.
        let warm = Instant::now() + Duration::from_secs(1);
        while Instant::now() < warm {
            tick.tick().await;
            s.write_all(&frame).await?;
        }
        let (r0, w0, t0) = (cpu_ns(&reader)?, cpu_ns("self")?, Instant::now());
        let end = t0 + Duration::from_secs(secs);
        let mut frames = 0u64;
        while Instant::now() < end {
            tick.tick().await;
            s.write_all(&frame).await?;
            frames += 1;
        }
        let (r1, w1, elapsed) = (cpu_ns(&reader)?, cpu_ns("self")?, t0.elapsed());
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3 / frames.max(1) as f64;
        println!(
            "{{\"every_us\":{every_us},\"bytes\":{bytes},\"seconds\":{:.2},\"frames\":{frames},\
             \"reader_us_per_frame\":{:.1},\"writer_us_per_frame\":{:.1},\"us_per_frame\":{:.1}}}",
            elapsed.as_secs_f64(),
            per(r0, r1),
            per(w0, w1),
            per(r0, r1) + per(w0, w1)
        );
        Ok(())
    })
}
