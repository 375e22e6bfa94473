//! The `ringlimit` binary with `--tls-cert` against clients we did not write: curl (HTTP/2 and
//! HTTP/1.1 by ALPN), `openssl s_client` (ALPN, the chain verified against our CA, the served
//! certificate's serial before and after a rotation) and Python grpcio with TLS root
//! certificates (health and ringlimit.v1 checks, a new connection each). The certificate files
//! are replaced while curl and grpcio keep checking: the new one is served within a bounded
//! wait and no check fails. And a node whose certificate cannot be read does not start.

use anyhow::{Context, Result, ensure};
use ringlimit_tests::tls::{CertDir, TestCa};
use ringlimit_tests::{
    Api, ProcessNode, ProcessSpec, Progress, WAIT, exclusive, free_peer_port, poll_every,
    python_with, ringlimit_binary, run_client_script, series_sum, wait_until,
};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether `tool` runs here (asked for its version with `arg`).
fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `curl` POSTing one check to `addr` over HTTPS, trusting `ca`, with `extra` flags: the
/// status and the HTTP version curl reports.
fn curl_check(addr: SocketAddr, ca: &Path, extra: &[&str]) -> Result<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .args(["-o", "/dev/null", "-w", "%{http_code} %{http_version}"])
        .args(extra)
        .args([
            "-X",
            "POST",
            "-d",
            r#"{"key":"curl","limit":1000000,"period_ms":60000}"#,
        ])
        .arg(format!("https://127.0.0.1:{}/v1/check", addr.port()))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "curl failed ({}): {text} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, version) = text.split_once(' ').context("curl's -w output")?;
    Ok((code.parse()?, version.to_owned()))
}

/// `openssl s_client` to `addr` offering ALPN `h2`, verifying against `ca`: the protocol ALPN
/// chose and the served certificate's serial (hex, as `openssl x509 -serial` prints it).
fn s_client(addr: SocketAddr, ca: &Path) -> Result<(String, String)> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args([
            "-servername",
            "localhost",
            "-alpn",
            "h2",
            "-verify_return_error",
        ])
        .arg("-CAfile")
        .arg(ca)
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        text.contains("Verify return code: 0 (ok)"),
        "s_client did not verify the chain: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let alpn = text
        .lines()
        .find_map(|l| l.strip_prefix("ALPN protocol: "))
        .unwrap_or("none")
        .to_owned();
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .context("no certificate")?;
    let end = text[begin..]
        .find("-----END CERTIFICATE-----")
        .context("no certificate end")?;
    let pem = &text[begin..begin + end + "-----END CERTIFICATE-----".len()];
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(x509.stdin.as_mut().context("stdin")?, pem.as_bytes())?;
    let serial = String::from_utf8(x509.wait_with_output()?.stdout)?;
    let serial = serial
        .trim()
        .strip_prefix("serial=")
        .context("no serial")?
        .to_owned();
    Ok((alpn, serial))
}

