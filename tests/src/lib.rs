//! Test harness for ringlimit integration tests: real nodes on loopback ephemeral ports.
//!
//! - [`TestNode`] — one node started in-process through `ringlimit_node::run`, stopped on drop.
//! - [`TestCluster`] — N in-process nodes seeded with each other, formed before it is returned.
//! - [`ProcessNode`] — the real `ringlimit` binary (built with `escargot`) as a child process
//!   that tests can SIGKILL, SIGTERM, SIGSTOP and SIGCONT; killed on drop.
//! - [`Api`] — the HTTP client both kinds of node share (through `Deref`), over HTTP or HTTPS.
//! - [`tls`] — a test CA, its certificates in files, TLS clients.
//!
//! Every wait is bounded and every address is on 127.0.0.1. The waits, the cluster view, the
//! metrics reading and key placement are those of `ringlimit-test-support`, which the in-memory
//! nodes' harness (the node crate's `testing`) uses too: [`Api`], [`TestNode`] and
//! [`ProcessNode`] are its [`Member`]s.

pub mod regions;
pub mod statefulset;
pub mod tls;

use anyhow::{Context, Result, anyhow, bail, ensure};
use ringlimit_node::{Listeners, NodeConfig, run};
pub use ringlimit_test_support::{
    ClusterView, Member, inline, keys_owned_by, owner_of, poll_every, series, series_sum,
    wait_all_alive, wait_for, wait_out_of_ring, wait_until,
};
use serde_json::{Value, json};
use std::future::Future;
use std::io::BufRead;
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Longest any harness wait may take.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long a cluster started by a test has to form: longer than [`WAIT`], since a cluster
/// restarted on new ports with its data directories meets its members' previous lives in
/// gossip (dead, then replaced), which under CI's parallel load took more than 10 s.
pub const FORM_WAIT: Duration = Duration::from_secs(30);

/// Sends the in-process nodes' logs to the test output, filtered by `RUST_LOG` (nothing when it
/// is unset). Safe to call from every test.
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// A shared per-ip limit, a per-user limit and a shadow trial: the rules of the several-limits
/// tests (HTTP `/v1/check/all` and gRPC `CheckAll`).
pub const LIMIT_RULES: &str = "
rules:
  - { name: per-ip, limit: 10, period: 1h }
  - { name: per-user, limit: 3, period: 1h }
  - { name: trial, limit: 1, period: 1h, shadow: true }
";

/// Puts [`LIMIT_RULES`] in force in `config`.
pub fn with_limit_rules(config: &mut NodeConfig) {
    config.rules = ringlimit_node::rules::RuleSet::from_yaml(LIMIT_RULES).expect("valid rules");
}

/// An HTTP client for one node.
#[derive(Clone)]
pub struct Api {
    /// The node's HTTP address.
    pub addr: SocketAddr,
    client: reqwest::Client,
    /// `http` or `https`.
    scheme: &'static str,
}

impl Api {
    /// A client whose requests time out after [`WAIT`].
    pub fn new(addr: SocketAddr) -> Result<Self> {
        Self::with_timeout(addr, WAIT)
    }

    /// A client whose requests time out after `timeout`.
    pub fn with_timeout(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        Ok(Self {
            addr,
            client: reqwest::Client::builder()
                .timeout(timeout)
                .no_proxy()
                .build()?,
            scheme: "http",
        })
    }

    /// A client of a node's HTTPS port (`--tls-cert`) whose certificate `ca_pem` signed (for
    /// `127.0.0.1`), requests timing out after [`WAIT`].
    pub fn https(addr: SocketAddr, ca_pem: &str) -> Result<Self> {
        Ok(Self {
            addr,
            client: reqwest::Client::builder()
                .timeout(WAIT)
                .no_proxy()
                .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
                .build()?,
            scheme: "https",
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.addr, path)
    }

    /// POSTs a raw body; returns status, headers and the body.
    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> Result<Reply> {
        let r = self.client.post(self.url(path)).body(body).send().await?;
        Reply::read(r).await
    }

    /// POSTs a JSON value.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply> {
        self.post_raw(path, serde_json::to_vec(body)?).await
    }

