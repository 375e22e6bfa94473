//! Whole nodes in memory: N real nodes started through [`crate::run`] on one [`MemoryNet`]
//! under tokio's paused clock, with an engine clock that follows it, so checks, gossip,
//! timeouts and handover all run on one virtual time. A test talks to a node's HTTP edge over
//! memnet, kills a node (aborts its task: SIGKILL), stops one gracefully (its shutdown future:
//! SIGTERM), restarts one with the same id, and cuts or heals links.
//!
//! The waits, the cluster view, the metrics reading and key placement are
//! `ringlimit-test-support`'s, which the process tests (`tests/`, real nodes in wall time) use
//! too: a [`NodeClient`] is its `Member`, as a process test's HTTP client is. Every wait is
//! bounded on tokio's clock: the paused clock advances by itself when every task waits, so a
//! bound costs no real time.
//!
//! Protocol behaviour is tested here; the process tests keep what needs real processes and
//! sockets (signals, latencies in wall time, the binary's flags, TLS, Envoy and Python clients),
//! with a smoke test of each cluster scenario (`cluster.rs`, `rolling.rs`, `global.rs` there).
//!
//! # Layout
//! - this file: [`Cluster`] (start, join, kill, stop, pause, cut, waits) and [`NodeClient`]
//!   (HTTP over memnet), plus [`owner_of`] to know which node owns a key.
//! - `cluster`: forming, forwarding and batching, kill, leave and rejoin, join, handover,
//!   pause, partition.
//! - `rolling`: a rolling restart under load keeps exhausted keys exhausted.
//! - `global`: global rules across nodes, a kill, a partition, a join and a rolling restart.
//! - `forwarding`: a check decided by its owner, failing open when the owner stalls or its link
//!   is lost (and the circuit that stops the waiting), a check relayed by a former owner, a node
//!   without a majority.
//! - `batches`: concurrent checks for one owner in one frame; large local batches that let single
//!   checks through and decide in turn.
//! - `calendar`: a monthly quota on calendar windows (Europe/Berlin) through three nodes.
//! - `buckets`: a bucket handed to its new owner on a ring change; a reset on every member.
//! - `replicas`: an owner killed after its keys' limits are used up: the new owner promotes
//!   its copies and keeps denying (token bucket, fixed window); a restarted owner gets them
//!   back by handover; `--replicas 0` as before.
//! - `reservations`: reserve through one node, settle through another (given back, taken
//!   into debt, repaid), settled once, expiry, garbage, an owner killed.
//! - `clocks`: one node's wall clock off by seconds: offsets measured and shown, global
//!   windows on the cluster clock, rule versions in the order written.
//! - `operators`: admin rule changes read-your-writes through rotating nodes and conditional on
//!   `If-Match`; named tokens with roles; the most denied keys merged across members.
//! - `pauses`: a node resumed from a pause (SIGSTOP) with checks waiting in its socket asks
//!   their owners before any fallback share.
//! - `regions`: two single-node clusters, each its own region, sharing a `scope: regions`
//!   limit; a cut-off region falls back only when its allowance expires.
//! - `all_or_nothing`: `/v1/check/all` across owners: exact limits, refunds that leave every
//!   algorithm untouched, shadow, global and fail-closed rules, an unreachable owner's share.

#[cfg(test)]
mod all_or_nothing;
#[cfg(test)]
mod batches;
#[cfg(test)]
mod blocks;
#[cfg(test)]
mod buckets;
#[cfg(test)]
mod calendar;
#[cfg(test)]
mod clocks;
#[cfg(test)]
mod cluster;
#[cfg(test)]
mod forwarding;
#[cfg(test)]
mod global;
#[cfg(test)]
mod leases;
#[cfg(test)]
mod operators;
#[cfg(test)]
mod pauses;
#[cfg(test)]
mod regions;
#[cfg(test)]
mod replicas;
#[cfg(test)]
mod reservations;
#[cfg(test)]
mod rolling;

use crate::cluster::pause::Pauses;
use crate::config::{EngineClock, NodeConfig};
use crate::node::{MemoryNet, NodeError};
use ringlimit_core::clock::Clock;
use ringlimit_core::link::dial::Dial;
use ringlimit_proto::InlineRule;
use ringlimit_test_support::{ClusterView, Member};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 2026-01-01T00:00:00Z: the engine clock's reading when the test starts.
const EPOCH_NS: u64 = 1_767_225_600_000 * 1_000_000;
/// The admin token of [`Cluster::admin`].
pub const ADMIN_TOKEN: &str = "in-memory admin token";
/// The longest any wait of the harness lasts (virtual time).
pub const WAIT: Duration = Duration::from_secs(60);

