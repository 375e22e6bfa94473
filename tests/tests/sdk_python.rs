//! The Python SDK (`clients/python`, package `ringlimit`): its own pytest suite (unit tests, and
//! integration tests against real three-node clusters that it starts from this build's
//! `ringlimit` binary, `RINGLIMIT_BIN`), run with the venv `.ci/run` makes. Without that venv the
//! test passes with a note, unless `CI` is set: there it must run.

use anyhow::{Context, Result, bail};
use ringlimit_tests::{exclusive, ringlimit_binary};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The whole suite's bound (it starts three clusters and waits out one failure detection).
const WITHIN: Duration = Duration::from_secs(600);
/// What the suite needs importable (the SDK itself comes from this checkout, see below).
const MODULES: &str = "grpc, grpc_tools, xxhash, pytest, pytest_asyncio, fastapi, flask, httpx";

/// The venv's Python: `RINGLIMIT_SDK_PYTHON`, else the one `.ci/run` makes.
fn sdk_python() -> Option<String> {
    let py = std::env::var("RINGLIMIT_SDK_PYTHON")
        .unwrap_or_else(|_| "/tmp/ringlimit-sdk-venv/bin/python".into());
    Command::new(&py)
        .args(["-c", &format!("import {MODULES}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| py)
}

#[tokio::test]
async fn the_python_sdk_passes_its_tests_against_this_build() -> Result<()> {
    let Some(python) = sdk_python() else {
        if std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
            bail!(
                "CI: the Python SDK's venv (/tmp/ringlimit-sdk-venv, made by .ci/run) is missing"
            );
        }
        println!("skipped: no Python venv with {MODULES} (run .ci/run's venv step)");
        return Ok(());
    };
    // The clusters' timings must not compete with the Rust cluster tests for two cores.
    let _one_at_a_time = exclusive().await;
    let bin = tokio::task::spawn_blocking(ringlimit_binary).await??;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the repository")?
        .join("clients/python");
    let run = tokio::task::spawn_blocking(move || {
        let child = Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&dir)
            // This checkout's SDK, whatever the venv has installed.
            .env("PYTHONPATH", dir.join("src"))
            .env("RINGLIMIT_BIN", &bin)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start pytest")?;
        let pid = child.id().to_string();
        // Read to the end on a thread of its own (a full pipe would stall the suite).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(WITHIN) {
            Ok(out) => Ok(out?),
            Err(_) => {
                // The nodes it started die with it (they ask the kernel for that).
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                bail!("the Python SDK's tests took over {WITHIN:?}")
            }
        }
    })
    .await??;
    let stdout = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        bail!(
            "the Python SDK's tests failed ({}):\n{stdout}{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
    }
    // The summary line, for the log.
    if let Some(last) = stdout.lines().rev().find(|l| !l.trim().is_empty()) {
        println!("python sdk: {last}");
    }
    Ok(())
}