    /// POSTs one check.
    pub async fn check(&self, body: &Value) -> Result<Reply> {
        self.post("/v1/check", body).await
    }

    /// POSTs one batch of checks.
    pub async fn batch(&self, checks: &[Value]) -> Result<Reply> {
        self.post("/v1/check/batch", &json!({ "checks": checks }))
            .await
    }

    /// An admin API request: `method` on `path` with `token` as bearer and `body` as JSON.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Reply> {
        let mut req = self
            .client
            .request(method, self.url(path))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(serde_json::to_vec(b)?);
        }
        Reply::read(req.send().await?).await
    }

    pub async fn get(&self, path: &str) -> Result<Reply> {
        let r = self.client.get(self.url(path)).send().await?;
        Reply::read(r).await
    }

    /// `GET /v1/cluster`.
    pub async fn cluster(&self) -> Result<ClusterView> {
        let r = self.get("/v1/cluster").await?;
        ensure!(
            r.status == 200,
            "/v1/cluster answered {}: {}",
            r.status,
            r.text
        );
        Ok(ClusterView(r.json()?))
    }

    /// Waits (at most [`WAIT`]) until `/readyz` answers 200.
    pub async fn wait_ready(&self) -> Result<()> {
        ringlimit_test_support::wait_ready(self, WAIT).await
    }

    /// The value of `name` (a series: its name and labels, see [`series`]) in the node's
    /// `/metrics`; an error when the node does not export it.
    pub async fn series(&self, name: &str) -> Result<f64> {
        let r = self.get("/metrics").await?;
        ensure!(r.status == 200, "/metrics answered {}", r.status);
        series(&r.text, name).with_context(|| format!("{} exports no {name}", self.addr))
    }

    /// Gossip datagrams this node has taken in so far.
    pub async fn gossip_received(&self) -> Result<f64> {
        self.series(r#"ringlimit_gossip_datagrams_total{direction="received"}"#)
            .await
    }

    /// Gossip datagrams this node has sent so far (to seeds it has not joined: its attempts).
    pub async fn gossip_sent(&self) -> Result<f64> {
        self.series(r#"ringlimit_gossip_datagrams_total{direction="sent"}"#)
            .await
    }
}

/// Waits until each of `nodes` has taken in `datagrams` more gossip datagrams than when called:
/// what a test waits for before it says that something did not spread (it had the chance).
pub async fn wait_gossip<N: Deref<Target = Api>>(nodes: &[N], datagrams: f64) -> Result<()> {
    let mut marks = Vec::with_capacity(nodes.len());
    for node in nodes {
        marks.push(node.gossip_received().await?);
    }
    for (node, mark) in nodes.iter().zip(marks) {
        wait_until(
            &format!("{} takes in {datagrams} gossip datagrams", node.addr),
            WAIT,
            || async { Ok(node.gossip_received().await? >= mark + datagrams) },
        )
        .await?;
    }
    Ok(())
}

/// What a load loop has done so far, shared with the test that drives it: the test waits for
/// an amount of load (before a kill, after a heal) rather than for an amount of time, which a
/// busy machine stretches.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<std::sync::atomic::AtomicU64>);

impl Progress {
    /// One more done.
    pub fn add(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Done so far.
    pub fn done(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `within`) until `n` more are done than when called.
    pub async fn wait_more(&self, n: u64, within: Duration) -> Result<()> {
        let want = self.done() + n;
        wait_until(&format!("{n} more done by the load"), within, || async {
            Ok(self.done() >= want)
        })
        .await
    }
}

impl Member for Api {
    fn name(&self) -> String {
        self.addr.to_string()
    }

    async fn ready(&self) -> Result<bool> {
        let r = self.client.get(self.url("/readyz")).send().await?;
        Ok(r.status().is_success())
    }

    fn cluster_view(&self) -> impl Future<Output = Result<ClusterView>> + Send {
        self.cluster()
    }
}

/// A [`Member`] reached through its [`Api`], named by its node id.
macro_rules! member_through_api {
    ($node:ty) => {
        impl Member for $node {
            fn name(&self) -> String {
                self.node_id.clone()
            }

            fn ready(&self) -> impl Future<Output = Result<bool>> + Send {
                self.api.ready()
            }

            fn cluster_view(&self) -> impl Future<Output = Result<ClusterView>> + Send {
                self.api.cluster()
            }
        }
    };
}

member_through_api!(TestNode);
member_through_api!(ProcessNode);

/// A node running in this process.
pub struct TestNode {
    pub http: SocketAddr,
    /// Peer address: TCP peer RPC and UDP gossip.
    pub peer: SocketAddr,
    /// gRPC, when the config asked for it.
    pub grpc: Option<SocketAddr>,
    pub node_id: String,
    api: Api,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ringlimit_node::NodeError>>>,
}

impl Deref for TestNode {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl TestNode {
    /// Starts a node with `config` (its addresses should be port 0) and waits until it is ready.
    pub async fn start(config: NodeConfig) -> Result<Self> {
        Self::start_with_api(config, Api::new).await
    }

    /// [`TestNode::start`], the node's HTTP client made by `api` from its address (e.g.
    /// [`Api::https`] for a node with `--tls-cert`).
    pub async fn start_with_api(
        config: NodeConfig,
        api: impl Fn(SocketAddr) -> Result<Api>,
    ) -> Result<Self> {
        let listeners = Listeners::bind(&config).await?;
        let mut node = Self::spawn(config, listeners)?;
        node.api = api(node.http)?;
        node.wait_ready().await?;
        Ok(node)
    }

    /// Runs a node on sockets already bound, without waiting for it to be ready.
    pub fn spawn(config: NodeConfig, listeners: Listeners) -> Result<Self> {
        init_logs();
        let http = listeners.http_addr().context("no HTTP address")?;
        let peer = listeners.peer_addr().context("no peer address")?;
        let grpc = listeners.grpc_addr();
        let node_id = config.node_id.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let id = node_id.clone();
        let task = tokio::spawn(async move {
            let ran = run(config, listeners, async move {
                let _ = stopped.await;
            })
            .await;
            if let Err(e) = &ran {
                // The test sees only that the node never formed a cluster: say why here.
                eprintln!("{id}'s run ended: {e}");
            }
            ran
        });
        Ok(Self {
            http,
            peer,
            grpc,
            node_id,
            api: Api::new(http)?,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// A single node with built-in rules.
    pub async fn single() -> Result<Self> {
        Self::start(NodeConfig::local("test-node")).await
    }

    /// The HTTP client of this node.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// Stops the node gracefully and waits for it to finish.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .context("node did not stop in time")???;
        }
        Ok(())
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// N in-process nodes, `node-0` to `node-{N-1}`, each seeded with every peer address.
/// Dropping it stops them all.
pub struct TestCluster {
    pub nodes: Vec<TestNode>,
}

impl Deref for TestCluster {
    type Target = [TestNode];
    fn deref(&self) -> &[TestNode] {
        &self.nodes
    }
}

/// The Python that can import `modules` (e.g. `"grpc, grpc_tools"`: clients we did not
/// write): `RINGLIMIT_TEST_PYTHON`, else the venv `.ci/run` makes.
pub fn python_with(modules: &str) -> Option<String> {
    let py = std::env::var("RINGLIMIT_TEST_PYTHON")
        .unwrap_or_else(|_| "/tmp/ringlimit-grpc-venv/bin/python".into());
    Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| py)
}

/// What a client script printed: one JSON line per call, named by its `call` field.
pub struct CallLog(pub Vec<Value>);

impl CallLog {
    /// The line of `call` (null when the script printed none).
    pub fn by(&self, call: &str) -> Value {
        self.0
            .iter()
            .find(|l| l["call"] == call)
            .cloned()
            .unwrap_or_default()
    }
}

/// Runs `python` with `args` (a client script and its arguments), bounded to a minute, and
/// reads its JSON lines; a failed script is an error with its stderr.
pub async fn run_client_script(python: String, args: Vec<String>) -> Result<CallLog> {
    let run = tokio::task::spawn_blocking(move || Command::new(python).args(args).output());
    // The scripts' own calls time out after 5 s each; this bounds the whole run.
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .context("the Python client took over a minute")???;
    ensure!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(CallLog(
        String::from_utf8(out.stdout)?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?,
    ))
}

/// An Envoy rate limit descriptor of `entries`.
pub fn envoy_descriptor(
    entries: &[(&str, &str)],
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

impl TestCluster {
    /// Every node's gRPC address, comma-separated (for a client script).
    pub fn grpc_addrs(&self) -> Result<String> {
        Ok(self
            .nodes
            .iter()
            .map(|n| n.grpc.map(|a| a.to_string()))
            .collect::<Option<Vec<_>>>()
            .context("every node serves gRPC")?
            .join(","))
    }

    /// Starts `n` nodes with `NodeConfig::local` and waits until every node shows all `n` alive.
    pub async fn start(n: usize) -> Result<Self> {
        Self::start_with(n, |_| {}).await
    }

    /// Like [`TestCluster::start`], with `configure` applied to every node's config (after the
    /// node id and seeds are set).
    pub async fn start_with(n: usize, configure: impl FnMut(&mut NodeConfig)) -> Result<Self> {
        Self::start_with_api(n, configure, Api::new).await
    }

    /// [`TestCluster::start_with`], each node's HTTP client made by `api` from its address.
    pub async fn start_with_api(
        n: usize,
        mut configure: impl FnMut(&mut NodeConfig),
        api: impl Fn(SocketAddr) -> Result<Api>,
    ) -> Result<Self> {
        ensure!(n > 0, "a cluster needs a node");
        let mut bound = Vec::with_capacity(n);
        for i in 0..n {
            let config = NodeConfig::local(&format!("node-{i}"));
            let listeners = Listeners::bind(&config).await?;
            bound.push((config, listeners));
        }
        let seeds: Vec<String> = bound
            .iter()
            .map(|(_, l)| l.peer_addr().map(|a| a.to_string()))
            .collect::<Option<_>>()
            .context("no peer address")?;
        let mut nodes = Vec::with_capacity(n);
        for (mut config, mut listeners) in bound {
            config.seeds = seeds.clone();
            configure(&mut config);
            // Asked for by `configure`, after the other sockets were bound.
            if let (Some(addr), None) = (config.grpc_addr, &listeners.grpc) {
                listeners.grpc = Some(tokio::net::TcpListener::bind(addr).await?);
            }
            let mut node = TestNode::spawn(config, listeners)?;
            node.api = api(node.http)?;
            nodes.push(node);
        }
        let cluster = Self { nodes };
        cluster.wait_formed(FORM_WAIT).await?;
        Ok(cluster)
    }

    /// Every node's peer address, as seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.peer.to_string()).collect()
    }

    /// The node ids, in order.
    pub fn ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.node_id.clone()).collect()
    }

    /// Waits until every node shows exactly the cluster's nodes alive and all in its ring,
    /// and is ready.
    pub async fn wait_formed(&self, within: Duration) -> Result<()> {
        let ids = self.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        if let Err(e) = wait_all_alive(&self.nodes, &ids, within).await {
            // A node whose run ended (it could not start) is the likelier cause: name it.
            let ended: Vec<&str> = self
                .nodes
                .iter()
                .filter(|n| n.task.as_ref().is_some_and(|t| t.is_finished()))
                .map(|n| n.node_id.as_str())
                .collect();
            if !ended.is_empty() {
                return Err(e.context(format!("these nodes' runs ended: {ended:?}")));
            }
            return Err(e);
        }
        for node in &self.nodes {
            node.wait_ready().await?;
        }
        Ok(())
    }

    /// Stops every node gracefully.
    pub async fn stop(self) -> Result<()> {
        for node in self.nodes {
            node.stop().await?;
        }
        Ok(())
    }
}

/// Where the kernel's ephemeral ports begin (32768 unless configured otherwise).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
}

/// A port free right now on 127.0.0.1 for both TCP and UDP (released before returning: start
/// the node soon). Taken below the kernel's ephemeral range, where only explicit binds take
/// ports: one from `bind(0)`, once released, can be handed out at once as the local port of an
/// outgoing connection — a node's own peer links dialling seeds not yet up took one, and the
/// next node could not bind its peer port (`graceful_leave_and_rejoin` in CI, 2026-11-24).
pub fn free_peer_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let high = ephemeral_low().clamp(LOW + 1_000, 65_535);
    // A different starting point in each test process, then ports in turn: test binaries
    // running side by side do not try the same ones.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
    for _ in 0..1_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(LOW + start.wrapping_add(n.wrapping_mul(7_919)) % (high - LOW))
            .context("port out of range")?;
        let Ok(_tcp) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
            continue;
        };
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no port below {high} free for both TCP and UDP after 1,000 tries")
}

