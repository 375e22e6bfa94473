//! The alerts and the dashboard in `deploy/` against a real Prometheus (Debian's `prometheus`
//! package) that scrapes a real 3-node cluster (the `ringlimit` binary, `ProcessNode`).
//!
//! Every PromQL expression of the alerts (`deploy/prometheus/ringlimit.rules.yaml`) and of the
//! dashboard (`deploy/grafana/ringlimit-dashboard.json`, template variables substituted) is
//! sent to Prometheus' query API: it must be accepted, every `ringlimit_*` metric it names must
//! be one Prometheus scraped from the nodes (a misspelt or removed metric fails here, not on an
//! operator's empty graph), and it must return data where this scenario has some: every
//! dashboard query, and the alerts the scenario sets off (one node with other rules, one whose
//! rules file is refused), while the alerts of a healthy cluster return nothing. Prometheus
//! also loads the rules file itself and must evaluate every rule without error.
//!
//! Without `prometheus` on PATH the test is skipped with a message, unless `CI` is set: there
//! (`.ci/run` installs the package) a missing Prometheus fails it. The files-only checks (the
//! PrometheusRule the same as the plain file, every alert unit-tested both ways) need nothing.
//! `deploy/prometheus/check.sh` runs promtool's checks and unit tests.

use anyhow::{Context, Result, anyhow, bail, ensure};
use ringlimit_tests::{ProcessNode, TempDir, exclusive, wait_for, wait_until};
use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Metrics an expression may name before any node exports them, each with why. Any other
/// `ringlimit_*` name that Prometheus did not scrape fails the test.
const PENDING_METRICS: &[(&str, &str)] = &[
    (
        "ringlimit_tls_cert_expiry_seconds",
        "exported only by nodes with --tls-cert or --peer-tls-cert; this scenario's nodes serve \
         plain HTTP (tls:: tests read it from nodes that have certificates)",
    ),
    (
        "ringlimit_region_up",
        "exported only by nodes with --region (one series per other region); this scenario's \
         nodes are one region",
    ),
];

/// Longest wait for Prometheus: to start, to have scraped what the test did, to evaluate rules.
const PROM_WAIT: Duration = Duration::from_secs(60);

/// How the template variables of the dashboard are replaced in the test: the scrape job is
/// `ringlimit`, every node and rule selected, rates over a minute (Prometheus scrapes every
/// second here).
const VARIABLES: &[(&str, &str)] = &[
    ("$__rate_interval", "1m"),
    ("$__interval", "5s"),
    ("$__range", "5m"),
    ("$job", "ringlimit"),
    ("$instance", ".*"),
    ("$rule", ".*"),
];

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

fn read_yaml(path: &Path) -> Result<Yaml> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))
}

/// What a query must return in the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A non-empty result.
    Data,
    /// Nothing (an alert of a healthy cluster).
    Nothing,
    /// Either (check latency on a debug build on a busy machine).
    Any,
}

/// One PromQL expression of the deploy files.
#[derive(Debug, Clone)]
struct Expr {
    /// Where it comes from (an alert's name, a dashboard panel's title).
    origin: String,
    promql: String,
    want: Want,
}

/// Expressions by where they come from: `(origin, PromQL)`.
type Sourced = Vec<(String, String)>;

/// Each alert's `(name, expr)`, in file order.
fn alerts() -> Result<Sourced> {
    let doc = read_yaml(&deploy("prometheus/ringlimit.rules.yaml"))?;
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().context("no groups")? {
        for rule in group["rules"]
            .as_sequence()
            .context("a group without rules")?
        {
            let name = rule["alert"].as_str().context("a rule without `alert`")?;
            let expr = rule["expr"].as_str().context("an alert without `expr`")?;
            out.push((name.to_owned(), expr.to_owned()));
        }
    }
    Ok(out)
}

