//! What the HTTP and gRPC ports accept from: a bound TCP socket, or a listener on the
//! in-memory network (`ringlimit_core::link::memnet`, for whole nodes in tests), and the
//! byte streams each yields — as they are, or inside TLS ([`super::tls`]).

use ringlimit_core::link::framing::BoxedIo;
use ringlimit_core::link::memnet::MemListener;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Where connections come from.
pub enum Listener {
    Tcp(TcpListener),
    Memory(MemListener),
}

/// Stands for the address of an in-memory connection whose dialer's name is not an address.
const UNKNOWN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

impl Listener {
    /// The next connection and where it comes from.
    pub async fn accept(&mut self) -> io::Result<(Accepted, SocketAddr)> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                // No Nagle: an answer written in two pieces would otherwise wait for the
                // client's delayed ACK (measured on gRPC: the docs' benchmarks page, "gRPC").
                let _ = stream.set_nodelay(true);
                Ok((Accepted::Tcp(stream.into_std()?), peer))
            }
            Listener::Memory(listener) => match listener.accept().await {
                Some((io, from)) => Ok((Accepted::Memory(io), from.parse().unwrap_or(UNKNOWN))),
                // The network is gone: nothing will ever connect again.
                None => std::future::pending().await,
            },
        }
    }
}

/// An accepted connection on its way to the runtime that serves it (a TCP stream leaves the
/// acceptor's runtime as a std socket and registers with the one it is handed to).
pub enum Accepted {
    Tcp(std::net::TcpStream),
    Memory(BoxedIo),
}

impl Accepted {
    /// The stream, on the runtime that calls this.
    pub fn into_stream(self) -> io::Result<Stream> {
        Ok(match self {
            Accepted::Tcp(s) => Stream::Tcp(TcpStream::from_std(s)?),
            Accepted::Memory(io) => Stream::Memory(io),
        })
    }
}

/// One connection's bytes.
pub enum Stream {
    Tcp(TcpStream),
    Memory(BoxedIo),
    /// Either of the others inside TLS (`--tls-cert`), once the handshake is done.
    Tls(Box<tokio_rustls::server::TlsStream<Stream>>),
}

impl Stream {
    /// Whether TLS's ALPN chose HTTP/2 (`h2`).
    pub fn alpn_h2(&self) -> bool {
        match self {
            Stream::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
            _ => false,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Memory(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Memory(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Memory(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