/// Where Debian's `faketime` package puts the library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The process environment that moves a wall clock by `offset` (libfaketime's form, e.g.
/// `+10s`, `+0.7`), the monotonic clock left alone, as an operator whose NTP failed on one
/// host would see it.
pub fn faketime(offset: &str) -> Vec<(String, String)> {
    [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", offset),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        // Read the offset once: the process never changes it.
        ("FAKETIME_NO_CACHE", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Whether a test under libfaketime can run: the library is there. Under CI (`CI` set) it
/// must be.
pub fn faketime_available() -> Result<bool> {
    if std::path::Path::new(LIBFAKETIME).exists() {
        return Ok(true);
    }
    ensure!(
        std::env::var_os("CI").is_none(),
        "{LIBFAKETIME} is missing: .ci/run installs Debian's faketime package"
    );
    eprintln!("SKIPPED: {LIBFAKETIME} is missing (apt-get install faketime)");
    Ok(false)
}

/// How to start one `ringlimit` process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub node_id: String,
    /// The fixed peer port (TCP and UDP on 127.0.0.1), so that others can be seeded with it.
    pub peer_port: u16,
    pub seeds: Vec<String>,
    pub cluster_id: Option<String>,
    /// `RINGLIMIT_CLUSTER_SECRET` for the process (never inherited from the test's environment).
    pub secret: Option<String>,
    /// More flags after `serve`.
    pub args: Vec<String>,
    /// More environment variables for the process (e.g. libfaketime's).
    pub env: Vec<(String, String)>,
}

impl ProcessSpec {
    pub fn new(node_id: &str, peer_port: u16) -> Self {
        Self {
            node_id: node_id.to_owned(),
            peer_port,
            seeds: Vec::new(),
            cluster_id: None,
            secret: None,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn peer_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.peer_port))
    }
}

/// The `ringlimit` binary, built once per test process.
pub fn ringlimit_binary() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| cargo_binary("ringlimit-node", "ringlimit", None))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Builds `bin` of `package` (with `features`) in the dev profile; its path.
pub(crate) fn cargo_binary(
    package: &str,
    bin: &str,
    features: Option<&str>,
) -> Result<PathBuf, String> {
    let mut build = escargot::CargoBuild::new().bin(bin).package(package);
    if let Some(f) = features {
        build = build.features(f);
    }
    // `cargo test` runs this process with its package's variables (CARGO_MANIFEST_DIR,
    // CARGO_PKG_NAME, ...). Build scripts that watch them (ring's, under rustls) would see
    // other values than in a plain `cargo build` and run again, rebuilding the node (and
    // what it links) in every test run and again in the next plain build.
    for (key, _) in std::env::vars_os() {
        let package_var = key.to_str().is_some_and(|k| {
            k.starts_with("CARGO_PKG_")
                || matches!(
                    k,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_MANIFEST_LINKS"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "OUT_DIR"
                )
        });
        if package_var {
            build = build.env_remove(key);
        }
    }
    build.run().map(|r| r.path().to_owned()).map_err(|e| {
        format!(
            "cannot build the {bin} binary: {}",
            last_lines(&e.to_string(), 30)
        )
    })
}

