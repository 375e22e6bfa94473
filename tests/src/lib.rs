//! Test harness for ringlimit integration tests: real nodes on loopback ephemeral ports,
//! started in-process through `ringlimit_node::run`, stopped (and waited for) on drop.

use anyhow::{Context, Result, bail};
use ringlimit_node::{Listeners, NodeConfig, run};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Longest any harness wait may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// A node running in this process.
pub struct TestNode {
    pub http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ringlimit_node::NodeError>>>,
    client: reqwest::Client,
}

impl TestNode {
    /// Starts a node with `config` (its addresses should be port 0) and waits until it is ready.
    pub async fn start(config: NodeConfig) -> Result<Self> {
        let listeners = Listeners::bind(&config).await?;
        let http = listeners.http_addr().context("no HTTP address")?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(config, listeners, async move {
            let _ = stopped.await;
        }));
        let node = Self {
            http,
            stop: Some(stop),
            task: Some(task),
            client: reqwest::Client::builder().timeout(WAIT).build()?,
        };
        node.wait_ready().await?;
        Ok(node)
    }

    /// A single node with built-in rules.
    pub async fn single() -> Result<Self> {
        Self::start(NodeConfig::local("test-node")).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(r) = self.client.get(self.url("/readyz")).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                bail!("node at {} not ready within {:?}", self.http, WAIT);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// POSTs a raw body; returns status, headers and the body parsed as JSON.
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

    pub async fn get(&self, path: &str) -> Result<Reply> {
        let r = self.client.get(self.url(path)).send().await?;
        Reply::read(r).await
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

/// An HTTP reply, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    async fn read(r: reqwest::Response) -> Result<Self> {
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
