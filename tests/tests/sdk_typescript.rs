//! The TypeScript SDK (`clients/typescript`, `@ringlimit/client`) runs its own tests under
//! `cargo test`: unit tests, the golden file's cases, the generated types against the proto,
//! Express and Fastify middleware on real servers, and three-node clusters started from this
//! workspace's `ringlimit` binary (`RINGLIMIT_BIN`). The package's dependencies come from
//! `npm ci` (`.ci/run`); without Node.js or them the test passes with a note, unless `CI=true`.

use anyhow::{Context, Result, bail};
use ringlimit_tests::{exclusive, ringlimit_binary};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bound on the whole run (build, unit and cluster tests).
const WITHIN: Duration = Duration::from_secs(600);

/// Whether `npm` runs and the package's dependencies are installed.
fn npm_ready(dir: &Path) -> bool {
    let npm = Command::new("npm")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    npm && dir.join("node_modules/.bin/tsc").exists()
}

#[tokio::test]
async fn the_typescript_sdk_passes_its_tests_against_this_binary() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript");
    if !npm_ready(&dir) {
        let why =
            "Node.js/npm or clients/typescript/node_modules missing (.ci/run runs `npm ci` there)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            bail!("{why}");
        }
        eprintln!("{why}: skipping the TypeScript SDK's tests");
        return Ok(());
    }
    let bin = tokio::task::spawn_blocking(ringlimit_binary).await??;
    // Its clusters measure deadlines and failure detection: not beside other cluster tests.
    let _one_at_a_time = exclusive().await;
    let out = tokio::task::spawn_blocking(move || npm_test(&dir, &bin)).await??;
    let (status, stdout, stderr) = out;
    if !status.success() {
        bail!("npm test failed ({status}):\n{stdout}\n{stderr}");
    }
    // The runner's summary, for the log.
    let summary = ["# tests ", "# pass ", "# fail ", "# skipped "];
    for line in stdout
        .lines()
        .filter(|l| summary.iter().any(|s| l.starts_with(s)))
    {
        eprintln!("typescript sdk {line}");
    }
    Ok(())
}

/// Runs `npm test` in `dir` with `RINGLIMIT_BIN=bin`, in a process group of its own that is
/// killed whole (npm, node, the nodes it started) past [`WITHIN`]; its status and output.
fn npm_test(dir: &Path, bin: &Path) -> Result<(ExitStatus, String, String)> {
    let mut child = Command::new("npm")
        .args(["test", "--silent"])
        .current_dir(dir)
        .env("RINGLIMIT_BIN", bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("cannot run npm test")?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > WITHIN {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            bail!("npm test did not finish within {WITHIN:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}