/// Every panel target's expression, and every template variable's query, of the dashboard.
fn dashboard() -> Result<(Sourced, Vec<String>)> {
    let path = deploy("grafana/ringlimit-dashboard.json");
    let text = std::fs::read_to_string(&path)?;
    let dash: Value = serde_json::from_str(&text).context("the dashboard is not JSON")?;
    let mut exprs = Vec::new();
    fn panels(list: &Value, exprs: &mut Sourced) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for (i, t) in p["targets"].as_array().into_iter().flatten().enumerate() {
                if let Some(e) = t["expr"].as_str() {
                    exprs.push((format!("panel {title:?} target {i}"), e.to_owned()));
                }
            }
            panels(&p["panels"], exprs);
        }
    }
    panels(&dash["panels"], &mut exprs);
    let vars = dash["templating"]["list"]
        .as_array()
        .context("no templating")?
        .iter()
        .filter_map(|v| v["definition"].as_str().map(str::to_owned))
        .collect();
    Ok((exprs, vars))
}

/// `expr` with the dashboard's template variables replaced (longest names first, so that
/// `$__rate_interval` is not read as `$__range`...); none may be left.
fn substitute(expr: &str) -> Result<String> {
    let mut vars = VARIABLES.to_vec();
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_owned();
    for (name, value) in vars {
        out = out.replace(&format!("${{{}}}", &name[1..]), value);
        out = out.replace(name, value);
    }
    ensure!(
        !out.contains('$'),
        "a template variable the test does not know in {expr:?}"
    );
    Ok(out)
}

