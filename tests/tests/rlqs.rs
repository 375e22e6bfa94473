//! Envoy's Rate Limit Quota Service (RLQS, `StreamRateLimitQuotas` on `--grpc`, buckets mapped
//! by `--rlqs-config`) with real processes: three nodes, and simulated Envoys over them
//! (tests/python/rlqs_envoys.py: what Envoy's rate_limit_quota filter does, each Envoy on a
//! stream of its own, Envoy i on node i mod 3, reopening a broken stream on the next node).
//! Their demand is skewed (Envoy 0 has 80% of it) and twice the rule's rate: the cluster keeps
//! the sum within the rate without starving the quiet Envoys, answers blanket and unmatched
//! buckets, goes on when the node that owns the rule's bucket is SIGKILLed, and a node that
//! stops ends its assignments (TTL 0) so that its Envoys move. A failure lists
//! every check that failed, then each run's summary (its lines are kept in target/tmp). The
//! bench (a minute, ±5%) is bench/rlqs.sh. [`bounds`]: what one client can make a node hold
//! (one in-process node, Rust clients on loopback addresses of their own; no Python needed),
//! and a blocked key's streams denied until the block is lifted.

use anyhow::{Context, Result, anyhow, ensure};
use ringlimit_tests::{
    ProcessNode, TempDir, WAIT, exclusive, free_peer_port, python_with, series_sum, wait_for,
    wait_until,
};
use serde_json::{Value, json};
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The rule the Envoys share: 100 requests a second.
const RULES: &str =
    "rules:\n  - { name: api_per_tenant, limit: 100, period: 1s, algorithm: token_bucket }\n";
const LIMIT: f64 = 100.0;
const RLQS: &str = r#"
domains:
  - domain: edge
    buckets:
      - bucket: { name: api, tenant: "*" }
        rule: api_per_tenant
        key: "{tenant}"
      - bucket: { name: blocked }
        blanket: deny_all
      - bucket: { name: open }
        blanket: allow_all
"#;
/// The bucket every simulated Envoy sends (and its key under the rule: `{tenant}`).
const API_BUCKET: &str = r#"{"name":"api","tenant":"acme"}"#;
const API_KEY: &str = "acme";
const ADMIN_TOKEN: &str = "rlqs-test-admin-token";
/// How long each simulation runs, in seconds.
const RUN_S: u64 = 15;

/// The Python that runs the simulator; `None` (skip) when there is none, an error under CI.
fn python() -> Result<Option<String>> {
    if let Some(py) = python_with("grpc, envoy_data_plane") {
        return Ok(Some(py));
    }
    ensure!(
        std::env::var_os("CI").is_none(),
        "no Python with grpcio and envoy-data-plane: .ci/run makes /tmp/ringlimit-grpc-venv"
    );
    eprintln!("SKIPPED: no Python with grpcio and envoy-data-plane (made by .ci/run)");
    Ok(None)
}

/// Three nodes serving RLQS, each on a gRPC port of its own, with the admin API (to ask for
/// the owner of the rule's bucket).
struct Cluster {
    nodes: Vec<ProcessNode>,
    grpc: Vec<SocketAddr>,
    _dir: TempDir,
}

impl Cluster {
    async fn start() -> Result<Self> {
        let dir = TempDir::new("rlqs")?;
        let rules = dir.0.join("rules.yaml");
        let rlqs = dir.0.join("rlqs.yaml");
        std::fs::write(&rules, RULES)?;
        std::fs::write(&rlqs, RLQS)?;
        let grpc = (0..3)
            .map(|_| Ok(SocketAddr::from(([127, 0, 0, 1], free_peer_port()?))))
            .collect::<Result<Vec<_>>>()?;
        let nodes = ProcessNode::cluster(3, |i, spec| {
            spec.args = vec![
                "--config".into(),
                rules.display().to_string(),
                "--rlqs-config".into(),
                rlqs.display().to_string(),
                "--grpc".into(),
                grpc[i].to_string(),
            ];
            spec.env = vec![("RINGLIMIT_ADMIN_TOKEN".into(), ADMIN_TOKEN.into())];
        })
        .await?;
        for addr in &grpc {
            wait_until(&format!("gRPC on {addr}"), WAIT, || async {
                Ok(tokio::net::TcpStream::connect(addr).await.is_ok())
            })
            .await?;
        }
        Ok(Self {
            nodes,
            grpc,
            _dir: dir,
        })
    }

