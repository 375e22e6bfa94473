//! The gRPC port's connection limits on a real node: a connection without a call in flight is
//! sent GOAWAY and closed after the idle timeout (pings do not count as use), a call whose
//! request never completes is answered DEADLINE_EXCEEDED at the request timeout, at the cap the
//! longest-idle connection makes room, and a real client (Python grpcio) rides through an idle
//! close without a failed call. The raw client is the `h2` crate, so that each frame is ours to
//! choose.

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use ringlimit_node::NodeConfig;
use ringlimit_node::config::ConnLimits;
use ringlimit_tests::{TestNode, WAIT, metric, python_with, read_until_closed, run_client_script};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

async fn node(idle_ms: u64, request_ms: u64, max_connections: usize) -> Result<TestNode> {
    let mut config = NodeConfig::local("grpc-limits");
    config.grpc_addr = Some("127.0.0.1:0".parse()?);
    config.grpc_limits = ConnLimits::grpc(
        Duration::from_millis(idle_ms),
        Duration::from_millis(request_ms),
        max_connections,
    );
    TestNode::start(config).await
}

/// An HTTP/2 connection to the node's gRPC port: its handle, its ping handle, and the task
/// driving it (which ends when the server closes the connection).
struct Client {
    send: h2::client::SendRequest<Bytes>,
    ping: Option<h2::PingPong>,
    driver: JoinHandle<Result<(), h2::Error>>,
}

async fn connect(n: &TestNode) -> Result<Client> {
    let tcp = TcpStream::connect(n.grpc.context("gRPC address")?).await?;
    let (send, mut connection) = h2::client::handshake(tcp).await?;
    let ping = connection.ping_pong();
    let driver = tokio::spawn(connection);
    Ok(Client { send, ping, driver })
}

/// Starts `grpc.health.v1.Health/Check` and sends `message` (a length-prefixed gRPC message,
/// whole or not), ending the request only if `end`.
async fn start_health_check(
    c: &mut Client,
    message: &'static [u8],
    end: bool,
) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
    let request = http::Request::post("/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let mut ready = c.send.clone().ready().await?;
    let (response, mut body) = ready.send_request(request, false)?;
    body.send_data(Bytes::from_static(message), end)?;
    Ok((response, body))
}

/// An empty `HealthCheckRequest` (the whole server), framed.
const HEALTH_REQUEST: &[u8] = &[0, 0, 0, 0, 0];