/// An engine clock reading tokio's (paused) clock, offset from a fixed epoch.
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        EPOCH_NS.saturating_add(elapsed)
    }
}

/// One node's task and what stops it gracefully.
struct Running {
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A cluster of nodes `n0`, `n1`, … on one in-memory network; node `i` serves HTTP on
/// `10.0.0.i:8080` and peers (RPC and gossip) on `10.0.0.i:7000`, and is seeded with `n0`.
pub struct Cluster {
    pub net: MemoryNet,
    clock: Arc<TokioClock>,
    configs: BTreeMap<String, NodeConfig>,
    running: BTreeMap<String, Running>,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One node's HTTP edge, reached over memnet; cheap to clone into load tasks.
#[derive(Clone)]
pub struct NodeClient {
    dialer: Arc<dyn Dial>,
    /// The node's id, for messages.
    id: String,
    addr: String,
}

impl NodeClient {
    /// One HTTP/1.1 request; `None` when the node does not answer within 5 s.
    pub async fn try_http(&self, method: &str, path: &str, body: &str) -> Option<Reply> {
        self.try_http_with(method, path, "", body).await
    }

    /// [`Self::try_http`] with `headers` (each line ending in `\r\n`) added.
    pub async fn try_http_with(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> Option<Reply> {
        let exchange = async {
            let mut io = self.dialer.dial(&self.addr).await.ok()?;
            let request = format!(
                "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
                 {headers}content-length: {}\r\n\r\n{body}",
                self.addr,
                body.len()
            );
            io.write_all(request.as_bytes()).await.ok()?;
            read_response(&mut io).await
        };
        tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .ok()
            .flatten()
    }

    /// [`Self::try_http`], which must be answered.
    pub async fn http(&self, method: &str, path: &str, body: &str) -> Reply {
        match self.try_http(method, path, body).await {
            Some(r) => r,
            None => panic!("{} did not answer {method} {path}", self.addr),
        }
    }

    /// `POST /v1/check`.
    pub async fn check(&self, body: &serde_json::Value) -> Reply {
        self.http("POST", "/v1/check", &body.to_string()).await
    }

    /// A request that must be answered, or an error naming the node.
    async fn answered(&self, method: &str, path: &str) -> anyhow::Result<Reply> {
        self.try_http(method, path, "")
            .await
            .ok_or_else(|| anyhow::anyhow!("{} did not answer {method} {path}", self.id))
    }
}

impl Member for NodeClient {
    fn name(&self) -> String {
        self.id.clone()
    }

    async fn ready(&self) -> anyhow::Result<bool> {
        Ok(self.answered("GET", "/readyz").await?.status == 200)
    }