    /// The gRPC addresses, comma-separated, node 0 first (Envoy i starts on node i mod 3).
    fn addrs(&self) -> String {
        let addrs: Vec<String> = self.grpc.iter().map(ToString::to_string).collect();
        addrs.join(",")
    }

    /// The index of the node that owns the rule's bucket for `key`, as node 0 says.
    async fn owner_of(&self, key: &str) -> Result<usize> {
        let path = format!("/v1/admin/keys/{key}?rule=api_per_tenant");
        let r = self.nodes[0]
            .api()
            .admin(reqwest::Method::GET, &path, ADMIN_TOKEN, None)
            .await?;
        ensure!(r.status == 200, "GET {path}: {} {}", r.status, r.text);
        let owner = r.json()?["owner"]
            .as_str()
            .context("no owner in the answer")?
            .to_owned();
        self.nodes
            .iter()
            .position(|n| n.node_id == owner)
            .with_context(|| format!("owner {owner:?} is none of the nodes"))
    }

    /// The sum over the nodes of every series of the metric `name` (any labels).
    async fn metric_sum(&self, name: &str) -> Result<f64> {
        let mut sum = 0.0;
        for node in &self.nodes {
            let text = node.api().get("/metrics").await?.text;
            sum += series_sum(&text, name)
                .with_context(|| format!("{} has no {name}", node.node_id))?;
        }
        Ok(sum)
    }
}

/// What one simulator run printed.
struct Run {
    what: String,
    lines: Vec<Value>,
    code: Option<i32>,
    stderr: String,
    /// The file that holds every line.
    saved: String,
}

impl Run {
    fn summary(&self) -> &Value {
        self.lines
            .iter()
            .rev()
            .find(|l| l["event"] == "summary")
            .unwrap_or(&Value::Null)
    }

    fn events<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.lines.iter().filter(move |l| l["event"] == kind)
    }

    /// The per-second lines, in order.
    fn seconds(&self) -> impl Iterator<Item = &Value> + '_ {
        self.lines
            .iter()
            .filter(|l| l["t"].is_u64() && l["event"].is_null())
    }

    /// A figure of the summary (NaN when absent).
    fn figure(&self, name: &str) -> f64 {
        self.summary()[name].as_f64().unwrap_or(f64::NAN)
    }

    /// The run exited 0 with a summary.
    fn ok(&self) -> bool {
        self.code == Some(0) && !self.summary().is_null()
    }
}

impl fmt::Display for Run {
    /// The summary (each Envoy on a line), what was admitted each second, the end of stderr.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut summary = self.summary().clone();
        let per = summary
            .as_object_mut()
            .and_then(|s| s.remove("per_envoy"))
            .unwrap_or_default();
        writeln!(f, "\n--- {} (every line in {}) ---", self.what, self.saved)?;
        writeln!(f, "{summary}")?;
        for (i, e) in per.as_array().into_iter().flatten().enumerate() {
            writeln!(f, "envoy {i}: {e}")?;
        }
        let seconds: Vec<Value> = self.seconds().map(|s| s["admitted"].clone()).collect();
        writeln!(f, "admitted each second: {}", Value::from(seconds))?;
        let stderr: Vec<&str> = self.stderr.lines().collect();
        let tail = &stderr[stderr.len().saturating_sub(20)..];
        write!(f, "stderr (last lines):\n{}", tail.join("\n"))
    }
}

/// How far a simulator run has got, in its own seconds (every line it prints carries `t`),
/// while it runs.
#[derive(Debug, Clone, Default)]
struct RunClock(Arc<AtomicU64>);

impl RunClock {
    /// Takes in one printed line.
    fn saw(&self, line: &str) {
        let t = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|l| l["t"].as_f64());
        if let Some(t) = t {
            self.0.fetch_max((t * 1_000.0) as u64, Ordering::Relaxed);
        }
    }

    /// Seconds into the run, as far as its lines have told.
    fn seconds(&self) -> f64 {
        self.0.load(Ordering::Relaxed) as f64 / 1_000.0
    }
}

