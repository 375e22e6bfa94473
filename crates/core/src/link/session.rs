//! Peer connections of their own, beside the pipelined checks of [`super::client`]: a request
//! answered by one frame (a handover, a reset), or frames written one way (global counts).
//! Opened on first use, authenticated like every peer connection, every wait bounded.

use super::client::{Connection, PeerSettings, connect};
use super::framing::{self, LinkError};
use bytes::Bytes;
use futures::SinkExt;
use parking_lot::Mutex;
use ringlimit_proto::peer::Frame;
use std::collections::HashMap;
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

/// Connections of their own kept open between requests, a few per peer, for requests made
/// one at a time by many callers at once (reservations): each request takes an idle session
/// (or opens one) and puts it back once answered, so a request costs no handshake.
#[derive(Debug)]
pub struct SessionPool {
    sessions: Sessions,
    idle: Mutex<HashMap<String, Vec<Session>>>,
    /// Idle sessions kept per peer; more are closed once answered.
    per_peer: usize,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("addr", &self.addr)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// A pooled request's answer.
#[derive(Debug)]
pub enum Pooled {
    /// The peer's answer.
    Answer(Frame),
    /// The peer speaks a version older than the request needs: nothing was sent.
    Older(u16),
}

impl SessionPool {
    pub fn new(sessions: Sessions, per_peer: usize) -> Self {
        Self {
            sessions,
            idle: Mutex::new(HashMap::new()),
            per_peer,
        }
    }

    /// Sends `frame` to the peer at `addr` when it speaks version `since` or later, and waits
    /// at most `within` for its answer. With `retry`, a request that failed on an idle
    /// session (the peer may have closed it meanwhile) is sent once more on a new one: only
    /// for requests whose repetition is harmless.
    pub async fn request(
        &self,
        addr: &str,
        frame: &Frame,
        within: Duration,
        since: u16,
        retry: bool,
    ) -> Result<Pooled, SessionError> {
        let idle = self.idle.lock().get_mut(addr).and_then(Vec::pop);
        let reused = idle.is_some();
        let session = idle.unwrap_or_else(|| self.sessions.open(addr));
        match self.exchange(session, frame, within, since).await {
            Err(_) if reused && retry => {
                let fresh = self.sessions.open(addr);
                self.exchange(fresh, frame, within, since).await
            }
            other => other,
        }
    }

    async fn exchange(
        &self,
        mut session: Session,
        frame: &Frame,
        within: Duration,
        since: u16,
    ) -> Result<Pooled, SessionError> {
        let version = session.version().await?;
        if version < since {
            self.put(session);
            return Ok(Pooled::Older(version));
        }
        let answer = session.request(frame, within).await?;
        self.put(session);
        Ok(Pooled::Answer(answer))
    }

    fn put(&self, session: Session) {
        let mut idle = self.idle.lock();
        let kept = idle.entry(session.addr.clone()).or_default();
        if kept.len() < self.per_peer {
            kept.push(session);
        }
    }

    /// Closes the idle sessions of peers not in `keep` (members that left).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.idle.lock().retain(|addr, _| keep(addr));
    }
}
