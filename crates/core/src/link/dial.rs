//! How a peer link is opened: the dialer is handed in ([`PeerSettings::dialer`]), so the same
//! client runs over TCP in a node and over an in-memory network ([`super::memnet`]) in tests.
//!
//! [`PeerSettings::dialer`]: super::PeerSettings::dialer

use super::framing::BoxedIo;
use futures::future::BoxFuture;
use std::sync::Arc;

/// Opens byte streams to peers by address.
pub trait Dial: Send + Sync + 'static {
    fn dial(&self, addr: &str) -> BoxFuture<'static, std::io::Result<BoxedIo>>;
}

impl std::fmt::Debug for dyn Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dial")
    }
}

/// Dials TCP, with Nagle off: frames are small and latency is the point.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpDial;

impl Dial for TcpDial {
    fn dial(&self, addr: &str) -> BoxFuture<'static, std::io::Result<BoxedIo>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream) as BoxedIo)
        })
    }
}

/// The TCP dialer, as [`super::PeerSettings`] takes it.
pub fn tcp() -> Arc<dyn Dial> {
    Arc::new(TcpDial)
}