/// Runs the simulator with `args` (its addresses first), bounded to `--duration` + 30 s; its
/// lines are read as it prints them, and tell `clock` how far it has got.
async fn simulate(
    python: &str,
    what: &str,
    args: Vec<String>,
    duration_s: u64,
    clock: RunClock,
) -> Result<Run> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/rlqs_envoys.py");
    let mut child = Command::new(python)
        .arg(script)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the simulator")?;
    let pid = child.id();
    let stdout = child.stdout.take().context("no stdout")?;
    let mut stderr = child.stderr.take().context("no stderr")?;
    // Both pipes read to their end while it runs (a full pipe would stop it).
    let out_reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            clock.saw(&line);
            lines.push(line);
        }
        lines
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let wait = tokio::task::spawn_blocking(move || child.wait());
    let status = match tokio::time::timeout(Duration::from_secs(duration_s + 30), wait).await {
        Ok(status) => status??,
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            anyhow::bail!("{what}: the simulator ran over {} s", duration_s + 30);
        }
    };
    let (out, stderr) =
        tokio::task::spawn_blocking(move || (out_reader.join(), err_reader.join())).await?;
    let out = out.map_err(|_| anyhow!("{what}: the reader of its output panicked"))?;
    let stderr = stderr.unwrap_or_default();
    // Every line, for a look after a failure (the last run of each kind).
    let saved =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rlqs-{what}.jsonl"));
    let mut text = out.join("\n");
    text.push('\n');
    std::fs::write(&saved, text).with_context(|| format!("cannot write {}", saved.display()))?;
    let lines = out
        .iter()
        .map(|l| serde_json::from_str(l))
        .collect::<Result<Vec<Value>, _>>()
        .with_context(|| format!("{what}: a line that is not JSON (in {})", saved.display()))?;
    Ok(Run {
        what: what.to_owned(),
        lines,
        code: status.code(),
        stderr,
        saved: saved.display().to_string(),
    })
}