#[tokio::test]
async fn curl_openssl_and_grpcio_over_tls_while_the_certificate_rotates() -> Result<()> {
    if !have("curl", "--version") || !have("openssl", "version") {
        eprintln!("curl or openssl not installed (.ci/run installs them): skipping");
        return Ok(());
    }
    let _one_at_a_time = exclusive().await;
    let ca = TestCa::new("ringlimit tools CA")?;
    let dir = CertDir::new("tls-tools")?;
    let ca_path = dir.ca("ca.crt", &ca)?;
    let (first, second) = (ca.issue("node", 0x1001)?, ca.issue("node", 0x1002)?);
    let files = dir.leaf("node", &first)?;
    let grpc = SocketAddr::from(([127, 0, 0, 1], free_peer_port()?));
    let mut spec = ProcessSpec::new("tls-tools", free_peer_port()?);
    spec.args = vec![
        "--tls-cert".into(),
        files.cert.display().to_string(),
        "--tls-key".into(),
        files.key.display().to_string(),
        "--grpc".into(),
        grpc.to_string(),
        "--config-poll-ms".into(),
        "100".into(),
    ];
    let mut node = ProcessNode::start(&spec).await?;
    node.set_api(Api::https(node.http, &ca.pem)?);
    node.wait_ready().await?;
    let http = node.http;

    // curl: HTTP/2 by ALPN, and HTTP/1.1 when asked.
    for (extra, version) in [(&[][..], "2"), (&["--http1.1"][..], "1.1")] {
        let p = ca_path.clone();
        let got = tokio::task::spawn_blocking(move || curl_check(http, &p, extra)).await??;
        assert_eq!(got, (200, version.to_owned()));
    }
    // s_client: the chain verifies against our CA, ALPN h2 on both ports, the first serial.
    for addr in [http, grpc] {
        let p = ca_path.clone();
        let got = tokio::task::spawn_blocking(move || s_client(addr, &p)).await??;
        assert_eq!(got, ("h2".to_owned(), "1001".to_owned()), "{addr}");
    }

    // Load while the certificate rotates: grpcio (new connection per call) and curl (a
    // process, so a connection, per check).
    let python = python_with("grpc, grpc_tools");
    let grpcio = python.map(|py| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tls_client.py");
        let protos = concat!(env!("CARGO_MANIFEST_DIR"), "/../crates/proto/proto");
        let args = vec![
            script.into(),
            protos.into(),
            grpc.to_string(),
            ca_path.display().to_string(),
            "4".into(),
        ];
        tokio::spawn(run_client_script(py, args))
    });
    if grpcio.is_none() {
        eprintln!("no Python with grpcio and grpc_tools (made by .ci/run): grpcio part skipped");
    }
    let checks_before = checks_decided(&node).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let curled = Progress::default();
    let curls = {
        let (stop, p, curled) = (stop.clone(), ca_path.clone(), curled.clone());
        tokio::task::spawn_blocking(move || {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match curl_check(http, &p, &[]) {
                    Ok((200, _)) => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
                curled.add();
            }
            (ok, failed)
        })
    };
    // Both loads under way before the rotation: 20 curl checks, and (with grpcio) checks the
    // node decided beyond curl's. One curl check at a time is in flight, so two more than
    // curl has counted are another client's.
    wait_until("curl and grpcio under way", WAIT, || async {
        let beyond_curl = checks_decided(&node).await? - checks_before - curled.done() as f64;
        Ok(curled.done() >= 20 && (grpcio.is_none() || beyond_curl >= 2.0))
    })
    .await?;
    dir.leaf("node", &second)?;
    let since = Instant::now();
    // Every 50 ms: each look is an openssl process.
    let (every, within) = (Duration::from_millis(50), Duration::from_secs(5));
    poll_every(every, "s_client sees serial 1002", within, || {
        let p = ca_path.clone();
        async move {
            let (_, serial) = tokio::task::spawn_blocking(move || s_client(http, &p)).await??;
            Ok((serial == "1002").then_some(()))
        }
    })
    .await?;
    let rotated = since.elapsed();
    eprintln!("s_client saw the new certificate {rotated:?} after the files were replaced");
    let p = ca_path.clone();
    let (_, grpc_serial) = tokio::task::spawn_blocking(move || s_client(grpc, &p)).await??;
    assert_eq!(grpc_serial, "1002", "the gRPC port rotated too");
    // 20 more curl checks, each on a connection made after the rotation.
    curled.wait_more(20, WAIT).await?;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = curls.await?;
    assert!(failed.is_empty(), "curl checks failed: {failed:?}");
    assert!(ok > 0, "no curl check ran");
    eprintln!("curl: {ok} checks, none failed");
    if let Some(grpcio) = grpcio {
        let calls = grpcio.await??;
        assert_eq!(
            calls.by("first-health")["status"],
            1,
            "SERVING: {:?}",
            calls.0
        );
        assert_eq!(
            calls.by("first-check")["answer"]["allowed"],
            true,
            "{:?}",
            calls.0
        );
        let summary = calls.by("loop");
        assert!(summary["calls"].as_u64().unwrap_or(0) > 0, "{summary}");
        assert_eq!(summary["failed"], 0, "grpcio calls failed: {summary}");
        eprintln!("grpcio: {summary}");
    }
    let text = node.get("/metrics").await?.text;
    assert!(
        ringlimit_tests::metric(&text, "ringlimit_tls_reload_total{result=\"ok\"} ") >= 1.0,
        "{text}"
    );
    ensure!(node.stop().await? == 0, "exit code");
    Ok(())
}

/// Checks `node` has decided so far, whatever their result.
async fn checks_decided(node: &ProcessNode) -> Result<f64> {
    let text = node.get("/metrics").await?.text;
    series_sum(&text, "ringlimit_checks_total").context("no ringlimit_checks_total")
}

/// Runs the binary's `serve` with `args` and the environment `env`, expecting it to exit at
/// once: its exit code and stderr.
fn serve_exits(args: &[&str], env: &[(&str, &str)]) -> Result<(i32, String)> {
    let bin = ringlimit_binary()?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .args(["--http", "127.0.0.1:0", "--peer", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RINGLIMIT_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output()?;
    Ok((
        out.status.code().context("killed by a signal")?,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn a_node_whose_certificate_cannot_be_used_exits_with_one_line_naming_the_file() -> Result<()>
{
    let dir = CertDir::new("tls-bad")?;
    let missing = dir.path("missing.crt").display().to_string();
    let junk = dir.write("junk.key", "not a key\n")?.display().to_string();
    let ca = TestCa::new("bad CA")?;
    let leaf = ca.issue("node", 1)?;
    let good = dir.leaf("good", &leaf)?;
    let cert = good.cert.display().to_string();
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let cases = [
        (
            owned(&["--tls-cert", &missing, "--tls-key", &junk]),
            vec![],
            format!("--tls-cert/--tls-key: cannot read certificate {missing}"),
        ),
        (
            owned(&["--tls-cert", &cert, "--tls-key", &junk]),
            vec![],
            format!("--tls-cert/--tls-key: key {junk} holds no PEM private key"),
        ),
        // The variables, as the flags.
        (
            vec![],
            vec![
                ("RINGLIMIT_PEER_TLS_CA", missing.clone()),
                ("RINGLIMIT_PEER_TLS_CERT", cert.clone()),
                ("RINGLIMIT_PEER_TLS_KEY", junk.clone()),
            ],
            format!("--peer-tls-ca/--peer-tls-cert/--peer-tls-key: cannot read CA {missing}"),
        ),
        // Gossip is not TLS: seeds still need the secret.
        (
            owned(&[
                "--peer-tls-ca",
                &cert,
                "--peer-tls-cert",
                &cert,
                "--peer-tls-key",
                &junk,
                "--seeds",
                "127.0.0.1:1",
            ]),
            vec![],
            "--seeds given but RINGLIMIT_CLUSTER_SECRET is not set: --peer-tls-* authenticates \
             peer RPC (TCP) only"
                .to_owned(),
        ),
    ];
    for (args, env, want) in cases {
        let (code, stderr) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            serve_exits(&args, &env)
        })
        .await??;
        assert_eq!(code, 1, "{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].starts_with(&format!("ringlimit: {want}")),
            "{stderr}\nwanted: {want}"
        );
    }
    Ok(())
}
