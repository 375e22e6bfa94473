//! Places for peer connections still in their handshake, counted apart from those logged in:
//! silent sockets used to hold every connection slot for the handshake timeout, so that real
//! peers with the secret were refused (the docs' benchmarks page, "Hardening findings").

use std::sync::Arc;

/// Most connections in their handshake at once.
const MAX_HANDSHAKING: usize = 256;
/// Most connections in their handshake from one source address.
const MAX_HANDSHAKING_PER_SOURCE: usize = 16;

/// Connections in their handshake: how many per source address, oldest first.
#[derive(Debug, Default)]
pub struct Logins {
    inner: parking_lot::Mutex<LoginsInner>,
}

#[derive(Debug, Default)]
pub struct LoginsInner {
    by_source: std::collections::HashMap<String, usize>,
    /// (id, its eviction signal), oldest first.
    waiting: std::collections::VecDeque<(u64, Arc<tokio::sync::Notify>)>,
    next_id: u64,
}

/// One connection's place among [`Logins`], given back when dropped.
pub struct Login {
    logins: Arc<Logins>,
    source: String,
    id: u64,
    evict: Arc<tokio::sync::Notify>,
}

impl Logins {
    /// A place for a connection from `from` (`ip:port`), or `None` when its source already has
    /// [`MAX_HANDSHAKING_PER_SOURCE`]. At [`MAX_HANDSHAKING`] in all, the connection waiting
    /// longest is told to go: a flood from many sources then only shortens every handshake's
    /// time to finish to what the flood's rate leaves (256 places last 25 ms at 10,000 sockets
    /// a second, against the few ms a real peer's handshake takes).
    pub fn enter(self: &Arc<Self>, from: &str) -> Option<Login> {
        // The source is the address without its port (a flood uses many ports).
        let source = match from.parse::<std::net::SocketAddr>() {
            Ok(a) => a.ip().to_string(),
            Err(_) => from.to_owned(),
        };
        let mut inner = self.inner.lock();
        let here = inner.by_source.get(&source).copied().unwrap_or(0);
        if here >= MAX_HANDSHAKING_PER_SOURCE {
            return None;
        }
        if inner.waiting.len() >= MAX_HANDSHAKING
            && let Some((_, oldest)) = inner.waiting.pop_front()
        {
            oldest.notify_one();
        }
        inner.by_source.insert(source.clone(), here + 1);
        inner.next_id += 1;
        let (id, evict) = (inner.next_id, Arc::new(tokio::sync::Notify::new()));
        inner.waiting.push_back((id, evict.clone()));
        Some(Login {
            logins: self.clone(),
            source,
            id,
            evict,
        })
    }
}

impl Login {
    /// Resolves when this connection must give its place to a newer one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        let mut inner = self.logins.inner.lock();
        if let Some(n) = inner.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                inner.by_source.remove(&self.source);
            }
        }
        let id = self.id;
        inner.waiting.retain(|(i, _)| *i != id);
    }
}
