//! An echo server and the probe that measures round trips and loss through it.
//!
//! UDP for the figures: each datagram is one round trip, lost or not, with no retransmission to
//! blur the time. TCP connects for the proof that TCP goes through (a SYN and its SYN-ACK).

use anyhow::{Context, Result};
use serde_json::json;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The address to echo on (UDP and TCP).
    #[arg(long)]
    listen: SocketAddr,
}

pub async fn serve(a: ServeArgs) -> Result<()> {
    crate::exit_with_stdin();
    let udp = UdpSocket::bind(a.listen)
        .await
        .with_context(|| format!("cannot bind UDP {}", a.listen))?;
    let tcp = TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot bind TCP {}", a.listen))?;
    println!("echo ready");
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = tcp.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let mut buf = [0u8; 2048];
    loop {
        let (len, from) = udp.recv_from(&mut buf).await?;
        let _ = udp.send_to(&buf[..len], from).await;
    }
}

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// The echo server.
    #[arg(long)]
    to: SocketAddr,
    /// UDP datagrams to send.
    #[arg(long, default_value_t = 500)]
    count: u32,
    /// Between two datagrams.
    #[arg(long, default_value_t = 2)]
    interval_ms: u64,
    /// TCP connects to time.
    #[arg(long, default_value_t = 5)]
    connects: u32,
    /// A connect not done by then is a failed one.
    #[arg(long, default_value_t = 5000)]
    connect_timeout_ms: u64,
}

/// Prints one JSON object: datagrams sent and echoed, their round trips (ms: min, p50, p90,
/// max), and each TCP connect's time (ms).
pub async fn probe(a: ProbeArgs) -> Result<()> {
    let bind: SocketAddr = if a.to.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let udp = Arc::new(UdpSocket::bind(bind).await?);
    udp.connect(a.to).await?;
    let start = Instant::now();
    let sender = {
        let udp = udp.clone();
        tokio::spawn(async move {
            let mut sent = HashMap::new();
            let mut tick = tokio::time::interval(Duration::from_millis(a.interval_ms.max(1)));
            for seq in 0..a.count {
                tick.tick().await;
                sent.insert(seq, Instant::now());
                // A send refused (no route while cut off) is a lost datagram.
                let _ = udp.send(&seq.to_be_bytes()).await;
            }
            sent
        })
    };
    let mut rtts: HashMap<u32, Duration> = HashMap::new();
    let mut arrivals = Vec::new();
    let mut buf = [0u8; 64];
    // Replies until a second after the last send could have come back.
    let window =
        Duration::from_millis(a.interval_ms.max(1) * u64::from(a.count)) + Duration::from_secs(2);
    while let Ok(Ok(len)) =
        tokio::time::timeout_at((start + window).into(), udp.recv(&mut buf)).await
    {
        if len == 4 {
            arrivals.push((
                u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]),
                Instant::now(),
            ));
        }
    }
    let sent = sender.await?;
    for (seq, at) in arrivals {
        if let Some(t) = sent.get(&seq) {
            rtts.entry(seq).or_insert(at - *t);
        }
    }
    let mut ms: Vec<f64> = rtts.values().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| -> f64 {
        if ms.is_empty() {
            f64::NAN
        } else {
            ms[((ms.len() - 1) as f64 * p).round() as usize]
        }
    };
    let mut connects = Vec::new();
    for _ in 0..a.connects {
        let t = Instant::now();
        let ok = tokio::time::timeout(
            Duration::from_millis(a.connect_timeout_ms),
            TcpStream::connect(a.to),
        )
        .await;
        if matches!(ok, Ok(Ok(_))) {
            connects.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    println!(
        "{}",
        json!({
            "sent": a.count,
            "received": ms.len(),
            "rtt_ms": { "min": q(0.0), "p50": q(0.5), "p90": q(0.9), "max": q(1.0) },
            "connect_ms": connects,
        })
    );
    Ok(())
}
