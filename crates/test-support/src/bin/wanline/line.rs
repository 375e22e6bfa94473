//! The delay line: TUN devices, one per region, and the packets between them.

use anyhow::{Context, Result, bail, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tun_rs::{AsyncDevice, DeviceBuilder};

/// Packets held per direction of a pair at most; beyond, dropped and counted (a slow writer
/// must not grow memory without bound).
const QUEUE: usize = 65_536;

/// A packet and when it leaves the line.
type Held = (Instant, Vec<u8>);
/// A region's queues, one per destination region (none to itself).
type Queues = Vec<Option<mpsc::Sender<Held>>>;

#[derive(clap::Args)]
pub struct Args {
    /// A region: `NAMESPACE:DEVICE:A.B.C.D/PREFIX` (its namespace, the TUN device made for it,
    /// the addresses in it). Repeated; the first is region 0.
    #[arg(long = "region", required = true)]
    regions: Vec<String>,
    /// A pair's round trip: `I-J=MS` (region indexes). Repeated; a pair not named has none.
    #[arg(long = "rtt")]
    rtts: Vec<String>,
    /// The fraction of packets dropped, each way.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// The seed of the drops.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The control socket (a Unix stream socket; one command a line, one answer a line):
    /// `cut I`, `restore I` (answer `ok`), `loss F` (`ok`), `stats` (a JSON object).
    #[arg(long)]
    control: PathBuf,
}

/// A region of the line.
#[derive(Debug, Clone, PartialEq)]
struct Region {
    ns: String,
    dev: String,
    net: Ipv4Addr,
    prefix: u8,
}

impl Region {
    fn parse(s: &str) -> Result<Self> {
        let mut parts = s.splitn(3, ':');
        let (Some(ns), Some(dev), Some(net)) = (parts.next(), parts.next(), parts.next()) else {
            bail!("a region is NAMESPACE:DEVICE:A.B.C.D/PREFIX, not {s:?}");
        };
        let (addr, prefix) = net
            .split_once('/')
            .with_context(|| format!("{net:?} has no /PREFIX"))?;
        let prefix: u8 = prefix.parse().context("bad prefix")?;
        ensure!(prefix <= 32, "bad prefix {prefix}");
        ensure!(
            dev.len() < 16,
            "device name {dev:?} is longer than 15 bytes"
        );
        Ok(Self {
            ns: ns.to_owned(),
            dev: dev.to_owned(),
            net: addr.parse().context("bad address")?,
            prefix,
        })
    }

    fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.net) & mask
    }
}

/// Round trips per pair, symmetric, from `I-J=MS` entries.
fn parse_rtts(n: usize, entries: &[String]) -> Result<Vec<Vec<Duration>>> {
    let mut rtt = vec![vec![Duration::ZERO; n]; n];
    for e in entries {
        let (pair, ms) = e
            .split_once('=')
            .with_context(|| format!("a round trip is I-J=MS, not {e:?}"))?;
        let (i, j) = pair
            .split_once('-')
            .with_context(|| format!("a pair is I-J, not {pair:?}"))?;
        let (i, j): (usize, usize) = (i.parse()?, j.parse()?);
        ensure!(i < n && j < n && i != j, "no pair {i}-{j} of {n} regions");
        let d = Duration::from_secs_f64(ms.parse::<f64>()? / 1000.0);
        rtt[i][j] = d;
        rtt[j][i] = d;
    }
    Ok(rtt)
}

/// The destination of an IPv4 packet; `None` for anything else.
fn ipv4_dst(pkt: &[u8]) -> Option<Ipv4Addr> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]))
}

/// What happened to the packets of one direction of a pair.
#[derive(Default)]
struct PairStats {
    forwarded: AtomicU64,
    lost: AtomicU64,
    cut: AtomicU64,
    overflow: AtomicU64,
}

struct Shared {
    regions: Vec<Region>,
    cut: Vec<AtomicBool>,
    /// The loss rate's bits (an f64), changed by `loss F`.
    loss: AtomicU64,
    /// `stats[from][to]`.
    stats: Vec<Vec<PairStats>>,
    /// Packets to no region (or not IPv4).
    unroutable: AtomicU64,
}

