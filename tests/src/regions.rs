//! Regions on an emulated WAN: one network namespace per region, `ringlimit` clusters inside
//! them, and `wanline` (crates/test-support's, feature `wanline`) between them.
//!
//! Region `r` (0-based) is namespace `rlwan<slot>r<r>`; its node `i` has the WAN address
//! `10.77.<r+1>.<i+1>` (peer port [`PEER_PORT`], on `lo`), and everything else in `10.77/16` is
//! routed through the region's TUN device to the delay line, which holds each packet for half
//! the pair's round trip and drops some. The test's own traffic does not cross the WAN: each
//! namespace has a veth pair to the root namespace, `10.253.<4·slot+r>.1` on the root's side,
//! and node `i` serves HTTP on `10.253.<4·slot+r>.<i+2>:`[`HTTP_PORT`], so [`Api`] and every
//! harness wait work as on loopback. Loads ([`Wan::load`]) run inside a region, as its clients.
//!
//! The slot (0..64) keeps two WANs of one machine apart (tests run in parallel, a bench beside
//! them). Dropping a [`Wan`] (a panic included) kills its processes, then the delay line (its
//! TUN devices go with it), and deletes its namespaces (their veth pairs go with them). Every
//! helper process also exits when its standard input, held here, closes. Needs root, `ip` with
//! `netns`, and `/dev/net/tun`: [`Wan::start`] fails with one line naming what is missing.

use crate::{Api, ProcessNode, Spawned, ringlimit_binary, spawn_logged, wait_all_alive};
use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Every node's peer port (each namespace is a host of its own).
pub const PEER_PORT: u16 = 7946;
/// Every node's HTTP port.
pub const HTTP_PORT: u16 = 8080;
/// The echo servers' port (UDP and TCP).
pub const ECHO_PORT: u16 = 7007;
/// The cluster secret of every region.
pub const CLUSTER_SECRET: &str = "regions-wan-cluster-secret";
/// The region secret (`RINGLIMIT_REGION_SECRET`), the same in every region.
pub const REGION_SECRET: &str = "regions-wan-region-secret";
/// Longest wait for a process to log that it serves or is ready.
const START_WAIT: Duration = Duration::from_secs(15);

/// What a WAN is made of.
#[derive(Debug, Clone)]
pub struct WanSpec {
    /// The regions' names (`--region`), at most 4.
    pub regions: Vec<String>,
    pub nodes_per_region: usize,
    /// Round trips between regions, `(i, j, ms)`.
    pub rtt_ms: Vec<(usize, usize, f64)>,
    /// Fraction of packets dropped each way.
    pub loss: f64,
    pub seed: u64,
    /// The rules file of every node.
    pub rules_yaml: String,
    /// Starts the nodes with `--region` and `--region-peers` (and the region secret); without,
    /// each region is a cluster that knows nothing of the others.
    pub regions_on: bool,
    /// `--region-interval-ms`, when set.
    pub region_interval_ms: Option<u64>,
    /// More `serve` flags for every node.
    pub node_args: Vec<String>,
    /// The node binary; `None`: `REGIONS_NODE_BIN` from the environment when set (another
    /// build, e.g. a branch's), else this checkout's debug build ([`ringlimit_binary`]).
    pub node_bin: Option<PathBuf>,
    /// The `wanline` binary; `None`: this checkout's debug build ([`wanline_binary`]).
    pub wanline: Option<PathBuf>,
    /// More environment for a region's nodes and loads, `(region, vars)` (e.g.
    /// [`crate::faketime`]'s: a region whose clocks are off).
    pub region_env: Vec<(usize, Vec<(String, String)>)>,
}

impl WanSpec {
    /// Three regions `a`, `b`, `c` of two nodes each, round trips 30 (a–b), 80 (a–c) and
    /// 150 ms (b–c), 1% loss, regions off, no rules.
    pub fn three_regions() -> Self {
        Self {
            regions: vec!["a".into(), "b".into(), "c".into()],
            nodes_per_region: 2,
            rtt_ms: vec![(0, 1, 30.0), (0, 2, 80.0), (1, 2, 150.0)],
            loss: 0.01,
            seed: 49,
            rules_yaml: "rules: []\n".into(),
            regions_on: false,
            region_interval_ms: None,
            node_args: Vec::new(),
            node_bin: None,
            wanline: None,
            region_env: Vec::new(),
        }
    }

