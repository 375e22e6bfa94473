//! Frames on a byte stream: a 4-byte big-endian length, then a bincode [`Frame`].

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use ringlimit_proto::peer::{Frame, FrameError, MAX_FRAME_BYTES};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// Any byte stream a peer link can run over (TCP, or an in-memory pipe in tests).
pub trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> PeerIo for T {}

/// A peer stream, boxed: one type for every transport (a virtual call per read or write is
/// nothing beside the system call under it).
pub type BoxedIo = Box<dyn PeerIo>;

/// A framed peer connection.
pub type FramedPeer = Framed<BoxedIo, LengthDelimitedCodec>;

/// Wraps a stream; both directions refuse frames over [`MAX_FRAME_BYTES`].
pub fn framed(io: impl PeerIo) -> FramedPeer {
    Framed::new(
        Box::new(io) as BoxedIo,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME_BYTES)
            .new_codec(),
    )
}

/// Wraps an accepted TCP stream, with Nagle off (frames are small and latency is the point).
pub fn framed_tcp(stream: TcpStream) -> FramedPeer {
    let _ = stream.set_nodelay(true);
    framed(stream)
}

/// Why a frame could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("connection closed")]
    Closed,
    #[error("timed out")]
    Timeout,
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Sends one frame.
pub async fn send(conn: &mut FramedPeer, frame: &Frame) -> Result<(), LinkError> {
    conn.send(Bytes::from(frame.encode()?)).await?;
    Ok(())
}

/// Receives one frame within `within`.
pub async fn recv(conn: &mut FramedPeer, within: Duration) -> Result<Frame, LinkError> {
    match tokio::time::timeout(within, conn.next()).await {
        Err(_) => Err(LinkError::Timeout),
        Ok(None) => Err(LinkError::Closed),
        Ok(Some(bytes)) => Ok(Frame::decode(&bytes?)?),
    }
}