    async fn cluster_view(&self) -> anyhow::Result<ClusterView> {
        let r = self.answered("GET", "/v1/cluster").await?;
        anyhow::ensure!(r.status == 200, "/v1/cluster answered {}", r.status);
        Ok(ClusterView(serde_json::from_str(&r.body)?))
    }
}

/// What one answer to a check said (a 200 or 429 with a well-formed body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub allowed: bool,
    pub degraded: bool,
}

impl Seen {
    /// Reads a check's answer, which must be 200 or 429 and agree with its `allowed`.
    pub fn of(status: u16, body: &serde_json::Value) -> Seen {
        assert!(status == 200 || status == 429, "{status}: {body}");
        let allowed = body["allowed"].as_bool().expect("allowed");
        assert_eq!(allowed, status == 200, "{body}");
        for field in ["limit", "remaining", "reset_at_ms", "retry_after_ms"] {
            assert!(body[field].is_u64(), "no `{field}` in {body}");
        }
        Seen {
            allowed,
            degraded: body["degraded"].as_bool().expect("degraded"),
        }
    }
}

pub use ringlimit_test_support::inline;

/// The member of `members` that owns `key` under an inline rule of `limit` per `period_ms`
/// (token bucket), as every node's ring places it.
pub fn owner_of(members: &[&str], key: &str, limit: u64, period_ms: u64) -> String {
    ringlimit_test_support::owner_of(members, key, limit, period_ms).unwrap_or_else(fail)
}

/// The member of `members` that owns `key` under the inline `rule`.
pub fn owner_under(members: &[&str], key: &str, rule: InlineRule) -> String {
    ringlimit_test_support::owner_under(members, key, &rule).unwrap_or_else(fail)
}

/// `n` keys named `{prefix}:{i}` that `owner` owns on a ring over `members`.
pub fn keys_owned_by(
    members: &[&str],
    owner: &str,
    prefix: &str,
    n: usize,
    rule: (u64, u64),
) -> Vec<String> {
    ringlimit_test_support::keys_owned_by(members, owner, prefix, n, rule).unwrap_or_else(fail)
}

/// The in-memory tests panic where the shared helpers return an error.
#[track_caller]
fn fail<T>(e: anyhow::Error) -> T {
    panic!("{e:#}")
}

fn ip(i: usize) -> [u8; 4] {
    [10, 0, 0, u8::try_from(i + 1).expect("under 255 nodes")]
}

/// The peer addresses of nodes `n0` to `n{n-1}`, as seeds: a node seeded with the others (as
/// the StatefulSet seeds every pod) waits to hear from a peer before it is ready, even `n0`.
pub fn seeds(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| SocketAddr::from((ip(i), 7000)).to_string())
        .collect()
}

/// Node `n{i}`'s configuration before the test's own: its addresses, seeded with `n0`, the
/// cluster secret, the shared engine clock.
fn node_config(i: usize, clock: &Arc<TokioClock>) -> NodeConfig {
    let mut config = NodeConfig::local(&format!("n{i}"));
    config.http_addr = SocketAddr::from((ip(i), 8080));
    config.peer_addr = SocketAddr::from((ip(i), 7000));
    config.advertise = config.peer_addr.to_string();
    config.seeds = vec![SocketAddr::from((ip(0), 7000)).to_string()];
    config.cluster_secret = Some("in-memory secret".into());
    config.allow_unauthenticated_peers = false;
    config.clock = Some(EngineClock(clock.clone()));
    config.pauses = Some(Arc::new(Pauses::new(config.gossip_interval)));
    config
}

impl Cluster {
    /// Starts `n` nodes, each configured by `configure`, and waits until all are ready.
    pub async fn start(n: usize, mut configure: impl FnMut(&mut NodeConfig)) -> Self {
        let mut cluster = Cluster {
            net: MemoryNet::default(),
            clock: Arc::new(TokioClock {
                start: tokio::time::Instant::now(),
            }),
            configs: BTreeMap::new(),
            running: BTreeMap::new(),
        };
        for i in 0..n {
            let id = format!("n{i}");
            let mut config = node_config(i, &cluster.clock);
            configure(&mut config);
            cluster.configs.insert(id.clone(), config);
            cluster.spawn(&id);
        }
        for i in 0..n {
            cluster.wait_ready(&format!("n{i}")).await;
        }
        cluster
    }

    /// Starts one more node, `n{i}` (configured as `n0` is, with its own addresses), and waits
    /// until it is ready; returns its id.
    pub async fn join(&mut self) -> String {
        let i = self.configs.len();
        let id = format!("n{i}");
        let own = node_config(i, &self.clock);
        let mut config = self.configs["n0"].clone();
        config.node_id = own.node_id;
        config.http_addr = own.http_addr;
        config.peer_addr = own.peer_addr;
        config.advertise = own.advertise;
        config.pauses = own.pauses;
        self.configs.insert(id.clone(), config);
        self.spawn(&id);
        self.wait_ready(&id).await;
        id
    }

    /// The engine clock's reading in Unix milliseconds (windows align to it).
    pub fn now_ms(&self) -> u64 {
        self.clock.now() / 1_000_000
    }

    /// Sleeps (virtual time) until `margin_ms` past the next boundary of a `period_ms` window;
    /// returns that window's end (Unix ms), as answers give it in `reset_at_ms`.
    pub async fn next_window(&self, period_ms: u64, margin_ms: u64) -> u64 {
        let now = self.now_ms();
        let start = now - now % period_ms + period_ms;
        tokio::time::sleep(Duration::from_millis(start + margin_ms - now)).await;
        start + period_ms
    }

    /// Starts node `id` (again) from its configuration.
    pub fn spawn(&mut self, id: &str) {
        let config = self.configs[id].clone();
        let listeners = self.net.listen(&config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::run(config, listeners, async move {
            let _ = stopped.await;
        }));
        self.running.insert(
            id.to_owned(),
            Running {
                task,
                stop: Some(stop),
            },
        );
    }