    /// The round trip configured between regions `i` and `j`.
    pub fn rtt(&self, i: usize, j: usize) -> Duration {
        self.rtt_ms
            .iter()
            .find(|&&(a, b, _)| (a, b) == (i, j) || (b, a) == (i, j))
            .map_or(Duration::ZERO, |&(_, _, ms)| {
                Duration::from_secs_f64(ms / 1000.0)
            })
    }
}

/// One region: its namespace and nodes.
pub struct Region {
    pub name: String,
    pub index: usize,
    /// The network namespace.
    pub ns: String,
    pub nodes: Vec<ProcessNode>,
}

impl Region {
    /// Node `i`'s WAN address (its `--peer`).
    pub fn peer(&self, i: usize) -> SocketAddr {
        SocketAddr::from((wan_ip(self.index, i), PEER_PORT))
    }

    /// The nodes' HTTP addresses, as a load inside the region reaches them.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.http).collect()
    }

    /// The region's echo server.
    pub fn echo(&self) -> SocketAddr {
        SocketAddr::from((wan_ip(self.index, 0), ECHO_PORT))
    }
}

/// A helper process (`wanline echo`, `probe`, `load`) in a region: its standard output read
/// line by line, killed on drop.
pub struct Helper {
    pub what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Helper {
    /// Closes the process's standard input: a `wanline` without `--seconds` stops.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Every line printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The lines printed so far that parse as JSON.
    pub fn json_lines(&self) -> Vec<Value> {
        self.lines()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits (at most `within`) for a line holding `text`.
    pub async fn wait_line(&mut self, text: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.contains(text)) {
                return Ok(l);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Lines read after the exit.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Some(l) = self.lines().into_iter().find(|l| l.contains(text)) {
                    return Ok(l);
                }
                bail!(
                    "{} exited ({status}) without printing {text:?}; it printed:\n{}",
                    self.what,
                    self.lines().join("\n")
                );
            }
            ensure!(
                Instant::now() < deadline,
                "{} did not print {text:?} within {within:?}; it printed:\n{}",
                self.what,
                self.lines().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (at most `within`) for the process to exit by itself; its last JSON line.
    pub async fn finish(&mut self, within: Duration) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            if self.child.try_wait()?.is_some() {
                // The reader thread's last lines.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return self.json_lines().pop().with_context(|| {
                    format!(
                        "{} printed no JSON; it printed:\n{}",
                        self.what,
                        self.lines().join("\n")
                    )
                });
            }
            ensure!(
                Instant::now() < deadline,
                "{} still runs after {within:?}",
                self.what
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The delay line's counts for one direction of a pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairCounts {
    pub forwarded: u64,
    pub lost: u64,
    pub cut: u64,
}

/// Three regions (or as many as the spec names) on the emulated WAN.
pub struct Wan {
    pub spec: WanSpec,
    pub regions: Vec<Region>,
    slot: u8,
    dir: PathBuf,
    control: PathBuf,
    line: Option<Helper>,
    echoes: Vec<Helper>,
    wanline: PathBuf,
}

/// The slots this process holds (a WAN each).
static SLOTS: Mutex<Option<HashSet<u8>>> = Mutex::new(None);

fn wan_ip(region: usize, node: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, region as u8 + 1, node as u8 + 1)
}

fn test_net(slot: u8, region: usize) -> u8 {
    slot * 4 + region as u8
}

fn ns_name(slot: u8, region: usize) -> String {
    format!("rlwan{slot}r{region}")
}

/// `ip ARGS`, its error with ip's own message.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
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

/// Whether this machine can build the WAN: root, `ip netns`, `/dev/net/tun`.
pub fn probe_host() -> Result<()> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    ensure!(
        uid == "0",
        "the regions' WAN tests need root (network namespaces, TUN devices); running as uid {uid}"
    );
    ip(&["netns", "list"]).context("the regions' WAN tests need `ip netns` (iproute2)")?;
    ensure!(
        Path::new("/dev/net/tun").exists(),
        "the regions' WAN tests need /dev/net/tun"
    );
    Ok(())
}