/// The last `n` lines of `text`: cargo's reason for a failed build comes after its long list
/// of `Compiling` lines, which CI logs cut in the middle.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let skipped = lines.len().saturating_sub(n);
    let tail = lines[skipped..].join("\n");
    if skipped == 0 {
        tail
    } else {
        format!("({skipped} lines before)\n{tail}")
    }
}

/// Waits (at most `within`) for the HTTP address `node` logs once it serves (sent by
/// [`read_stderr`] on `found`); a failure carries the node's log.
pub(crate) async fn await_serving(
    node: &mut ProcessNode,
    found: oneshot::Receiver<SocketAddr>,
    within: Duration,
) -> Result<SocketAddr> {
    match tokio::time::timeout(within, found).await {
        Ok(Ok(http)) => Ok(http),
        Ok(Err(_)) => bail!(
            "{} exited before serving ({:?}); its log:\n{}",
            node.node_id,
            node.child.try_wait().ok().flatten(),
            node.log()
        ),
        Err(_) => bail!(
            "{} did not log its HTTP address within {within:?}; its log:\n{}",
            node.node_id,
            node.log()
        ),
    }
}

/// Stderr lines kept per process (the last ones).
const LOG_LINES: usize = 5_000;

/// A `ringlimit serve` child process. Killed (SIGKILL) and reaped on drop; when dropped by a
/// panicking test, the last lines of its log are printed first.
pub struct ProcessNode {
    pub node_id: String,
    pub http: SocketAddr,
    pub peer: SocketAddr,
    child: Child,
    api: Api,
    log: Arc<Mutex<Vec<String>>>,
}