    /// SIGKILL: the node's task is aborted, its connections and gossip stop at once.
    pub async fn kill(&mut self, id: &str) {
        if let Some(r) = self.running.remove(id) {
            r.task.abort();
            let _ = r.task.await;
        }
        self.net
            .links
            .drop_connections(&self.configs[id].peer_addr.to_string());
    }

    /// SIGTERM: the node leaves (peers stop routing to it), drains and returns.
    pub async fn stop(&mut self, id: &str) {
        self.terminate(id);
        self.wait_exit(id).await;
    }

    /// Sends node `id` its shutdown signal (SIGTERM) and returns at once: it keeps serving for
    /// its leave delay.
    pub fn terminate(&mut self, id: &str) {
        if let Some(stop) = self.running.get_mut(id).and_then(|r| r.stop.take()) {
            let _ = stop.send(());
        }
    }

    /// Waits until node `id`'s `run` returns, which must be cleanly (exit code 0).
    pub async fn wait_exit(&mut self, id: &str) {
        let Some(r) = self.running.remove(id) else {
            return;
        };
        match tokio::time::timeout(WAIT, r.task).await {
            Ok(Ok(Ok(()))) => {}
            other => panic!("{id} did not stop cleanly: {other:?}"),
        }
    }

    /// SIGSTOP: node `id` keeps its connections but nothing moves to or from it (peer RPC and
    /// HTTP stall, gossip to and from it is lost), and its pause detector stops ticking (its
    /// other tasks go on: in one runtime they cannot stop; those that matter heed the detector).
    pub async fn pause(&self, id: &str) {
        self.freeze(id, true);
        let me = self.peer_addr(id);
        self.net.links.stall(&me.to_string());
        self.net
            .links
            .stall(&self.configs[id].http_addr.to_string());
        for other in self.configs.keys().filter(|o| *o != id) {
            self.net.gossip.remove_link(me, self.peer_addr(other)).await;
        }
    }

    /// SIGCONT after [`Self::pause`]: what was sent to it meanwhile arrives.
    pub async fn resume(&self, id: &str) {
        let me = self.peer_addr(id);
        for other in self.configs.keys().filter(|o| *o != id) {
            self.net.gossip.add_link(me, self.peer_addr(other)).await;
        }
        self.freeze(id, false);
        self.net.links.resume(&me.to_string());
        self.net
            .links
            .resume(&self.configs[id].http_addr.to_string());
    }

    /// Stops (or restarts) node `id`'s pause detector, as SIGSTOP (SIGCONT) would.
    fn freeze(&self, id: &str, frozen: bool) {
        if let Some(p) = &self.configs[id].pauses {
            p.freeze(frozen);
        }
    }

    /// Restarts a stopped or killed node with the same id (a new gossip generation).
    pub async fn restart(&mut self, id: &str) {
        // chitchat frees its in-memory port once its stopped server task has run.
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.spawn(id);
        self.wait_ready(id).await;
    }

    /// Node `id`'s peer address (its name on the network).
    pub fn peer_addr(&self, id: &str) -> SocketAddr {
        self.configs[id].peer_addr
    }

    /// Gossip and peer RPC between `a` and `b` stop (a partition).
    pub async fn cut(&self, a: &str, b: &str) {
        let (a, b) = (self.peer_addr(a), self.peer_addr(b));
        self.net.gossip.remove_link(a, b).await;
        self.net.links.cut(&a.to_string(), &b.to_string());
    }

    /// `a` and `b` reach each other again.
    pub async fn heal(&self, a: &str, b: &str) {
        let (a, b) = (self.peer_addr(a), self.peer_addr(b));
        self.net.gossip.add_link(a, b).await;
        self.net.links.heal(&a.to_string(), &b.to_string());
    }

    /// Peer RPC between `a` and `b` stops (their connections drop); gossip still flows, so each
    /// keeps the other alive in its ring.
    pub fn cut_link(&self, a: &str, b: &str) {
        let (a, b) = (self.peer_addr(a), self.peer_addr(b));
        self.net.links.cut(&a.to_string(), &b.to_string());
    }

    /// Peer RPC between `a` and `b` resumes after [`Self::cut_link`].
    pub fn heal_link(&self, a: &str, b: &str) {
        let (a, b) = (self.peer_addr(a), self.peer_addr(b));
        self.net.links.heal(&a.to_string(), &b.to_string());
    }

