//! TLS on real nodes (in this process): HTTPS checks over HTTP/1.1 keep-alive and HTTP/2 (by
//! ALPN), gRPC over TLS, the certificate replaced under load (the new one served within a
//! bounded wait, no check failed), mutual TLS on the peer port in 3-node clusters with and
//! without the cluster secret, a node whose certificate another CA signed refused there, and
//! the SDK over HTTPS discovery and mutual TLS, tower layer included. Certificates come from a
//! CA made at test time (`ringlimit_tests::tls`).

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use ringlimit_client::layer::key;
use ringlimit_client::{Check, Client, InlineRule, RateLimitLayer};
use ringlimit_core::link::{PeerSettings, client::connect as peer_connect, dial};
use ringlimit_core::tls::{CertFiles, PeerTls, PeerTlsFiles};
use ringlimit_node::NodeConfig;
use ringlimit_node::grpc::ringlimit_v1::pb;
use ringlimit_node::grpc::ringlimit_v1::pb::rate_limiter_client::RateLimiterClient;
use ringlimit_proto::Algorithm;
use ringlimit_tests::tls::{CertDir, Leaf, TestCa, client_config, connect, presented};
use ringlimit_tests::{
    Api, ProcessNode, ProcessSpec, Progress, TestCluster, TestNode, WAIT, free_peer_port, inline,
    metric, series, wait_until,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A CA and the files it signed, in a directory of their own.
struct Pki {
    ca: TestCa,
    ca_path: std::path::PathBuf,
    dir: CertDir,
}

impl Pki {
    fn new(what: &str) -> Result<Self> {
        let ca = TestCa::new(&format!("ringlimit test CA ({what})"))?;
        let dir = CertDir::new(what)?;
        let ca_path = dir.ca("ca.crt", &ca)?;
        Ok(Self { ca, ca_path, dir })
    }

    /// A certificate written as `{name}.crt`/`.key`.
    fn leaf(&self, name: &str, serial: u64) -> Result<(Leaf, CertFiles)> {
        let leaf = self.ca.issue(name, serial)?;
        let files = self.dir.leaf(name, &leaf)?;
        Ok((leaf, files))
    }

    /// A peer's files under this CA.
    fn peer(&self, name: &str, serial: u64) -> Result<PeerTlsFiles> {
        let leaf = self.ca.issue(name, serial)?;
        self.dir.peer(&self.ca_path, name, &leaf)
    }

    fn https(&self) -> impl Fn(SocketAddr) -> Result<Api> + '_ {
        |addr| Api::https(addr, &self.ca.pem)
    }
}

/// The forwarding deadline of the TLS clusters here. Right after a cluster forms, every node
/// opens its links at once (checks, global counts, replicas, and the recall link an owner's
/// first check waits for); a mutual TLS handshake costs ~3 ms of CPU a side in a debug build
/// (ringlimit-core's TLS test; ~1 ms in release), and on 2 shared cores the first forwarded
/// checks waited past the default 25 ms and failed open (2 runs of 3; never without TLS).
const DEBUG_BUILD_DEADLINE: Duration = Duration::from_millis(500);

const CHECK: &str = r#"{"key":"tls","limit":5,"period_ms":60000}"#;

/// One `POST /v1/check` of `body` over HTTP/1.1 on `io` (kept alive): status and body.
async fn h1_check<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    body: &str,
) -> Result<(u16, String)> {
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    io.write_all(request.as_bytes()).await?;
    io.flush().await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse().ok())
                    .context("no content-length")?;
                if got.len() >= end + 4 + len {
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .context("no status")?;
                    let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).into_owned();
                    return Ok((status, body));
                }
            }
            let n = io.read(&mut buf).await?;
            ensure!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .context("no answer in time")?
}

/// `remaining` of a check answer's JSON body.
fn remaining(body: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(body)?;
    v["remaining"].as_u64().context("no remaining")
}

