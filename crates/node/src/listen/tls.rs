//! TLS on the HTTP and gRPC ports (`--tls-cert`, `--tls-key`): each connection's handshake,
//! run on the runtime that serves the connection (not the acceptor: a handshake costs a
//! signature, and one runtime must not do every connection's).
//!
//! A connection in its handshake is a connection like any other: admitted to the table first
//! (so it counts against the cap, and at the cap, having sent no request, it is among the
//! first closed to make room), closed when evicted or when the server stops, and it must
//! finish within the time a request head has ([`ConnLimits::handshake_timeout`]): a client
//! that opens connections and never completes a handshake holds nothing for long.
//!
//! The certificate is read at each handshake from a [`ReloadingCert`], which a task swaps when
//! the files change: connections already open keep theirs.

use super::conns::{Conn, ConnLimits, ConnTable};
use super::stream::Stream;
use ringlimit_core::tls::{ReloadingCert, TlsError};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A port's TLS: its configuration, and how long a handshake may take.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    within: Duration,
}

impl ServerTls {
    /// TLS presenting `cert` (as it is at each handshake), offering `alpn`, each handshake
    /// bounded by `limits`' [`ConnLimits::handshake_timeout`].
    pub fn new(
        cert: Arc<ReloadingCert>,
        alpn: &[&[u8]],
        limits: &ConnLimits,
    ) -> Result<Self, TlsError> {
        Ok(Self {
            acceptor: TlsAcceptor::from(ringlimit_core::tls::http::server_config(cert, alpn)?),
            within: limits.handshake_timeout(),
        })
    }

    /// Runs the server's side of the handshake on `stream`: the stream inside TLS, or `None`
    /// when the handshake failed, took too long, or the connection was evicted or the server
    /// stopped meanwhile (counted as closed for `tls_handshake`, but for the stop).
    pub async fn handshake(
        &self,
        stream: Stream,
        conn: &Conn,
        table: &ConnTable,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Stream> {
        let failed = || {
            table.stats.closed_tls.fetch_add(1, Ordering::Relaxed);
            None
        };
        tokio::select! {
            done = tokio::time::timeout(self.within, self.acceptor.accept(stream)) => match done {
                Ok(Ok(tls)) => Some(Stream::Tls(Box::new(tls))),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    failed()
                }
                Err(_) => failed(),
            },
            () = conn.evicted() => failed(),
            _ = stop.wait_for(|s| *s) => None,
        }
    }
}