    /// Gossip between `a` and `b` stops; peer RPC still flows.
    pub async fn cut_gossip(&self, a: &str, b: &str) {
        let (a, b) = (self.peer_addr(a), self.peer_addr(b));
        self.net.gossip.remove_link(a, b).await;
    }

    /// Node `id`'s peer server stops answering (frames to it wait, its connections stay open);
    /// gossip still flows, so the others keep it in their rings.
    pub fn stall_peer(&self, id: &str) {
        self.net.links.stall(&self.peer_addr(id).to_string());
    }

    /// Connections opened to node `id`'s peer address so far.
    pub fn dials_to(&self, id: &str) -> u64 {
        self.net.links.dials(&self.peer_addr(id).to_string())
    }

    /// Node `id`'s peer server answers again after [`Self::stall_peer`].
    pub fn resume_peer(&self, id: &str) {
        self.net.links.resume(&self.peer_addr(id).to_string());
    }

    /// A client of node `id`'s HTTP edge (from an address of its own on the network).
    pub fn client(&self, id: &str) -> NodeClient {
        NodeClient {
            dialer: self.net.links.dialer("10.0.0.250:1"),
            id: id.to_owned(),
            addr: self.configs[id].http_addr.to_string(),
        }
    }

    /// One HTTP/1.1 request to node `id`'s HTTP edge; `None` when the node does not answer.
    pub async fn try_http(&self, id: &str, method: &str, path: &str, body: &str) -> Option<Reply> {
        self.client(id).try_http(method, path, body).await
    }

    /// [`Self::try_http`], which must be answered.
    pub async fn http(&self, id: &str, method: &str, path: &str, body: &str) -> Reply {
        self.client(id).http(method, path, body).await
    }

    /// `POST /v1/check` on node `id`.
    pub async fn check(&self, id: &str, body: &serde_json::Value) -> Reply {
        self.client(id).check(body).await
    }

    /// `POST /v1/check` on node `id`, read as [`Seen`].
    pub async fn seen(&self, id: &str, body: &serde_json::Value) -> Seen {
        let r = self.check(id, body).await;
        Seen::of(r.status, &r.json())
    }

    /// `remaining` of a cost-0 check of `body` on node `id` (a peek).
    pub async fn remaining(&self, id: &str, body: &serde_json::Value) -> u64 {
        let mut peek = body.clone();
        peek["cost"] = 0.into();
        let r = self.check(id, &peek).await.json();
        r["remaining"].as_u64().unwrap_or_else(|| panic!("{r}"))
    }