/// One check over HTTP/2 on `send`: status and body.
async fn h2_check(send: &mut h2::client::SendRequest<Bytes>, body: &str) -> Result<(u16, String)> {
    let request = http::Request::post("https://localhost/v1/check")
        .header("content-type", "application/json")
        .body(())?;
    let mut ready = send.clone().ready().await?;
    let (response, mut stream) = ready.send_request(request, false)?;
    stream.send_data(Bytes::copy_from_slice(body.as_bytes()), true)?;
    let response = tokio::time::timeout(WAIT, response).await??;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    *send = ready;
    Ok((status, String::from_utf8(text)?))
}

#[tokio::test]
async fn https_checks_over_http1_keep_alive_and_h2_and_grpc_over_tls() -> Result<()> {
    let pki = Pki::new("tls-edges")?;
    let (leaf, files) = pki.leaf("node", 7)?;
    let mut config = NodeConfig::local("tls-edges");
    config.tls = Some(files);
    config.grpc_addr = "127.0.0.1:0".parse().ok();
    let node = TestNode::start_with_api(config, pki.https()).await?;

    // reqwest (hyper's client) over HTTPS.
    let r = node.check(&inline("reqwest", 5, 60_000)).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()?["remaining"], 4);

    // HTTP/1.1 by ALPN, three checks on one kept-alive connection (the check loop's path).
    let mut h1 = connect(node.http, client_config(&pki.ca.pem, &[b"http/1.1"])?).await?;
    assert_eq!(
        ringlimit_tests::tls::alpn(&h1).as_deref(),
        Some(&b"http/1.1"[..])
    );
    assert_eq!(presented(&h1)?, leaf.der()?, "the configured certificate");
    for want in [4, 3, 2] {
        let (status, body) = h1_check(&mut h1, CHECK).await?;
        assert_eq!((status, remaining(&body)?), (200, want), "{body}");
    }

    // HTTP/2 by ALPN: two checks on one connection, the same bucket.
    let tls = connect(
        node.http,
        client_config(&pki.ca.pem, &[b"h2", b"http/1.1"])?,
    )
    .await?;
    assert_eq!(
        ringlimit_tests::tls::alpn(&tls).as_deref(),
        Some(&b"h2"[..])
    );
    let (mut send, connection) = h2::client::handshake(tls).await?;
    let driver = tokio::spawn(connection);
    for want in [1, 0] {
        let (status, body) = h2_check(&mut send, CHECK).await?;
        assert_eq!((status, remaining(&body)?), (200, want), "{body}");
    }
    let (status, _) = h2_check(&mut send, CHECK).await?;
    assert_eq!(status, 429, "the same bucket, denied");
    driver.abort();

    // Plain HTTP on the TLS port: no answer, the connection closed; counted.
    let mut plain = tokio::net::TcpStream::connect(node.http).await?;
    let sent = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{CHECK}",
        CHECK.len()
    );
    plain.write_all(sent.as_bytes()).await?;
    let answer = ringlimit_tests::read_until_closed(&mut plain).await?;
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"),
        "{answer:?}"
    );
    wait_until("the failed handshake counted", WAIT, || async {
        let text = node.get("/metrics").await?.text;
        Ok(metric(
            &text,
            "ringlimit_tls_handshake_failures_total{server=\"http\"} ",
        ) >= 1.0)
    })
    .await?;

    // gRPC over TLS (tonic's client, ALPN h2): a check and the health service.
    let addr = node.grpc.context("a gRPC address")?;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca.pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await?;
    let answer = RateLimiterClient::new(channel.clone())
        .check(pb::CheckRequest {
            key: "grpc-tls".into(),
            rule_spec: Some(pb::check_request::RuleSpec::Inline(pb::InlineRule {
                limit: 3,
                period_ms: 60_000,
                algorithm: 0,
                burst: None,
                ..Default::default()
            })),
            cost: None,
            hold: false,
        })
        .await?
        .into_inner();
    assert!(answer.allowed);
    assert_eq!(answer.remaining, 2);
    let health = HealthClient::new(channel);
    wait_until("SERVING over TLS", WAIT, || {
        let mut health = health.clone();
        async move {
            let r = health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await?
                .into_inner();
            Ok(r.status == ServingStatus::Serving as i32)
        }
    })
    .await?;
    // And plain gRPC (h2c) is refused.
    let plain = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await;
    if let Ok(plain) = plain {
        let r = HealthClient::new(plain)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        assert!(r.is_err(), "plaintext gRPC answered: {r:?}");
    }
    node.stop().await
}

