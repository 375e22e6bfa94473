//! Serving a listener's connections, bounded: accepting, admitting each connection to a
//! [`conns::ConnTable`] (timeouts, a cap), handing it to a runtime, its TLS handshake there
//! when the port has TLS ([`tls`]), and driving hyper's side of it until it ends. The HTTP
//! port and the gRPC port differ only in what serves one connection (a [`Handler`]).
//!
//! Why dedicated single-threaded runtimes (`threads > 0`, the HTTP port): on the
//! multi-threaded runtime the HTTP path spent most of its time in the kernel waking and
//! switching worker threads (perf: `_raw_spin_unlock_irqrestore`, `finish_task_switch` on
//! top), not in ringlimit or hyper. Here one acceptor hands each new connection, round-robin,
//! to one of N current-thread runtimes, which keeps it: a request never changes thread.
//! Round-robin matters: N runtimes accepting from one socket themselves let whichever woke
//! first take most connections (throughput then bimodal from run to run; the docs' benchmarks
//! page, "HTTP against Redis + Lua"); handing them out evenly is what makes the gain steady. The rest of the node (peer RPC, gossip) stays on the
//! main runtime; channels and the shared state work across runtimes.

pub mod conns;
pub mod stream;
pub mod tls;

use conns::{Conn, ConnTable, Expiry};
use hyper_util::server::graceful::GracefulConnection;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use stream::{Accepted, Listener, Stream};
use tls::ServerTls;
use tokio::sync::{mpsc, watch};

/// Connections waiting for their runtime to pick them up, per runtime.
const HANDOFF_QUEUE: usize = 1024;

/// A connection handed to a runtime.
type Handed = (Accepted, SocketAddr, Arc<Conn>);

/// Serves one connection a runtime was handed: spawns a task that serves it until it ends and
/// then calls `ended` (which forgets it). `stop` turns true when the server shuts down.
pub trait Handler: Clone + Send + 'static {
    fn spawn(
        self,
        stream: Stream,
        peer: SocketAddr,
        conn: Arc<Conn>,
        table: Arc<ConnTable>,
        stop: watch::Receiver<bool>,
        ended: Ended,
    );
}

/// Called when a connection's task ends: forgets the connection and lets the runtime's drain
/// know.
pub struct Ended {
    table: Arc<ConnTable>,
    conn: Arc<Conn>,
    _open: watch::Receiver<()>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        self.table.remove(&self.conn);
    }
}

/// Serves `listener`'s connections with the handlers `handler` makes (one per runtime) until
/// `shutdown` completes, then drains, every connection bounded by `table`, each inside TLS
/// first when `tls` is given. With
/// `threads == 0` on the caller's runtime; otherwise on `threads` OS threads each running a
/// current-thread runtime (they stop when `shutdown` completes, so drive this future to
/// completion: aborting it would leave them serving). `name` is for logs and thread names.
pub async fn serve<H: Handler>(
    name: &'static str,
    listener: Listener,
    handler: impl Fn() -> H + Send + Sync + 'static,
    threads: usize,
    table: Arc<ConnTable>,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    if threads == 0 {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        let acceptor = tokio::spawn(accept_loop(name, listener, vec![tx], table.clone()));
        let server = tokio::spawn(run_connections(rx, handler(), table, tls, stop_rx));
        shutdown.await;
        acceptor.abort();
        let _ = stop_tx.send(true);
        return server.await.map_err(io::Error::other);
    }
    let mut queues = Vec::with_capacity(threads);
    let mut workers = Vec::with_capacity(threads);
    let handler = Arc::new(handler);
    for i in 0..threads {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        queues.push(tx);
        let handler = handler.clone();
        let stop = stop_rx.clone();
        let table = table.clone();
        let tls = tls.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ringlimit-{}-{i}", name.to_lowercase()))
            .spawn(move || -> io::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(run_connections(rx, handler(), table, tls, stop));
                Ok(())
            })?;
        workers.push(worker);
    }
    let acceptor = tokio::spawn(accept_loop(name, listener, queues, table));
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
                    .unwrap_or_else(|_| Err(io::Error::other("server worker thread panicked")));
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
    name: &'static str,
    mut listener: Listener,
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
                tracing::warn!(error = %e, server = name, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(conn) = table.admit() else {
            // Every connection is busy at the cap: closing this one at once is all we can do.
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
            tracing::warn!(
                server = name,
                "every runtime is saturated; connection dropped"
            );
        }
        next = next.wrapping_add(1);
    }
}