/// Takes a free slot: its namespaces made. A slot whose namespaces are left from a run that
/// died (no process in them, not this process's) is cleaned and taken.
fn take_slot(regions: usize) -> Result<u8> {
    let mut held = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashSet::new);
    for slot in 0..64u8 {
        if held.contains(&slot) {
            continue;
        }
        let first = ns_name(slot, 0);
        if ip(&["netns", "add", &first]).is_err() {
            let pids = Command::new("ip")
                .args(["netns", "pids", &first])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_else(|_| "?".into());
            if !pids.is_empty() {
                continue;
            }
            remove_slot(slot, 4);
            if ip(&["netns", "add", &first]).is_err() {
                continue;
            }
        }
        let rest: Result<()> = (1..regions).try_for_each(|r| {
            let ns = ns_name(slot, r);
            let _ = ip(&["netns", "del", &ns]);
            ip(&["netns", "add", &ns])
        });
        if let Err(e) = rest {
            remove_slot(slot, regions);
            return Err(e);
        }
        held.insert(slot);
        return Ok(slot);
    }
    bail!("no free WAN slot of 64 (namespaces rlwan*r* left over? `ip netns list`)")
}

fn remove_slot(slot: u8, regions: usize) {
    for r in 0..regions.max(4) {
        let _ = ip(&["link", "del", &format!("rlwv{slot}r{r}")]);
        let _ = ip(&["netns", "del", &ns_name(slot, r)]);
    }
}