#[tokio::test]
async fn a_handshake_never_finished_is_closed_at_the_header_timeout_and_gives_way_at_the_cap()
-> Result<()> {
    let pki = Pki::new("tls-bounds")?;
    let (_, files) = pki.leaf("node", 11)?;
    let mut config = NodeConfig::local("tls-bounds");
    config.tls = Some(files);
    config.http_limits.header_timeout = Duration::from_millis(300);
    config.http_limits.max_connections = 2;
    let node = TestNode::start_with_api(config, pki.https()).await?;
    // Two connections that never send a ClientHello fill the table.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(node.http).await?);
    }
    // A sleep for the accept loop to take both: nothing can be asked meanwhile, since any
    // request (a scrape) would be the connection that makes one of them give way.
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A real client still gets in: one still in its handshake is closed to make room.
    let mut tls = connect(node.http, client_config(&pki.ca.pem, &[b"http/1.1"])?).await?;
    assert_eq!(h1_check(&mut tls, CHECK).await?.0, 200);
    drop(tls);
    // And the silent ones are gone within the header timeout (plus its eighth of spread).
    let since = Instant::now();
    for mut s in silent {
        let got = ringlimit_tests::read_until_closed(&mut s).await?;
        assert!(got.is_empty(), "{got:?}");
    }
    assert!(
        since.elapsed() < Duration::from_secs(2),
        "{:?}",
        since.elapsed()
    );
    let text = node.get("/metrics").await?.text;
    assert!(
        metric(
            &text,
            "ringlimit_tls_handshake_failures_total{server=\"http\"} "
        ) >= 2.0,
        "{text}"
    );
    node.stop().await
}

/// One check on a new connection: the certificate the server presented, or why it failed.
async fn check_on_a_new_connection(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<rustls::pki_types::CertificateDer<'static>> {
    let mut tls = connect(addr, config).await?;
    let served = presented(&tls)?;
    let (status, body) = h1_check(
        &mut tls,
        r#"{"key":"load","limit":1000000,"period_ms":1000}"#,
    )
    .await?;
    ensure!(status == 200, "{status} {body}");
    Ok(served)
}

