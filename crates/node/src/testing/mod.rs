//! Whole nodes in memory: N real nodes started through [`crate::run`] on one [`MemoryNet`]
//! under tokio's paused clock, with an engine clock that follows it, so checks, gossip,
//! timeouts and handover all run on one virtual time. A test talks to a node's HTTP edge over
//! memnet, kills a node (aborts its task: SIGKILL), stops one gracefully (its shutdown future:
//! SIGTERM), restarts one with the same id, and cuts or heals links.
//!
//! Waits are bounded with `tokio::time::timeout`: the paused clock advances by itself when every
//! task waits, so a bound costs no real time.

#[cfg(test)]
mod cluster;

use crate::config::{EngineClock, NodeConfig};
use crate::node::{MemoryNet, NodeError};
use ringlimit_core::clock::Clock;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 2026-01-01T00:00:00Z: the engine clock's reading when the test starts.
const EPOCH_NS: u64 = 1_767_225_600_000 * 1_000_000;
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

fn ip(i: usize) -> [u8; 4] {
    [10, 0, 0, u8::try_from(i + 1).expect("under 255 nodes")]
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
            let mut config = NodeConfig::local(&id);
            config.http_addr = SocketAddr::from((ip(i), 8080));
            config.peer_addr = SocketAddr::from((ip(i), 7000));
            config.advertise = config.peer_addr.to_string();
            config.seeds = vec![SocketAddr::from((ip(0), 7000)).to_string()];
            config.cluster_secret = Some("in-memory secret".into());
            config.allow_unauthenticated_peers = false;
            config.clock = Some(EngineClock(cluster.clock.clone()));
            configure(&mut config);
            cluster.configs.insert(id.clone(), config);
            cluster.spawn(&id);
        }
        for i in 0..n {
            cluster.wait_ready(&format!("n{i}")).await;
        }
        cluster
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
        let Some(mut r) = self.running.remove(id) else {
            return;
        };
        if let Some(stop) = r.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(WAIT, r.task).await {
            Ok(Ok(Ok(()))) => {}
            other => panic!("{id} did not stop cleanly: {other:?}"),
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

    /// One HTTP/1.1 request to node `id`'s HTTP edge; `None` when the node does not answer.
    pub async fn try_http(&self, id: &str, method: &str, path: &str, body: &str) -> Option<Reply> {
        let dialer = self.net.links.dialer("10.0.0.250:1");
        let addr = self.configs[id].http_addr.to_string();
        let exchange = async {
            let mut io = dialer.dial(&addr).await.ok()?;
            let request = format!(
                "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
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
    pub async fn http(&self, id: &str, method: &str, path: &str, body: &str) -> Reply {
        match self.try_http(id, method, path, body).await {
            Some(r) => r,
            None => panic!("{id} did not answer {method} {path}"),
        }
    }

    /// `POST /v1/check` on node `id`.
    pub async fn check(&self, id: &str, body: &serde_json::Value) -> Reply {
        self.http(id, "POST", "/v1/check", &body.to_string()).await
    }

    /// `GET /v1/cluster` on node `id`.
    pub async fn view(&self, id: &str) -> serde_json::Value {
        self.http(id, "GET", "/v1/cluster", "").await.json()
    }

    /// Waits until node `id` answers `/readyz` with 200.
    pub async fn wait_ready(&self, id: &str) {
        self.wait(&format!("{id} ready"), || async {
            self.try_http(id, "GET", "/readyz", "")
                .await
                .is_some_and(|r| r.status == 200)
        })
        .await;
    }

    /// Polls `condition` every 10 ms (virtual) until it holds; panics after [`WAIT`].
    pub async fn wait<F, Fut>(&self, what: &str, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let waited = tokio::time::timeout(WAIT, async {
            while !condition().await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "not within {WAIT:?}: {what}");
    }

    /// The ids node `id` shows alive in `/v1/cluster`.
    pub async fn alive(&self, id: &str) -> Vec<String> {
        let view = self.view(id).await;
        view["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["state"] == "alive")
            .filter_map(|m| m["node_id"].as_str().map(str::to_owned))
            .collect()
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