/// The `wanline` binary (crates/test-support, feature `wanline`), built once per test process.
pub fn wanline_binary() -> Result<PathBuf> {
    static BIN: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| crate::cargo_binary("ringlimit-test-support", "wanline", Some("wanline")))
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// Unix time in ms.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Wan {
    /// Builds the namespaces, starts the delay line and the echo servers, then every node, and
    /// waits until each region's cluster has formed (every node alive in each of its nodes'
    /// views).
    pub async fn start(spec: WanSpec) -> Result<Self> {
        probe_host()?;
        ensure!(
            (2..=4).contains(&spec.regions.len()),
            "2 to 4 regions, not {}",
            spec.regions.len()
        );
        ensure!(
            (1..=8).contains(&spec.nodes_per_region),
            "1 to 8 nodes a region"
        );
        let from_env = std::env::var_os("REGIONS_NODE_BIN").map(PathBuf::from);
        let bin = match spec.node_bin.clone().or(from_env) {
            Some(b) => b,
            None => tokio::task::spawn_blocking(ringlimit_binary).await??,
        };
        let wanline = match &spec.wanline {
            Some(b) => b.clone(),
            None => tokio::task::spawn_blocking(wanline_binary).await??,
        };
        let n = spec.regions.len();
        let dir = scratch_dir()?;
        let slot = take_slot(n)?;
        // From here on, dropping `wan` (an error, a panic) removes everything made so far.
        let mut wan = Self {
            regions: Vec::new(),
            slot,
            control: dir.join("line.sock"),
            dir,
            line: None,
            echoes: Vec::new(),
            wanline,
            spec,
        };
        wan.build_namespaces()?;
        wan.start_line().await?;
        for r in 0..n {
            let ns = ns_name(slot, r);
            let tun = format!("rlwt{slot}r{r}");
            let src = wan_ip(r, 0).to_string();
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                "10.77.0.0/16",
                "dev",
                &tun,
                "src",
                &src,
            ])?;
        }
        for r in 0..n {
            let mut echo = wan.helper(
                r,
                "echo",
                &["echo", "--listen", &wan.regions[r].echo().to_string()],
            )?;
            echo.wait_line("echo ready", START_WAIT).await?;
            wan.echoes.push(echo);
        }
        let rules = wan.dir.join("rules.yaml");
        std::fs::write(&rules, &wan.spec.rules_yaml)?;
        for r in 0..n {
            for i in 0..wan.spec.nodes_per_region {
                let node = wan.start_node(&bin, &rules, r, i).await?;
                wan.regions[r].nodes.push(node);
            }
        }
        for region in &wan.regions {
            let ids: Vec<String> = region.nodes.iter().map(|n| n.node_id.clone()).collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            wait_all_alive(&region.nodes, &ids, crate::FORM_WAIT)
                .await
                .with_context(|| format!("region {}'s cluster did not form", region.name))?;
        }
        Ok(wan)
    }

    /// Namespaces (made by [`take_slot`]): loopback up with the nodes' WAN addresses, a veth
    /// pair to the root namespace for the test's own traffic.
    fn build_namespaces(&mut self) -> Result<()> {
        let slot = self.slot;
        for (r, name) in self.spec.regions.clone().into_iter().enumerate() {
            let ns = ns_name(slot, r);
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for i in 0..self.spec.nodes_per_region {
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/32", wan_ip(r, i)),
                    "dev",
                    "lo",
                ])?;
            }
            let net = test_net(slot, r);
            let veth = format!("rlwv{slot}r{r}");
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["addr", "add", &format!("10.253.{net}.1/24"), "dev", &veth])?;
            ip(&["link", "set", &veth, "up"])?;
            for i in 0..self.spec.nodes_per_region {
                let addr = format!("10.253.{net}.{}/24", i + 2);
                ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            }
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            self.regions.push(Region {
                name,
                index: r,
                ns,
                nodes: Vec::new(),
            });
        }
        Ok(())
    }

    async fn start_line(&mut self) -> Result<()> {
        let mut args: Vec<String> = vec!["line".into()];
        for r in 0..self.regions.len() {
            args.push("--region".into());
            args.push(format!(
                "{}:rlwt{}r{r}:10.77.{}.0/24",
                ns_name(self.slot, r),
                self.slot,
                r + 1
            ));
        }
        for &(i, j, ms) in &self.spec.rtt_ms {
            args.push("--rtt".into());
            args.push(format!("{i}-{j}={ms}"));
        }
        args.extend([
            "--loss".into(),
            self.spec.loss.to_string(),
            "--seed".into(),
            self.spec.seed.to_string(),
            "--control".into(),
            self.control.display().to_string(),
        ]);
        let mut cmd = Command::new(&self.wanline);
        cmd.args(&args);
        let mut line = spawn_helper(cmd, "wanline line".into())?;
        line.wait_line("wanline ready", START_WAIT).await?;
        self.line = Some(line);
        Ok(())
    }

    async fn start_node(
        &self,
        bin: &Path,
        rules: &Path,
        r: usize,
        i: usize,
    ) -> Result<ProcessNode> {
        let region = &self.regions[r];
        let node_id = format!("{}-{i}", region.name);
        let http = SocketAddr::from((
            Ipv4Addr::new(10, 253, test_net(self.slot, r), i as u8 + 2),
            HTTP_PORT,
        ));
        let peer = region.peer(i);
        let seeds: Vec<String> = (0..self.spec.nodes_per_region)
            .map(|k| region.peer(k).to_string())
            .collect();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &region.ns])
            .arg(bin)
            .arg("serve")
            .args(["--node-id", &node_id])
            .args(["--http", &http.to_string()])
            .args(["--peer", &peer.to_string()])
            .args(["--seeds", &seeds.join(",")])
            .arg("--config")
            .arg(rules);
        crate::clear_ringlimit_env(&mut cmd);
        cmd.env("RINGLIMIT_CLUSTER_SECRET", CLUSTER_SECRET);
        if self.spec.regions_on {
            let peers: Vec<String> = self
                .regions
                .iter()
                .filter(|o| o.index != r)
                .map(|o| format!("{}={}", o.name, o.peer(0)))
                .collect();
            cmd.args(["--region", &region.name])
                .args(["--region-peers", &peers.join(",")])
                .env("RINGLIMIT_REGION_SECRET", REGION_SECRET);
            if let Some(ms) = self.spec.region_interval_ms {
                cmd.args(["--region-interval-ms", &ms.to_string()]);
            }
        }
        cmd.args(&self.spec.node_args);
        cmd.envs(self.region_env(r));
        let Spawned { child, found, log } = spawn_logged(&mut cmd, node_id.clone())
            .with_context(|| format!("cannot start {node_id}"))?;
        let mut node = ProcessNode {
            node_id: node_id.clone(),
            http,
            peer,
            child,
            api: Api::new(http)?,
            log,
        };
        let served = crate::await_serving(&mut node, found, START_WAIT).await?;
        ensure!(
            served == http,
            "{node_id} serves HTTP on {served}, not {http}"
        );
        Ok(node)
    }

    /// The environment [`WanSpec::region_env`] gives region `r`'s processes.
    fn region_env(&self, r: usize) -> Vec<(String, String)> {
        self.spec
            .region_env
            .iter()
            .filter(|(i, _)| *i == r)
            .flat_map(|(_, vars)| vars.iter().cloned())
            .collect()
    }

    /// Starts `wanline ARGS` inside region `r`'s namespace.
    pub fn helper(&self, r: usize, what: &str, args: &[&str]) -> Result<Helper> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.regions[r].ns])
            .arg(&self.wanline)
            .args(args)
            .envs(self.region_env(r));
        spawn_helper(cmd, format!("{what} in {}", self.regions[r].name))
    }

    /// Round trips and loss from region `from` to region `to`'s echo server: `count` UDP
    /// datagrams `interval_ms` apart, then `connects` TCP connects. The probe's JSON.
    pub async fn probe(
        &self,
        from: usize,
        to: usize,
        count: u32,
        interval_ms: u64,
        connects: u32,
    ) -> Result<Value> {
        let to_addr = self.regions[to].echo().to_string();
        let mut p = self.helper(
            from,
            "probe",
            &[
                "probe",
                "--to",
                &to_addr,
                "--count",
                &count.to_string(),
                "--interval-ms",
                &interval_ms.to_string(),
                "--connects",
                &connects.to_string(),
                // One lost SYN (retransmitted after 1 s) still connects; a cut-off does not.
                "--connect-timeout-ms",
                "2500",
            ],
        )?;
        let within = Duration::from_millis(interval_ms * u64::from(count))
            + Duration::from_secs(5 + 3 * u64::from(connects));
        p.finish(within).await
    }

    /// An open-loop load of `body` checks inside region `r`, spread over its nodes: `rate`
    /// per second, changed by `schedule` (`SECONDS=RATE`), for `seconds`, from unix ms `t0_ms`;
    /// answers counted per `window_ms`. See `wanline load`.
    pub fn load(&self, r: usize, body: &str, load: &LoadPlan) -> Result<Helper> {
        let mut args: Vec<String> = vec!["load".into()];
        for a in self.regions[r].http_addrs() {
            args.push("--node".into());
            args.push(a.to_string());
        }
        args.extend([
            "--body".into(),
            body.into(),
            "--rate".into(),
            load.rate.to_string(),
            "--seconds".into(),
            load.seconds.to_string(),
            "--tick-ms".into(),
            load.tick_ms.to_string(),
        ]);
        if !load.schedule.is_empty() {
            args.push("--schedule".into());
            args.push(
                load.schedule
                    .iter()
                    .map(|(t, r)| format!("{t}={r}"))
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        if let Some(t0) = load.t0_ms {
            args.extend(["--t0-ms".into(), t0.to_string()]);
        }
        if let Some(w) = load.window_ms {
            args.extend(["--window-ms".into(), w.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.helper(r, "load", &args)
    }

    /// Cuts region `r` off: the line drops everything to and from it (in flight too).
    pub async fn cut(&self, r: usize) -> Result<()> {
        let a = self.control(&format!("cut {r}")).await?;
        ensure!(a == "ok", "cut {r}: {a}");
        Ok(())
    }

    /// Puts region `r` back on the WAN.
    pub async fn restore(&self, r: usize) -> Result<()> {
        let a = self.control(&format!("restore {r}")).await?;
        ensure!(a == "ok", "restore {r}: {a}");
        Ok(())
    }

    /// The line's counts per direction of each pair, `[from][to]`.
    pub async fn line_counts(&self) -> Result<Vec<Vec<PairCounts>>> {
        let v: Value = serde_json::from_str(&self.control("stats").await?)?;
        let n = self.regions.len();
        let mut counts = vec![vec![PairCounts::default(); n]; n];
        for p in v["pairs"].as_array().context("no pairs")? {
            let get = |k: &str| p[k].as_u64().with_context(|| format!("no {k} in {p}"));
            let (i, j) = (get("from")? as usize, get("to")? as usize);
            ensure!(i < n && j < n, "pair {i}-{j} of {n}");
            counts[i][j] = PairCounts {
                forwarded: get("forwarded")?,
                lost: get("lost")?,
                cut: get("cut")?,
            };
        }
        Ok(counts)
    }

    /// One command to the delay line's control socket; its answer.
    async fn control(&self, command: &str) -> Result<String> {
        let conn = tokio::net::UnixStream::connect(&self.control)
            .await
            .with_context(|| format!("cannot reach the delay line at {:?}", self.control))?;
        let (read, mut write) = conn.into_split();
        write.write_all(format!("{command}\n").as_bytes()).await?;
        let mut lines = tokio::io::BufReader::new(read).lines();
        let answer = tokio::time::timeout(crate::WAIT, lines.next_line())
            .await
            .context("the delay line did not answer")??
            .context("the delay line closed the connection")?;
        Ok(answer)
    }

    /// Whether the nodes know regions: `/v1/cluster` has `regions`.
    pub async fn nodes_have_regions(&self) -> Result<bool> {
        let v = self.regions[0].nodes[0].get("/v1/cluster").await?.json()?;
        Ok(v.get("regions").is_some())
    }
}

/// A load's plan: see [`Wan::load`].
#[derive(Debug, Clone, Default)]
pub struct LoadPlan {
    pub rate: f64,
    pub schedule: Vec<(f64, f64)>,
    pub seconds: f64,
    pub tick_ms: u64,
    pub t0_ms: Option<u64>,
    pub window_ms: Option<u64>,
}

impl Drop for Wan {
    fn drop(&mut self) {
        for region in &mut self.regions {
            region.nodes.clear();
        }
        self.echoes.clear();
        self.line = None;
        remove_slot(self.slot, self.regions.len());
        if let Ok(mut held) = SLOTS.lock()
            && let Some(held) = held.as_mut()
        {
            held.remove(&self.slot);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `cmd` with its stdout read into lines by a thread and its stdin held (closed on
/// drop, which ends `wanline`); stderr goes to the test's.
fn spawn_helper(mut cmd: Command, what: String) -> Result<Helper> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {what}: {cmd:?}"))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stdin = child.stdin.take();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::Builder::new()
        .name(format!("stdout-{what}"))
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        })?;
    Ok(Helper {
        what,
        child,
        stdin,
        lines,
    })
}

/// A fresh scratch directory under the system's temporary directory.
fn scratch_dir() -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ringlimit-wan-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Max-min fair shares of `limit` among `demands`: every demand under an equal split gets
/// all it asks, the rest is split equally among the others, again and again.
pub fn max_min_shares(limit: f64, demands: &[f64]) -> Vec<f64> {
    let mut shares = vec![0.0; demands.len()];
    let mut open: Vec<usize> = (0..demands.len()).collect();
    let mut left = limit;
    while !open.is_empty() {
        let equal = left / open.len() as f64;
        let (small, big): (Vec<usize>, Vec<usize>) =
            open.iter().partition(|&&i| demands[i] <= equal);
        if small.is_empty() {
            for &i in &big {
                shares[i] = equal;
            }
            break;
        }
        for &i in &small {
            shares[i] = demands[i];
            left -= demands[i];
        }
        open = big;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_min_shares_fill_small_demands_first() {
        let s = max_min_shares(200.0, &[240.0, 120.0, 40.0]);
        assert_eq!(s, vec![80.0, 80.0, 40.0]);
        let s = max_min_shares(100.0, &[10.0, 10.0]);
        assert_eq!(s, vec![10.0, 10.0]);
        let s = max_min_shares(90.0, &[100.0, 100.0, 100.0]);
        assert_eq!(s, vec![30.0, 30.0, 30.0]);
    }

    #[test]
    fn addresses_stay_apart_per_slot_and_region() {
        assert_eq!(wan_ip(0, 0), Ipv4Addr::new(10, 77, 1, 1));
        assert_eq!(wan_ip(2, 1), Ipv4Addr::new(10, 77, 3, 2));
        assert_eq!(test_net(1, 3), 7);
        assert_eq!(test_net(63, 3), 255);
        assert_eq!(ns_name(2, 1), "rlwan2r1");
    }
}
