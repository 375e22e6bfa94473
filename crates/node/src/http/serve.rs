//! Serving the HTTP API on dedicated single-threaded runtimes.
//!
//! Why: on the multi-threaded runtime the HTTP path spent most of its time in the kernel waking
//! and switching worker threads (perf: `_raw_spin_unlock_irqrestore`, `finish_task_switch` on
//! top), not in ringlimit or hyper. Here one acceptor hands each new connection, round-robin,
//! to one of N current-thread runtimes, which keeps it: a request never changes thread.
//! Round-robin matters: N runtimes accepting from one socket themselves let whichever woke
//! first take most connections (measured: bimodal 84k or 157k checks/s); handing them out
//! evenly is what makes the gain steady. The rest of the node (peer RPC, gossip) stays on the
//! main runtime; channels and the shared state work across runtimes.

use super::fast::FastPath;
use axum::ServiceExt as _;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// The address a request's connection comes from (forward auth's last resort for
/// `{client_ip}`), as the `ConnectInfo` of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TcpListener>>
    for PeerAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Handoff>> for PeerAddr {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Handoff>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// Connections waiting for their runtime to pick them up, per runtime.
const HANDOFF_QUEUE: usize = 1024;

/// Serves the routes `app` makes on `listener` until `shutdown` completes, then drains. With `threads == 0` on
/// the caller's runtime; otherwise on `threads` OS threads each running a current-thread
/// runtime (they stop when `shutdown` completes, so drive this future to completion: aborting
/// it would leave them serving).
pub async fn serve(
    listener: TcpListener,
    app: impl Fn() -> FastPath + Send + Sync + 'static,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    if threads == 0 {
        return axum::serve(
            listener,
            app().into_make_service_with_connect_info::<PeerAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await;
    }
    let local = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut queues = Vec::with_capacity(threads);
    let mut workers = Vec::with_capacity(threads);
    // Each runtime gets routes (and state) of its own: see `AppState::for_runtime`.
    let app = std::sync::Arc::new(app);
    for i in 0..threads {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        queues.push(tx);
        let handoff = Handoff { rx, local };
        let app = app.clone();
        let mut stop = stop_rx.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ringlimit-http-{i}"))
            .spawn(move || -> io::Result<()> {
                crate::forward::pool::bind_current_thread();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    axum::serve(
                        handoff,
                        app().into_make_service_with_connect_info::<PeerAddr>(),
                    )
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|stopped| *stopped).await;
                    })
                    .await
                })
            })?;
        workers.push(worker);
    }
    let acceptor = tokio::spawn(accept_loop(listener, queues));
    // A worker that fails (its runtime cannot start) ends the node like the single-runtime
    // server would; otherwise wait for the shutdown signal.
    let (failed_tx, mut failed_rx) = mpsc::channel::<io::Error>(threads);
    let watchers: Vec<_> = workers
        .into_iter()
        .map(|w| {
            let failed = failed_tx.clone();
            tokio::task::spawn_blocking(move || {
                let result = w
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("HTTP worker thread panicked")));
                if let Err(e) = &result {
                    let _ = failed.try_send(io::Error::new(e.kind(), e.to_string()));
                }
                result
            })
        })
        .collect();
    drop(failed_tx);
    let early = tokio::select! {
        () = shutdown => None,
        Some(e) = failed_rx.recv() => Some(e),
    };
    acceptor.abort();
    let _ = stop_tx.send(true);
    for w in watchers {
        if let Ok(Err(e)) = w.await
            && early.is_none()
        {
            return Err(e);
        }
    }
    early.map_or(Ok(()), Err)
}

/// Accepts connections and deals them out to the runtimes in turn.
async fn accept_loop(listener: TcpListener, queues: Vec<mpsc::Sender<std::net::TcpStream>>) {
    let mut next = 0usize;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: the error persists for a while, and a
                // tight retry loop would only burn the CPU the other connections need.
                tracing::warn!(error = %e, "HTTP accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        // A full queue means that runtime is far behind: try the others before dropping.
        let mut stream = stream;
        let mut handed = false;
        for k in 0..queues.len() {
            match queues[(next + k) % queues.len()].try_send(stream) {
                Ok(()) => {
                    handed = true;
                    break;
                }
                Err(mpsc::error::TrySendError::Full(s) | mpsc::error::TrySendError::Closed(s)) => {
                    stream = s;
                }
            }
        }
        if !handed {
            tracing::warn!("every HTTP runtime is saturated; connection dropped");
        }
        next = next.wrapping_add(1);
    }
}

/// One runtime's share of the connections, as an axum listener.
struct Handoff {
    rx: mpsc::Receiver<std::net::TcpStream>,
    local: SocketAddr,
}

impl axum::serve::Listener for Handoff {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some(stream) = self.rx.recv().await else {
                // The acceptor stopped: the node is shutting down, and the graceful shutdown
                // signal ends this server.
                std::future::pending::<()>().await;
                continue;
            };
            let Ok(stream) = TcpStream::from_std(stream) else {
                continue;
            };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            return (stream, peer);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
