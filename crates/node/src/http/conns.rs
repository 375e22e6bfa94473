//! The HTTP server's connections, bounded: a request header must arrive in time (slowloris),
//! a keep-alive connection idle for too long is closed, and open connections are capped — at
//! the cap a new connection closes the one idle the longest, or is refused when none is idle.
//!
//! Why by hand: `axum::serve` exposes none of these. hyper has the header-read timeout; the
//! idle timeout and the cap need to know, per connection, when bytes last moved and whether a
//! request is in flight, which only the connection's IO and service see.

pub use crate::config::ConnLimits;
use crate::metrics::ConnStats;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
// tokio's clock: follows a paused test clock; the same `Instant` in a release build.
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One open connection, as the table and its task see it.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    /// Ms since the table's epoch when bytes last moved or a request ended.
    last_active_ms: AtomicU64,
    inflight: AtomicUsize,
    /// Told to close (evicted at the cap).
    close: Notify,
}

impl Conn {
    /// Whether the connection has a request in flight.
    pub fn busy(&self) -> bool {
        self.inflight.load(Ordering::Relaxed) > 0
    }

    /// Resolves when the table evicts this connection.
    pub async fn evicted(&self) {
        self.close.notified().await;
    }
}

/// Every open connection of a node's HTTP server, across its runtimes.
#[derive(Debug)]
pub struct ConnTable {
    limits: ConnLimits,
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Closed by the server for idleness / to make room; refused at the cap; open now.
    pub stats: Arc<ConnStats>,
}

impl ConnTable {
    pub fn new(limits: ConnLimits, stats: Arc<ConnStats>) -> Self {
        Self {
            limits,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            stats,
        }
    }

    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// Open connections now.
    pub fn len(&self) -> usize {
        self.open.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Registers a new connection; at the cap, first evicts the connection idle the longest.
    /// `None`: the cap is reached and every connection is busy (refuse this one).
    pub fn admit(&self) -> Option<Arc<Conn>> {
        let now = self.now_ms();
        let mut open = self.open.lock();
        if open.len() >= self.limits.max_connections {
            // O(open) at the cap only: a scan of 10,000 entries is microseconds, less than
            // accepting the connection costs.
            let oldest = open
                .values()
                .filter(|c| !c.busy())
                .min_by_key(|c| c.last_active_ms.load(Ordering::Relaxed))
                .map(|c| c.id);
            match oldest.and_then(|id| open.remove(&id)) {
                Some(victim) => {
                    victim.close.notify_one();
                    self.stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            last_active_ms: AtomicU64::new(now),
            inflight: AtomicUsize::new(0),
            close: Notify::new(),
        });
        open.insert(conn.id, conn.clone());
        self.stats.open.store(open.len() as u64, Ordering::Relaxed);
        Some(conn)
    }

    /// Forgets a connection that ended.
    pub fn remove(&self, conn: &Conn) {
        let mut open = self.open.lock();
        open.remove(&conn.id);
        self.stats.open.store(open.len() as u64, Ordering::Relaxed);
    }

    /// Marks activity on `conn` now.
    pub fn touch(&self, conn: &Conn) {
        conn.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A request started on `conn`; the guard ends it.
    pub fn start_request(self: &Arc<Self>, conn: &Arc<Conn>) -> RequestGuard {
        conn.inflight.fetch_add(1, Ordering::Relaxed);
        RequestGuard {
            table: self.clone(),
            conn: conn.clone(),
        }
    }

    /// Resolves when `conn` has been idle (no request in flight, no bytes) for the idle
    /// timeout.
    pub async fn idle(&self, conn: &Conn) {
        let limit = self.limits.idle_timeout;
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        loop {
            let since = self
                .now_ms()
                .saturating_sub(conn.last_active_ms.load(Ordering::Relaxed));
            if !conn.busy() && since >= limit_ms {
                self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // Sleep until the earliest moment it could be idle long enough.
            let wait = Duration::from_millis(limit_ms.saturating_sub(since).max(1))
                .min(limit)
                .max(Duration::from_millis(10));
            tokio::time::sleep(wait).await;
        }
    }
}

/// Ends a request on drop (also when the client goes away mid-request).
pub struct RequestGuard {
    table: Arc<ConnTable>,
    conn: Arc<Conn>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.table.touch(&self.conn);
        self.conn.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's byte stream, marking activity whenever bytes move.
pub struct Tracked<T> {
    io: T,
    table: Arc<ConnTable>,
    conn: Arc<Conn>,
}

impl<T> Tracked<T> {
    pub fn new(io: T, table: Arc<ConnTable>, conn: Arc<Conn>) -> Self {
        Self { io, table, conn }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.table.touch(&self.conn);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.table.touch(&self.conn);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.table.touch(&self.conn);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize) -> Arc<ConnTable> {
        Arc::new(ConnTable::new(
            ConnLimits {
                max_connections: max,
                ..ConnLimits::default()
            },
            Arc::default(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let t = table(2);
        let a = t.admit().expect("room");
        let b = t.admit().expect("room");
        // b was active after a: a is the longest idle.
        tokio::time::advance(Duration::from_millis(3)).await;
        t.touch(&b);
        let c = t.admit().expect("a evicted");
        assert_eq!(t.len(), 2);
        assert_eq!(t.stats.evicted.load(Ordering::Relaxed), 1);
        assert_eq!(t.stats.open.load(Ordering::Relaxed), 2);
        tokio::time::timeout(Duration::from_secs(1), a.evicted())
            .await
            .expect("a told to close");
        // Every connection busy: refused.
        let _rb = t.start_request(&b);
        let _rc = t.start_request(&c);
        assert!(t.admit().is_none());
        assert_eq!(t.stats.refused.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_means_no_request_in_flight_for_the_whole_timeout() {
        let t = Arc::new(ConnTable::new(
            ConnLimits {
                idle_timeout: Duration::from_millis(50),
                ..ConnLimits::default()
            },
            Arc::default(),
        ));
        let c = t.admit().expect("room");
        let guard = t.start_request(&c);
        // Busy: never idle, whatever the time.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), t.idle(&c))
                .await
                .is_err()
        );
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), t.idle(&c))
            .await
            .expect("idle after the request");
        assert_eq!(t.stats.closed_idle.load(Ordering::Relaxed), 1);
    }
}
