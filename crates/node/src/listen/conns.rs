//! A server's connections, bounded: a request header must arrive in time (slowloris; HTTP/1),
//! a connection idle for too long is closed, and open connections are capped — at the cap a
//! new connection closes the ones idle the longest, or is refused when none is idle. The HTTP
//! port counts any bytes moved as activity ([`Tracked`]); the gRPC port only calls (gRPC's
//! `MAX_CONNECTION_IDLE`: a client that only pings is idle).
//!
//! Why by hand: `axum::serve` and tonic's server expose none of these, and hyper's header-read
//! timeout does not fit: it starts whenever hyper waits for a request head, so it also closed
//! every keep-alive connection idle for the header timeout (5 s), long before the idle timeout
//! (60 s), and it allocated and armed a timer for every request. Here the header clock starts
//! at the first byte of a request head, and each connection has one timer of its own
//! ([`Expiry`]). Both timeouts and the cap need to know, per connection, when bytes last moved,
//! whether a head has begun and whether a request is in flight, which only the connection's IO
//! and service see.

pub use crate::config::ConnLimits;
use crate::metrics::ConnStats;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
// tokio's clock: follows a paused test clock; the same `Instant` in a release build.
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// `Conn::head_since_ms` when no request head has begun.
const NO_HEAD: u64 = u64::MAX;
/// At the cap, the longest-idle `1 / EVICT_SHARE` of the cap is closed at once.
const EVICT_SHARE: usize = 100;

/// One open connection, as the table and its task see it.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    /// Ms since the table's epoch when bytes last moved or a request ended.
    last_active_ms: AtomicU64,
    /// Ms since the table's epoch when the first byte of a request head not yet started
    /// arrived ([`NO_HEAD`]: none since the last request started).
    head_since_ms: AtomicU64,
    /// HTTP/2 (prior knowledge, or TLS's ALPN): frames, not request heads, so no header clock.
    h2: AtomicBool,
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

