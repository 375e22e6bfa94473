//! Peer connections of their own, beside the pipelined checks of [`super::client`]: a request
//! answered by one frame (a handover, a reset), or frames written one way (global counts).
//! Opened on first use, authenticated like every peer connection, every wait bounded.

use super::client::{Connection, PeerSettings, connect};
use super::framing::{self, LinkError};
use bytes::Bytes;
use futures::SinkExt;
use ringlimit_proto::peer::Frame;
use std::sync::Arc;
use std::time::Duration;

/// Why a session's exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("{0}")]
    Connect(String),
    #[error("write timed out")]
    WriteTimeout,
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("refused: {0}")]
    Refused(String),
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
}

/// Opens [`Session`]s with one node's settings (cheap to clone).
#[derive(Debug, Clone)]
pub struct Sessions {
    settings: Arc<PeerSettings>,
}

impl Sessions {
    pub fn new(settings: Arc<PeerSettings>) -> Self {
        Self { settings }
    }

    /// How the sessions dial.
    pub fn settings(&self) -> &PeerSettings {
        &self.settings
    }

    /// A session with the peer at `addr`, not connected yet.
    pub fn open(&self, addr: &str) -> Session {
        Session {
            addr: addr.to_owned(),
            settings: self.settings.clone(),
            conn: None,
        }
    }
}

/// One connection of its own to one peer, made on first use and again after [`Session::close`].
pub struct Session {
    addr: String,
    settings: Arc<PeerSettings>,
    conn: Option<Connection>,
}

impl Session {
    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn connected(&mut self) -> Result<&mut Connection, SessionError> {
        let conn = match self.conn.take() {
            Some(c) => c,
            None => tokio::time::timeout(
                self.settings.connect_timeout,
                connect(&self.addr, &self.settings),
            )
            .await
            .map_err(|_| SessionError::ConnectTimeout)?
            .map_err(SessionError::Connect)?,
        };
        Ok(self.conn.insert(conn))
    }

    /// The protocol version the handshake agreed with the peer (connecting first if needed).
    pub async fn version(&mut self) -> Result<u16, SessionError> {
        Ok(self.connected().await?.version)
    }

    /// Sends `frame` and waits at most `within` for the answer (a `Refused` is an error).
    pub async fn request(
        &mut self,
        frame: &Frame,
        within: Duration,
    ) -> Result<Frame, SessionError> {
        self.exchange(frame, within).await.map(|(answer, _)| answer)
    }

    /// [`Session::request`], and the size `frame` took on the wire.
    pub async fn exchange(
        &mut self,
        frame: &Frame,
        within: Duration,
    ) -> Result<(Frame, usize), SessionError> {
        let conn = &mut self.connected().await?.framed;
        let size = framing::send(conn, frame).await?;
        match framing::recv(conn, within).await? {
            Frame::Refused { reason } => Err(SessionError::Refused(reason)),
            answer => Ok((answer, size)),
        }
    }

    /// Writes encoded frames one way, each within `within` (a stalled peer is given up); calls
    /// `written` with each frame's size on the wire.
    pub async fn write(
        &mut self,
        frames: &[Bytes],
        within: Duration,
        mut written: impl FnMut(usize),
    ) -> Result<(), SessionError> {
        let conn = &mut self.connected().await?.framed;
        for f in frames {
            tokio::time::timeout(within, conn.send(f.clone()))
                .await
                .map_err(|_| SessionError::WriteTimeout)?
                .map_err(LinkError::from)?;
            written(f.len() + 4);
        }
        Ok(())
    }

    /// Drops the connection: the next exchange makes a new one.
    pub fn close(&mut self) {
        self.conn = None;
    }
}
