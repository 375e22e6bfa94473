//! The check endpoints over HTTP/1.1 (`POST /v1/check`, `/v1/check/batch`, `/v1/check/all`),
//! read and answered straight off the connection; the first request of any other shape hands
//! the connection, with the bytes already read, to hyper for the rest of its life.
//!
//! Why by hand: a single check cost well more server CPU than nginx answering the same exchange
//! with a fixed body. The kernel's share was the same in both (one `recvfrom`, one `writev`);
//! ringlimit's own was several times nginx's, spread over hyper's dispatcher, header maps built and
//! hashed for every request, a boxed body, a request future, and some twenty allocations (measured
//! before writing it, `bench/cpu.sh` and `perf`: the docs' benchmarks page, "Server CPU per check,
//! by path"). A check is the narrowest HTTP/1.1 there is — one small body of known length, answered
//! at once — so this loop takes only that shape: `POST` to a check endpoint, HTTP/1.1, one
//! `Content-Length` of at most [`MAX_BODY`], no `Transfer-Encoding`, `Expect`, `Upgrade` or
//! `Connection` other than keep-alive, a head that `httparse` (hyper's parser) reads whole with at
//! most [`MAX_HEADERS`] headers. Everything else (other routes and methods, HTTP/1.0, HTTP/2's
//! preface, chunked bodies, malformed heads and their 400s) is hyper's, unchanged. The answer is
//! the route's own (a single check's written straight from its outcome), written as hyper writes it
//! (same status line, headers in the same order, `content-length`, `date`):
//! `tests/tests/http_wire.rs` holds the two paths to the same bytes.

use super::answer_json;
use super::check;
use super::error::ApiError;
use super::{AppState, MAX_BODY_BYTES};
use crate::listen::conns::{Conn, ConnTable};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes, BytesMut};
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Headers a check's head may have here; more go to hyper (its limit is 100).
const MAX_HEADERS: usize = 32;
/// Longest head read here; a longer one goes to hyper (its limits, its 431).
const MAX_HEAD: usize = 8 * 1024;
/// Longest body read here: the API's limit; longer ones go to hyper (its 413).
const MAX_BODY: usize = MAX_BODY_BYTES;
/// Read buffer grown by this much at a time while waiting for a head: small, since thousands of
/// idle connections each hold one.
const READ_CHUNK: usize = 1024;
/// A body is read in steps of at most this: memory follows the bytes that arrive, not the
/// length a client declares.
const BODY_CHUNK: usize = 64 * 1024;
/// A read buffer grown past this (a large batch) is dropped once its request is answered.
const KEEP_BUFFER: usize = 16 * 1024;

/// The endpoints this loop serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Check,
    Batch,
    All,
}

impl Route {
    fn of(path: &str) -> Option<Self> {
        match path {
            "/v1/check" => Some(Self::Check),
            "/v1/check/batch" => Some(Self::Batch),
            "/v1/check/all" => Some(Self::All),
            _ => None,
        }
    }
}

/// How the loop ended.
pub(super) enum Ended {
    /// The connection is done: closed by the client, failed, timed out, or shutting down.
    Closed,
    /// A request of another shape: serve the rest with hyper, these bytes first.
    HandOver(Bytes),
}

/// What the bytes read so far hold.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A request to `route`: its head is `head` bytes, its body the next `body`.
    Check {
        route: Route,
        head: usize,
        body: usize,
    },
    /// Not a whole head yet.
    Partial,
    /// Anything else: hyper's.
    Other,
}

fn parse(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        // Any head is read whole here before it goes to hyper, even one whose request line
        // already says it is not a check: a slowloris client then costs a few bytes parsed
        // per drip, never hyper's connection state (thousands of slow connections handed to
        // hyper at the same drip held a runtime for many ms: `bench/notes/slow-connections.md`).
        // A real client's head comes whole in one read, so it waits for nothing.
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Head::Partial,
        Ok(httparse::Status::Partial) => return Head::Other,
        Err(_) => return Head::Other,
    };
    let Some(route) = req.path.and_then(Route::of) else {
        return Head::Other;
    };
    if req.method != Some("POST") || req.version != Some(1) {
        return Head::Other;
    }
    let mut length = None;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            match (length, content_length(h.value)) {
                (None, Some(n)) => length = Some(n),
                _ => return Head::Other,
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                return Head::Other;
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Head::Other;
        }
    }
    match length {
        Some(body) if body <= MAX_BODY => Head::Check { route, head, body },
        _ => Head::Other,
    }
}

/// A `Content-Length` value of digits only, at most 7 of them (anything else: hyper's).
fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 7 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0')))
}

