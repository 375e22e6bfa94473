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

use super::conns::{Conn, ConnTable, Tracked};
use super::fast::FastPath;
use super::h1;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower::Service as _;

/// The address a request's connection comes from (forward auth's last resort for
/// `{client_ip}`), as the `ConnectInfo` of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Connections waiting for their runtime to pick them up, per runtime.
const HANDOFF_QUEUE: usize = 1024;

/// A connection handed to a runtime.
type Handed = (std::net::TcpStream, SocketAddr, Arc<Conn>);

/// Serves the routes `app` makes on `listener` until `shutdown` completes, then drains, with
/// every connection bounded by `table` ([`super::conns`]). With `threads == 0` on the caller's
/// runtime; otherwise on `threads` OS threads each running a current-thread runtime (they stop
/// when `shutdown` completes, so drive this future to completion: aborting it would leave them
/// serving).
pub async fn serve(
    listener: TcpListener,
    app: impl Fn() -> FastPath + Send + Sync + 'static,
    threads: usize,
    table: Arc<ConnTable>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    if threads == 0 {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        let acceptor = tokio::spawn(accept_loop(listener, vec![tx], table.clone()));
        let server = tokio::spawn(run_connections(rx, app(), table, stop_rx));
        shutdown.await;
        acceptor.abort();
        let _ = stop_tx.send(true);
        return server.await.map_err(io::Error::other);
    }
    let mut queues = Vec::with_capacity(threads);
    let mut workers = Vec::with_capacity(threads);
    // Each runtime gets routes (and state) of its own: see `AppState::for_runtime`.
    let app = Arc::new(app);
    for i in 0..threads {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        queues.push(tx);
        let app = app.clone();
        let stop = stop_rx.clone();
        let table = table.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ringlimit-http-{i}"))
            .spawn(move || -> io::Result<()> {
                crate::forward::pool::bind_current_thread();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(run_connections(rx, app(), table, stop));
                Ok(())
            })?;
        workers.push(worker);
    }
    let acceptor = tokio::spawn(accept_loop(listener, queues, table));
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

/// Accepts connections, admits them to the table (refusing at the cap when every connection
/// is busy) and deals them out to the runtimes in turn.
async fn accept_loop(
    listener: TcpListener,
    queues: Vec<mpsc::Sender<Handed>>,
    table: Arc<ConnTable>,
) {
    let mut next = 0usize;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: the error persists for a while, and a
                // tight retry loop would only burn the CPU the other connections need.
                tracing::warn!(error = %e, "HTTP accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(conn) = table.admit() else {
            // Every connection is busy at the cap: closing this one at once is all we can do.
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok(stream) = stream.into_std() else {
            table.remove(&conn);
            continue;
        };
        // A full queue means that runtime is far behind: try the others before dropping.
        let mut handed = Some((stream, peer, conn));
        for k in 0..queues.len() {
            let Some(h) = handed.take() else { break };
            match queues[(next + k) % queues.len()].try_send(h) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Full(h) | mpsc::error::TrySendError::Closed(h)) => {
                    handed = Some(h);
                }
            }
        }
        if let Some((_, _, conn)) = handed {
            table.remove(&conn);
            tracing::warn!("every HTTP runtime is saturated; connection dropped");
        }
        next = next.wrapping_add(1);
    }
}

/// Serves the connections handed to this runtime until `stop`, then lets each finish its
/// request in flight and waits for all of them.
async fn run_connections(
    mut rx: mpsc::Receiver<Handed>,
    app: FastPath,
    table: Arc<ConnTable>,
    mut stop: watch::Receiver<bool>,
) {
    // Each connection task holds a receiver; `closed()` resolves when the last one is gone.
    let (open_tx, open_rx) = watch::channel(());
    let for_connections = stop.clone();
    loop {
        tokio::select! {
            handed = rx.recv() => {
                let Some((stream, peer, conn)) = handed else { break };
                let Ok(stream) = TcpStream::from_std(stream) else {
                    table.remove(&conn);
                    continue;
                };
                let task = serve_connection(stream, peer, conn, app.clone(), table.clone(), for_connections.clone());
                let open = open_rx.clone();
                tokio::spawn(async move {
                    task.await;
                    drop(open);
                });
            }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    drop(open_rx);
    open_tx.closed().await;
}

/// One connection: HTTP/1.1 or HTTP/2 (prior knowledge), closed when a request head is too
/// slow, when idle, evicted or at shutdown (after its request in flight). Its checks are
/// answered by [`h1::serve`] until a request of another shape hands it to hyper.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: Arc<Conn>,
    app: FastPath,
    table: Arc<ConnTable>,
    mut stop: watch::Receiver<bool>,
) {
    let mut io = Tracked::new(stream, table.clone(), conn.clone());
    let expiry = table.expiry(&conn);
    tokio::pin!(expiry);
    let prefix = {
        let mut stopped = stop.clone();
        let closing = async {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => {}
                _ = expiry.as_mut() => {}
                () = conn.evicted() => {}
            }
        };
        tokio::pin!(closing);
        let stopping = || *stop.borrow();
        match h1::serve(&mut io, app.state(), &table, &conn, closing, stopping).await {
            h1::Ended::Closed => {
                table.remove(&conn);
                return;
            }
            h1::Ended::HandOver(prefix) => prefix,
        }
    };
    let io = TokioIo::new(h1::Rewind::new(prefix, io));
    let service = {
        let (table, conn) = (table.clone(), conn.clone());
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let guard = table.start_request(&conn);
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
            let call = app.clone().call(req);
            async move {
                let response = call.await;
                drop(guard);
                response
            }
        })
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // No HTTP/1 timer: the header timeout is the table's (see `conns`), and without a timer
    // hyper arms none of its own per request.
    builder.http1().header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            // The connection first: the expiry, polled after it, sees what it just read.
            biased;
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::trace!(error = %e, "HTTP connection ended");
                }
                break;
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                // Shutting down: a request in flight is finished (then the connection closes);
                // a connection without one closes now.
                if !conn.busy() {
                    break;
                }
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            // Idle, a head too slow, or evicted (only an idle connection is): no request is in
            // flight, so it is closed at once — a graceful shutdown would wait for a half-sent
            // header.
            _ = expiry.as_mut(), if !closing => break,
            () = conn.evicted(), if !closing => break,
        }
    }
    table.remove(&conn);
}
