//! Real `ringlimit` processes started the way `deploy/k8s/statefulset.yaml` starts pods:
//! ids `ringlimit-0..N`, every flag through `RINGLIMIT_*` variables, a cluster secret, a rules
//! file, and gossip seeds that name every pod by its DNS name under the headless service
//! (`ringlimit-i.ringlimit-peers.default.svc.cluster.local:<peer port>`), never by address.
//!
//! Names resolve in one of two ways ([`Naming`]):
//!
//! - [`Naming::HostsFile`] (preferred): each pod runs on a loopback address of its own (Linux
//!   routes all of 127/8 to `lo`) with the same peer and HTTP ports on every pod, as pods share
//!   container ports. Each process starts through `unshare --mount`, which bind-mounts this set's
//!   hosts file over `/etc/hosts` in a private mount namespace and then `exec`s the binary (so the
//!   child's pid is the node's, and signals reach it). A restarted pod gets a new address, as a
//!   replaced pod gets a new IP: its line in the hosts file is rewritten in place (the same inode,
//!   so every namespace sees it), as DNS publishes the new pod. The machine's `/etc/hosts` is
//!   never touched. Needs root and `unshare`; [`StatefulSet::start`] probes for them.
//! - [`Naming::Localhost`] (fallback): every pod on 127.0.0.1 with ports of its own, seeds
//!   `localhost:<port>`.
//!
//! `ROLLING_NAMING=localhost` in the test's environment forces the fallback.

use crate::{ProcessNode, Spawned, ringlimit_binary, spawn_logged, wait_all_alive};
use anyhow::{Context, Result, bail, ensure};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The StatefulSet's name: pod `i` is `ringlimit-i`.
pub const NAME: &str = "ringlimit";
/// The headless service publishing the pods' DNS names.
pub const SERVICE: &str = "ringlimit-peers";
/// The namespace in the pods' DNS names.
pub const NAMESPACE: &str = "default";
/// The cluster secret every pod gets (the StatefulSet requires one).
pub const SECRET: &str = "rolling-test-secret";

/// Longest wait for a process to log that it serves.
const SERVE_WAIT: Duration = Duration::from_secs(10);

/// How pod names resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// Pod DNS names in a hosts file bind-mounted over `/etc/hosts` in each process's private
    /// mount namespace; a loopback address per pod and per generation.
    HostsFile,
    /// `localhost:<port>`, a port per pod on 127.0.0.1; `why` the preferred way was not used.
    Localhost { why: String },
}

/// What the pods run with, besides what the StatefulSet fixes.
#[derive(Debug, Clone)]
pub struct SetSpec {
    pub replicas: usize,
    /// Contents of the rules file (`RINGLIMIT_CONFIG`), as the ConfigMap mounts it.
    pub rules_yaml: String,
    /// `RINGLIMIT_*` variables added to every pod's environment, e.g. `("LEAVE_DELAY_MS", "5000")`
    /// (the prefix is added).
    pub env: Vec<(String, String)>,
}

/// One pod: a stable name and, while it runs, its current process (generation).
pub struct Pod {
    /// `ringlimit-i`, the node id.
    pub name: String,
    /// 0 for the first process, one more per restart.
    pub generation: u32,
    /// The address the pod has now (its "pod IP").
    pub ip: Ipv4Addr,
    pub peer_port: u16,
    pub http_port: u16,
    /// The running process; `None` between an exit and a restart.
    pub process: Option<ProcessNode>,
}

impl Pod {
    /// The HTTP address of the pod's current generation.
    pub fn http(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.http_port))
    }

    /// The peer address of the pod's current generation.
    pub fn peer(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.peer_port))
    }

    /// The running process.
    pub fn process(&self) -> Result<&ProcessNode> {
        self.process
            .as_ref()
            .with_context(|| format!("{} is not running", self.name))
    }

    /// The running process, mutably.
    pub fn process_mut(&mut self) -> Result<&mut ProcessNode> {
        self.process
            .as_mut()
            .with_context(|| format!("{} is not running", self.name))
    }
}

/// A StatefulSet of `ringlimit` processes on this machine. Dropping it kills every process
/// (through [`ProcessNode`]'s drop) and removes its scratch directory.
pub struct StatefulSet {
    pub naming: Naming,
    pub pods: Vec<Pod>,
    bin: PathBuf,
    dir: PathBuf,
    hosts: PathBuf,
    rules: PathBuf,
    env: Vec<(String, String)>,
}

