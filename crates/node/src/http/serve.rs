//! One HTTP connection: the check loop ([`h1::serve`]) first, then hyper; served on the
//! HTTP runtimes by [`crate::listen::serve`] (`--http-threads`).

use super::fast::FastPath;
use super::h1;
use crate::listen::conns::{Conn, ConnTable, Tracked};
use crate::listen::stream::Stream;
use crate::listen::{Ended, Handler, OnExpiry};
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tower::Service as _;

/// The address a request's connection comes from (forward auth's last resort for
/// `{client_ip}`), as the `ConnectInfo` of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// hyper's settings, the same for every connection: built once.
static BUILDER: std::sync::LazyLock<hyper_util::server::conn::auto::Builder<TokioExecutor>> =
    std::sync::LazyLock::new(|| {
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        // No HTTP/1 timer: the header timeout is the table's (see `listen::conns`), and
        // without a timer hyper arms none of its own per request.
        builder.http1().header_read_timeout(None);
        builder.http2().timer(TokioTimer::new());
        builder
    });

/// Serves HTTP connections with one runtime's routes.
#[derive(Clone)]
pub struct HttpConnections(pub FastPath);

impl Handler for HttpConnections {
    fn spawn(
        self,
        stream: Stream,
        peer: SocketAddr,
        conn: Arc<Conn>,
        table: Arc<ConnTable>,
        stop: watch::Receiver<bool>,
        ended: Ended,
    ) {
        tokio::spawn(async move {
            serve_connection(stream, peer, conn, self.0, table, stop).await;
            drop(ended);
        });
    }
}

/// One connection: HTTP/1.1 or HTTP/2 (prior knowledge, or TLS's ALPN), closed when a request
/// head is too slow, when idle, evicted or at shutdown (after its request in flight). Its
/// checks are answered by [`h1::serve`] until a request of another shape hands it to hyper.
async fn serve_connection(
    stream: Stream,
    peer: SocketAddr,
    conn: Arc<Conn>,
    app: FastPath,
    table: Arc<ConnTable>,
    mut stop: watch::Receiver<bool>,
) {
    // HTTP/2 chosen by TLS's ALPN: hyper's from the first byte (no head to read here).
    let h2 = stream.alpn_h2();
    let mut io = Tracked::new(stream, table.clone(), conn.clone());
    if h2 {
        table.set_h2(&conn);
    }
    let expiry = table.expiry(&conn);
    tokio::pin!(expiry);
    let prefix = if h2 {
        bytes::Bytes::new()
    } else {
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
            h1::Ended::Closed => return,
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
    let connection = BUILDER.serve_connection(io, service);
    tokio::pin!(connection);
    // A request in flight at shutdown has the body timeout to finish.
    let grace = table.limits().body_timeout;
    crate::listen::drive(connection, &conn, expiry, &mut stop, OnExpiry::Close, grace).await;
}