#[tokio::test]
async fn a_replaced_certificate_is_served_within_a_bounded_wait_and_no_check_fails() -> Result<()> {
    let pki = Pki::new("tls-rotation")?;
    let (first, files) = pki.leaf("http", 1)?;
    let second = pki.ca.issue("http-next", 2)?;
    let mut config = NodeConfig::local("tls-rotation");
    config.tls = Some(files.clone());
    config.rules_poll = Duration::from_millis(50);
    let node = TestNode::start_with_api(config, pki.https()).await?;
    let client = client_config(&pki.ca.pem, &[b"http/1.1"])?;

    // A connection opened before the rotation keeps working through it.
    let mut kept = connect(node.http, client.clone()).await?;
    assert_eq!(presented(&kept)?, first.der()?);
    assert_eq!(h1_check(&mut kept, CHECK).await?.0, 200);

    // Load: one check per new connection, until told to stop; 20 before the rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::default();
    let load = {
        let (stop, client, addr) = (stop.clone(), client.clone(), node.http);
        let progress = progress.clone();
        tokio::spawn(async move {
            let (mut served, mut failed) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match check_on_a_new_connection(addr, client.clone()).await {
                    Ok(der) => served.push(der),
                    Err(e) => failed.push(e.to_string()),
                }
                progress.add();
            }
            (served, failed)
        })
    };
    progress.wait_more(20, WAIT).await?;

    // The certificate rewritten first, its key not yet: refused, the first one stays.
    std::fs::write(&files.cert, &second.cert)?;
    wait_until("the half-written pair refused", WAIT, || async {
        let text = node.get("/metrics").await?.text;
        Ok(metric(&text, "ringlimit_tls_reload_total{result=\"error\"} ") >= 1.0)
    })
    .await?;
    let probe = connect(node.http, client.clone()).await?;
    assert_eq!(presented(&probe)?, first.der()?, "the previous pair stays");
    // Then the key: the new certificate, within a bounded wait.
    std::fs::write(&files.key, &second.key)?;
    let since = Instant::now();
    wait_until(
        "the new certificate served",
        Duration::from_secs(5),
        || async {
            let tls = connect(node.http, client.clone()).await?;
            Ok(presented(&tls)? == second.der()?)
        },
    )
    .await?;
    let took = since.elapsed();
    eprintln!("new certificate served {took:?} after its key was written (polled every 50 ms)");
    // 20 more checks, on connections made after the new pair was served.
    progress.wait_more(20, WAIT).await?;
    stop.store(true, Ordering::Relaxed);
    let (served, failed) = load.await?;
    assert!(
        failed.is_empty(),
        "checks failed during the rotation: {failed:?}"
    );
    let (a, b) = (first.der()?, second.der()?);
    let (on_first, on_second) = (
        served.iter().filter(|d| **d == a).count(),
        served.iter().filter(|d| **d == b).count(),
    );
    assert!(
        on_first > 0 && on_second > 0,
        "{on_first} checks under the first, {on_second} under the second"
    );
    assert_eq!(on_first + on_second, served.len());
    // The kept connection still has its session.
    assert_eq!(h1_check(&mut kept, CHECK).await?.0, 200);
    let text = node.get("/metrics").await?.text;
    assert!(
        metric(&text, "ringlimit_tls_reload_total{result=\"ok\"} ") >= 1.0,
        "{text}"
    );
    node.stop().await
}

/// Checks through `via` of keys owned across the cluster: every one answered by its owner
/// (none degraded), some forwarded; then one key's limit is exact through two nodes.
async fn forwards_exactly(cluster: &TestCluster) -> Result<()> {
    for i in 0..30 {
        let r = cluster[0]
            .check(&inline(&format!("fwd:{i}"), 100, 60_000))
            .await?;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json()?["degraded"], false, "{}", r.text);
    }
    let view = cluster[0].cluster().await?;
    assert!(
        view.forwarding("forwarded") > 0,
        "{:?}",
        view.0["forwarding"]
    );
    assert_eq!(
        view.forwarding("fail_open"),
        0,
        "{:?}",
        view.0["forwarding"]
    );
    let mut allowed = 0;
    for i in 0..6 {
        let r = cluster[1 + i % 2]
            .check(&inline("exact", 3, 60_000))
            .await?;
        assert_eq!(r.json()?["degraded"], false, "{}", r.text);
        allowed += usize::from(r.status == 200);
    }
    assert_eq!(allowed, 3, "exact through two nodes");
    Ok(())
}

