//! The admin CLI: the real `ringlimit` binary run as `ringlimit rules|top|cluster|keys` against a
//! 3-node in-process cluster with an admin token — rules written through one node and deleted
//! through another, top keys after denials, the cluster, a key's state and reset, and the errors
//! (unknown rule, bad token, stale If-Match, unreachable address, bad usage) with their exit codes.

use anyhow::{Context, Result, bail, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_tests::tls::{CertDir, TestCa};
use ringlimit_tests::{
    Api, TestCluster, TestNode, WAIT, inline, ringlimit_binary, wait_for, wait_until,
};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "cli-test-admin-token";
/// Longest one CLI run may take (its own request timeout is 5 s).
const RUN_WITHIN: Duration = Duration::from_secs(30);

/// One run of the binary: exit code, standard output, standard error.
#[derive(Debug)]
struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.out).with_context(|| format!("not JSON: {self:?}"))
    }

    fn ok(self) -> Result<Self> {
        ensure!(self.code == 0, "exit {}: {self:?}", self.code);
        Ok(self)
    }
}

/// How to run the CLI: the binary, the address (`RINGLIMIT_ADDR`), the token
/// (`RINGLIMIT_ADMIN_TOKEN`), standard input.
struct Cli<'a> {
    bin: &'a Path,
    addr: String,
    token: Option<&'a str>,
    /// `RINGLIMIT_CACERT`.
    cacert: Option<&'a str>,
    stdin: Option<&'a str>,
}

impl<'a> Cli<'a> {
    fn at(bin: &'a Path, http: std::net::SocketAddr) -> Self {
        Cli {
            bin,
            addr: format!("http://{http}"),
            token: Some(TOKEN),
            cacert: None,
            stdin: None,
        }
    }

