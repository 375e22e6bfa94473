//! The check endpoints on the wire: the HTTP/1.1 check loop (`http/h1.rs`) answers with the same
//! bytes as hyper's path (forced by a first request of another shape on the connection),
//! takes heads and bodies in pieces and pipelined, and hands a connection to hyper mid-way.

use anyhow::{Context, Result, ensure};
use ringlimit_core::clock::ManualClock;
use ringlimit_node::NodeConfig;
use ringlimit_node::config::EngineClock;
use ringlimit_tests::{TestNode, WAIT, read_responses};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A node whose buckets all see one instant: answers to the same check are the same bytes.
async fn node() -> Result<TestNode> {
    let mut config = NodeConfig::local("http-wire");
    config.clock = Some(EngineClock(Arc::new(ManualClock::new(
        20_000 * 86_400 * 1_000_000_000,
    ))));
    TestNode::start(config).await
}

fn check(body: &str) -> String {
    post("/v1/check", body)
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads `n` whole responses from `s`, `date` values masked.
async fn responses(s: &mut TcpStream, n: usize) -> Result<Vec<String>> {
    Ok(read_responses(s, n)
        .await?
        .iter()
        .map(|r| mask_date(r))
        .collect())
}

fn mask_date(response: &str) -> String {
    response
        .lines()
        .map(|l| {
            if l.starts_with("date: ") {
                "date: <masked>".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

async fn exchange(s: &mut TcpStream, request: &str) -> Result<String> {
    s.write_all(request.as_bytes()).await?;
    Ok(responses(s, 1).await?.remove(0))
}

/// A connection whose requests hyper serves: its first request is not a check.
async fn hyper_connection(addr: SocketAddr) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    let health = exchange(&mut s, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n").await?;
    ensure!(health.starts_with("HTTP/1.1 200"), "{health}");
    Ok(s)
}

#[tokio::test]
async fn the_check_loop_answers_with_hypers_bytes() -> Result<()> {
    let n = node().await?;
    let mut fast = TcpStream::connect(n.http).await?;
    let mut slow = hyper_connection(n.http).await?;
    // Each body twice: allowed then denied, errors of every kind.
    let cases = [
        r#"{"key":"a","limit":1,"period_ms":60000}"#,
        r#"{"key":"a","limit":1,"period_ms":60000}"#,
        r#"{"key":"b","limit":5,"period_ms":1000,"algorithm":"sliding_window","cost":2}"#,
        r#"{"key":"c","limit":10,"period_ms":60000,"algorithm":"fixed_window"}"#,
        r#"{"key":"c","limit":10,"period_ms":60000,"shadow":true}"#,
        r#"{"key":"#,
        r#"{"limit":1}"#,
        r#"{"key":"d","rule":"no-such-rule"}"#,
        r#"{"key":"e","limit":0,"period_ms":1000}"#,
        r#"{"key":"f","limit":1,"period_ms":1000,"cost":5}"#,
        "",
    ];
    let batch = r#"{"checks":[{"key":"g","limit":1,"period_ms":60000},{"key":"g","limit":1,"period_ms":60000},{"key":""}]}"#;
    let all = r#"{"checks":[{"key":"i","limit":5,"period_ms":60000},{"key":"j","limit":1,"period_ms":60000,"cost":1}]}"#;
    let cases = cases.iter().map(|b| ("/v1/check", *b)).chain([
        ("/v1/check/batch", batch),
        ("/v1/check/batch", r#"{"checks":[]}"#),
        ("/v1/check/all", all),
        ("/v1/check/all", all),
        ("/v1/check/all", r#"{"checks":[{"key":"k"}]}"#),
    ]);
    let mut statuses = Vec::new();
    for (path, body) in cases {
        // Each path its own keys (one node: the same key would share a bucket).
        let f = post(path, &body.replace(r#""key":""#, r#""key":"f-"#));
        let h = post(path, &body.replace(r#""key":""#, r#""key":"h-"#));
        let f = exchange(&mut fast, &f).await?;
        let h = exchange(&mut slow, &h).await?;
        ensure!(f == h, "{path} {body:?}\n check loop:\n{f}\n hyper:\n{h}");
        statuses.push(f.get(9..12).unwrap_or_default().to_owned());
    }
    ensure!(
        statuses
            == [
                "200", "429", "200", "200", "400", "400", "400", "404", "400", "400", "400", "200",
                "400", "200", "429", "400"
            ],
        "{statuses:?}"
    );
    n.stop().await
}

#[tokio::test]
async fn checks_in_pieces_pipelined_and_handed_over_mid_connection() -> Result<()> {
    let n = node().await?;
    let body = r#"{"key":"p","limit":100,"period_ms":60000}"#;
    // A request written a byte at a time.
    let mut s = TcpStream::connect(n.http).await?;
    for b in check(body).as_bytes() {
        s.write_all(&[*b]).await?;
    }
    let one = responses(&mut s, 1).await?;
    ensure!(one[0].starts_with("HTTP/1.1 200"), "{one:?}");
    ensure!(one[0].contains("\"remaining\":99"), "{one:?}");
    // Three checks in one write, then a GET in the same write: the loop answers the checks,
    // hyper the rest of the connection.
    let pipelined = format!(
        "{}{}{}GET /v1/rules HTTP/1.1\r\nHost: n\r\n\r\n{}",
        check(body),
        check(body),
        check(body),
        check(body)
    );
    s.write_all(pipelined.as_bytes()).await?;
    let five = responses(&mut s, 5).await?;
    for (i, remaining) in [(0, 98), (1, 97), (2, 96), (4, 95)] {
        ensure!(
            five[i].contains(&format!("\"remaining\":{remaining}")),
            "answer {i}: {}",
            five[i]
        );
    }
    ensure!(five[3].starts_with("HTTP/1.1 200"), "{}", five[3]);
    ensure!(!five[3].contains("x-ratelimit"), "{}", five[3]);
    // `Connection: close` is hyper's: answered, then closed.
    let close = check(body).replace("Host: n\r\n", "Host: n\r\nConnection: close\r\n");
    let mut c = TcpStream::connect(n.http).await?;
    c.write_all(close.as_bytes()).await?;
    let mut all = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut all))
        .await
        .context("not closed")??;
    let text = String::from_utf8_lossy(&all);
    ensure!(text.starts_with("HTTP/1.1 200"), "{text}");
    ensure!(text.contains("connection: close"), "{text}");
    n.stop().await
}

#[tokio::test]
async fn a_real_http_client_gets_the_check_loops_answers() -> Result<()> {
    // curl (not ours) over one keep-alive connection: three checks, then the same URL with a
    // GET (hyper's 405), all on one connection (`--next` reuses it).
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl not found: skipped");
        return Ok(());
    }
    let n = node().await?;
    let url = format!("http://{}/v1/check", n.http);
    let body = r#"{"key":"curl","limit":2,"period_ms":60000}"#;
    // Each transfer prints its status and whether it opened a connection.
    let report = [
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{num_connects}\\n",
    ];
    let mut args = Vec::new();
    for _ in 0..3 {
        args.extend(report);
        args.extend([
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &url,
        ]);
        args.push("--next");
    }
    args.extend(report);
    args.push(&url);
    // curl exits by itself; run it off the runtime so the node keeps serving meanwhile.
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["--max-time", "20"])
            .args(&args)
            .output()
    })
    .await??;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text == "200 1\n200 0\n429 0\n405 0\n",
        "curl said {text:?} ({})",
        String::from_utf8_lossy(&out.stderr)
    );
    n.stop().await
}