impl StatefulSet {
    /// The pod DNS name of pod `i` (without port).
    pub fn dns_name(i: usize) -> String {
        format!("{NAME}-{i}.{SERVICE}.{NAMESPACE}.svc.cluster.local")
    }

    /// The node id of pod `i`.
    pub fn pod_name(i: usize) -> String {
        format!("{NAME}-{i}")
    }

    /// Starts every pod at once (`podManagementPolicy: Parallel`) and waits until each one shows
    /// all of them alive.
    pub async fn start(spec: SetSpec) -> Result<Self> {
        ensure!(spec.replicas > 0, "a StatefulSet needs a replica");
        let bin = tokio::task::spawn_blocking(ringlimit_binary).await??;
        let dir = scratch_dir()?;
        let hosts = dir.join("hosts");
        let rules = dir.join("rules.yaml");
        std::fs::write(&rules, &spec.rules_yaml)?;
        let naming = if std::env::var("ROLLING_NAMING").as_deref() == Ok("localhost") {
            Naming::Localhost {
                why: "ROLLING_NAMING=localhost".into(),
            }
        } else {
            match probe_namespace(&dir) {
                Ok(()) => Naming::HostsFile,
                Err(e) => Naming::Localhost {
                    why: format!("{e:#}"),
                },
            }
        };
        let mut pods = Vec::with_capacity(spec.replicas);
        match naming {
            Naming::HostsFile => {
                // One peer and one HTTP port for every pod, free on every address that the
                // first generations may take.
                let ips: Vec<Ipv4Addr> = (0..spec.replicas * 3)
                    .map(|n| pod_ip(n % spec.replicas, n / spec.replicas))
                    .collect::<Result<_>>()?;
                let peer_port = free_port(&ips, true, &[])?;
                let http_port = free_port(&ips, false, &[peer_port])?;
                for i in 0..spec.replicas {
                    pods.push(Pod {
                        name: Self::pod_name(i),
                        generation: 0,
                        ip: pod_ip(i, 0)?,
                        peer_port,
                        http_port,
                        process: None,
                    });
                }
            }
            Naming::Localhost { .. } => {
                let lo = [Ipv4Addr::LOCALHOST];
                let mut taken = Vec::new();
                for i in 0..spec.replicas {
                    let peer_port = free_port(&lo, true, &taken)?;
                    taken.push(peer_port);
                    let http_port = free_port(&lo, false, &taken)?;
                    taken.push(http_port);
                    pods.push(Pod {
                        name: Self::pod_name(i),
                        generation: 0,
                        ip: Ipv4Addr::LOCALHOST,
                        peer_port,
                        http_port,
                        process: None,
                    });
                }
            }
        }
        let mut set = Self {
            naming,
            pods,
            bin,
            dir,
            hosts,
            rules,
            env: spec.env,
        };
        set.write_hosts()?;
        let mut starting = Vec::new();
        for i in 0..set.pods.len() {
            starting.push(set.spawn(i)?);
        }
        for (i, spawned) in starting.into_iter().enumerate() {
            let process = set.wait_serving(i, spawned).await?;
            set.pods[i].process = Some(process);
        }
        set.wait_all_alive(Duration::from_secs(20)).await?;
        Ok(set)
    }

    /// Every pod's seed entry: `<pod DNS name>:<peer port>`, or `localhost:<port>`.
    pub fn seeds(&self) -> Vec<String> {
        self.pods
            .iter()
            .enumerate()
            .map(|(i, p)| match self.naming {
                Naming::HostsFile => format!("{}:{}", Self::dns_name(i), p.peer_port),
                Naming::Localhost { .. } => format!("localhost:{}", p.peer_port),
            })
            .collect()
    }