/// Serves checks on `io` until the connection ends or a request of another shape comes.
/// `closing` resolves when the connection should close while it waits for a request (idle or
/// header timeout, eviction, shutdown); it is polled after each read, so that the connection
/// table sees what the read brought (see [`ConnTable::expiry`]).
pub(super) async fn serve<I, C>(
    io: &mut I,
    state: &AppState,
    table: &Arc<ConnTable>,
    conn: &Arc<Conn>,
    mut closing: Pin<&mut C>,
    stopping: impl Fn() -> bool,
) -> Ended
where
    I: AsyncRead + AsyncWrite + Unpin,
    C: Future<Output = ()>,
{
    let mut buf = BytesMut::new();
    let (mut out, mut body_out) = (Vec::new(), Vec::new());
    loop {
        // A whole head of a check, or hand over.
        let (route, head, body) = loop {
            match parse(&buf) {
                Head::Check { route, head, body } => break (route, head, body),
                Head::Other => return Ended::HandOver(buf.freeze()),
                Head::Partial => {}
            }
            if buf.capacity() - buf.len() < READ_CHUNK / 2 {
                buf.reserve(READ_CHUNK);
            }
            tokio::select! {
                biased;
                read = io.read_buf(&mut buf) => match read {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(_) => {}
                },
                () = closing.as_mut() => return Ended::Closed,
            }
        };
        let request = table.start_request(conn);
        let end = head + body;
        if buf.len() < end {
            let deadline = tokio::time::Instant::now() + state.body_timeout;
            while buf.len() < end {
                buf.reserve((end - buf.len()).min(BODY_CHUNK));
                match tokio::time::timeout_at(deadline, io.read_buf(&mut buf)).await {
                    Ok(Ok(0) | Err(_)) => return Ended::Closed,
                    Ok(Ok(_)) => {}
                    Err(_) => {
                        let timeout = ApiError::body_timeout(state.body_timeout).into_response();
                        let _ = write(io, &mut out, timeout).await;
                        return Ended::Closed;
                    }
                }
            }
        }
        let bytes = &buf[head..end];
        let written = match route {
            // A single check's answer is written straight from its outcome (no header map, no
            // response body); an error goes through its response.
            Route::Check => {
                let decided = check::decide_with(state, bytes, |o, name| {
                    body_out.clear();
                    answer_json::write_answer_with(
                        &mut body_out,
                        &o.answer,
                        o.shadow_denied,
                        o.blocked,
                    );
                    out.clear();
                    status_line(&mut out, check::answer_status(o));
                    let policy = [check::policy(o, name)];
                    check::answer_headers(&o.answer, policy, |h, v| {
                        header_line(&mut out, h.as_str(), v)
                    });
                    end_head(&mut out, body_out.len());
                    out.extend_from_slice(&body_out);
                })
                .await;
                match decided {
                    Ok(()) => write_out(io, &out).await,
                    Err(e) => write(io, &mut out, e.into_response()).await,
                }
            }
            Route::Batch => write(io, &mut out, check::batch_answer(state, bytes).await).await,
            Route::All => write(io, &mut out, check::all_answer(state, bytes).await).await,
        };
        buf.advance(end);
        if buf.capacity() > KEEP_BUFFER {
            buf = BytesMut::from(&buf[..]);
        }
        if out.capacity() > KEEP_BUFFER {
            out = Vec::new();
        }
        if written.is_err() {
            return Ended::Closed;
        }
        drop(request);
        if stopping() {
            // Shutting down: the request in flight is answered; the connection closes.
            return Ended::Closed;
        }
    }
}

/// Writes `response` on `io` as hyper would; an error if the write fails or the response
/// closes the connection (a 408).
async fn write<I: AsyncWrite + Unpin>(
    io: &mut I,
    out: &mut Vec<u8>,
    response: Response,
) -> io::Result<()> {
    let (parts, body) = response.into_parts();
    // The routes' bodies are whole bytes: collected at once.
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(io::Error::other)?;
    out.clear();
    head_bytes(out, parts.status, &parts.headers, body.len());
    out.extend_from_slice(&body);
    write_out(io, out).await?;
    if parts.headers.contains_key(header::CONNECTION) {
        return Err(io::Error::other("the answer closes the connection"));
    }
    Ok(())
}

/// Writes `bytes` and flushes: over TLS, what the socket did not take at once waits in the
/// session until a flush (over TCP the flush costs nothing).
async fn write_out<I: AsyncWrite + Unpin>(io: &mut I, bytes: &[u8]) -> io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// The status line and headers hyper writes for a response: the headers in order (names as
/// stored, lower case), then `content-length`, then `date`.
fn head_bytes(out: &mut Vec<u8>, status: StatusCode, headers: &header::HeaderMap, len: usize) {
    status_line(out, status);
    for (name, value) in headers {
        if name != header::CONTENT_LENGTH {
            header_line(out, name.as_str(), value.as_bytes());
        }
    }
    end_head(out, len);
}

fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn header_line(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `content-length`, `date` and the blank line.
fn end_head(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    date(out);
    out.extend_from_slice(b"\r\n\r\n");
}

thread_local! {
    /// The `date` value (an HTTP date is 29 bytes) and the second it is for: formatted once a
    /// second per thread, as hyper does.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

fn date(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != second {
            let text = httpdate::fmt_http_date(now);
            if let Some(bytes) = text.as_bytes().get(..29) {
                cached.1.copy_from_slice(bytes);
                cached.0 = second;
            }
        }
        out.extend_from_slice(&cached.1);
    });
}