/// Serves the connections handed to this runtime (each through its TLS handshake first, with
/// `tls`) until `stop`, then lets each finish its request in flight and waits for all of them.
async fn run_connections<H: Handler>(
    mut rx: mpsc::Receiver<Handed>,
    handler: H,
    table: Arc<ConnTable>,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
) {
    // Each connection task holds a receiver; `closed()` resolves when the last one is gone.
    let (open_tx, open_rx) = watch::channel(());
    let for_connections = stop.clone();
    loop {
        tokio::select! {
            handed = rx.recv() => {
                let Some((stream, peer, conn)) = handed else { break };
                let Ok(stream) = stream.into_stream() else {
                    table.remove(&conn);
                    continue;
                };
                let ended = Ended { table: table.clone(), conn: conn.clone(), _open: open_rx.clone() };
                let (handler, table, mut stop) = (handler.clone(), table.clone(), for_connections.clone());
                match &tls {
                    None => handler.spawn(stream, peer, conn, table, stop, ended),
                    // The handshake in a task of its own (the connection's, until it hands the
                    // stream on), so that a slow one holds up nothing else.
                    Some(tls) => {
                        let tls = tls.clone();
                        tokio::spawn(async move {
                            if let Some(stream) = tls.handshake(stream, &conn, &table, &mut stop).await {
                                handler.spawn(stream, peer, conn, table, stop, ended);
                            }
                        });
                    }
                }
            }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    drop(open_rx);
    open_tx.closed().await;
}

/// How a connection that expires (idle, a head too slow) or is evicted at the cap closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExpiry {
    /// At once: no request is in flight then, and a graceful shutdown of HTTP/1 would wait
    /// for a half-sent header.
    Close,
    /// HTTP/2 GOAWAY first (gRPC): the client learns not to start new streams on it, so a
    /// request it sends meanwhile is retried on a new connection rather than failed.
    GoAway,
}

/// How long a connection sent GOAWAY for idleness or to make room has to close before it is
/// dropped: a client answers the GOAWAY's PING within a round trip, and one that never does
/// must not hold its descriptor for long, since the table no longer counts it (found by
/// `bench/slowconns.sh`: with each evicted connection held up to the request timeout, a
/// reconnecting flood at the cap outgrew it; `bench/notes/slow-connections.md`).
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Drives hyper's side of `conn` until it ends: it closes itself, or expires or is evicted
/// ([`OnExpiry`]), or the server stops (a connection without a request in flight closes at
/// once under [`OnExpiry::Close`]; otherwise a graceful shutdown lets requests in flight
/// finish). A graceful close is cut off after `grace` (after [`IDLE_GRACE`] when it closed an
/// idle connection, unless a request came in meanwhile): a client that never reads its GOAWAY
/// or never finishes its request does not keep the connection.
///
/// The connection comes as a trait object: generic over its type, this future failed the
/// compiler's `Send` proof for hyper's HTTP/1-or-2 connection (rust-lang/rust#96865).
pub async fn drive<E: std::fmt::Display>(
    mut connection: Pin<&mut (dyn GracefulConnection<Error = E, Output = Result<(), E>> + Send)>,
    conn: &Conn,
    mut expiry: Pin<&mut Expiry>,
    stop: &mut watch::Receiver<bool>,
    on_expiry: OnExpiry,
    grace: Duration,
) {
    // Registered with the timer only once polled, i.e. once closing.
    let cut_off = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(cut_off);
    let mut closing = false;
    // The cut-off may be extended once, to `grace`, for a request that came in at the GOAWAY.
    let mut extended = false;
    loop {
        let expired = tokio::select! {
            // The connection first: the expiry, polled after it, sees what it just read.
            biased;
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::trace!(error = %e, "connection ended");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !closing => false,
            _ = expiry.as_mut(), if !closing => true,
            () = conn.evicted(), if !closing => true,
            () = cut_off.as_mut(), if closing => {
                if extended || !conn.busy() {
                    return;
                }
                extended = true;
                cut_off.as_mut().reset(tokio::time::Instant::now() + grace);
                continue;
            }
        };
        if on_expiry == OnExpiry::Close && (expired || !conn.busy()) {
            return;
        }
        closing = true;
        extended = !expired;
        connection.as_mut().graceful_shutdown();
        let wait = if expired {
            IDLE_GRACE.min(grace)
        } else {
            grace
        };
        cut_off.as_mut().reset(tokio::time::Instant::now() + wait);
    }
}