impl Deref for ProcessNode {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl ProcessNode {
    /// Starts the binary with `--http 127.0.0.1:0 --peer 127.0.0.1:<peer_port>` and waits (at
    /// most [`WAIT`]) for its "ringlimit node serving" log line, which gives the HTTP address.
    /// Does not wait for readiness.
    pub async fn start(spec: &ProcessSpec) -> Result<Self> {
        let bin = tokio::task::spawn_blocking(ringlimit_binary).await??;
        Self::start_with_binary(&bin, spec).await
    }

    async fn start_with_binary(bin: &Path, spec: &ProcessSpec) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .args(["--node-id", &spec.node_id])
            .args(["--http", "127.0.0.1:0"])
            .args(["--peer", &spec.peer_addr().to_string()]);
        if !spec.seeds.is_empty() {
            cmd.args(["--seeds", &spec.seeds.join(",")]);
        }
        if let Some(id) = &spec.cluster_id {
            cmd.args(["--cluster-id", id]);
        }
        cmd.args(&spec.args);
        clear_ringlimit_env(&mut cmd);
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
        match &spec.secret {
            Some(secret) => cmd.env("RINGLIMIT_CLUSTER_SECRET", secret),
            // Test clusters on loopback without a secret must say so (the safe default refuses
            // --seeds without one).
            None => cmd.env("RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS", "true"),
        };
        let Spawned { child, found, log } = spawn_logged(&mut cmd, spec.node_id.clone())
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut node = Self {
            node_id: spec.node_id.clone(),
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            peer: spec.peer_addr(),
            child,
            api: Api::new(SocketAddr::from(([127, 0, 0, 1], 0)))?,
            log,
        };
        let http = await_serving(&mut node, found, WAIT).await?;
        node.http = http;
        node.api = Api::new(http)?;
        Ok(node)
    }