/// The call's gRPC status: from the trailers, or from the headers of a trailers-only answer.
async fn grpc_status(response: h2::client::ResponseFuture) -> Result<String> {
    let response = tokio::time::timeout(WAIT, response).await??;
    ensure!(response.status() == 200, "{response:?}");
    if let Some(s) = response.headers().get("grpc-status") {
        return Ok(s.to_str()?.to_owned());
    }
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await? {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = tokio::time::timeout(WAIT, body.trailers())
        .await??
        .context("no trailers")?;
    Ok(trailers
        .get("grpc-status")
        .context("no grpc-status")?
        .to_str()?
        .to_owned())
}

/// Waits for the server to close `c`'s connection; how long that took.
async fn closed_by_server(c: Client) -> Result<Duration> {
    let start = Instant::now();
    let ended = tokio::time::timeout(WAIT, c.driver)
        .await
        .context("the server never closed the connection")??;
    // GOAWAY then close: a clean end, not a protocol error.
    ended.context("the connection ended in an error")?;
    Ok(start.elapsed())
}

#[tokio::test]
async fn an_idle_grpc_connection_is_sent_goaway_and_pings_do_not_keep_it() -> Result<()> {
    let n = node(300, 10_000, 100).await?;
    let mut c = connect(&n).await?;
    let (response, _body) = start_health_check(&mut c, HEALTH_REQUEST, true).await?;
    ensure!(grpc_status(response).await? == "0");
    // The call ended; from now on the connection only pings, every 50 ms.
    let mut ping = c.ping.take().context("ping handle")?;
    let pinger = tokio::spawn(async move {
        let mut pongs = 0u32;
        while ping.ping(h2::Ping::opaque()).await.is_ok() {
            pongs += 1;
            // A sleep is the thing: pings at a steady pace, which must not keep it open.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pongs
    });
    let took = closed_by_server(c).await?;
    // The idle timeout, stretched by at most an eighth, plus scheduling.
    ensure!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    let pongs = tokio::time::timeout(WAIT, pinger).await??;
    ensure!(
        pongs >= 3,
        "the server answered {pongs} pings before closing"
    );
    let metrics = n.get("/metrics").await?.text;
    ensure!(
        metric(
            &metrics,
            "ringlimit_grpc_connections_closed_total{reason=\"idle\"} "
        ) >= 1.0,
        "{metrics}"
    );
    n.stop().await
}

#[tokio::test]
async fn a_call_that_never_completes_is_cut_at_the_request_timeout_not_the_idle_one() -> Result<()>
{
    // The idle timeout is shorter than the request timeout: a call in flight is not idle.
    let n = node(200, 600, 100).await?;
    let mut c = connect(&n).await?;
    let start = Instant::now();
    // A message announced as 5 bytes, none of which ever comes.
    let (response, _body) = start_health_check(&mut c, &[0, 0, 0, 0, 5], false).await?;
    let status = grpc_status(response).await?;
    let took = start.elapsed();
    ensure!(status == "4", "DEADLINE_EXCEEDED expected, got {status}");
    ensure!(
        took >= Duration::from_millis(550) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );
    // The connection is still there for the next call.
    let (response, _body) = start_health_check(&mut c, HEALTH_REQUEST, true).await?;
    ensure!(grpc_status(response).await? == "0");
    let metrics = n.get("/metrics").await?.text;
    ensure!(
        metric(&metrics, "ringlimit_grpc_requests_timed_out_total ") == 1.0,
        "{metrics}"
    );
    n.stop().await
}

#[tokio::test]
async fn at_the_grpc_cap_the_longest_idle_connection_makes_room() -> Result<()> {
    let n = node(30_000, 10_000, 3).await?;
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut c = connect(&n).await?;
        let (response, _body) = start_health_check(&mut c, HEALTH_REQUEST, true).await?;
        ensure!(grpc_status(response).await? == "0");
        idle.push(c);
    }
    // The first is now the longest idle: a fourth connection closes it and is served.
    let mut fourth = connect(&n).await?;
    let (response, _body) = start_health_check(&mut fourth, HEALTH_REQUEST, true).await?;
    ensure!(grpc_status(response).await? == "0");
    let first = idle.remove(0);
    closed_by_server(first).await?;
    for c in &idle {
        ensure!(
            !c.driver.is_finished(),
            "a more recent connection was closed"
        );
    }
    let metrics = n.get("/metrics").await?.text;
    ensure!(
        metric(
            &metrics,
            "ringlimit_grpc_connections_closed_total{reason=\"evicted\"} "
        ) == 1.0,
        "{metrics}"
    );
    ensure!(
        metric(&metrics, "ringlimit_grpc_connections ") == 3.0,
        "{metrics}"
    );
    n.stop().await
}

/// grpcio keeps one channel: calls before and after the server closed it for idleness all
/// succeed (the GOAWAY tells the client to reconnect rather than fail a call).
#[tokio::test]
async fn a_grpcio_channel_rides_through_idle_closes() -> Result<()> {
    let Some(python) = python_with("grpc") else {
        eprintln!("no Python with grpcio (made by .ci/run): skipping");
        return Ok(());
    };
    let n = node(200, 10_000, 100).await?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/idle_client.py");
    let addr = n.grpc.context("gRPC address")?.to_string();
    let calls =
        run_client_script(python, vec![script.into(), addr, "6".into(), "0.5".into()]).await?;
    ensure!(calls.0.len() == 6, "{:?}", calls.0);
    for call in &calls.0 {
        ensure!(call["status"] == "SERVING", "{call}");
    }
    let metrics = n.get("/metrics").await?.text;
    ensure!(
        metric(
            &metrics,
            "ringlimit_grpc_connections_closed_total{reason=\"idle\"} "
        ) >= 3.0,
        "the calls were not spread over idle closes: {metrics}"
    );
    n.stop().await
}

/// A client that never answers the GOAWAY's PING (nor closes) loses its connection about a
/// second after the idle close began, not after the request timeout: closed connections are no
/// longer counted against the cap, so they must not linger.
#[tokio::test]
async fn a_client_deaf_to_goaway_is_dropped_soon_after() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let n = node(200, 20_000, 100).await?;
    let mut s = TcpStream::connect(n.grpc.context("gRPC address")?).await?;
    // The client preface and an empty SETTINGS frame; then nothing, ever (no SETTINGS ack, no
    // PING ack), though what the server sends is read.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await?;
    let start = Instant::now();
    read_until_closed(&mut s).await?;
    let took = start.elapsed();
    // Idle 200 ms (+ up to an eighth), then at most a second's grace.
    ensure!(
        took >= Duration::from_millis(1_150) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );
    n.stop().await
}