#[tokio::test]
async fn three_nodes_forward_over_mutual_tls_with_and_without_the_secret() -> Result<()> {
    let _one_at_a_time = ringlimit_tests::exclusive().await;
    for secret in [None, Some("tls-and-hmac")] {
        let pki = Pki::new("tls-cluster")?;
        let files: Vec<PeerTlsFiles> = (0..3)
            .map(|i| pki.peer(&format!("node-{i}"), 100 + i))
            .collect::<Result<_>>()?;
        let mut next = files.into_iter();
        let cluster = TestCluster::start_with(3, |c| {
            c.peer_tls = next.next();
            c.cluster_secret = secret.map(str::to_owned);
            c.forward_timeout = DEBUG_BUILD_DEADLINE;
        })
        .await?;
        forwards_exactly(&cluster)
            .await
            .with_context(|| format!("secret: {secret:?}"))?;
        cluster.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn the_peer_port_refuses_another_cas_certificate_and_plain_connections() -> Result<()> {
    let _one_at_a_time = ringlimit_tests::exclusive().await;
    let pki = Pki::new("tls-refused")?;
    let stranger = TestCa::new("another CA")?;
    // node-1's certificate is the stranger's (it trusts the cluster CA, so only node-0's
    // refusal keeps it out).
    let outsider = pki
        .dir
        .peer(&pki.ca_path, "outsider", &stranger.issue("node-1", 9)?)?;
    let mut files = vec![pki.peer("node-0", 1)?, outsider.clone()].into_iter();
    let cluster = TestCluster::start_with(2, |c| {
        c.peer_tls = files.next();
        c.replicas = 0;
    })
    .await?;
    let members = cluster.ids();
    let owned_by_0: Vec<String> = (0..200)
        .map(|i| format!("k{i}"))
        .filter(|k| {
            ringlimit_tests::owner_of(
                &members.iter().map(String::as_str).collect::<Vec<_>>(),
                k,
                100,
                60_000,
            )
            .is_ok_and(|o| o == "node-0")
        })
        .take(5)
        .collect();
    ensure!(!owned_by_0.is_empty(), "no key owned by node-0");
    for key in &owned_by_0 {
        let r = cluster[1].check(&inline(key, 100, 60_000)).await?;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(
            r.json()?["degraded"],
            true,
            "node-0 never answers node-1: {}",
            r.text
        );
    }
    wait_until("node-0 counts the refusals", WAIT, || async {
        let text = cluster[0].get("/metrics").await?.text;
        Ok(metric(&text, "ringlimit_peer_connections_refused_total ") >= 1.0)
    })
    .await?;

    // The same by hand, against node-0's peer port: the link's own client.
    let settings = |dialer| PeerSettings {
        dialer,
        node_id: "probe".into(),
        cluster_id: "ringlimit".into(),
        secret: None,
        client_token: None,
        deadline: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        open_for: Duration::from_secs(1),
        queue: 16,
    };
    let addr = cluster[0].peer.to_string();
    let member = PeerTls::load(&pki.peer("member", 2)?)?;
    let agreed = peer_connect(&addr, &settings(member.dialer(dial::tcp()))).await;
    assert!(
        agreed.is_ok(),
        "a certificate of the cluster CA: {:?}",
        agreed.err()
    );
    let foreign = PeerTls::load(&outsider)?;
    let refused = peer_connect(&addr, &settings(foreign.dialer(dial::tcp()))).await;
    assert!(refused.is_err(), "another CA's certificate got in");
    let plain = peer_connect(&addr, &settings(dial::tcp())).await;
    assert!(plain.is_err(), "a connection without TLS got in");
    cluster.stop().await
}

#[tokio::test]
async fn the_sdk_discovers_over_https_and_checks_owners_over_mutual_tls() -> Result<()> {
    let _one_at_a_time = ringlimit_tests::exclusive().await;
    let pki = Pki::new("tls-sdk")?;
    let (_, http_files) = pki.leaf("http", 50)?;
    let peers: Vec<PeerTlsFiles> = (0..3)
        .map(|i| pki.peer(&format!("node-{i}"), 60 + i))
        .collect::<Result<_>>()?;
    let mut next = peers.into_iter();
    let cluster = TestCluster::start_with_api(
        3,
        |c| {
            c.tls = Some(http_files.clone());
            c.peer_tls = next.next();
            c.forward_timeout = DEBUG_BUILD_DEADLINE;
        },
        pki.https(),
    )
    .await?;
    let sdk = pki.peer("sdk", 70)?;
    let seeds = [format!("https://{}", cluster[0].http)];
    let client = Client::builder()
        .seeds(seeds.clone())
        .http_tls_ca(&pki.ca_path)
        .peer_tls(&sdk.ca, &sdk.cert, &sdk.key)
        .deadline(DEBUG_BUILD_DEADLINE)
        .build()
        .await?;
    wait_until("the SDK sees three members over HTTPS", WAIT, || async {
        Ok(client.refresh().await && client.members().len() == 3)
    })
    .await?;
    for i in 0..30 {
        let a = client
            .check(&Check::inline(
                format!("sdk:{i}"),
                100,
                Duration::from_secs(60),
            ))
            .await?;
        assert!(a.allowed && !a.degraded, "{a:?}");
    }
    let stats = client.stats();
    assert_eq!((stats.direct, stats.degraded), (30, 0), "{stats:?}");

    // The tower layer, through the same client.
    let rule = InlineRule {
        limit: 2,
        period_ms: 60_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "hello\n" }))
        .layer(RateLimitLayer::inline(
            client.clone(),
            rule,
            key::header("x-api-key"),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = Api::new(listener.local_addr()?)?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = reqwest::Client::new()
            .get(api.url("/hello"))
            .header("x-api-key", "alice")
            .send()
            .await?;
        statuses.push(r.status().as_u16());
    }
    server.abort();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(client.stats().degraded, 0);

    // A client without the certificate: discovery works, owners refuse it, checks degrade.
    let plain = Client::builder()
        .seeds(seeds)
        .http_tls_ca(&pki.ca_path)
        .deadline(Duration::from_millis(200))
        .build()
        .await?;
    let a = plain
        .check(&Check::inline("plain", 100, Duration::from_secs(60)))
        .await?;
    assert!(a.degraded, "{a:?}");
    assert_eq!(plain.stats().direct, 0);
    cluster.stop().await
}

#[tokio::test]
async fn the_sdk_refuses_https_seeds_without_a_ca_and_names_a_bad_certificate_file() -> Result<()> {
    let e = Client::builder()
        .seeds(["https://127.0.0.1:1"])
        .build()
        .await
        .expect_err("no CA");
    assert!(e.to_string().contains("http_tls_ca"), "{e}");
    let missing = std::env::temp_dir().join("ringlimit-no-such-ca.pem");
    let e = Client::builder()
        .seeds(["127.0.0.1:1"])
        .peer_tls(&missing, &missing, &missing)
        .build()
        .await
        .expect_err("no file");
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
    Ok(())
}

/// Now, in Unix seconds.
fn unix_now() -> Result<u64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs())
}

