//! Wiring: one node is an engine, its HTTP API and its background tasks, run until shutdown.

use crate::clock::SystemClock;
use crate::config::NodeConfig;
use crate::engine::Engine;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;

/// The sockets a node serves on, bound before [`run`] so that tests can use port 0.
#[derive(Debug)]
pub struct Listeners {
    pub http: TcpListener,
}

impl Listeners {
    /// Binds the addresses of `config`.
    pub async fn bind(config: &NodeConfig) -> Result<Self, NodeError> {
        let http = TcpListener::bind(config.http_addr)
            .await
            .map_err(|source| NodeError::Bind {
                what: "HTTP",
                addr: config.http_addr,
                source,
            })?;
        Ok(Self { http })
    }

    /// The HTTP address actually bound.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }
}

/// Why a node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot bind the {what} address {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Runs a node until `shutdown` completes, then drains in-flight requests and returns.
pub async fn run(
    config: NodeConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let engine = Arc::new(Engine::new(
        config.rules.clone(),
        config.max_keys,
        Arc::new(SystemClock::new()),
    ));
    let ready = Arc::new(AtomicBool::new(false));
    let state = AppState {
        engine: engine.clone(),
        ready: ready.clone(),
        metrics: Arc::new(Metrics::new()),
    };
    let reload = config.rules_path.clone().map(|path| {
        tokio::spawn(crate::reload::watch(
            engine.clone(),
            path,
            config.rules_poll,
        ))
    });
    let addr = listeners
        .http_addr()
        .map_or_else(|| config.http_addr.to_string(), |a| a.to_string());
    tracing::info!(
        node_id = %config.node_id,
        http = %addr,
        rules = config.rules.len(),
        max_keys = config.max_keys,
        "ringlimit node serving"
    );
    // A single node is its own cluster as soon as it serves.
    ready.store(true, Ordering::Release);
    let ready_on_stop = ready.clone();
    let result = axum::serve(listeners.http, http::router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            ready_on_stop.store(false, Ordering::Release);
            tracing::info!("shutting down: draining in-flight requests");
        })
        .await
        .map_err(NodeError::Serve);
    if let Some(task) = reload {
        task.abort();
    }
    tracing::info!("ringlimit node stopped");
    result
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