    /// The node ids.
    pub fn ids(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.name.clone()).collect()
    }

    /// The hosts file the pods resolve names with (only meaningful for [`Naming::HostsFile`]).
    pub fn hosts_file(&self) -> &Path {
        &self.hosts
    }

    /// Waits until every running pod shows every pod alive and in its ring.
    pub async fn wait_all_alive(&self, within: Duration) -> Result<()> {
        let nodes: Vec<&crate::Api> = self
            .pods
            .iter()
            .map(|p| p.process().map(ProcessNode::api))
            .collect::<Result<_>>()?;
        let ids = self.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        wait_all_alive(&nodes, &ids, within).await
    }

    /// SIGTERM to pod `i`'s process; returns at once.
    pub fn terminate(&mut self, i: usize) -> Result<()> {
        self.pods[i].process_mut()?.terminate()
    }

    /// Waits at most `within` for pod `i`'s process to exit; returns its exit code and keeps
    /// the exited process (its log) in `pod.process` until the restart.
    pub async fn wait_exit(&mut self, i: usize, within: Duration) -> Result<i32> {
        self.pods[i].process_mut()?.wait_exit(within).await
    }

    /// Starts pod `i` again: a new generation (a new process, and under
    /// [`Naming::HostsFile`] a new address published in the hosts file), the same name, ports,
    /// seeds and environment. Returns the previous process (exited) for its log. Waits until
    /// the new process serves, not until it is ready.
    pub async fn restart(&mut self, i: usize) -> Result<Option<ProcessNode>> {
        let previous = self.pods[i].process.take();
        if let Some(mut p) = previous {
            if !p.exited() {
                self.pods[i].process = Some(p);
                bail!("{} still runs; terminate it first", self.pods[i].name);
            }
            self.pods[i].generation += 1;
            if self.naming == Naming::HostsFile {
                self.pods[i].ip = pod_ip(i, self.pods[i].generation as usize)?;
                self.write_hosts()?;
            }
            let spawned = self.spawn(i)?;
            self.pods[i].process = Some(self.wait_serving(i, spawned).await?);
            Ok(Some(p))
        } else {
            bail!("{} has no process to restart", self.pods[i].name)
        }
    }

    /// Writes the hosts file: every pod's DNS names at its current address. In place (truncate
    /// and write, never rename), so that the bind mounts, which hold the inode, see it.
    fn write_hosts(&self) -> Result<()> {
        let mut text = String::from(
            "# ringlimit StatefulSet test: pod DNS names under the headless service\n\
             127.0.0.1 localhost\n",
        );
        for (i, p) in self.pods.iter().enumerate() {
            text.push_str(&format!(
                "{} {} {}-{i}.{SERVICE} {}\n",
                p.ip,
                Self::dns_name(i),
                NAME,
                p.name
            ));
        }
        std::fs::write(&self.hosts, text).context("cannot write the hosts file")
    }

    /// Starts pod `i`'s process (its current generation), configured through the environment
    /// as the StatefulSet configures its container.
    fn spawn(&self, i: usize) -> Result<Spawned> {
        let pod = &self.pods[i];
        let mut cmd = match self.naming {
            Naming::HostsFile => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .arg(r#"mount --bind "$1" /etc/hosts || exit 97; shift; exec "$@""#)
                    .arg("sh")
                    .arg(&self.hosts)
                    .arg(&self.bin);
                cmd
            }
            Naming::Localhost { .. } => Command::new(&self.bin),
        };
        cmd.arg("serve");
        crate::clear_ringlimit_env(&mut cmd);
        let peer = pod.peer().to_string();
        cmd.env("RINGLIMIT_NODE_ID", &pod.name)
            .env("RINGLIMIT_HTTP", pod.http().to_string())
            .env("RINGLIMIT_PEER", &peer)
            // The pod IP, as the StatefulSet advertises `$(POD_IP):7946`.
            .env("RINGLIMIT_ADVERTISE", &peer)
            .env("RINGLIMIT_SEEDS", self.seeds().join(","))
            .env("RINGLIMIT_CONFIG", &self.rules)
            .env("RINGLIMIT_CLUSTER_SECRET", SECRET);
        for (k, v) in &self.env {
            cmd.env(format!("RINGLIMIT_{k}"), v);
        }
        spawn_logged(&mut cmd, format!("{}-{}", pod.name, pod.generation))
            .with_context(|| format!("cannot start {}: {cmd:?}", pod.name))
    }

    /// Waits for the "serving" line of a process just spawned and wraps it in a
    /// [`ProcessNode`] (killed on drop).
    async fn wait_serving(
        &self,
        i: usize,
        Spawned { child, found, log }: Spawned,
    ) -> Result<ProcessNode> {
        let pod = &self.pods[i];
        let mut node = ProcessNode {
            node_id: pod.name.clone(),
            http: pod.http(),
            peer: pod.peer(),
            child,
            api: crate::Api::new(pod.http())?,
            log,
        };
        let http = crate::await_serving(&mut node, found, SERVE_WAIT).await?;
        ensure!(
            http == pod.http(),
            "{} serves HTTP on {http}, not on {}",
            pod.name,
            pod.http()
        );
        // `unshare` and `sh` exec'd: the child's pid is the node's, so signals reach it.
        let comm =
            std::fs::read_to_string(format!("/proc/{}/comm", node.pid())).unwrap_or_default();
        ensure!(
            comm.trim() == "ringlimit",
            "{}: pid {} runs {:?}, not ringlimit",
            pod.name,
            node.pid(),
            comm.trim()
        );
        Ok(node)
    }
}