const EXPIRY: &str = "ringlimit_tls_cert_expiry_seconds{cert=\"http\"}";
const DAY: u64 = 86_400;

/// A renewed certificate that is expired, or not valid yet, is refused on reload like a bad
/// pair: the previous one is still presented. A valid renewal is then taken, and the seconds
/// until the certificate in force expires are exported.
#[tokio::test]
async fn an_expired_or_early_certificate_is_refused_on_reload_and_its_expiry_exported() -> Result<()>
{
    let pki = Pki::new("tls-dates")?;
    let now = unix_now()?;
    let first = pki.ca.issue_dated("http", 1, now - 3_600, now + 30 * DAY)?;
    let files = pki.dir.leaf("http", &first)?;
    let mut config = NodeConfig::local("tls-dates");
    config.tls = Some(files);
    config.rules_poll = Duration::from_millis(50);
    let node = TestNode::start_with_api(config, pki.https()).await?;
    let client = client_config(&pki.ca.pem, &[b"http/1.1"])?;
    let text = node.get("/metrics").await?.text;
    let left = series(&text, EXPIRY).context("no expiry gauge")?;
    ensure!(
        (30.0 * DAY as f64 - 120.0..=30.0 * DAY as f64).contains(&left),
        "{left}"
    );

    for (what, leaf) in [
        (
            "expired",
            pki.ca
                .issue_dated("http-old", 2, now - 2 * DAY, now - DAY)?,
        ),
        (
            "not yet valid",
            pki.ca
                .issue_dated("http-early", 3, now + DAY, now + 2 * DAY)?,
        ),
    ] {
        let errors = metric(
            &node.get("/metrics").await?.text,
            "ringlimit_tls_reload_total{result=\"error\"} ",
        );
        pki.dir.leaf("http", &leaf)?;
        wait_until(&format!("the {what} pair refused"), WAIT, || async {
            let text = node.get("/metrics").await?.text;
            Ok(metric(&text, "ringlimit_tls_reload_total{result=\"error\"} ") > errors)
        })
        .await?;
        // Polled a few more times (every 50 ms): still refused. A sleep is the thing: a poll
        // of unchanged files leaves no trace to wait for.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let tls = connect(node.http, client.clone()).await?;
        ensure!(
            presented(&tls)? == first.der()?,
            "the {what} certificate is served"
        );
    }
    let text = node.get("/metrics").await?.text;
    ensure!(
        metric(&text, "ringlimit_tls_reload_total{result=\"ok\"} ") == 0.0,
        "{text}"
    );

    let next = pki
        .ca
        .issue_dated("http-next", 4, now - 60, now + 90 * DAY)?;
    pki.dir.leaf("http", &next)?;
    wait_until("the renewed certificate served", WAIT, || async {
        let tls = connect(node.http, client.clone()).await?;
        Ok(presented(&tls)? == next.der()?)
    })
    .await?;
    let left = series(&node.get("/metrics").await?.text, EXPIRY).context("no expiry gauge")?;
    ensure!(
        (90.0 * DAY as f64 - 120.0..=90.0 * DAY as f64).contains(&left),
        "{left}"
    );
    node.stop().await
}