/// `io` with `prefix` read first: how hyper gets the bytes the loop read before handing over.
pub(super) struct Rewind<T> {
    prefix: Bytes,
    io: T,
}

impl<T> Rewind<T> {
    pub fn new(prefix: Bytes, io: T) -> Self {
        Self { prefix, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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

    const BODY: &str = r#"{"key":"k","limit":10,"period_ms":1000}"#;

    fn check_head(extra: &str) -> String {
        format!(
            "POST /v1/check HTTP/1.1\r\nHost: n\r\nContent-Length: {}\r\n{extra}\r\n",
            BODY.len()
        )
    }

    #[test]
    fn a_plain_check_is_taken_and_its_lengths_known() {
        let head = check_head("Content-Type: application/json\r\nConnection: keep-alive\r\n");
        let all = format!("{head}{BODY}");
        assert_eq!(
            parse(all.as_bytes()),
            Head::Check {
                route: Route::Check,
                head: head.len(),
                body: BODY.len()
            }
        );
        let batch = head.replace("/v1/check", "/v1/check/batch");
        assert!(matches!(
            parse(batch.as_bytes()),
            Head::Check {
                route: Route::Batch,
                ..
            }
        ));
        let all = head.replace("/v1/check", "/v1/check/all");
        assert!(matches!(
            parse(all.as_bytes()),
            Head::Check {
                route: Route::All,
                ..
            }
        ));
        // Case does not matter in header names.
        let lower = check_head("content-type: application/json\r\n")
            .replace("Content-Length", "content-LENGTH");
        assert!(matches!(parse(lower.as_bytes()), Head::Check { .. }));
    }

    #[test]
    fn any_other_shape_goes_to_hyper() {
        let other = [
            "GET /v1/check HTTP/1.1\r\nHost: n\r\n\r\n".to_owned(),
            "POST /v1/check/batches HTTP/1.1\r\nContent-Length: 2\r\n\r\n".to_owned(),
            "POST /v1/forward-auth HTTP/1.1\r\nContent-Length: 2\r\n\r\n".to_owned(),
            "POST /v1/check?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n".to_owned(),
            "POST /v1/check HTTP/1.0\r\nContent-Length: 2\r\n\r\n".to_owned(),
            "POST /v1/check HTTP/1.1\r\nHost: n\r\n\r\n".to_owned(),
            check_head("Connection: close\r\n"),
            check_head("Transfer-Encoding: chunked\r\n"),
            check_head("Expect: 100-continue\r\n"),
            check_head("Upgrade: h2c\r\n"),
            check_head("Content-Length: 40\r\n"),
            "POST /v1/check HTTP/1.1\r\nContent-Length: +4\r\n\r\n".to_owned(),
            "POST /v1/check HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n".to_owned(),
            "POST /v1/check HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n".to_owned(),
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned(),
            "POST /v1/check HTTP/1.1\r\nBad Header: x\r\n\r\n".to_owned(),
        ];
        for o in &other {
            assert_eq!(parse(o.as_bytes()), Head::Other, "{o:?}");
        }
        let many: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(parse(check_head(&many).as_bytes()), Head::Other);
    }

    #[test]
    fn a_partial_head_is_read_whole_before_anything_is_decided() {
        let partial: [&[u8]; 6] = [
            b"",
            b"POST /v1/che",
            b"POST /v1/check HTTP/1.1\r\nHost: n\r\n",
            b"GET /metr",
            b"POST /v1/cluster HTTP/1.1\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-a: b\r\n",
        ];
        for p in partial {
            assert_eq!(parse(p), Head::Partial, "{:?}", String::from_utf8_lossy(p));
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"), Head::Other);
        let long = format!("POST /v1/check HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        assert_eq!(parse(long.as_bytes()), Head::Other);
    }

    #[test]
    fn the_head_is_written_as_hyper_writes_it() {
        let mut headers = header::HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            "application/json".parse().expect("value"),
        );
        headers.insert("x-ratelimit-limit", "10".parse().expect("value"));
        let mut out = Vec::new();
        head_bytes(&mut out, StatusCode::TOO_MANY_REQUESTS, &headers, 42);
        let text = String::from_utf8(out).expect("ascii");
        let (before_date, date) = text.split_once("date: ").expect("a date");
        assert_eq!(
            before_date,
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nx-ratelimit-limit: 10\r\ncontent-length: 42\r\n"
        );
        assert!(date.ends_with(" GMT\r\n\r\n"), "{date:?}");
        assert_eq!(date.len(), 29 + 4);
    }

    #[tokio::test]
    async fn rewind_reads_the_prefix_first() {
        let mut r = Rewind::new(Bytes::from_static(b"abc"), &b"def"[..]);
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.expect("read");
        assert_eq!(all, b"abcdef");
    }
}