/// Every open connection of one of a node's servers (HTTP or gRPC), across its runtimes.
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

    /// Registers a new connection; at the cap, first evicts the connections idle the longest
    /// (a hundredth of the cap at once, see [`EVICT_SHARE`]). `None`: the cap is reached and
    /// every connection is busy (refuse this one).
    pub fn admit(&self) -> Option<Arc<Conn>> {
        let now = self.now_ms();
        let mut open = self.open.lock();
        if open.len() >= self.limits.max_connections {
            // O(open) at the cap only, and once per batch: a flood that reconnects every
            // connection it loses keeps the table at the cap, and a scan of every entry for
            // each new connection (the lock held meanwhile) cost a large share of a core
            // (`bench/slowconns.sh`; the docs' benchmarks page, "Slow and idle connections").
            let batch = (self.limits.max_connections / EVICT_SHARE).max(1);
            let mut idle: Vec<(u64, u64)> = open
                .values()
                .filter(|c| !c.busy())
                .map(|c| (c.last_active_ms.load(Ordering::Relaxed), c.id))
                .collect();
            if idle.is_empty() {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let batch = batch.min(idle.len());
            if batch < idle.len() {
                idle.select_nth_unstable(batch - 1);
            }
            for &(_, id) in &idle[..batch] {
                if let Some(victim) = open.remove(&id) {
                    victim.close.notify_one();
                    self.stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            last_active_ms: AtomicU64::new(now),
            head_since_ms: AtomicU64::new(NO_HEAD),
            h2: AtomicBool::new(false),
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

    /// `conn` speaks HTTP/2 (TLS's ALPN said so): frames, not request heads, so no header clock.
    pub fn set_h2(&self, conn: &Conn) {
        conn.h2.store(true, Ordering::Relaxed);
        conn.head_since_ms.store(NO_HEAD, Ordering::Relaxed);
    }

    /// Marks activity on `conn` now.
    pub fn touch(&self, conn: &Conn) {
        conn.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Bytes arrived on `conn`: activity, and the start of a request head if none has begun
    /// and no request is in flight (bytes read during a request may be the next pipelined
    /// head; its clock then starts with the next bytes after, or the idle timeout applies).
    fn received(&self, conn: &Conn) {
        let now = self.now_ms();
        conn.last_active_ms.store(now, Ordering::Relaxed);
        if !conn.busy()
            && conn.head_since_ms.load(Ordering::Relaxed) == NO_HEAD
            && !conn.h2.load(Ordering::Relaxed)
        {
            conn.head_since_ms.store(now, Ordering::Relaxed);
        }
    }

    /// A request started on `conn` (its head is complete); the guard ends it.
    pub fn start_request(self: &Arc<Self>, conn: &Arc<Conn>) -> RequestGuard {
        conn.head_since_ms.store(NO_HEAD, Ordering::Relaxed);
        conn.inflight.fetch_add(1, Ordering::Relaxed);
        RequestGuard {
            table: self.clone(),
            conn: conn.clone(),
        }
    }

    /// Resolves when `conn` is to be closed: idle (no request in flight, no bytes) for the
    /// idle timeout, or a request head begun and not complete within the header timeout.
    /// Poll it after the connection in the same task (`select!` with `biased;`): each poll
    /// sees the state the connection left, so a head that began in that poll arms the header
    /// timer at once.
    pub fn expiry(self: &Arc<Self>, conn: &Arc<Conn>) -> Expiry {
        Expiry {
            table: self.clone(),
            conn: conn.clone(),
            sleep: Box::pin(tokio::time::sleep_until(self.epoch)),
            armed_ms: 0,
        }
    }

    /// The moment `conn` should close if nothing changes, in ms since the epoch, and why;
    /// `None` while a request is in flight. Each timeout is stretched by up to an eighth,
    /// differently for each connection ([`spread`]).
    fn deadline(&self, conn: &Conn) -> Option<(u64, Expired)> {
        if conn.busy() {
            return None;
        }
        let idle = conn
            .last_active_ms
            .load(Ordering::Relaxed)
            .saturating_add(spread(conn.id, self.limits.idle_timeout));
        let head = conn.head_since_ms.load(Ordering::Relaxed);
        if head != NO_HEAD {
            let header = head.saturating_add(spread(conn.id, self.limits.header_timeout));
            if header <= idle {
                return Some((header, Expired::HeaderTimeout));
            }
        }
        Some((idle, Expired::Idle))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `timeout` in ms, plus up to an eighth of it chosen by the connection's id.
///
/// Why: connections opened together (a slowloris flood opens thousands at once, and reopens
/// each one it loses) would otherwise time out in the same millisecond, and closing thousands
/// of connections at once — then accepting their replacements — holds every other connection
/// of the runtime for tens of ms (measured: `bench/slowconns.sh` with `OPEN_RATE`, in
/// `bench/notes/slow-connections.md`). Spread over an eighth of the timeout, the closes come a
/// few per ms.
fn spread(id: u64, timeout: Duration) -> u64 {
    let ms = millis(timeout);
    // Fibonacci hashing: consecutive ids land far apart in [0, ms / 8].
    let slot = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ms.saturating_add(slot % (ms / 8 + 1))
}

/// Why a connection's [`Expiry`] ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    Idle,
    HeaderTimeout,
}

/// A connection's timer for both timeouts: see [`ConnTable::expiry`]. Armed at the earliest
/// deadline seen; a deadline that moved later (every request moves the idle one) is not
/// re-armed until the timer fires, so a busy connection costs no timer work per request.
pub struct Expiry {
    table: Arc<ConnTable>,
    conn: Arc<Conn>,
    sleep: Pin<Box<Sleep>>,
    /// The deadline the timer is set for (ms since the epoch); 0 before the first poll.
    armed_ms: u64,
}

impl Expiry {
    fn arm(&mut self, at_ms: u64) {
        self.armed_ms = at_ms;
        let at = self.table.epoch + Duration::from_millis(at_ms.min(u64::MAX / 4));
        self.sleep.as_mut().reset(at);
    }
}

impl Future for Expiry {
    type Output = Expired;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        loop {
            let now_or_later = match self.table.deadline(&self.conn) {
                Some((at, why)) => {
                    if self.armed_ms == 0 || at < self.armed_ms {
                        self.arm(at);
                    }
                    Some((at, why))
                }
                None => None,
            };
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer fired: close if the deadline is really here, else re-arm for the
            // current one (or, with a request in flight, look again an idle timeout later).
            let now = self.table.now_ms();
            match now_or_later {
                Some((at, why)) if at <= now => {
                    let stat = match why {
                        Expired::Idle => &self.table.stats.closed_idle,
                        Expired::HeaderTimeout => &self.table.stats.closed_header_timeout,
                    };
                    stat.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(why);
                }
                Some((at, _)) => self.arm(at),
                None => {
                    let later = now.saturating_add(millis(self.table.limits.idle_timeout));
                    self.arm(later);
                }
            }
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
    /// The connection's first bytes, up to 4, and how many: `PRI ` starts HTTP/2's preface,
    /// never an HTTP/1 request.
    first: [u8; 4],
    sniffed: usize,
}

impl<T> Tracked<T> {
    pub fn new(io: T, table: Arc<ConnTable>, conn: Arc<Conn>) -> Self {
        Self {
            io,
            table,
            conn,
            first: [0; 4],
            sniffed: 0,
        }
    }

    /// Looks at the first bytes the connection receives for HTTP/2's preface.
    fn sniff(&mut self, received: &[u8]) {
        let n = received.len().min(4 - self.sniffed);
        self.first[self.sniffed..self.sniffed + n].copy_from_slice(&received[..n]);
        self.sniffed += n;
        if self.sniffed == 4 && self.first == *b"PRI " {
            self.conn.h2.store(true, Ordering::Relaxed);
            self.conn.head_since_ms.store(NO_HEAD, Ordering::Relaxed);
        }
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
            if self.sniffed < 4 {
                self.sniff(&buf.filled()[before..]);
            }
            self.table.received(&self.conn);
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
    async fn at_the_cap_a_hundredth_of_it_is_evicted_at_once_longest_idle_first() {
        let t = table(300);
        let conns: Vec<_> = (0..300).map(|_| t.admit().expect("room")).collect();
        // Every connection active after the first five, in order; one of those five is busy.
        tokio::time::advance(Duration::from_millis(10)).await;
        for c in &conns[5..] {
            t.touch(c);
        }
        let _busy = t.start_request(&conns[1]);
        t.admit().expect("room made");
        assert_eq!(t.stats.evicted.load(Ordering::Relaxed), 3);
        assert_eq!(t.len(), 298);
        for i in [0, 2, 3] {
            tokio::time::timeout(Duration::from_secs(1), conns[i].evicted())
                .await
                .expect("evicted");
        }
        // Room for two more without another scan.
        t.admit().expect("room");
        t.admit().expect("room");
        assert_eq!(t.stats.evicted.load(Ordering::Relaxed), 3);
        t.admit().expect("room made");
        assert_eq!(t.stats.evicted.load(Ordering::Relaxed), 6);
    }

    fn timed(header_ms: u64, idle_ms: u64) -> Arc<ConnTable> {
        Arc::new(ConnTable::new(
            ConnLimits {
                header_timeout: Duration::from_millis(header_ms),
                idle_timeout: Duration::from_millis(idle_ms),
                ..ConnLimits::default()
            },
            Arc::default(),
        ))
    }

    /// Polls `expiry` for up to `ms`: what it gave, if it ended.
    async fn within(expiry: &mut Pin<Box<Expiry>>, ms: u64) -> Option<Expired> {
        tokio::time::timeout(Duration::from_millis(ms), expiry.as_mut())
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_header_clock_starts_at_a_heads_first_byte_not_while_idle() {
        // The regression: a keep-alive connection waiting for its next request was closed
        // after the header timeout (hyper's), not the idle timeout.
        let t = timed(100, 1_000);
        let c = t.admit().expect("room");
        let mut expiry = Box::pin(t.expiry(&c));
        let mut io = Tracked::new(&b"POST /v1/check HTTP/1.1\r\n"[..], t.clone(), c.clone());
        let mut buf = [0u8; 64];
        // A whole request came and went.
        tokio::io::AsyncReadExt::read(&mut io, &mut buf[..5])
            .await
            .expect("read");
        drop(t.start_request(&c));
        // Idle well past the header timeout: still open.
        assert_eq!(within(&mut expiry, 500).await, None);
        // The next head begins and stalls: closed a header timeout after its first byte.
        tokio::io::AsyncReadExt::read(&mut io, &mut buf[..5])
            .await
            .expect("read");
        assert_eq!(within(&mut expiry, 99).await, None);
        assert_eq!(within(&mut expiry, 2).await, Some(Expired::HeaderTimeout));
        assert_eq!(t.stats.closed_header_timeout.load(Ordering::Relaxed), 1);
        assert_eq!(t.stats.closed_idle.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_completed_in_time_stops_the_header_clock() {
        let t = timed(100, 1_000);
        let c = t.admit().expect("room");
        let mut expiry = Box::pin(t.expiry(&c));
        let mut io = Tracked::new(&b"POST /v1/check"[..], t.clone(), c.clone());
        let mut buf = [0u8; 4];
        tokio::io::AsyncReadExt::read(&mut io, &mut buf)
            .await
            .expect("read");
        assert_eq!(within(&mut expiry, 50).await, None);
        // The head completes: its request runs for longer than the header timeout.
        let request = t.start_request(&c);
        assert_eq!(within(&mut expiry, 5_000).await, None);
        drop(request);
        // Then idle: closed for idleness, an idle timeout after the request ended.
        assert_eq!(within(&mut expiry, 999).await, None);
        assert_eq!(within(&mut expiry, 2).await, Some(Expired::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn http2_connections_have_no_header_clock() {
        let t = timed(100, 1_000);
        let c = t.admit().expect("room");
        let mut expiry = Box::pin(t.expiry(&c));
        // The preface arrives in two reads: the clock starts at the first, stops once known.
        let mut io = Tracked::new(
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            t.clone(),
            c.clone(),
        );
        let mut buf = [0u8; 64];
        tokio::io::AsyncReadExt::read(&mut io, &mut buf[..2])
            .await
            .expect("read");
        tokio::io::AsyncReadExt::read(&mut io, &mut buf[2..])
            .await
            .expect("read");
        assert_eq!(within(&mut expiry, 999).await, None);
        assert_eq!(within(&mut expiry, 2).await, Some(Expired::Idle));
    }

    #[test]
    fn timeouts_are_spread_over_an_eighth_of_their_length() {
        let t = Duration::from_millis(8_000);
        let deadlines: Vec<u64> = (0..1_000).map(|id| spread(id, t)).collect();
        assert!(deadlines.iter().all(|d| (8_000..=9_000).contains(d)));
        // Spread out: every tenth of the range gets some.
        for tenth in 0..10 {
            let (lo, hi) = (8_000 + tenth * 100, 8_000 + (tenth + 1) * 100);
            let n = deadlines.iter().filter(|d| (lo..hi).contains(*d)).count();
            assert!((50..=150).contains(&n), "{n} in {lo}..{hi}");
        }
        assert_eq!(spread(0, t), 8_000);
        assert_eq!(spread(7, Duration::ZERO), 0);
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
        let mut expiry = Box::pin(t.expiry(&c));
        let guard = t.start_request(&c);
        // Busy: never idle, whatever the time.
        assert_eq!(within(&mut expiry, 200).await, None);
        drop(guard);
        assert_eq!(within(&mut expiry, 5_000).await, Some(Expired::Idle));
        assert_eq!(t.stats.closed_idle.load(Ordering::Relaxed), 1);
    }
}
