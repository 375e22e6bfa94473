//! The `ringlimit` binary: flags, environment, exit codes and graceful shutdown.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ringlimit");

fn run_to_end(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ringlimit");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_non_zero_with_one_line() {
    for args in [
        vec!["serve", "--max-keys", "many"],
        vec!["serve", "--max-keys", "0"],
        vec!["serve", "--http", "not-an-address"],
        vec!["serve", "--trusted-proxies", "10.0.0.0/8,10.0.0.0/33"],
        vec!["serve", "--no-such-flag"],
        vec!["launch"],
    ] {
        let (code, err) = run_to_end(&args, &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("ringlimit: "), "{args:?}: {err}");
    }
}

/// The safe default: a node given seeds without a cluster secret does not start (anyone who
/// reached the peer port could join and rewrite rules), unless told the danger is accepted.
#[test]
fn seeds_without_a_secret_are_refused_unless_unauthenticated_peers_are_allowed() {
    let args = [
        "serve",
        "--http",
        "127.0.0.1:0",
        "--peer",
        "127.0.0.1:0",
        "--seeds",
        "127.0.0.1:9",
    ];
    let (code, err) = run_to_end(&args, &[("RINGLIMIT_CLUSTER_SECRET", "")]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("RINGLIMIT_CLUSTER_SECRET") && err.contains("--allow-unauthenticated-peers"),
        "{err}"
    );
    // With the flag (or its variable) the config is accepted: the run gets as far as the
    // rules file.
    for (flag, env) in [
        (Some("--allow-unauthenticated-peers"), None),
        (
            None,
            Some(("RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS", "true")),
        ),
    ] {
        let mut a = args.to_vec();
        a.extend(flag);
        a.extend(["--config", "/nonexistent/rules.yaml"]);
        let (code, err) = run_to_end(&a, &env.into_iter().collect::<Vec<_>>());
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("/nonexistent/rules.yaml"), "{err}");
    }
}

#[test]
fn environment_variables_are_read_and_flags_win() {
    let (code, err) = run_to_end(&["serve"], &[("RINGLIMIT_MAX_KEYS", "lots")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("max-keys"), "{err}");
    let (code, err) = run_to_end(&["serve"], &[("RINGLIMIT_TRUSTED_PROXIES", "proxy.local")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("trusted-proxies") && err.contains("address block"),
        "{err}"
    );
    // With the flag given, the bad variable is never read: the run gets as far as the config.
    let (code, err) = run_to_end(
        &[
            "serve",
            "--max-keys",
            "5",
            "--config",
            "/nonexistent/rules.yaml",
        ],
        &[("RINGLIMIT_MAX_KEYS", "lots")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/rules.yaml"), "{err}");
}

#[test]
fn unreadable_or_invalid_config_is_refused_at_start() {
    let (code, err) = run_to_end(&["serve", "--config", "/nonexistent/rules.yaml"], &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/rules.yaml"), "{err}");

    let dir = std::env::temp_dir().join(format!("ringlimit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "rules:\n  - name: free-tier\n    limit: 100\n    period: 1 fortnight\n",
    )
    .expect("write");
    let (code, err) = run_to_end(
        &["serve", "--config", path.to_str().unwrap_or_default()],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("free-tier") && err.contains("period"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the binary on ephemeral ports, checks once, then SIGTERM: exit 0.
#[test]
fn serves_then_exits_zero_on_sigterm() {
    let (mut child, rx) = serve(&["--node-id", "cli-test"], &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("node did not log its address in time");
        if let Some(rest) = line.split("http=").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
    };
    let body = r#"{"key":"cli","limit":1,"period_ms":60000}"#;
    let reply = http_post(&addr, "/v1/check", body);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let reply = http_post(&addr, "/v1/check", body);
    assert!(reply.starts_with("HTTP/1.1 429"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("retry-after:"),
        "{reply}"
    );

    assert_eq!(terminate(&mut child), Some(0));
}

/// `ringlimit serve` on ephemeral ports (HTTP from `RINGLIMIT_HTTP`) with info logs, plus
/// `args` and `envs`; its stderr line by line.
fn serve(
    args: &[&str],
    envs: &[(&str, &str)],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(["serve", "--peer", "127.0.0.1:0"])
        .args(args)
        .env("RINGLIMIT_HTTP", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlimit");
    let rx = stderr_lines(&mut child);
    (child, rx)
}

/// The child's stderr, line by line, from a reader thread.
fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// Sends SIGTERM and waits (at most 10 s) for the exit code.
fn terminate(child: &mut std::process::Child) -> Option<i32> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ringlimit did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn http_post(addr: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// `--log-format json` gives one JSON object per line with structured fields, and the admin
/// token is read from `RINGLIMIT_ADMIN_TOKEN` (never a flag) and never logged.
#[test]
fn json_logs_and_the_admin_token_from_the_environment() {
    let token = "cli-admin-token-value";
    let (mut child, rx) = serve(
        &["--node-id", "cli-json", "--log-format", "json"],
        &[("RINGLIMIT_ADMIN_TOKEN", token)],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("node did not log its address in time");
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        lines.push(line);
        let fields = &v["fields"];
        if fields["message"] == "ringlimit node serving" {
            assert_eq!(v["level"], "INFO");
            assert_eq!(fields["admin_api"], true, "{v}");
            assert_eq!(fields["node_id"], "cli-json");
            break fields["http"].as_str().expect("http field").to_owned();
        }
    };
    let reply = http_get(&addr, "/v1/admin/rules", "");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    assert!(reply.contains(r#""error":"unauthorized""#), "{reply}");
    let reply = http_get(
        &addr,
        "/v1/admin/rules",
        &format!("Authorization: Bearer {token}\r\n"),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(r#""source":"built-in""#), "{reply}");

    assert_eq!(terminate(&mut child), Some(0));
    lines.extend(rx.try_iter());
    for line in &lines {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "{line}"
        );
        assert!(!line.contains(token), "the token was logged: {line}");
    }
}

fn http_get(addr: &str, path: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