    /// `POST /v1/check/batch` on node `id`: the answers, in order.
    pub async fn batch(&self, id: &str, checks: &[serde_json::Value]) -> Vec<serde_json::Value> {
        let body = serde_json::json!({ "checks": checks }).to_string();
        let r = self.http(id, "POST", "/v1/check/batch", &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["results"].as_array().cloned().expect("results")
    }

    /// A request to node `id`'s admin API, with the admin token (which the test must have set:
    /// `config.admin_token = Some(ADMIN_TOKEN.into())`).
    pub async fn admin(&self, id: &str, method: &str, path: &str) -> Reply {
        let auth = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
        match self.client(id).try_http_with(method, path, &auth, "").await {
            Some(r) => r,
            None => panic!("{id} did not answer {method} {path}"),
        }
    }

    /// `POST /v1/check/all` on node `id`.
    pub async fn check_all(&self, id: &str, checks: &[serde_json::Value]) -> Reply {
        let body = serde_json::json!({ "checks": checks }).to_string();
        self.http(id, "POST", "/v1/check/all", &body).await
    }

    /// The buckets node `id` holds (`ringlimit_buckets`).
    pub async fn buckets(&self, id: &str) -> u64 {
        self.metric(id, "ringlimit_buckets").await
    }

    /// The value of node `id`'s series `name` (e.g. `ringlimit_relayed_total`, with labels if
    /// it has any), a whole number.
    pub async fn metric(&self, id: &str, name: &str) -> u64 {
        let text = self.metrics(id).await;
        let value = ringlimit_test_support::series(&text, name)
            .unwrap_or_else(|| panic!("no {name} in {id}'s metrics"));
        assert!(
            value >= 0.0 && value.fract() == 0.0,
            "{id}'s {name} is {value}, not a whole number"
        );
        value as u64
    }

    /// `GET /v1/cluster` on node `id`.
    pub async fn view(&self, id: &str) -> serde_json::Value {
        self.http(id, "GET", "/v1/cluster", "").await.json()
    }

    /// `GET /v1/cluster` on node `id`, read.
    pub async fn cluster_view(&self, id: &str) -> ClusterView {
        ClusterView(self.view(id).await)
    }

    /// One counter of node `id`'s `forwarding` section (`forwarded`, `fail_open`, ...).
    pub async fn forwarding(&self, id: &str, counter: &str) -> u64 {
        self.cluster_view(id).await.forwarding(counter)
    }

    /// A `forwarding` counter summed over `ids`.
    pub async fn sum_forwarding(&self, ids: &[&str], counter: &str) -> u64 {
        let mut total = 0;
        for id in ids {
            total += self.forwarding(id, counter).await;
        }
        total
    }

    /// Node `id`'s `/metrics` text.
    pub async fn metrics(&self, id: &str) -> String {
        self.http(id, "GET", "/metrics", "").await.body
    }

    /// The state node `id` shows `member` in (`alive`, `dead`, `leaving`), if it lists it.
    pub async fn state_of(&self, id: &str, member: &str) -> Option<String> {
        self.cluster_view(id).await.state_of(member)
    }

    /// Waits until every node of `ids` shows exactly `ids` alive, and as many in its ring.
    pub async fn wait_all_alive(&self, ids: &[&str]) {
        let clients: Vec<NodeClient> = ids.iter().map(|id| self.client(id)).collect();
        ringlimit_test_support::wait_all_alive(&clients, ids, WAIT)
            .await
            .unwrap_or_else(fail);
    }

    /// Waits until node `id` answers `/readyz` with 200.
    pub async fn wait_ready(&self, id: &str) {
        ringlimit_test_support::wait_ready(&self.client(id), WAIT)
            .await
            .unwrap_or_else(fail);
    }

    /// Waits until node `id` shows `member` other than alive and `ring` members in its ring;
    /// returns the state it shows then (`None`: no longer listed).
    pub async fn wait_out_of_ring(&self, id: &str, member: &str, ring: u64) -> Option<String> {
        ringlimit_test_support::wait_out_of_ring(&self.client(id), member, ring, WAIT)
            .await
            .unwrap_or_else(fail)
    }

    /// Polls `condition` until it holds; panics after [`WAIT`] (virtual).
    pub async fn wait<F, Fut>(&self, what: &str, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        ringlimit_test_support::wait_until(what, WAIT, || {
            let holds = condition();
            async { Ok(holds.await) }
        })
        .await
        .unwrap_or_else(fail);
    }

    /// The ids node `id` shows alive in `/v1/cluster`, sorted.
    pub async fn alive(&self, id: &str) -> Vec<String> {
        self.cluster_view(id).await.alive()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for r in self.running.values() {
            r.task.abort();
        }
    }
}

/// Reads one response: its head, then `content-length` bytes (or to the end without one).
async fn read_response(io: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Reply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut body = buf[head_end..].to_vec();
    // 204 and 304 have no body, and no length to say so.
    let length = if status == 204 || status == 304 {
        Some(0)
    } else {
        length
    };
    match length {
        Some(len) => {
            while body.len() < len {
                let n = io.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                body.extend_from_slice(&chunk[..n]);
            }
            body.truncate(len);
        }
        None => {
            io.read_to_end(&mut body).await.ok()?;
        }
    }
    Some(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The harness places keys with the shared helper (core's bucket identity, proto's ring): it
/// must agree with the rules in force, or every test that picks a key by its owner tests
/// nothing.
#[test]
fn owner_of_places_keys_as_the_node_does() {
    use crate::rules::{InForce, RuleSet, RuleSpec};
    use ringlimit_proto::{Algorithm, Ring};
    let in_force = InForce::new(RuleSet::builtin());
    let members = ["n0", "n1", "n2"];
    let ring = Ring::new(members);
    for (i, algorithm) in [Algorithm::TokenBucket, Algorithm::FixedWindow]
        .into_iter()
        .enumerate()
    {
        let rule = InlineRule {
            limit: 5 + i as u64,
            period_ms: 60_000,
            algorithm,
            burst: None,
            calendar: None,
        };
        for k in 0..50 {
            let key = format!("k:{k}");
            let (_, id) = in_force
                .prepare(&key, RuleSpec::Inline(rule), 1)
                .expect("valid");
            let by_node = ring.owner(id).expect("members");
            assert_eq!(owner_under(&members, &key, rule), by_node, "{key}");
        }
    }
}