/// The simulator's arguments: 10 Envoys on `addrs`, skewed demand of twice the limit for
/// `RUN_S` s on the api bucket.
fn skewed(addrs: &str) -> Vec<String> {
    [
        addrs,
        "--envoys",
        "10",
        "--bucket",
        API_BUCKET,
        "--demand",
        "200",
        "--skew",
        "0.8",
        "--duration",
        &RUN_S.to_string(),
        "--limit-rate",
        &LIMIT.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The checks that failed: all of them are reported at once, each run's summary after them.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn done(self, runs: &[&Run]) -> Result<()> {
        let summaries: String = runs.iter().map(ToString::to_string).collect();
        ensure!(
            self.0.is_empty(),
            "{} failed:\n- {}\n{summaries}",
            self.0.len(),
            self.0.join("\n- ")
        );
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_envoys_share_the_rule_and_blanket_and_unmatched_buckets_are_answered() -> Result<()> {
    let Some(py) = python()? else { return Ok(()) };
    let _one_at_a_time = exclusive().await;
    let c = Cluster::start().await?;
    let addrs = c.addrs();

    // Beside the skewed run, three Envoys on the blanket and unmatched buckets for 4 s.
    let blanket_args: Vec<String> = [
        addrs.as_str(),
        "--envoys",
        "3",
        "--bucket",
        r#"{"name":"blocked","tenant":"acme"}"#,
        "--bucket",
        r#"{"name":"open"}"#,
        "--bucket",
        r#"{"name":"nope","tenant":"acme"}"#,
        "--demand",
        "30",
        "--skew",
        "0",
        "--duration",
        "4",
    ]
    .map(str::to_owned)
    .to_vec();
    let (blanket_over, blanket_ended) = tokio::sync::oneshot::channel();
    let blanket = async {
        let run = simulate(&py, "blanket", blanket_args, 4, RunClock::default()).await;
        let _ = blanket_over.send(());
        run
    };
    let streams = async {
        // Once the blanket run is over, the ten skewed Envoys' streams are all there are.
        let _ = blanket_ended.await;
        let last = std::sync::Mutex::new(None);
        let ten = wait_until("ten streams", Duration::from_secs(3), || async {
            let n = c.metric_sum("ringlimit_rlqs_streams").await?;
            if let Ok(mut last) = last.lock() {
                *last = Some(n);
            }
            Ok(n == 10.0)
        })
        .await;
        let last = last.into_inner().ok().flatten();
        ten.map_err(|e| format!("{e:#} (last seen: {last:?})"))
    };
    let (skew, blanket, streams) = tokio::join!(
        simulate(&py, "skewed", skewed(&addrs), RUN_S, RunClock::default()),
        blanket,
        streams,
    );
    let (skew, blanket) = (skew?, blanket?);
    let mut f = Failures::default();

    // The skewed run: the rule's rate over the whole run within 10%, no quiet Envoy starved.
    f.check(skew.ok(), || {
        format!("the skewed run exited {:?}", skew.code)
    });
    let ratio = skew.figure("admitted_ratio");
    f.check((0.9..=1.1).contains(&ratio), || {
        format!("admitted {ratio} x limit x time, want 0.9..1.1")
    });
    let quiet = skew.figure("quiet_worst_ratio");
    f.check(quiet >= 0.9, || {
        format!("a quiet Envoy got {quiet} of its demand, want >= 0.9")
    });
    let reconnects = skew.figure("reconnects");
    f.check(reconnects == 0.0, || {
        format!("{reconnects} streams broke while every node was up (they must last {RUN_S} s)")
    });
    let per = skew.summary()["per_envoy"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    f.check(
        per.len() == 10 && per.iter().all(|e| e["assignments"].as_u64() > Some(0)),
        || "an Envoy got no assignment".into(),
    );
    let strategies = &skew.summary()["buckets"]["name=api,tenant=acme"]["strategies"];
    f.check(*strategies == json!(["token_bucket"]), || {
        format!("the api bucket's strategies: {strategies}, want token buckets")
    });
    // The rates assigned at each second's end add up to the rule's (a little over while a
    // change travels to two streams on two nodes).
    let rate_sum = skew.figure("max_rate_sum");
    f.check(rate_sum <= LIMIT * 1.1, || {
        format!("the assigned rates summed to {rate_sum}/s at a second's end")
    });
    f.check(streams.is_ok(), || {
        format!("ringlimit_rlqs_streams summed over the nodes after the blanket run: {streams:?}")
    });

    // Blanket buckets: denied (allowed) by their assignment, the unmatched one abandoned.
    f.check(blanket.ok(), || {
        format!("the blanket run exited {:?}", blanket.code)
    });
    let buckets = &blanket.summary()["buckets"];
    let blocked = &buckets["name=blocked,tenant=acme"];
    f.check(
        blocked["strategies"] == json!(["deny_all"])
            && blocked["decided_by"]["deny_all"][0] == 0
            && blocked["decided_by"]["deny_all"][1].as_u64() > Some(0)
            && blocked["admitted"] == blocked["decided_by"]["no_assignment"][0],
        || format!("blocked: {blocked}"),
    );
    let open = &buckets["name=open"];
    f.check(
        open["strategies"] == json!(["allow_all"])
            && open["decided_by"]["allow_all"][1] == 0
            && open["decided_by"]["allow_all"][0].as_u64() > Some(0),
        || format!("open: {open}"),
    );
    let nope = &buckets["name=nope,tenant=acme"];
    f.check(
        nope["assignments"] == 0 && nope["abandons"].as_u64() > Some(0),
        || format!("unmatched: {nope}"),
    );
    f.check(
        blanket
            .events("abandon")
            .all(|e| e["bucket"]["name"] == "nope"),
        || "a matched bucket was abandoned".into(),
    );

    // The nodes count what the Envoys got.
    let assignments = c.metric_sum("ringlimit_rlqs_assignments_total").await;
    let abandons = c.metric_sum("ringlimit_rlqs_abandons_total").await;
    let buckets = c.metric_sum("ringlimit_rlqs_buckets").await;
    let (got, abandoned) = (
        skew.figure("assignments") + blanket.figure("assignments"),
        blanket.figure("abandons"),
    );
    f.check(
        matches!(assignments, Ok(n) if n >= got)
            && matches!(abandons, Ok(n) if n >= abandoned)
            && buckets.is_ok(),
        || {
            format!(
                "metrics: assignments {assignments:?}, abandons {abandons:?}, buckets \
                 {buckets:?}; the Envoys got {got} assignments and {abandoned} abandons"
            )
        },
    );
    f.done(&[&skew, &blanket])
}

/// Runs the skewed simulation and, `at_s` seconds into it by its own lines, does `hit` to node
/// `victim`; returns the run and when the hit came, in seconds of the run.
async fn run_and_hit(
    c: &mut Cluster,
    py: &str,
    what: &'static str,
    victim: usize,
    at_s: f64,
    hit: impl FnOnce(&mut ProcessNode) -> Result<()>,
) -> Result<(Run, f64)> {
    let addrs = c.addrs();
    let clock = RunClock::default();
    let run = tokio::spawn({
        let (py, clock) = (py.to_owned(), clock.clone());
        async move { simulate(&py, what, skewed(&addrs), RUN_S, clock).await }
    });
    // A run that ended (`Some(Err)`) is not waited on.
    wait_for(
        &format!("the {what} run {at_s} s in"),
        Duration::from_secs(RUN_S),
        || async {
            if run.is_finished() {
                return Ok(Some(Err(anyhow!("the {what} run ended first"))));
            }
            Ok((clock.seconds() >= at_s).then_some(Ok(())))
        },
    )
    .await??;
    let hit_at = now_s();
    hit(&mut c.nodes[victim])?;
    let run = run.await??;
    let start = run
        .events("start")
        .next()
        .and_then(|s| s["wall"].as_f64())
        .with_context(|| format!("no start line: {run}"))?;
    Ok((run, hit_at - start))
}

/// When `envoy` reconnected after `t` s, and whether it was assigned again after that.
fn reassigned(run: &Run, envoy: usize, t: f64) -> (Option<f64>, bool) {
    let moved = run
        .events("reconnect")
        .find(|e| e["envoy"] == envoy && e["t"].as_f64() >= Some(t - 0.5))
        .and_then(|e| e["t"].as_f64());
    let assigned = moved.is_some_and(|moved| {
        run.events("assignment")
            .any(|e| e["envoy"] == envoy && e["ended"] != true && e["t"].as_f64() > Some(moved))
    });
    (moved, assigned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_of_the_rules_bucket_sigkilled_mid_run() -> Result<()> {
    let Some(py) = python()? else { return Ok(()) };
    let _one_at_a_time = exclusive().await;
    let mut c = Cluster::start().await?;
    let victim = c.owner_of(API_KEY).await?;
    let (run, t_kill) =
        run_and_hit(&mut c, &py, "owner-killed", victim, 5.0, ProcessNode::kill).await?;
    eprintln!("the owner killed {t_kill:.2} s into the run");
    let mut f = Failures::default();
    f.check(run.ok(), || format!("the run exited {:?}", run.code));
    ensure!(
        (2.0..RUN_S as f64 - 5.0).contains(&t_kill),
        "killed at {t_kill} s into the run: {run}"
    );

    // The aggregate: at most 15% over the rule's rate, over the run and after the kill.
    let ratio = run.figure("admitted_ratio");
    f.check(ratio <= 1.15, || {
        format!("admitted {ratio} x limit x time, want <= 1.15")
    });
    let after: Vec<f64> = run
        .seconds()
        .filter(|s| s["t"].as_f64().is_some_and(|t| t >= t_kill.ceil()))
        .map(|s| s["admitted"].as_f64().unwrap_or(0.0))
        .collect();
    let after_ratio = after.iter().sum::<f64>() / (LIMIT * after.len().max(1) as f64);
    f.check(after_ratio <= 1.15, || {
        format!("after the kill (at {t_kill:.2} s) {after_ratio} x limit x time: {after:?}")
    });

    // The Envoys of the killed node moved to another and were assigned again there.
    for envoy in (0..10).filter(|i| i % 3 == victim) {
        let (moved, assigned) = reassigned(&run, envoy, t_kill);
        f.check(assigned, || {
            format!(
                "Envoy {envoy} (on the killed node-{victim}) reconnected at {moved:?} s and was \
                 not assigned again after"
            )
        });
    }
    f.done(&[&run])
}

/// A node that stops (SIGTERM) first ends every assignment it made (TTL 0) and closes its
/// streams, so that its Envoys fall back at once and move to another node, where they are
/// assigned again; the others go on (the stopping node does not own the rule's bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_ends_its_assignments_and_its_envoys_move() -> Result<()> {
    let Some(py) = python()? else { return Ok(()) };
    let _one_at_a_time = exclusive().await;
    let mut c = Cluster::start().await?;
    let owner = c.owner_of(API_KEY).await?;
    let victim = (owner + 1) % 3;
    let (run, t_stop) = run_and_hit(
        &mut c,
        &py,
        "node-stopped",
        victim,
        3.5,
        ProcessNode::terminate,
    )
    .await?;
    eprintln!("a node stopped {t_stop:.2} s into the run");
    let mut f = Failures::default();
    f.check(run.ok(), || format!("the run exited {:?}", run.code));
    for envoy in (0..10).filter(|i| i % 3 == victim) {
        let ended = run
            .events("assignment")
            .find(|e| e["envoy"] == envoy && e["ended"] == true)
            .and_then(|e| e["t"].as_f64());
        f.check(ended.is_some_and(|t| t >= t_stop - 0.5), || {
            format!(
                "Envoy {envoy} (on the stopped node-{victim}) got no TTL 0 after the SIGTERM at \
                 {t_stop:.2} s (first at {ended:?})"
            )
        });
        let (moved, assigned) = reassigned(&run, envoy, t_stop);
        f.check(assigned, || {
            format!(
                "Envoy {envoy} (on the stopped node-{victim}) reconnected at {moved:?} s and was \
                 not assigned again after"
            )
        });
    }
    let ratio = run.figure("admitted_ratio");
    f.check(ratio <= 1.15, || {
        format!("admitted {ratio} x limit x time, want <= 1.15")
    });
    f.done(&[&run])
}

/// The RLQS port's bounds on one real node, through the client envoy-types generates from
/// Envoy's protos, each client on a loopback address of its own (the node shares its room per
/// source address): oversized bucket ids are neither kept nor answered, a client holding the
/// node's whole bucket budget gives way to a new client's bucket, and a count no Envoy can
/// report ends its stream.
mod bounds {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy;
    use futures::channel::mpsc;
    use ringlimit_node::NodeConfig;
    use ringlimit_node::rlqs::config::RlqsConfig;
    use ringlimit_tests::{TestNode, metric};
    use std::collections::HashMap;
    use std::net::IpAddr;

    const CONFIG: &str = r#"
domains:
  - domain: edge
    buckets:
      - bucket: { name: api, tenant: "*" }
        rule: per-second
        key: "{tenant}"
      - bucket: { name: bulk }
        blanket: allow_all
"#;

    /// A simulated Envoy: its reports in, the node's answers out.
    struct Envoy {
        reports: mpsc::UnboundedSender<RateLimitQuotaUsageReports>,
        answers: tonic::Streaming<RateLimitQuotaResponse>,
    }

    impl Envoy {
        /// A stream to `node` from the loopback address `from`.
        async fn connect(node: SocketAddr, from: IpAddr) -> Result<Self> {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{node}"))?
                .local_address(Some(from))
                .connect()
                .await?;
            let mut client = RateLimitQuotaServiceClient::new(channel)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            let (reports, rx) = mpsc::unbounded();
            let answers = client.stream_rate_limit_quotas(rx).await?.into_inner();
            Ok(Self { reports, answers })
        }

        fn send(&self, usages: Vec<BucketQuotaUsage>) -> Result<()> {
            self.reports
                .unbounded_send(RateLimitQuotaUsageReports {
                    domain: "edge".into(),
                    bucket_quota_usages: usages,
                })
                .context("the stream is closed")
        }

        /// The next answer within `within`: `None` when none came.
        async fn next(
            &mut self,
            within: Duration,
        ) -> Result<Option<Result<RateLimitQuotaResponse, tonic::Status>>> {
            match tokio::time::timeout(within, self.answers.message()).await {
                Err(_) => Ok(None),
                Ok(Ok(Some(r))) => Ok(Some(Ok(r))),
                Ok(Ok(None)) => anyhow::bail!("the answers ended"),
                Ok(Err(status)) => Ok(Some(Err(status))),
            }
        }

        /// Reads answers until one names a bucket whose `key` is `value`, within `within`.
        async fn action_for(
            &mut self,
            key: &str,
            value: &str,
            within: Duration,
        ) -> Result<Option<BucketAction>> {
            let until = tokio::time::Instant::now() + within;
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let Some(answer) = self.next(left).await? else {
                    return Ok(None);
                };
                for a in answer?.bucket_action {
                    let named = a
                        .bucket_id
                        .as_ref()
                        .is_some_and(|b| b.bucket.get(key).map(String::as_str) == Some(value));
                    if named {
                        return Ok(a.bucket_action);
                    }
                }
            }
        }
    }

    fn usage(pairs: &[(&str, &str)], allowed: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<HashMap<_, _>>(),
            }),
            time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }
    }

    async fn node() -> Result<TestNode> {
        let mut config = NodeConfig::local("rlqs-bounds");
        config.grpc_addr = Some("127.0.0.1:0".parse()?);
        config.rlqs_config = RlqsConfig::parse("rlqs.yaml", CONFIG)?;
        TestNode::start(config).await
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn oversized_ids_are_not_kept_and_one_client_cannot_crowd_out_another() -> Result<()> {
        let node = node().await?;
        let grpc = node.grpc.context("a gRPC address")?;

        // The junk probe (`bench/rlqs_probe.py junk`): 200 reports, each a new bucket with 1 MiB of
        // junk in its id.
        let mut probe = Envoy::connect(grpc, ip(2)).await?;
        for i in 0..200 {
            let junk = format!("{i:04}{}", "x".repeat(1 << 20));
            probe.send(vec![usage(
                &[("name", "api"), ("tenant", "t1"), ("junk", &junk)],
                1,
            )])?;
        }
        // Then a bucket of its own kind on the same stream: answered, and nothing before it.
        probe.send(vec![usage(&[("name", "bulk"), ("n", "after")], 1)])?;
        let first = probe.next(WAIT).await?.context("no answer")??;
        ensure!(
            first.bucket_action.len() == 1
                && first.bucket_action[0].bucket_id.as_ref().is_some_and(|b| b
                    .bucket
                    .get("n")
                    .map(String::as_str)
                    == Some("after")),
            "the first answer: {:?}",
            first
                .bucket_action
                .iter()
                .map(|a| a
                    .bucket_id
                    .as_ref()
                    .map(|b| b.bucket.keys().collect::<Vec<_>>()))
                .collect::<Vec<_>>()
        );
        let text = node.api().get("/metrics").await?.text;
        let refused = metric(
            &text,
            "ringlimit_rlqs_refused_buckets_total{reason=\"id_too_large\"}",
        );
        let bytes = metric(&text, "ringlimit_rlqs_bytes");
        ensure!(refused == 200.0, "refused {refused}, want 200");
        ensure!(
            (0.0..100_000.0).contains(&bytes),
            "the node holds {bytes} bytes of RLQS state after 200 MiB of ids"
        );

        // The fill probe (`bench/rlqs_probe.py fill`): one client's ten streams of 10,000 buckets
        // fill the node.
        let mut hog = Vec::new();
        for s in 0..10 {
            let e = Envoy::connect(grpc, ip(3)).await?;
            let usages = (0..10_000)
                .map(|i| usage(&[("name", "bulk"), ("n", &format!("{s}-{i}"))], 1))
                .collect();
            e.send(usages)?;
            hog.push(e);
        }
        wait_until("the node holds 100,000 buckets", WAIT * 4, || async {
            let text = node.api().get("/metrics").await?.text;
            Ok(metric(&text, "ringlimit_rlqs_buckets") >= 100_000.0)
        })
        .await?;
        // A well-behaved Envoy's new bucket is admitted (assigned, not abandoned).
        let mut envoy = Envoy::connect(grpc, ip(4)).await?;
        envoy.send(vec![usage(&[("name", "bulk"), ("n", "mine")], 1)])?;
        let got = envoy.action_for("n", "mine", WAIT).await?;
        ensure!(
            matches!(got, Some(BucketAction::QuotaAssignmentAction(_))),
            "the new client's bucket: {got:?}"
        );
        let text = node.api().get("/metrics").await?.text;
        let evicted = metric(&text, "ringlimit_rlqs_evicted_total{what=\"buckets\"}");
        let clients = metric(&text, "ringlimit_rlqs_clients");
        ensure!(evicted >= 1.0, "evicted {evicted}");
        ensure!(clients == 3.0, "clients {clients}");
        drop(hog);

        // 2^64-1 requests in one report: the stream ends INVALID_ARGUMENT, naming the bound.
        envoy.send(vec![usage(
            &[("name", "api"), ("tenant", "acme")],
            u64::MAX,
        )])?;
        let until = tokio::time::Instant::now() + WAIT;
        let status = loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match envoy.next(left).await? {
                Some(Ok(_)) => continue,
                Some(Err(status)) => break status,
                None => anyhow::bail!("the stream did not end"),
            }
        };
        ensure!(
            status.code() == tonic::Code::InvalidArgument
                && status.message().contains("18446744073709551615")
                && status.message().contains("4294967295"),
            "{status:?}"
        );
        node.stop().await
    }
    /// The strategy and TTL of an assignment (`None`: not an assignment).
    fn assignment(a: Option<BucketAction>) -> Option<(rate_limit_strategy::Strategy, Duration)> {
        let Some(BucketAction::QuotaAssignmentAction(q)) = a else {
            return None;
        };
        let ttl = q.assignment_time_to_live?;
        let ttl = Duration::new(
            u64::try_from(ttl.seconds).ok()?,
            u32::try_from(ttl.nanos).ok()?,
        );
        Some((q.rate_limit_strategy?.strategy?, ttl))
    }

    /// A managed block of a rule bucket's key (through the admin API): its streams are pushed a
    /// deny-all living no longer than the block, and their share again when it is lifted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocked_key_is_denied_on_its_streams_until_lifted() -> Result<()> {
        let mut config = NodeConfig::local("rlqs-blocks");
        config.grpc_addr = Some("127.0.0.1:0".parse()?);
        config.rlqs_config = RlqsConfig::parse("rlqs.yaml", CONFIG)?;
        config.admin_token = Some(ADMIN_TOKEN.into());
        let node = TestNode::start(config).await?;
        let grpc = node.grpc.context("a gRPC address")?;
        let mut envoy = Envoy::connect(grpc, ip(5)).await?;
        envoy.send(vec![usage(&[("name", "api"), ("tenant", "acme")], 1)])?;
        let got = assignment(envoy.action_for("tenant", "acme", WAIT).await?);
        ensure!(
            matches!(
                got,
                Some((rate_limit_strategy::Strategy::TokenBucket(_), _))
            ),
            "before the block: {got:?}"
        );

        let r = node
            .api()
            .admin(
                reqwest::Method::PUT,
                "/v1/admin/blocks/acme",
                ADMIN_TOKEN,
                Some(&json!({ "ttl": "5s", "reason": "abuse" })),
            )
            .await?;
        ensure!(r.status == 200, "PUT: {} {}", r.status, r.text);
        let deny = rate_limit_strategy::Strategy::BlanketRule(
            rate_limit_strategy::BlanketRule::DenyAll as i32,
        );
        // The next round (a fraction of a second) pushes it; a token bucket's refresh may come
        // first.
        let until = tokio::time::Instant::now() + WAIT;
        let ttl = loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let got = assignment(envoy.action_for("tenant", "acme", left).await?);
            match got {
                Some((s, ttl)) if s == deny => break ttl,
                Some((rate_limit_strategy::Strategy::TokenBucket(_), _)) => continue,
                other => anyhow::bail!("while blocked: {other:?}"),
            }
        };
        ensure!(
            ttl <= Duration::from_secs(5) && ttl > Duration::ZERO,
            "the deny lives {ttl:?}, past the block's 5 s"
        );

        let r = node
            .api()
            .admin(
                reqwest::Method::DELETE,
                "/v1/admin/blocks/acme",
                ADMIN_TOKEN,
                None,
            )
            .await?;
        ensure!(r.status == 200, "DELETE: {} {}", r.status, r.text);
        envoy.send(vec![usage(&[("name", "api"), ("tenant", "acme")], 1)])?;
        let got = assignment(envoy.action_for("tenant", "acme", WAIT).await?);
        ensure!(
            matches!(
                got,
                Some((rate_limit_strategy::Strategy::TokenBucket(_), _))
            ),
            "after the lift: {got:?}"
        );
        node.stop().await
    }
}