/// A node started with an expired certificate starts (its peers, SDK clients and a renewed
/// certificate need no restart), says so in an error line naming the file and the date, and
/// exports a negative expiry.
#[tokio::test]
async fn a_node_started_with_an_expired_certificate_says_so_and_exports_it() -> Result<()> {
    let pki = Pki::new("tls-expired-start")?;
    let now = unix_now()?;
    let expired = pki.ca.issue_dated("http", 1, now - 10 * DAY, now - DAY)?;
    let files = pki.dir.leaf("http", &expired)?;
    let mut spec = ProcessSpec::new("tls-expired", free_peer_port()?);
    spec.args = vec![
        "--tls-cert".into(),
        files.cert.display().to_string(),
        "--tls-key".into(),
        files.key.display().to_string(),
    ];
    let node = ProcessNode::start(&spec).await?;
    wait_until("the error line", WAIT, || async {
        Ok(node
            .log()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("out of its dates")))
    })
    .await?;
    let log = node.log();
    let line = log
        .lines()
        .find(|l| l.contains("out of its dates"))
        .context("no line")?;
    ensure!(
        line.contains(&files.cert.display().to_string()) && line.contains("expired on"),
        "{line}"
    );
    // Clients refuse it; one that does not check dates sees the node serve.
    ensure!(
        Api::https(node.http, &pki.ca.pem)?
            .get("/metrics")
            .await
            .is_err(),
        "an expired certificate was accepted"
    );
    let lax = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(WAIT)
        .no_proxy()
        .build()?;
    let text = lax
        .get(format!("https://{}/metrics", node.http))
        .send()
        .await?
        .text()
        .await?;
    let left = series(&text, EXPIRY).context("no expiry gauge")?;
    ensure!(
        (-(DAY as f64) - 120.0..=-(DAY as f64)).contains(&left),
        "{left}"
    );
    Ok(())
}