/// The `ringlimit_*` metric names an expression uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("ringlimit_") {
        let start = i + at;
        let preceded = start > 0 && {
            let c = bytes[start - 1];
            c.is_ascii_alphanumeric() || c == b'_' || c == b'"'
        };
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| start + n);
        if !preceded {
            names.insert(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// Everything the test checks of an expression's names, apart from Prometheus: pending ones
/// allowed.
fn pending(name: &str) -> bool {
    PENDING_METRICS.iter().any(|(n, _)| *n == name)
}

#[test]
fn the_prometheusrule_is_the_rules_file_and_every_alert_is_unit_tested_both_ways() -> Result<()> {
    let plain = read_yaml(&deploy("prometheus/ringlimit.rules.yaml"))?;
    let wrapped = read_yaml(&deploy("k8s/prometheusrule.yaml"))?;
    assert_eq!(
        wrapped["apiVersion"],
        Yaml::from("monitoring.coreos.com/v1")
    );
    assert_eq!(wrapped["kind"], Yaml::from("PrometheusRule"));
    assert!(
        plain["groups"] == wrapped["spec"]["groups"],
        "deploy/k8s/prometheusrule.yaml's groups differ from deploy/prometheus/ringlimit.rules.yaml: \
         run deploy/prometheus/check.sh --write"
    );
    // Not in the kustomize base: validate.sh checks it against schemas that lack the CRD.
    let kustomization = std::fs::read_to_string(deploy("k8s/kustomization.yaml"))?;
    assert!(!kustomization.contains("prometheusrule.yaml"));

    let names: Vec<String> = alerts()?.into_iter().map(|(n, _)| n).collect();
    assert!(names.len() >= 8, "{names:?}");
    let tests = read_yaml(&deploy("prometheus/ringlimit.rules.test.yaml"))?;
    // For each alert: (a case where it fires with annotations, a case where nothing fires).
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for t in tests["tests"].as_sequence().context("no tests")? {
        for case in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"]
                .as_str()
                .context("a case without alertname")?;
            let exp = case["exp_alerts"].as_sequence().context("no exp_alerts")?;
            let entry = seen.entry(name.to_owned()).or_default();
            if exp.is_empty() {
                entry.1 = true;
            } else if exp.iter().all(|a| {
                a["exp_labels"]["severity"].as_str().is_some()
                    && ["summary", "description", "runbook"]
                        .iter()
                        .all(|k| a["exp_annotations"][*k].as_str().is_some())
            }) {
                entry.0 = true;
            }
        }
    }
    for name in &names {
        let (fires, quiet) = seen.get(name).copied().unwrap_or_default();
        assert!(
            fires && quiet,
            "{name}: needs a promtool test where it fires (severity, summary, description, runbook) \
             and one where it does not (fires: {fires}, quiet: {quiet})"
        );
    }
    let unknown: Vec<_> = seen.keys().filter(|n| !names.contains(n)).collect();
    assert!(unknown.is_empty(), "tests of no alert: {unknown:?}");
    Ok(())
}

#[test]
fn the_name_finder_and_the_substitution() -> Result<()> {
    assert_eq!(
        metric_names(
            "sum(rate(ringlimit_a_total{job=\"ringlimit\", x=\"ringlimit_no\"}[1m])) / ringlimit_b"
        ),
        BTreeSet::from(["ringlimit_a_total".to_owned(), "ringlimit_b".to_owned()])
    );
    assert_eq!(
        substitute("rate(x{job=\"$job\",i=~\"${instance}\"}[$__rate_interval])")?,
        "rate(x{job=\"ringlimit\",i=~\".*\"}[1m])"
    );
    assert!(substitute("rate(x[$nope])").is_err());
    Ok(())
}

/// A Prometheus server of its own (its config, data directory and loopback port), killed and
/// its directory removed on drop.
struct Prometheus {
    child: Child,
    base: String,
    dir: TempDir,
    http: reqwest::Client,
    /// The `ringlimit_*` names it has scraped (read by [`Prometheus::learn_names`]).
    names: BTreeSet<String>,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where `prometheus` is, if on PATH.
fn prometheus_binary() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    })
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Prometheus {
    /// Starts `bin` scraping `targets` every second in job `ringlimit`, with the rules file
    /// loaded; waits (bounded) until it is ready.
    async fn start(bin: &Path, targets: &[String]) -> Result<Self> {
        let dir = TempDir::new("prometheus")?;
        let rules = deploy("prometheus/ringlimit.rules.yaml").canonicalize()?;
        let config = json!({
            "global": { "scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s" },
            "rule_files": [rules],
            "scrape_configs": [{
                "job_name": "ringlimit",
                "static_configs": [{ "targets": targets }],
            }],
        });
        // JSON is YAML.
        std::fs::write(dir.0.join("prometheus.yml"), config.to_string())?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.0.join("prometheus.log"))?;
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut prom = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            names: BTreeSet::new(),
        };
        let (http, ready_url) = (prom.http.clone(), format!("{}/-/ready", prom.base));
        let child = &mut prom.child;
        // Ready, or exited (`Some(Err)`: no use waiting on).
        let ready = wait_for("prometheus ready", PROM_WAIT, || {
            let exited = child.try_wait().ok().flatten();
            let ask = http.get(&ready_url).send();
            async move {
                if let Some(status) = exited {
                    return Ok(Some(Err(anyhow!("prometheus exited ({status})"))));
                }
                let ok = ask.await.is_ok_and(|r| r.status().is_success());
                Ok(ok.then_some(Ok(())))
            }
        })
        .await;
        match ready.and_then(|r| r) {
            Ok(()) => Ok(prom),
            Err(e) => bail!("{e:#}; its log:\n{}", prom.log()),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("prometheus.log")).unwrap_or_default()
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .query(query)
            .send()
            .await?;
        let status = r.status();
        let body: Value = r.json().await.context("not JSON")?;
        ensure!(
            status.is_success() && body["status"] == "success",
            "{status}: {} {}",
            body["errorType"],
            body["error"]
        );
        Ok(body["data"].clone())
    }

    /// The result of an instant query: its samples (a vector's; a scalar counts as one).
    async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self.get("/api/v1/query", &[("query", promql)]).await?;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            Some("scalar" | "string") => Ok(vec![data["result"].clone()]),
            other => bail!("unexpected result type {other:?}"),
        }
    }

    /// A one-number query's value.
    async fn value(&self, promql: &str) -> Result<f64> {
        let r = self.query(promql).await?;
        let v = r.first().with_context(|| format!("no data for {promql}"))?;
        v["value"][1]
            .as_str()
            .context("no value")?
            .parse()
            .context("not a number")
    }

    async fn learn_names(&mut self) -> Result<()> {
        let names = self.get("/api/v1/label/__name__/values", &[]).await?;
        self.names = names
            .as_array()
            .context("not a list")?
            .iter()
            .filter_map(|n| n.as_str())
            .filter(|n| n.starts_with("ringlimit_"))
            .map(str::to_owned)
            .collect();
        ensure!(!self.names.is_empty(), "no ringlimit_* metric scraped");
        Ok(())
    }

    /// Checks an expression as the test does: every `ringlimit_*` name it uses was scraped (or
    /// is pending), and Prometheus accepts it; returns how many samples it returned.
    async fn check(&self, promql: &str) -> Result<usize> {
        let unknown: Vec<String> = metric_names(promql)
            .into_iter()
            .filter(|n| !self.names.contains(n) && !pending(n))
            .collect();
        ensure!(
            unknown.is_empty(),
            "names metrics Prometheus did not scrape from the nodes: {unknown:?}"
        );
        Ok(self
            .query(promql)
            .await
            .context("refused by Prometheus")?
            .len())
    }
}

