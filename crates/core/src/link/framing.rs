//! Frames on a TCP stream: a 4-byte big-endian length, then a bincode [`Frame`].

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use ringlimit_proto::peer::{Frame, FrameError, MAX_FRAME_BYTES};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// A framed peer connection.
pub type FramedPeer = Framed<TcpStream, LengthDelimitedCodec>;

/// Wraps a stream; both directions refuse frames over [`MAX_FRAME_BYTES`].
pub fn framed(stream: TcpStream) -> FramedPeer {
    let _ = stream.set_nodelay(true);
    Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME_BYTES)
            .new_codec(),
    )
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
