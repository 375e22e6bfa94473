//! Frames on a byte stream: a 4-byte big-endian length, then a bincode [`Frame`] — and, once
//! the handshake has set a session key ([`PeerCodec::seal`]), the frame's MAC after it.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use ringlimit_proto::auth::{FRAME_TAG_LEN, FrameMac, Role, SessionKey};
use ringlimit_proto::peer::{Frame, FrameError, MAX_FRAME_BYTES};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder, Framed, LengthDelimitedCodec};

/// Any byte stream a peer link can run over (TCP, or an in-memory pipe in tests).
pub trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> PeerIo for T {}

/// A peer stream, boxed: one type for every transport (a virtual call per read or write is
/// nothing beside the system call under it).
pub type BoxedIo = Box<dyn PeerIo>;

/// A framed peer connection.
pub type FramedPeer = Framed<BoxedIo, PeerCodec>;

/// Length-delimited frames, sealed with a MAC each once [`PeerCodec::seal`] is called (after a
/// handshake with a secret). An incoming frame whose MAC does not verify is an error that ends
/// the connection: nothing an on-path attacker injects, changes or replays is ever decoded.
#[derive(Debug)]
pub struct PeerCodec {
    lengths: LengthDelimitedCodec,
    mac: Option<FrameMac>,
}

impl PeerCodec {
    /// Seals every frame from now on, both ways, under `key`, as the `role` end.
    pub fn seal(&mut self, key: &SessionKey, role: Role) {
        self.mac = Some(FrameMac::new(key, role));
    }

    /// Whether frames are sealed.
    pub fn sealed(&self) -> bool {
        self.mac.is_some()
    }
}

impl Decoder for PeerCodec {
    type Item = BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, std::io::Error> {
        let Some(mut frame) = self.lengths.decode(src)? else {
            return Ok(None);
        };
        if let Some(mac) = &mut self.mac {
            let Some(at) = frame.len().checked_sub(FRAME_TAG_LEN) else {
                return Err(bad_mac());
            };
            let tag = frame.split_off(at);
            if !mac.open(&frame, &tag) {
                return Err(bad_mac());
            }
        }
        Ok(Some(frame))
    }
}

impl Encoder<Bytes> for PeerCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        let Some(mac) = &mut self.mac else {
            return self.lengths.encode(item, dst);
        };
        if item.len() > MAX_FRAME_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "frame over the size limit",
            ));
        }
        let tag = mac.seal(&item);
        let len = u32::try_from(item.len() + FRAME_TAG_LEN).map_err(std::io::Error::other)?;
        dst.reserve(4 + item.len() + FRAME_TAG_LEN);
        dst.put_u32(len);
        dst.extend_from_slice(&item);
        dst.extend_from_slice(&tag);
        Ok(())
    }
}

fn bad_mac() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "frame MAC does not verify (injected, altered or replayed)",
    )
}

/// Wraps a stream; both directions refuse frames over [`MAX_FRAME_BYTES`] (plus a sealed
/// frame's tag).
pub fn framed(io: impl PeerIo) -> FramedPeer {
    Framed::new(
        Box::new(io) as BoxedIo,
        PeerCodec {
            lengths: LengthDelimitedCodec::builder()
                .max_frame_length(MAX_FRAME_BYTES + FRAME_TAG_LEN)
                .new_codec(),
            mac: None,
        },
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

/// Sends one frame; returns its size on the wire (with its length prefix).
pub async fn send(conn: &mut FramedPeer, frame: &Frame) -> Result<usize, LinkError> {
    let bytes = frame.encode()?;
    let size = bytes.len() + 4;
    conn.send(Bytes::from(bytes)).await?;
    Ok(size)
}

/// Receives one frame within `within`.
pub async fn recv(conn: &mut FramedPeer, within: Duration) -> Result<Frame, LinkError> {
    match tokio::time::timeout(within, conn.next()).await {
        Err(_) => Err(LinkError::Timeout),
        Ok(None) => Err(LinkError::Closed),
        Ok(Some(bytes)) => Ok(Frame::decode(&bytes?)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_proto::auth::session_key;
    use tokio::io::AsyncWriteExt;

    fn ping(id: u64) -> Frame {
        Frame::ResetAck { removed: id }
    }

    /// Two sealed ends over a pipe, and the raw bytes an attacker on the path would write.
    #[tokio::test]
    async fn sealed_frames_pass_and_injected_or_altered_ones_end_the_connection() {
        let key = session_key(b"secret", &[1; 16], &[2; 16], "ringlimit");
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (framed(a), framed(b));
        client.codec_mut().seal(&key, Role::Client);
        server.codec_mut().seal(&key, Role::Server);
        for id in 0..3 {
            send(&mut client, &ping(id)).await.expect("send");
            let got = recv(&mut server, Duration::from_secs(1))
                .await
                .expect("recv");
            assert_eq!(got, ping(id));
            send(&mut server, &ping(id + 100)).await.expect("send");
            let got = recv(&mut client, Duration::from_secs(1))
                .await
                .expect("recv");
            assert_eq!(got, ping(id + 100));
        }

        // An unsealed frame written into the stream (what an injector without the key can do).
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut server = framed(b);
        server.codec_mut().seal(&key, Role::Server);
        let mut raw = a;
        let body = ping(7).encode().expect("encode");
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend(&body);
        raw.write_all(&bytes).await.expect("write");
        assert!(matches!(
            recv(&mut server, Duration::from_secs(1)).await,
            Err(LinkError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData
        ));

        // A sealed frame with one byte changed, and a sealed frame replayed.
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut server = framed(b);
        server.codec_mut().seal(&key, Role::Server);
        let mut mac = FrameMac::new(&key, Role::Client);
        let tag = mac.seal(&body);
        let mut sealed = ((body.len() + FRAME_TAG_LEN) as u32).to_be_bytes().to_vec();
        sealed.extend(&body);
        sealed.extend(tag);
        let mut raw = a;
        raw.write_all(&sealed).await.expect("write");
        assert_eq!(
            recv(&mut server, Duration::from_secs(1))
                .await
                .expect("first"),
            ping(7)
        );
        raw.write_all(&sealed).await.expect("replay");
        assert!(recv(&mut server, Duration::from_secs(1)).await.is_err());

        let (a, b) = tokio::io::duplex(1 << 16);
        let mut server = framed(b);
        server.codec_mut().seal(&key, Role::Server);
        let mut altered = sealed.clone();
        altered[5] ^= 1;
        let mut raw = a;
        raw.write_all(&altered).await.expect("write");
        assert!(recv(&mut server, Duration::from_secs(1)).await.is_err());
    }
}