impl Shared {
    fn is_cut(&self, i: usize, j: usize) -> bool {
        self.cut[i].load(Ordering::Relaxed) || self.cut[j].load(Ordering::Relaxed)
    }

    fn stats_json(&self) -> Value {
        let mut pairs = Vec::new();
        for (i, row) in self.stats.iter().enumerate() {
            for (j, s) in row.iter().enumerate() {
                if i == j {
                    continue;
                }
                pairs.push(json!({
                    "from": i,
                    "to": j,
                    "forwarded": s.forwarded.load(Ordering::Relaxed),
                    "lost": s.lost.load(Ordering::Relaxed),
                    "cut": s.cut.load(Ordering::Relaxed),
                    "overflow": s.overflow.load(Ordering::Relaxed),
                }));
            }
        }
        let cut: Vec<usize> = (0..self.regions.len())
            .filter(|&i| self.cut[i].load(Ordering::Relaxed))
            .collect();
        json!({
            "pairs": pairs,
            "unroutable": self.unroutable.load(Ordering::Relaxed),
            "cut": cut,
        })
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

pub async fn run(a: Args) -> Result<()> {
    let regions: Vec<Region> = a
        .regions
        .iter()
        .map(|r| Region::parse(r))
        .collect::<Result<_>>()?;
    let n = regions.len();
    ensure!(n >= 2, "a line needs two regions");
    ensure!((0.0..=1.0).contains(&a.loss), "loss is a fraction");
    let rtt = parse_rtts(n, &a.rtts)?;
    crate::exit_with_stdin();

    // Each device made here, then moved into its region's namespace: the file descriptor stays
    // attached to the device wherever it lives.
    let mut devs = Vec::with_capacity(n);
    for r in &regions {
        let dev = DeviceBuilder::new()
            .name(&r.dev)
            .mtu(1500)
            .build_async()
            .with_context(|| format!("cannot create TUN device {}", r.dev))?;
        ip(&["link", "set", "dev", &r.dev, "netns", &r.ns])?;
        ip(&["-n", &r.ns, "link", "set", "dev", &r.dev, "up"])?;
        devs.push(Arc::new(dev));
    }
    let shared = Arc::new(Shared {
        cut: (0..n).map(|_| AtomicBool::new(false)).collect(),
        loss: AtomicU64::new(a.loss.to_bits()),
        stats: (0..n)
            .map(|_| (0..n).map(|_| PairStats::default()).collect())
            .collect(),
        unroutable: AtomicU64::new(0),
        regions,
    });

    // One queue and one writer per direction of a pair: a pair's delay is fixed, so its
    // packets leave in the order they came, each at its own time.
    let mut queues: Vec<Queues> = Vec::new();
    for i in 0..n {
        let mut row = Vec::new();
        for (j, dev) in devs.iter().enumerate() {
            if i == j {
                row.push(None);
                continue;
            }
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(write_pair(i, j, rx, dev.clone(), shared.clone()));
            row.push(Some(tx));
        }
        queues.push(row);
    }
    for (i, dev) in devs.iter().enumerate() {
        let rng = StdRng::seed_from_u64(a.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        tokio::spawn(read_region(
            i,
            dev.clone(),
            queues[i].clone(),
            rtt[i].clone(),
            rng,
            shared.clone(),
        ));
    }

    let _ = std::fs::remove_file(&a.control);
    let listener = UnixListener::bind(&a.control)
        .with_context(|| format!("cannot bind {}", a.control.display()))?;
    println!("wanline ready");
    loop {
        let (conn, _) = listener.accept().await?;
        tokio::spawn(control(conn, shared.clone()));
    }
}

async fn read_region(
    i: usize,
    dev: Arc<AsyncDevice>,
    queues: Queues,
    rtt: Vec<Duration>,
    mut rng: StdRng,
    shared: Arc<Shared>,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let len = match dev.recv(&mut buf).await {
            Ok(len) => len,
            Err(e) => {
                eprintln!("wanline: region {i}: {e}");
                return;
            }
        };
        let pkt = &buf[..len];
        let to = ipv4_dst(pkt).and_then(|dst| shared.regions.iter().position(|r| r.contains(dst)));
        let (Some(j), true) = (to, to != Some(i)) else {
            shared.unroutable.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let stats = &shared.stats[i][j];
        if shared.is_cut(i, j) {
            stats.cut.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let loss = f64::from_bits(shared.loss.load(Ordering::Relaxed));
        if rng.random::<f64>() < loss {
            stats.lost.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let at = Instant::now() + rtt[j] / 2;
        let Some(q) = &queues[j] else { continue };
        if q.try_send((at, pkt.to_vec())).is_err() {
            stats.overflow.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn write_pair(
    i: usize,
    j: usize,
    mut rx: mpsc::Receiver<Held>,
    dev: Arc<AsyncDevice>,
    shared: Arc<Shared>,
) {
    while let Some((at, pkt)) = rx.recv().await {
        tokio::time::sleep_until(at).await;
        let stats = &shared.stats[i][j];
        // A cut drops what is on the wire too.
        if shared.is_cut(i, j) {
            stats.cut.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        match dev.send(&pkt).await {
            Ok(_) => stats.forwarded.fetch_add(1, Ordering::Relaxed),
            Err(_) => stats.overflow.fetch_add(1, Ordering::Relaxed),
        };
    }
}

async fn control(conn: tokio::net::UnixStream, shared: Arc<Shared>) {
    let (read, mut write) = conn.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = command(&shared, line.trim()).unwrap_or_else(|e| format!("error: {e:#}"));
        if write
            .write_all(format!("{answer}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn command(shared: &Shared, line: &str) -> Result<String> {
    let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
    let region = || -> Result<usize> {
        let i: usize = arg.trim().parse().context("a region index")?;
        ensure!(i < shared.regions.len(), "no region {i}");
        Ok(i)
    };
    match verb {
        "cut" => shared.cut[region()?].store(true, Ordering::Relaxed),
        "restore" => shared.cut[region()?].store(false, Ordering::Relaxed),
        "loss" => {
            let f: f64 = arg.trim().parse().context("a fraction")?;
            ensure!((0.0..=1.0).contains(&f), "loss is a fraction");
            shared.loss.store(f.to_bits(), Ordering::Relaxed);
        }
        "stats" => return Ok(shared.stats_json().to_string()),
        _ => bail!("unknown command {verb:?}"),
    }
    Ok("ok".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_parse_and_match_their_addresses() {
        let r = Region::parse("ns1:tun1:10.77.1.0/24").unwrap();
        assert!(r.contains(Ipv4Addr::new(10, 77, 1, 2)));
        assert!(!r.contains(Ipv4Addr::new(10, 77, 2, 1)));
        assert!(Region::parse("ns1:tun1").is_err());
        assert!(Region::parse("ns1:a-name-far-too-long:10.0.0.0/8").is_err());
    }

    #[test]
    fn round_trips_are_symmetric() {
        let rtt = parse_rtts(3, &["0-1=30".into(), "2-1=150".into()]).unwrap();
        assert_eq!(rtt[1][0], Duration::from_millis(30));
        assert_eq!(rtt[1][2], Duration::from_millis(150));
        assert_eq!(rtt[0][2], Duration::ZERO);
        assert!(parse_rtts(3, &["0-3=1".into()]).is_err());
    }

    #[test]
    fn only_ipv4_packets_have_a_destination() {
        let mut pkt = [0u8; 20];
        pkt[0] = 0x45;
        pkt[16..20].copy_from_slice(&[10, 77, 3, 1]);
        assert_eq!(ipv4_dst(&pkt), Some(Ipv4Addr::new(10, 77, 3, 1)));
        pkt[0] = 0x60;
        assert_eq!(ipv4_dst(&pkt), None);
        assert_eq!(ipv4_dst(&pkt[..10]), None);
    }
}