/// Rules every node has; node-2 has one more (so that the nodes' rules differ).
const RULES: &str = "rules:\n  - { name: api, limit: 5, period: 1h }\n";
const RULES_NODE_2: &str =
    "rules:\n  - { name: api, limit: 5, period: 1h }\n  - { name: extra, limit: 1, period: 1h }\n";
/// Keys checked under each rule, and checks of each.
const KEYS: usize = 12;
const API_CHECKS: usize = 7;
const INLINE_CHECKS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_alert_and_dashboard_query_runs_on_a_real_prometheus_scraping_a_real_cluster()
-> Result<()> {
    let Some(bin) = prometheus_or_skip()? else {
        return Ok(());
    };
    let _one = exclusive().await;
    let files = TempDir::new("prometheus-rules")?;
    let (nodes, rules) = three_nodes_with_rules_files(&files).await?;
    let targets: Vec<String> = nodes.iter().map(|n| n.http.to_string()).collect();
    let mut prom = Prometheus::start(&bin, &targets).await?;
    wait_until("prometheus scraped the 3 nodes", PROM_WAIT, || async {
        Ok(prom.value(r#"count(up{job="ringlimit"} == 1)"#).await.ok() == Some(3.0))
    })
    .await?;
    let checks = traffic_through_every_node(&nodes).await?;
    // node-0's rules file turns invalid: refused, the previous rules stay.
    std::fs::write(
        &rules[0],
        "rules:\n  - { name: api, limit: 0, period: 1h }\n",
    )?;
    wait_until(
        "prometheus scraped every check and the refusal",
        PROM_WAIT,
        || async {
            let scraped = prom
                .value(r#"sum(ringlimit_checks_total{job="ringlimit"})"#)
                .await
                .ok();
            let refused = prom
                .value(r#"sum(ringlimit_rules_last_reload_successful{job="ringlimit"} == bool 0)"#)
                .await
                .ok();
            Ok(scraped == Some(checks as f64) && refused == Some(1.0))
        },
    )
    .await?;
    prom.learn_names().await?;

    the_checker_fails_unknown_metrics_and_bad_queries(&prom).await?;
    per_rule_counts_are_exact(&prom).await?;
    let (exprs, variables) = expressions()?;
    every_expression_runs(&prom, &exprs, &variables).await?;
    let alerts = exprs
        .iter()
        .filter(|e| e.origin.starts_with("alert"))
        .count();
    prometheus_evaluates_every_rule(&prom, alerts).await?;
    drop(prom);
    drop(nodes);
    Ok(())
}

/// The `prometheus` binary; `None` (the test skipped, said on stdout) without one, unless `CI`
/// is set.
fn prometheus_or_skip() -> Result<Option<PathBuf>> {
    let bin = prometheus_binary();
    if bin.is_none() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty());
        ensure!(
            !ci,
            "prometheus is not installed and CI is set: .ci/run installs Debian's prometheus package"
        );
        println!(
            "SKIPPED prometheus::every_alert_and_dashboard_query_runs_on_a_real_prometheus_scraping_a_real_cluster: \
             no `prometheus` on PATH (apt-get install prometheus); under CI=true this fails"
        );
    }
    Ok(bin)
}

/// Three processes with a secret, each with its rules file in `files` (node-2's has one rule
/// more), ready; the nodes and their rules files.
async fn three_nodes_with_rules_files(files: &TempDir) -> Result<(Vec<ProcessNode>, Vec<PathBuf>)> {
    let rules: Vec<PathBuf> = (0..3)
        .map(|i| files.0.join(format!("rules-{i}.yaml")))
        .collect();
    for (i, path) in rules.iter().enumerate() {
        std::fs::write(path, if i == 2 { RULES_NODE_2 } else { RULES })?;
    }
    let nodes = ProcessNode::cluster(3, |i, spec| {
        spec.secret = Some("prometheus-test-secret".into());
        spec.args = vec![
            "--config".into(),
            rules[i].display().to_string(),
            "--config-poll-ms".into(),
            "100".into(),
            // A debug build on a busy CI machine can miss the 25 ms default: a forwarded check
            // answered fail-open would set off the fail-open alerts this test expects quiet.
            "--forward-timeout-ms".into(),
            "2000".into(),
        ];
    })
    .await?;
    for n in &nodes {
        n.wait_ready().await?;
    }
    Ok((nodes, rules))
}

/// Traffic through every node: a named rule (5 of 7 allowed per key) and inline rules (2 of
/// 3), keys spread over the owners (forwarded checks, peer RPC). Returns the checks made.
async fn traffic_through_every_node(nodes: &[ProcessNode]) -> Result<usize> {
    let mut checks = 0usize;
    for k in 0..KEYS {
        let node = &nodes[k % nodes.len()];
        for _ in 0..API_CHECKS {
            let r = node
                .check(&json!({ "key": format!("user:{k}"), "rule": "api" }))
                .await?;
            ensure!(r.status == 200 || r.status == 429, "{}", r.text);
            checks += 1;
        }
        for _ in 0..INLINE_CHECKS {
            let r = node
                .check(&json!({ "key": format!("ip:{k}"), "limit": 2, "period_ms": 3_600_000 }))
                .await?;
            ensure!(r.status == 200 || r.status == 429, "{}", r.text);
            checks += 1;
        }
    }
    Ok(checks)
}

/// The checker itself: a metric no node exports, and a query Prometheus refuses, fail it.
async fn the_checker_fails_unknown_metrics_and_bad_queries(prom: &Prometheus) -> Result<()> {
    let bogus = prom.check("rate(ringlimit_no_such_metric_total[1m])").await;
    ensure!(
        bogus
            .as_ref()
            .is_err_and(|e| e.to_string().contains("ringlimit_no_such_metric_total")),
        "the checker let a metric that does not exist through: {bogus:?}"
    );
    ensure!(
        prom.check("rate(ringlimit_checks_total[1m]").await.is_err(),
        "the checker let a malformed query through"
    );
    Ok(())
}

/// Per rule, across the nodes: exactly what was checked.
async fn per_rule_counts_are_exact(prom: &Prometheus) -> Result<()> {
    let by_rule = prom
        .query(r#"sum by (rule, result) (ringlimit_rule_checks_total{job="ringlimit"})"#)
        .await?;
    let count = |rule: &str, result: &str| -> f64 {
        by_rule
            .iter()
            .find(|s| s["metric"]["rule"] == rule && s["metric"]["result"] == result)
            .and_then(|s| s["value"][1].as_str()?.parse().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(count("api", "allowed"), (KEYS * 5) as f64, "{by_rule:?}");
    assert_eq!(count("api", "denied"), (KEYS * 2) as f64, "{by_rule:?}");
    assert_eq!(count("inline", "allowed"), (KEYS * 2) as f64, "{by_rule:?}");
    assert_eq!(count("inline", "denied"), KEYS as f64, "{by_rule:?}");
    Ok(())
}

/// Every alert's and dashboard target's expression with what this scenario should make of it,
/// and the dashboard's template variables' queries.
fn expressions() -> Result<(Vec<Expr>, Vec<String>)> {
    let mut exprs = Vec::new();
    for (name, promql) in alerts()? {
        // What this scenario sets off; check latency depends on the machine (a debug build).
        let want = match name.as_str() {
            "RinglimitRulesDiverging" | "RinglimitRulesReloadFailing" => Want::Data,
            "RinglimitCheckLatencyHigh" => Want::Any,
            _ => Want::Nothing,
        };
        exprs.push(Expr {
            origin: format!("alert {name}"),
            promql,
            want,
        });
    }
    let (panels, variables) = dashboard()?;
    for (origin, promql) in panels {
        let want = if metric_names(&promql).iter().any(|n| pending(n)) {
            Want::Any
        } else {
            Want::Data
        };
        exprs.push(Expr {
            origin,
            promql: substitute(&promql)?,
            want,
        });
    }
    Ok((exprs, variables))
}

/// Every expression runs and returns what it should; the template variables' queries
/// (label_values(...), not PromQL) name metrics that exist.
async fn every_expression_runs(
    prom: &Prometheus,
    exprs: &[Expr],
    variables: &[String],
) -> Result<()> {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for e in exprs {
        match prom.check(&e.promql).await {
            Err(err) => failures.push(format!("{}: {err:#}\n    {}", e.origin, e.promql)),
            Ok(n) => {
                report.push(format!("{n:>3} samples  {}", e.origin));
                let ok = match e.want {
                    Want::Data => n > 0,
                    Want::Nothing => n == 0,
                    Want::Any => true,
                };
                if !ok {
                    failures.push(format!(
                        "{}: {n} samples, wanted {:?}\n    {}",
                        e.origin, e.want, e.promql
                    ));
                }
            }
        }
    }
    for v in variables {
        let unknown: Vec<_> = metric_names(v)
            .into_iter()
            .filter(|n| !prom.names.contains(n))
            .collect();
        if !unknown.is_empty() {
            failures.push(format!(
                "template variable {v:?}: unknown metrics {unknown:?}"
            ));
        }
    }
    println!(
        "checked {} expressions ({} alerts, {} dashboard targets) and {} template queries against Prometheus:\n{}",
        exprs.len(),
        exprs
            .iter()
            .filter(|e| e.origin.starts_with("alert"))
            .count(),
        exprs
            .iter()
            .filter(|e| e.origin.starts_with("panel"))
            .count(),
        variables.len(),
        report.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Prometheus evaluates the rules file itself: all `alerts` rules healthy.
async fn prometheus_evaluates_every_rule(prom: &Prometheus, alerts: usize) -> Result<()> {
    wait_until("prometheus evaluated every rule", PROM_WAIT, || async {
        let data = prom.get("/api/v1/rules", &[]).await?;
        let rules: Vec<&Value> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        let bad: Vec<_> = rules
            .iter()
            .filter(|r| r["health"] == "err")
            .map(|r| format!("{}: {}", r["name"], r["lastError"]))
            .collect();
        ensure!(bad.is_empty(), "rules failing in Prometheus: {bad:?}");
        Ok(rules.len() == alerts && rules.iter().all(|r| r["health"] == "ok"))
    })
    .await
}