impl Drop for StatefulSet {
    fn drop(&mut self) {
        for pod in &mut self.pods {
            pod.process = None;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process just started: its child, the HTTP address it will log, and its log lines.
/// The address of pod `i` in generation `generation`: 127.0.0.2 and up, a new one for every
/// restart.
fn pod_ip(i: usize, generation: usize) -> Result<Ipv4Addr> {
    // Up to 16 pods per generation, 15 generations: 127.0.(g).(2 + i) stays inside 127/8.
    ensure!(i < 250, "too many pods");
    let g = u8::try_from(generation).context("too many restarts")?;
    let last = u8::try_from(2 + i).context("too many pods")?;
    Ok(Ipv4Addr::new(127, 0, g, last))
}

/// Whether this machine can run pods in private mount namespaces with our hosts file and on
/// their own loopback addresses: runs `getent hosts` through the same `unshare` wrapper the pods
/// use, and binds a socket on a pod address.
fn probe_namespace(dir: &Path) -> Result<()> {
    let file = dir.join("hosts.probe");
    std::fs::write(&file, "127.0.0.2 ringlimit-probe.ringlimit-peers.test\n")?;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/hosts || exit 97; shift; exec "$@""#)
        .arg("sh")
        .arg(&file)
        .args(["getent", "hosts", "ringlimit-probe.ringlimit-peers.test"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run unshare")?;
    let _ = std::fs::remove_file(&file);
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("127.0.0.2"),
        "unshare --mount with a bind-mounted /etc/hosts did not resolve a name ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let ip = pod_ip(0, 1)?;
    std::net::TcpListener::bind((ip, 0)).with_context(|| format!("cannot bind {ip}"))?;
    std::net::UdpSocket::bind((ip, 0)).with_context(|| format!("cannot bind {ip} (UDP)"))?;
    Ok(())
}

/// A port below the ephemeral range (so that no client connection takes it between a pod's
/// exit and its restart) that is free on every address in `ips`, for TCP and, with `udp`,
/// for UDP too; not one of `taken`.
fn free_port(ips: &[Ipv4Addr], udp: bool, taken: &[u16]) -> Result<u16> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (from, to) = if low > 12_000 {
        (10_000, low)
    } else {
        (low, 65_000)
    };
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32)
        ^ SEQ.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    'next: for _ in 0..500 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = from + (x % u64::from(to - from)) as u16;
        if taken.contains(&port) {
            continue;
        }
        let mut held = Vec::new();
        for &ip in ips {
            let Ok(tcp) = std::net::TcpListener::bind((ip, port)) else {
                continue 'next;
            };
            held.push(tcp);
            if udp && std::net::UdpSocket::bind((ip, port)).is_err() {
                continue 'next;
            }
        }
        return Ok(port);
    }
    bail!("no port free on {ips:?} after 500 tries")
}

/// A fresh scratch directory under the system's temporary directory.
fn scratch_dir() -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ringlimit-statefulset-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_are_distinct_per_generation() {
        let mut seen = std::collections::HashSet::new();
        for g in 0..3 {
            for i in 0..3 {
                assert!(seen.insert(pod_ip(i, g).unwrap()));
            }
        }
        assert_eq!(pod_ip(0, 0).unwrap(), Ipv4Addr::new(127, 0, 0, 2));
    }

    #[test]
    fn names_are_the_statefulsets() {
        assert_eq!(StatefulSet::pod_name(1), "ringlimit-1");
        assert_eq!(
            StatefulSet::dns_name(2),
            "ringlimit-2.ringlimit-peers.default.svc.cluster.local"
        );
    }

    #[test]
    fn free_ports_are_free_everywhere() {
        let ips = [Ipv4Addr::LOCALHOST];
        let p = free_port(&ips, true, &[]).unwrap();
        assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        assert!(std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok());
    }
}
