//! The HTTP server's connection limits on a real node: a client that never finishes its
//! header is closed, an idle keep-alive connection is closed, and at the connection cap idle
//! connections make room for a real client (and a flood of slow ones cannot lock it out).

use anyhow::{Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::config::ConnLimits;
use ringlimit_tests::{TestNode, WAIT, metric, read_responses, read_until_closed};
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn node(limits: ConnLimits) -> Result<TestNode> {
    let mut config = NodeConfig::local("http-limits");
    config.http_limits = limits;
    TestNode::start(config).await
}

const CHECK: &str = r#"{"key":"k","limit":10,"period_ms":60000}"#;

fn request(keep_alive: bool) -> String {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{CHECK}",
        CHECK.len(),
        if keep_alive { "keep-alive" } else { "close" }
    )
}

#[tokio::test]
async fn a_header_that_never_ends_is_closed_and_an_idle_connection_too() -> Result<()> {
    let n = node(ConnLimits {
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        max_connections: 100,
        ..ConnLimits::default()
    })
    .await?;
    // Half a header, then nothing (slowloris).
    let mut slow = TcpStream::connect(n.http).await?;
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nHost: n\r\n")
        .await?;
    read_until_closed(&mut slow).await?;
    // A keep-alive connection: answered, then closed once idle.
    let mut idle = TcpStream::connect(n.http).await?;
    idle.write_all(request(true).as_bytes()).await?;
    let answer = read_until_closed(&mut idle).await?;
    let text = String::from_utf8_lossy(&answer);
    ensure!(text.starts_with("HTTP/1.1 200"), "{text}");
    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(n.http).await?;
    read_until_closed(&mut silent).await?;
    // The node answers as before.
    let r = n
        .check(&json!({ "key": "after", "limit": 1, "period_ms": 1000 }))
        .await?;
    assert_eq!(r.status, 200);
    n.stop().await
}

/// Writes `req` on `s` and reads one answer's head and body (up to its Content-Length).
async fn exchange(s: &mut TcpStream, req: &str) -> Result<String> {
    s.write_all(req.as_bytes()).await?;
    Ok(read_responses(s, 1).await?.remove(0))
}

#[tokio::test]
async fn a_keep_alive_connection_waits_for_the_idle_timeout_not_the_header_timeout() -> Result<()> {
    // The regression: hyper's header-read timer ran while a keep-alive connection waited for
    // its next request, so such connections closed after 5 s instead of the idle timeout's 60.
    let n = node(ConnLimits {
        header_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(30),
        max_connections: 100,
        ..ConnLimits::default()
    })
    .await?;
    let mut s = TcpStream::connect(n.http).await?;
    let first = exchange(&mut s, &request(true)).await?;
    ensure!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Two header timeouts (each at most an eighth longer) without a byte. A sleep is the
    // thing: the connection must outlive that timer while it waits for its next request.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = exchange(&mut s, &request(true)).await?;
    ensure!(second.starts_with("HTTP/1.1 200"), "{second}");
    // A head that begins and stalls is still closed, timed from its first byte.
    s.write_all(b"POST /v1/check HTTP/1.1\r\n").await?;
    read_until_closed(&mut s).await?;
    let metrics = n.get("/metrics").await?.text;
    ensure!(
        metrics.contains("ringlimit_http_connections_closed_total{reason=\"header_timeout\"} 1"),
        "{metrics}"
    );
    n.stop().await
}

#[tokio::test]
async fn a_body_that_stalls_is_answered_408_and_its_connection_closed() -> Result<()> {
    // Before the body timeout, a complete header and half a body held the connection busy
    // for ever: never idle, never evicted at the cap.
    let n = node(ConnLimits {
        body_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(30),
        ..ConnLimits::default()
    })
    .await?;
    let mut s = TcpStream::connect(n.http).await?;
    s.write_all(
        format!(
            "POST /v1/check HTTP/1.1\r\nHost: n\r\nContent-Length: {}\r\n\r\n{}",
            CHECK.len(),
            &CHECK[..10]
        )
        .as_bytes(),
    )
    .await?;
    let answer = read_until_closed(&mut s).await?;
    let text = String::from_utf8_lossy(&answer);
    ensure!(text.starts_with("HTTP/1.1 408"), "{text}");
    ensure!(text.contains("connection: close"), "{text}");
    ensure!(text.contains("\"error\":\"request_timeout\""), "{text}");
    // The bucket was not touched: the key's first check still sees the whole limit.
    let r = n.check(&serde_json::from_str(CHECK)?).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()?["remaining"], 9);
    n.stop().await
}

#[tokio::test]
async fn an_http2_connection_has_no_header_clock() -> Result<()> {
    let n = node(ConnLimits {
        header_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(30),
        max_connections: 100,
        ..ConnLimits::default()
    })
    .await?;
    let tcp = TcpStream::connect(n.http).await?;
    let (client, connection) = h2::client::handshake(tcp).await?;
    let driver = tokio::spawn(connection);
    // Connected (preface and settings sent), then quiet for two header timeouts (each at most
    // an eighth longer). A sleep is the thing: no header clock may close it meanwhile.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut client = client.ready().await?;
    let request = http::Request::post("/v1/check")
        .header("content-type", "application/json")
        .body(())?;
    let (response, mut body) = client.send_request(request, false)?;
    body.send_data(bytes::Bytes::from_static(CHECK.as_bytes()), true)?;
    let response = tokio::time::timeout(WAIT, response).await??;
    ensure!(response.status() == 200, "{response:?}");
    driver.abort();
    n.stop().await
}

#[tokio::test]
async fn at_the_cap_idle_connections_make_room_for_real_clients() -> Result<()> {
    let n = node(ConnLimits {
        header_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 20,
        ..ConnLimits::default()
    })
    .await?;
    // 200 connections that send half a header and then nothing: ten times the cap.
    let mut flood = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(n.http).await?;
        s.write_all(b"GET /v1/cluster HTTP/1.1\r\n").await?;
        flood.push(s);
    }
    // Real clients keep getting answers.
    for i in 0..20 {
        let mut s = TcpStream::connect(n.http).await?;
        s.write_all(request(false).as_bytes()).await?;
        let answer = read_until_closed(&mut s).await?;
        let text = String::from_utf8_lossy(&answer);
        // Answered (the check's own limit of 10 denies the later ones).
        ensure!(
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.1 429"),
            "request {i}: {text:?}"
        );
    }
    // At most the cap stays open: the others were closed to make room.
    let mut open = 0;
    for s in &mut flood {
        let mut b = [0u8; 1];
        // Nothing to read within the wait: still open (a closed one reads EOF or a reset).
        if tokio::time::timeout(Duration::from_millis(20), s.read(&mut b))
            .await
            .is_err()
        {
            open += 1;
        }
    }
    ensure!(
        open <= 20,
        "{open} slow connections still open, over the cap of 20"
    );
    // What the server did is in its metrics.
    let metrics = n.get("/metrics").await?.text;
    let value = |series: &str| metric(&metrics, series);
    ensure!(
        value("ringlimit_http_connections_closed_total{reason=\"evicted\"} ") >= 180.0,
        "{metrics}"
    );
    let gauge = value("ringlimit_http_connections ");
    ensure!((1.0..=20.0).contains(&gauge), "open connections {gauge}");
    n.stop().await
}