    /// Starts `n` processes `node-0..` on fresh peer ports, each seeded with all of them, and
    /// waits until every one shows all `n` alive. `configure` may change each spec.
    pub async fn cluster(
        n: usize,
        mut configure: impl FnMut(usize, &mut ProcessSpec),
    ) -> Result<Vec<ProcessNode>> {
        let bin = tokio::task::spawn_blocking(ringlimit_binary).await??;
        let mut specs = Vec::with_capacity(n);
        let mut ports: Vec<u16> = Vec::with_capacity(n);
        while ports.len() < n {
            let port = free_peer_port()?;
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        for (i, &port) in ports.iter().enumerate() {
            let mut spec = ProcessSpec::new(&format!("node-{i}"), port);
            spec.seeds = seeds.clone();
            configure(i, &mut spec);
            specs.push(spec);
        }
        let mut nodes = Vec::with_capacity(n);
        for spec in &specs {
            nodes.push(Self::start_with_binary(&bin, spec).await?);
        }
        let ids: Vec<&str> = nodes.iter().map(|p| p.node_id.as_str()).collect();
        wait_all_alive(&nodes, &ids, WAIT).await?;
        Ok(nodes)
    }

    /// The HTTP client of this node.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// Talks to the node through `api` from now on (e.g. [`Api::https`] for `--tls-cert`).
    pub fn set_api(&mut self, api: Api) {
        self.api = api;
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote to stderr so far (its last lines).
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Whether the process has exited (and been reaped).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    fn signal(&mut self, sig: &str) -> Result<()> {
        ensure!(
            !self.exited(),
            "{} has already exited; not sending SIG{sig}",
            self.node_id
        );
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .context("cannot run kill")?;
        ensure!(status.success(), "kill -{sig} {} failed", self.pid());
        Ok(())
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) -> Result<()> {
        self.signal("KILL")?;
        let _ = self.child.wait();
        Ok(())
    }

    /// Sends SIGTERM and returns at once (see [`ProcessNode::wait_exit`]).
    pub fn terminate(&mut self) -> Result<()> {
        self.signal("TERM")
    }

    /// Waits at most `within` for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, within: Duration) -> Result<i32> {
        let what = format!("{} exits", self.node_id);
        let child = &mut self.child;
        let status = wait_for(&what, within, || {
            let exited = child.try_wait();
            async move { Ok(exited?) }
        })
        .await?;
        status
            .code()
            .with_context(|| format!("{} ended by a signal: {status}", self.node_id))
    }

    /// SIGTERM, then waits (at most [`WAIT`]) for the exit; returns the exit code.
    pub async fn stop(&mut self) -> Result<i32> {
        self.terminate()?;
        self.wait_exit(WAIT).await
    }

    /// SIGSTOP: the process freezes (sockets stay open, nothing answers). Returns once every
    /// thread is stopped: kill(2) only wakes one thread to start the group stop, and on a busy
    /// machine the others answer requests for a while (seen in CI: an answer after the pause).
    pub fn pause(&mut self) -> Result<()> {
        self.signal("STOP")?;
        let tasks = PathBuf::from(format!("/proc/{}/task", self.pid()));
        let deadline = Instant::now() + WAIT;
        loop {
            if all_threads_stopped(&tasks)? {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{} not stopped within {WAIT:?} of SIGSTOP",
                self.node_id
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self) -> Result<()> {
        self.signal("CONT")
    }
}

/// Whether every thread under `/proc/<pid>/task` is in the stopped state (`T`).
fn all_threads_stopped(tasks: &Path) -> Result<bool> {
    for task in std::fs::read_dir(tasks).with_context(|| format!("cannot list {tasks:?}"))? {
        let stat = std::fs::read_to_string(task?.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised command name, which may itself hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state != Some('T') {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Drop for ProcessNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- last lines of {} (pid {}) ---\n{}",
                self.node_id,
                self.pid(),
                tail.join("\n")
            );
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Nothing from the test's environment may configure a node behind the test's back.
pub(crate) fn clear_ringlimit_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RINGLIMIT_") {
            cmd.env_remove(k);
        }
    }
}

/// A node process just started, its stderr read by a thread of its own.
pub(crate) struct Spawned {
    pub child: Child,
    /// The HTTP address from the "ringlimit node serving" line.
    pub found: oneshot::Receiver<SocketAddr>,
    /// Every stderr line so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// Starts `cmd` (a node) with info logs, no colour and a piped stderr, which a thread named
/// after `name` reads to its end.
pub(crate) fn spawn_logged(cmd: &mut Command, name: String) -> Result<Spawned> {
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (found_tx, found) = oneshot::channel::<SocketAddr>();
    let lines = log.clone();
    std::thread::Builder::new()
        .name(format!("stderr-{name}"))
        .spawn(move || read_stderr(stderr, lines, found_tx))?;
    Ok(Spawned { child, found, log })
}

/// Reads a child's stderr to its end: keeps the lines, and hands over the HTTP address from
/// the "ringlimit node serving" line.
fn read_stderr(
    stderr: std::process::ChildStderr,
    lines: Arc<Mutex<Vec<String>>>,
    found: oneshot::Sender<SocketAddr>,
) {
    let mut found = Some(found);
    for line in std::io::BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if found.is_some()
            && line.contains("ringlimit node serving")
            && let Some(addr) = field(&line, "http").and_then(|v| v.parse().ok())
            && let Some(tx) = found.take()
        {
            let _ = tx.send(addr);
        }
        if let Ok(mut l) = lines.lock() {
            if l.len() >= LOG_LINES {
                l.remove(0);
            }
            l.push(line);
        }
    }
}

/// The value of `name=VALUE` in a plain-text tracing line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// One test at a time for the tests that call it: cluster tests measure latencies and failure
/// detection on a small machine, and must not compete with each other for its cores.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// An HTTP reply, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    /// Reads a response whole.
    pub async fn read(r: reqwest::Response) -> Result<Self> {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await?;
        Ok(Self {
            status,
            headers,
            text,
        })
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.text).with_context(|| format!("not JSON: {:?}", self.text))
    }

    /// A header as a string ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("ringlimit-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Reads `n` whole HTTP/1.1 responses (each head, then its `Content-Length` of body) from a raw
/// connection, within [`WAIT`]: each response's text. Bytes past the `n`th are an error.
pub async fn read_responses(s: &mut tokio::net::TcpStream, n: usize) -> Result<Vec<String>> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            let mut out = Vec::new();
            let mut rest = &got[..];
            while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&rest[..end + 4]);
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse().ok())
                    .context("no content-length")?;
                if rest.len() < end + 4 + len {
                    break;
                }
                out.push(String::from_utf8_lossy(&rest[..end + 4 + len]).into_owned());
                rest = &rest[end + 4 + len..];
            }
            if out.len() >= n {
                ensure!(rest.is_empty(), "bytes after the answers: {rest:?}");
                return Ok(out);
            }
            let read = s.read(&mut buf).await?;
            ensure!(read > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..read]);
        }
    })
    .await
    .context("answers did not come in time")?
}

/// Reads a raw connection until the server closes it (EOF or reset), within [`WAIT`]: the
/// bytes read.
pub async fn read_until_closed(s: &mut tokio::net::TcpStream) -> Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .context("the server never closed the connection")?;
    Ok(got)
}

/// The value of one series in a `/metrics` text (its name and labels, see [`series`]); -1
/// when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    series(text, name).unwrap_or(-1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_serving_line() {
        let line = "2026-01-01T00:00:00.000000Z  INFO ringlimit_node::node: ringlimit node serving \
                    node_id=x http=127.0.0.1:38077 peer=127.0.0.1:35397 seeds=[]";
        assert_eq!(field(line, "http"), Some("127.0.0.1:38077"));
        assert_eq!(field(line, "peer"), Some("127.0.0.1:35397"));
        assert_eq!(field(line, "nope"), None);
    }

    #[test]
    fn free_ports_are_free() {
        let p = free_peer_port().expect("port");
        let low = ephemeral_low();
        assert!(
            (10_000..low).contains(&u32::from(p)),
            "{p} not below the ephemeral range ({low}..)"
        );
        assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        assert!(std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok());
    }
}