    /// Runs `ringlimit args...` (waited for in a blocking thread), killed if it outlives
    /// [`RUN_WITHIN`].
    async fn run(&self, args: &[&str]) -> Result<Run> {
        let mut cmd = Command::new(self.bin);
        cmd.args(args)
            .env("RINGLIMIT_ADDR", &self.addr)
            .env_remove("RINGLIMIT_ADMIN_TOKEN")
            .env_remove("RINGLIMIT_CACERT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = self.token {
            cmd.env("RINGLIMIT_ADMIN_TOKEN", t);
        }
        if let Some(ca) = self.cacert {
            cmd.env("RINGLIMIT_CACERT", ca);
        }
        let what = format!("ringlimit {}", args.join(" "));
        let mut child = cmd.spawn().with_context(|| format!("spawn {what}"))?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(self.stdin.unwrap_or("").as_bytes())?;
        }
        // Its pid stays its own until the blocking wait below reaps it.
        let pid = child.id();
        let ran = tokio::task::spawn_blocking(move || child.wait_with_output());
        let out = match tokio::time::timeout(RUN_WITHIN, ran).await {
            Ok(out) => out??,
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                bail!("{what} still running after {RUN_WITHIN:?}");
            }
        };
        Ok(Run {
            code: out.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Whether every node of `c` has rule `name` in force (`GET /v1/rules`, what each knows itself).
async fn everywhere(c: &TestCluster, name: &str) -> Result<bool> {
    for node in &c.nodes {
        let rules = node.get("/v1/rules").await?.json()?;
        let known = rules["rules"]
            .as_array()
            .context("rules")?
            .iter()
            .any(|r| r["name"] == name);
        if !known {
            return Ok(false);
        }
    }
    Ok(true)
}

fn bin() -> Result<PathBuf> {
    ringlimit_binary()
}

/// The CLI against one 3-node cluster, scenario by scenario (each leaves the rules as the next
/// expects them: `cli-rule` at 3 an hour, its key denied, until it is deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_drives_a_cluster() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let c = TestCluster::start_with(3, |c| c.admin_token = Some(TOKEN.into())).await?;
    let nodes: [Cli<'_>; 3] = [0, 1, 2].map(|i| Cli::at(&bin, c.nodes[i].http));
    rules_are_written_read_and_guarded_by_their_version(&nodes).await?;
    a_rule_from_yaml_on_stdin_is_listed(&bin, &c, &nodes).await?;
    top_lists_the_denied_key(&c, &nodes).await?;
    the_cluster_shows_three_alive_without_a_token(&bin, &c).await?;
    a_keys_state_and_its_reset_on_every_member(&nodes).await?;
    deleted_rules_are_unknown(&nodes).await?;
    c.stop().await
}

/// Written through node 0 (a table of the rule), read through node 2 (JSON, its version); a
/// stale If-Match refused with nothing changed, the right one accepted.
async fn rules_are_written_read_and_guarded_by_their_version(
    [n0, n1, n2]: &[Cli<'_>; 3],
) -> Result<()> {
    let put = n0
        .run(&[
            "rules",
            "put",
            "cli-rule",
            "--limit",
            "3",
            "--period",
            "1h",
            "--algorithm",
            "fixed_window",
            "--lease",
            "off",
        ])
        .await?
        .ok()?;
    ensure!(
        put.out.contains("cli-rule") && put.out.lines().any(|l| l == "source                api"),
        "{}",
        put.out
    );
    let got = n2
        .run(&["rules", "get", "cli-rule", "-o", "json"])
        .await?
        .ok()?;
    let rule = got.json()?;
    ensure!(rule["limit"] == 3 && rule["source"] == "api", "{rule}");
    let version = rule["version"].as_str().context("version")?.to_owned();
    ensure!(rule["updated_by"] == "admin", "{rule}");

    // A stale If-Match: 412 version_mismatch, exit 1, nothing changed.
    let stale = n1
        .run(&[
            "rules",
            "put",
            "cli-rule",
            "--limit",
            "9",
            "--period",
            "1h",
            "--if-match",
            "0.0.nobody",
        ])
        .await?;
    ensure!(
        stale.code == 1
            && stale.err.contains("error: version_mismatch: ")
            && stale.err.contains("HTTP 412"),
        "{stale:?}"
    );
    // The right version: accepted (the same fields: lease off, fixed window, 3 an hour).
    n1.run(&[
        "rules",
        "put",
        "cli-rule",
        "--limit",
        "3",
        "--period",
        "1h",
        "--algorithm",
        "fixed_window",
        "--lease",
        "off",
        "--if-match",
        &version,
    ])
    .await?
    .ok()?;
    Ok(())
}

/// A rule from YAML on standard input; the list, in JSON and as a table, once node 1 has it.
async fn a_rule_from_yaml_on_stdin_is_listed(
    bin: &Path,
    c: &TestCluster,
    [_, n1, _]: &[Cli<'_>; 3],
) -> Result<()> {
    let mut from_stdin = Cli::at(bin, c.nodes[2].http);
    from_stdin.stdin = Some("limit: 50\nperiod: 10s\nalgorithm: sliding_window\n");
    let r = from_stdin
        .run(&["rules", "put", "cli-yaml", "--file", "-", "-o", "json"])
        .await?
        .ok()?;
    ensure!(r.json()?["algorithm"] == "sliding_window", "{}", r.out);

    // JSON that parses, with both rules once node 1 has learnt cli-yaml (a listing is what the
    // node asked knows: gossip brings it within about a second).
    wait_until("node 1 lists cli-rule and cli-yaml", WAIT, || async {
        let list = n1.run(&["rules", "list", "--output", "json"]).await?.ok()?;
        let names: Vec<String> = list.json()?["rules"]
            .as_array()
            .context("rules")?
            .iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect();
        Ok(names.iter().any(|n| n == "cli-rule") && names.iter().any(|n| n == "cli-yaml"))
    })
    .await?;
    let table = n1.run(&["rules", "list"]).await?.ok()?;
    ensure!(
        table.out.starts_with("NAME ")
            && table
                .out
                .lines()
                .any(|l| l.starts_with("cli-rule ") && l.contains(" 1h ") && l.contains(" api ")),
        "{}",
        table.out
    );
    eprintln!("ringlimit rules list:\n{}", table.out);
    Ok(())
}

/// Denials through node 0 once every node has the rule: the key tops the rule's list, as a
/// table and by denials in JSON.
async fn top_lists_the_denied_key(c: &TestCluster, [_, _, n2]: &[Cli<'_>; 3]) -> Result<()> {
    wait_until("every node has cli-rule", WAIT, || {
        everywhere(c, "cli-rule")
    })
    .await?;
    let mut denied = 0;
    for _ in 0..6 {
        let r = c.nodes[0]
            .check(&json!({ "key": "user:cli", "rule": "cli-rule" }))
            .await?;
        denied += u32::from(r.status == 429);
    }
    ensure!(denied == 3, "{denied} denied of 6 at 3 an hour");
    let top = wait_for("top lists user:cli", WAIT, || async {
        let r = n2
            .run(&["top", "--rule", "cli-rule", "-n", "5"])
            .await?
            .ok()?;
        Ok(r.out
            .lines()
            .any(|l| l.starts_with("user:cli "))
            .then_some(r))
    })
    .await?;
    ensure!(
        top.out.starts_with("KEY ") && top.out.contains("complete: 3 of 3 members answered"),
        "{}",
        top.out
    );
    eprintln!("ringlimit top --rule cli-rule:\n{}", top.out);
    let top = n2
        .run(&["top", "--rule", "cli-rule", "--by", "denied", "-o", "json"])
        .await?
        .ok()?
        .json()?;
    ensure!(
        top["keys"][0]["key"] == "user:cli" && top["keys"][0]["count"].as_u64() >= Some(3),
        "{top}"
    );
    Ok(())
}

/// The cluster: three members alive, in a table and in JSON; no token needed.
async fn the_cluster_shows_three_alive_without_a_token(bin: &Path, c: &TestCluster) -> Result<()> {
    let mut anonymous = Cli::at(bin, c.nodes[1].http);
    anonymous.token = None;
    let cluster = anonymous.run(&["cluster"]).await?.ok()?;
    ensure!(
        cluster.out.contains("quorate; 3 in the ring")
            && cluster
                .out
                .lines()
                .filter(|l| l.contains(" alive "))
                .count()
                == 3,
        "{}",
        cluster.out
    );
    eprintln!("ringlimit cluster:\n{}", cluster.out);
    let view = anonymous
        .run(&["cluster", "-o", "json"])
        .await?
        .ok()?
        .json()?;
    ensure!(
        view["members"].as_array().map(Vec::len) == Some(3),
        "{view}"
    );
    Ok(())
}

/// A key's state (nothing consumed), its reset on every member, its state again; a key of any
/// characters, and an inline rule by its parameters.
async fn a_keys_state_and_its_reset_on_every_member([n0, n1, n2]: &[Cli<'_>; 3]) -> Result<()> {
    let state = n1
        .run(&[
            "keys", "get", "user:cli", "--rule", "cli-rule", "-o", "json",
        ])
        .await?
        .ok()?
        .json()?;
    ensure!(
        state["state"]["allowed"] == false && state["state"]["remaining"] == 0,
        "{state}"
    );
    let table = n1
        .run(&["keys", "get", "user:cli", "--rule", "cli-rule"])
        .await?
        .ok()?;
    ensure!(
        table.out.lines().any(|l| l == "key          user:cli")
            && table.out.lines().any(|l| l == "remaining    0"),
        "{}",
        table.out
    );
    let reset = n2
        .run(&["keys", "reset", "user:cli", "--rule", "cli-rule"])
        .await?
        .ok()?;
    ensure!(
        reset.out.contains("NODE ")
            && reset.out.lines().filter(|l| l.contains(" ok ")).count() == 3
            && reset.out.contains("complete: 3 of 3 members answered")
            && !reset.out.contains("removed: 0 "),
        "{}",
        reset.out
    );
    eprintln!(
        "ringlimit keys reset user:cli --rule cli-rule:\n{}",
        reset.out
    );
    let state = n0
        .run(&[
            "keys", "get", "user:cli", "--rule", "cli-rule", "-o", "json",
        ])
        .await?
        .ok()?
        .json()?;
    ensure!(state["state"]["remaining"] == 3, "{state}");
    // A key of any characters reaches the node as it is (percent-encoded in the path), and an
    // inline rule by its parameters.
    let odd = "a/b c?d#e%f+g&h=\u{e9}";
    let state = n0
        .run(&[
            "keys",
            "get",
            odd,
            "--limit",
            "5",
            "--period-ms",
            "1000",
            "-o",
            "json",
        ])
        .await?
        .ok()?
        .json()?;
    ensure!(
        state["key"] == odd && state["state"]["limit"] == 5,
        "{state}"
    );
    Ok(())
}

/// Deleted through node 1, right after; then gone: exit 1 with unknown_rule (404). A delete
/// with a stale If-Match is refused.
async fn deleted_rules_are_unknown([n0, n1, n2]: &[Cli<'_>; 3]) -> Result<()> {
    let deleted = n1.run(&["rules", "delete", "cli-rule"]).await?.ok()?;
    ensure!(deleted.out.trim() == "rule cli-rule deleted", "{deleted:?}");
    let gone = n0.run(&["rules", "get", "cli-rule"]).await?;
    ensure!(
        gone.code == 1
            && gone.out.is_empty()
            && gone.err.starts_with("error: unknown_rule: ")
            && gone.err.contains("HTTP 404"),
        "{gone:?}"
    );
    let again = n2
        .run(&["rules", "delete", "cli-yaml", "--if-match", "0.0.x"])
        .await?;
    ensure!(
        again.code == 1 && again.err.contains("version_mismatch"),
        "{again:?}"
    );
    n2.run(&["rules", "delete", "cli-yaml"]).await?.ok()?;
    Ok(())
}

/// A wrong token, and none: exit 1, unauthorized (with a hint when none was given); the token
/// given as a flag works too (though the environment is preferred).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_or_none_is_unauthorized() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let mut config = NodeConfig::local("cli-tokens");
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    let mut wrong = Cli::at(&bin, node.http);
    wrong.token = Some("not-the-admin-token");
    let r = wrong.run(&["rules", "list"]).await?;
    ensure!(
        r.code == 1 && r.err.starts_with("error: unauthorized") && r.err.contains("HTTP 401"),
        "{r:?}"
    );
    let mut none = Cli::at(&bin, node.http);
    none.token = None;
    let r = none
        .run(&["keys", "reset", "k", "--rule", "default"])
        .await?;
    ensure!(
        r.code == 1 && r.err.contains("unauthorized") && r.err.contains("RINGLIMIT_ADMIN_TOKEN"),
        "{r:?}"
    );
    none.run(&["rules", "get", "default", "--token", TOKEN])
        .await?
        .ok()?;
    node.stop().await
}

/// Bad usage: exit 2, one line, before any request (the address is one nothing listens on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_exits_2_with_one_line() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let nowhere = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let cli = Cli::at(&bin, nowhere);
    for args in [
        &["rules", "put", "x", "--limit", "5"][..],
        &["top"],
        &["keys", "get", "k"],
        &["cluster", "--addr", "ftp://127.0.0.1:1"],
    ] {
        let r = cli.run(args).await?;
        ensure!(
            r.code == 2 && r.err.trim_end().lines().count() == 1,
            "{args:?}: {r:?}"
        );
    }
    Ok(())
}

/// Nothing listening, or TLS asked of a plain HTTP port: exit 1 and one line naming the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_is_one_line_naming_its_address() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let mut cli = Cli::at(&bin, closed);
    cli.addr = closed.to_string();
    let r = cli.run(&["cluster"]).await?;
    ensure!(
        r.code == 1
            && r.out.is_empty()
            && r.err.trim_end().lines().count() == 1
            && r.err.contains(&format!("cannot reach http://{closed}/")),
        "{r:?}"
    );

    let node = ringlimit_tests::TestNode::single().await?;
    let mut tls = Cli::at(&bin, node.http);
    tls.addr = format!("https://{}", node.http);
    let r = tls.run(&["cluster", "--timeout-ms", "3000"]).await?;
    ensure!(
        r.code == 1
            && r.err
                .contains(&format!("cannot reach https://{}/", node.http)),
        "{r:?}"
    );
    // A CA file that holds no certificate is bad usage.
    let r = tls.run(&["cluster", "--cacert", "/dev/null"]).await?;
    ensure!(r.code == 2 && r.err.contains("--cacert"), "{r:?}");
    node.stop().await?;
    Ok(())
}

/// `https://` over rustls against a node serving TLS (`--tls-cert`) under a private CA: refused
/// without the CA, reached with `--cacert` or `RINGLIMIT_CACERT`, by address or by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_trusts_a_private_ca_given_by_cacert() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let ca = TestCa::new("ringlimit test CA (cli)")?;
    let dir = CertDir::new("cli-tls")?;
    let ca_path = dir.ca("ca.crt", &ca)?;
    let mut config = NodeConfig::local("cli-tls");
    config.tls = Some(dir.leaf("node", &ca.issue("node", 1)?)?);
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start_with_api(config, |addr| Api::https(addr, &ca.pem)).await?;
    let ca_file = ca_path.to_str().context("CA path")?;

    let mut cli = Cli::at(&bin, node.http);
    cli.addr = format!("https://{}", node.http);
    let r = cli.run(&["rules", "list"]).await?;
    ensure!(
        r.code == 1
            && r.err
                .contains(&format!("cannot reach https://{}/", node.http))
            && r.err.contains("UnknownIssuer"),
        "{r:?}"
    );
    let r = cli
        .run(&["rules", "list", "--cacert", ca_file])
        .await?
        .ok()?;
    ensure!(r.out.starts_with("NAME "), "{}", r.out);
    cli.cacert = Some(ca_file);
    cli.addr = format!("https://localhost:{}", node.http.port());
    let r = cli.run(&["cluster", "-o", "json"]).await?.ok()?;
    ensure!(r.json()?["node_id"] == "cli-tls", "{}", r.out);
    // Plain HTTP to the TLS port: no answer, one line naming the address.
    cli.addr = node.http.to_string();
    let r = cli.run(&["cluster"]).await?;
    ensure!(
        r.code == 1
            && r.err.trim_end().lines().count() == 1
            && r.err.contains("cannot reach http://"),
        "{r:?}"
    );
    node.stop().await?;
    Ok(())
}

/// Keys reach the API byte for byte: each key of every byte class a shell can pass (tab,
/// newline, `%`, `/`, `?`, `#`, space, non-ASCII, a lone `+`, a backslash) is checked once
/// through the HTTP API, then read and reset through the real CLI. The node must name that very
/// key, see its one check, and reset only it (the URL parser once dropped tabs and newlines:
/// `keys reset "a<TAB>b"` reset `ab`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_reach_the_node_byte_for_byte() -> Result<()> {
    let bin = tokio::task::spawn_blocking(bin).await??;
    let mut config = NodeConfig::local("cli-bytes");
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    let cli = Cli::at(&bin, node.http);
    // Confusable pairs are both present: a key that went as its neighbour would show it.
    let keys = [
        "a\tb",
        "ab",
        "a\nb",
        "a\r\nb",
        "a b",
        "a+b",
        "+",
        " ",
        "%",
        "%41",
        "A",
        "a/b",
        "a?b",
        "a#b",
        "a\\b",
        "\u{e9}t\u{e9}",
        "\u{1f600}",
        ".a",
        "%2e%2e",
    ];
    let rule = ["--limit", "5", "--period-ms", "3600000"];
    for key in keys {
        let r = node.check(&inline(key, 5, 3_600_000)).await?;
        ensure!(r.status == 200, "check {key:?}: {r:?}");
    }
    for key in keys {
        let mut args = vec!["keys", "get", key, "-o", "json"];
        args.extend(rule);
        let state = cli.run(&args).await?.ok()?.json()?;
        ensure!(
            state["key"] == key && state["state"]["remaining"] == 4,
            "keys get {key:?}: {state}"
        );
    }
    for key in keys {
        let mut args = vec!["keys", "reset", key, "-o", "json"];
        args.extend(rule);
        let reset = cli.run(&args).await?.ok()?.json()?;
        ensure!(
            reset["key"] == key && reset["removed"] == 1,
            "keys reset {key:?}: {reset}"
        );
        let r = node.check(&inline(key, 5, 3_600_000)).await?.json()?;
        ensure!(r["remaining"] == 4, "{key:?} after its reset: {r}");
    }
    node.stop().await?;
    Ok(())
}
