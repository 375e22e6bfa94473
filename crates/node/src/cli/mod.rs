//! The admin CLI: `ringlimit rules|top|cluster|keys ...`, an HTTP client of a node's admin API
//! (and of `GET /v1/cluster`). It knows nothing of the node's internals: each command is one
//! request ([`ApiRequest`], built from the arguments by [`request`]), sent by [`client`], and
//! its answer printed as a table ([`table`]) or as the server's JSON (`--output json`).
//!
//! Exit codes: 0 on success; 1 when the server answers an error (`error: <code>: <message>
//! (HTTP <status>)` on stderr) or cannot be reached (one line naming the address); 2 on bad usage
//! (clap's, and an unusable `--addr`, `--cacert` or `--file`).

pub mod client;
pub mod table;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// Where the admin commands connect, with what, and how they print.
#[derive(Debug, Clone, Args)]
pub struct Conn {
    /// The node's HTTP API: http://host:port, https://host:port, or host:port (plain HTTP).
    #[arg(
        long,
        env = "RINGLIMIT_ADDR",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub addr: String,
    /// Admin token (bearer). Prefer the RINGLIMIT_ADMIN_TOKEN variable: a flag's value shows in
    /// `ps` and in shell history.
    #[arg(
        long,
        env = "RINGLIMIT_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// PEM file of CA certificates to trust for an https:// address, beside the system's roots.
    #[arg(long, env = "RINGLIMIT_CACERT", value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// How to print the answer: aligned tables, or the server's JSON (pretty-printed).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// How long the whole request may take, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub timeout_ms: u64,
}

/// How answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// The admin commands, beside `serve` in the binary's command line.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// List, read, write and delete rules (admin API).
    #[command(arg_required_else_help = false)]
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// The most denied (or checked) keys of a rule across the cluster (admin API).
    Top(TopArgs),
    /// The members as the node at --addr sees them, quorum and forwarding counters.
    Cluster(ClusterArgs),
    /// A key's bucket: its state (nothing consumed), or its reset on every member (admin API).
    #[command(arg_required_else_help = false)]
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// The blocklist: blocks held, added and removed (admin API).
    #[command(arg_required_else_help = false)]
    Blocks {
        #[command(subcommand)]
        command: BlocksCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum BlocksCommand {
    /// The blocks the node at --addr holds (every member holds the same), a page at a time.
    List(BlocksListArgs),
    /// Block a key, or a network written cidr:203.0.113.0/24, under every rule.
    Add(BlocksAddArgs),
    /// Lift a managed block (or with --rule, the automatic block of a key under that rule).
    Remove(BlocksRemoveArgs),
}

#[derive(Debug, Args)]
pub struct BlocksListArgs {
    /// Only blocks under this rule.
    #[arg(long, value_name = "NAME")]
    pub rule: Option<String>,
    /// Only blocks whose reason contains this.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    #[arg(long, value_parser = ["auto", "managed"])]
    pub source: Option<String>,
    /// Blocks per page (1 to 1000).
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// The page after this cursor (a listing's next_cursor).
    #[arg(long)]
    pub cursor: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct BlocksAddArgs {
    /// The key, or cidr:ADDRESS/LENGTH.
    pub key: String,
    /// How long: 90s, 1h, 7d.
    #[arg(long, value_name = "DURATION")]
    pub ttl: String,
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct BlocksRemoveArgs {
    /// The key, or cidr:ADDRESS/LENGTH.
    pub key: String,
    /// Lift the automatic block of the key under this rule.
    #[arg(long, value_name = "NAME")]
    pub rule: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Every rule in force, from the rules file and the admin API.
    List(RulesListArgs),
    /// One rule in force.
    Get(RuleNameArgs),
    /// Create or replace an API rule (from flags, or from a JSON or YAML file).
    Put(Box<RulesPutArgs>),
    /// Delete an API rule.
    Delete(RulesDeleteArgs),
}

#[derive(Debug, Args)]
pub struct RulesListArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct RuleNameArgs {
    /// The rule's name.
    pub name: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// Algorithms, modes and policies as the rules file names them (the server checks them too).
const ALGORITHMS: [&str; 5] = [
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

#[derive(Debug, Args)]
pub struct RulesPutArgs {
    /// The rule's name.
    pub name: String,
    /// Requests (or cost) allowed per period.
    #[arg(long, value_name = "N", required_unless_present = "file")]
    pub limit: Option<u64>,
    /// The period as the rules file writes it: 250ms, 10s, 1m, 1h, 1d.
    #[arg(long, value_name = "PERIOD", required_unless_present = "file")]
    pub period: Option<String>,
    #[arg(long, value_parser = ALGORITHMS)]
    pub algorithm: Option<String>,
    /// Capacity of a token or leaky bucket (default: the limit).
    #[arg(long, value_name = "N")]
    pub burst: Option<u64>,
    #[arg(long, value_parser = ["owner", "global"])]
    pub mode: Option<String>,
    /// What checks do while a bucket's owner cannot be reached.
    #[arg(long, value_parser = ["open", "closed"])]
    pub on_owner_unreachable: Option<String>,
    /// Decided and counted, never denies (answers say shadow_denied).
    #[arg(long)]
    pub shadow: bool,
    /// Whether hot buckets may be leased to nodes and SDKs.
    #[arg(long, value_parser = ["auto", "off"])]
    pub lease: Option<String>,
    /// The key template of a gateway's requests (forward auth), e.g. apikey:{header:x-api-key}.
    #[arg(long, value_name = "TEMPLATE")]
    pub request_key: Option<String>,
    /// The rule's fields as a JSON or YAML object, from a file or `-` (standard input), instead
    /// of the flags above.
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with_all = [
        "limit", "period", "algorithm", "burst", "mode", "on_owner_unreachable", "shadow",
        "lease", "request_key",
    ])]
    pub file: Option<PathBuf>,
    /// Only if the rule's version is still this one (from `rules get`; `*`: it must exist).
    #[arg(long, value_name = "VERSION")]
    pub if_match: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct RulesDeleteArgs {
    /// The rule's name.
    pub name: String,
    /// Only if the rule's version is still this one (from `rules get`).
    #[arg(long, value_name = "VERSION")]
    pub if_match: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The rule (an inline rule by its derived name, e.g. 10-per-1000ms).
    #[arg(long, value_name = "NAME")]
    pub rule: String,
    /// Rank keys by denied checks or by checks.
    #[arg(long, value_parser = ["denied", "checks"], default_value = "denied")]
    pub by: String,
    /// How many keys.
    #[arg(short = 'n', value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub n: u64,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// A key's bucket, its owner and its state (a cost-0 check: nothing consumed).
    Get(KeyArgs),
    /// Drop a key's bucket (and its fallback shares) on every member.
    Reset(KeyArgs),
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The key (any string: it is percent-encoded into the path).
    pub key: String,
    #[command(flatten)]
    pub rule: KeyRule,
    #[command(flatten)]
    pub conn: Conn,
}

/// A key's rule: a named one, or inline parameters as in a check.
#[derive(Debug, Args)]
pub struct KeyRule {
    /// A configured rule.
    #[arg(long, value_name = "NAME", required_unless_present = "limit",
          conflicts_with_all = ["limit", "period_ms", "algorithm", "burst"])]
    pub rule: Option<String>,
    /// An inline rule's limit (with --period-ms).
    #[arg(long, value_name = "N", requires = "period_ms")]
    pub limit: Option<u64>,
    /// An inline rule's period in milliseconds.
    #[arg(long, value_name = "MS", requires = "limit")]
    pub period_ms: Option<u64>,
    /// An inline rule's algorithm.
    #[arg(long, value_parser = ALGORITHMS, requires = "limit")]
    pub algorithm: Option<String>,
    /// An inline rule's burst.
    #[arg(long, value_name = "N", requires = "limit")]
    pub burst: Option<u64>,
}

/// One admin API request, as the arguments give it (the address comes from [`Conn`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub method: reqwest::Method,
    /// Path segments, unencoded (the key of `keys` may hold any character).
    pub path: Vec<String>,
    pub query: Vec<(String, String)>,
    pub body: Option<Value>,
    /// The `If-Match` header's value, quoted.
    pub if_match: Option<String>,
    /// Whether the admin token is sent (not for `GET /v1/cluster`).
    pub auth: bool,
    /// How a successful answer is printed as a table.
    pub view: View,
}

/// What a successful answer is, for the tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    RuleList,
    Rule,
    Deleted(String),
    Top,
    Cluster,
    KeyState,
    KeyReset,
    BlockList,
    Block,
    Unblocked(String),
}

/// Bad input the arguments parser cannot see (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn segments(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The value of `If-Match` for a version given on the command line: quoted as an entity tag
/// unless it is `*` or quoted already.
pub fn if_match_header(version: &str) -> String {
    let v = version.trim();
    if v == "*" || (v.len() >= 2 && v.starts_with('"') && v.ends_with('"')) {
        v.to_owned()
    } else {
        format!("\"{v}\"")
    }
}

/// The rule's fields from `rules put`'s flags, as the PUT body.
pub fn rule_body(a: &RulesPutArgs) -> Value {
    let mut m = Map::new();
    if let Some(limit) = a.limit {
        m.insert("limit".into(), limit.into());
    }
    let strings = [
        ("period", &a.period),
        ("algorithm", &a.algorithm),
        ("mode", &a.mode),
        ("on_owner_unreachable", &a.on_owner_unreachable),
        ("lease", &a.lease),
        ("request_key", &a.request_key),
    ];
    for (field, value) in strings {
        if let Some(v) = value {
            m.insert(field.into(), v.clone().into());
        }
    }
    if let Some(burst) = a.burst {
        m.insert("burst".into(), burst.into());
    }
    if a.shadow {
        m.insert("shadow".into(), true.into());
    }
    Value::Object(m)
}

/// A rule's fields from a JSON or YAML document (`--file`): it must be one object.
pub fn rule_from_document(text: &str) -> Result<Value, UsageError> {
    // YAML 1.2 reads JSON too; a JSON parse first gives JSON's own messages.
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(json) => serde_yaml_ng::from_str(text).map_err(|yaml| {
            if text.trim_start().starts_with('{') {
                UsageError(format!("not a JSON object: {json}"))
            } else {
                UsageError(format!("not a YAML object: {yaml}"))
            }
        })?,
    };
    match value {
        Value::Object(_) => Ok(value),
        _ => Err(UsageError(
            "the rule must be an object of the rules file's fields (limit, period, ...)".into(),
        )),
    }
}

fn read_document(path: &std::path::Path) -> Result<String, UsageError> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| UsageError(format!("cannot read the rule from standard input: {e}")))?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))
    }
}

fn key_query(rule: &KeyRule) -> Vec<(String, String)> {
    let mut q = Vec::new();
    if let Some(name) = &rule.rule {
        q.push(("rule".into(), name.clone()));
    }
    let numbers = [
        ("limit", rule.limit),
        ("period_ms", rule.period_ms),
        ("burst", rule.burst),
    ];
    for (field, value) in numbers {
        if let Some(v) = value {
            q.push((field.into(), v.to_string()));
        }
    }
    if let Some(a) = &rule.algorithm {
        q.push(("algorithm".into(), a.clone()));
    }
    q
}

/// The request a command makes, and the connection flags it was given. `read` gives the text of
/// `rules put --file` (a path, or `-` for standard input).
pub fn request(
    command: &AdminCommand,
    read: impl Fn(&std::path::Path) -> Result<String, UsageError>,
) -> Result<(ApiRequest, &Conn), UsageError> {
    use reqwest::Method;
    let plain = |method: Method, path: Vec<String>, view: View| ApiRequest {
        method,
        path,
        query: Vec::new(),
        body: None,
        if_match: None,
        auth: true,
        view,
    };
    Ok(match command {
        AdminCommand::Rules { command } => match command {
            RulesCommand::List(a) => (
                plain(
                    Method::GET,
                    segments(&["v1", "admin", "rules"]),
                    View::RuleList,
                ),
                &a.conn,
            ),
            RulesCommand::Get(a) => (
                plain(
                    Method::GET,
                    segments(&["v1", "admin", "rules", &a.name]),
                    View::Rule,
                ),
                &a.conn,
            ),
            RulesCommand::Put(a) => {
                let body = match &a.file {
                    Some(path) => rule_from_document(&read(path)?)?,
                    None => rule_body(a),
                };
                let mut r = plain(
                    Method::PUT,
                    segments(&["v1", "admin", "rules", &a.name]),
                    View::Rule,
                );
                r.body = Some(body);
                r.if_match = a.if_match.as_deref().map(if_match_header);
                (r, &a.conn)
            }
            RulesCommand::Delete(a) => {
                let mut r = plain(
                    Method::DELETE,
                    segments(&["v1", "admin", "rules", &a.name]),
                    View::Deleted(a.name.clone()),
                );
                r.if_match = a.if_match.as_deref().map(if_match_header);
                (r, &a.conn)
            }
        },
        AdminCommand::Top(a) => {
            let mut r = plain(Method::GET, segments(&["v1", "admin", "top"]), View::Top);
            r.query = vec![
                ("rule".into(), a.rule.clone()),
                ("by".into(), a.by.clone()),
                ("n".into(), a.n.to_string()),
            ];
            (r, &a.conn)
        }
        AdminCommand::Cluster(a) => {
            let mut r = plain(Method::GET, segments(&["v1", "cluster"]), View::Cluster);
            r.auth = false;
            (r, &a.conn)
        }
        AdminCommand::Keys { command } => {
            let (a, method, path, view) = match command {
                KeysCommand::Get(a) => (
                    a,
                    Method::GET,
                    segments(&["v1", "admin", "keys", &a.key]),
                    View::KeyState,
                ),
                KeysCommand::Reset(a) => (
                    a,
                    Method::POST,
                    segments(&["v1", "admin", "keys", &a.key, "reset"]),
                    View::KeyReset,
                ),
            };
            let mut r = plain(method, path, view);
            r.query = key_query(&a.rule);
            (r, &a.conn)
        }
        AdminCommand::Blocks { command } => match command {
            BlocksCommand::List(a) => {
                let mut r = plain(
                    Method::GET,
                    segments(&["v1", "admin", "blocks"]),
                    View::BlockList,
                );
                let limit = a.limit.map(|n| n.to_string());
                let pairs = [
                    ("rule", &a.rule),
                    ("reason", &a.reason),
                    ("source", &a.source),
                    ("limit", &limit),
                    ("cursor", &a.cursor),
                ];
                r.query = pairs
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_owned(), v.clone()?)))
                    .collect();
                (r, &a.conn)
            }
            BlocksCommand::Add(a) => {
                let mut r = plain(
                    Method::PUT,
                    segments(&["v1", "admin", "blocks", &a.key]),
                    View::Block,
                );
                r.body = Some(serde_json::json!({ "ttl": a.ttl, "reason": a.reason }));
                (r, &a.conn)
            }
            BlocksCommand::Remove(a) => {
                let mut r = plain(
                    Method::DELETE,
                    segments(&["v1", "admin", "blocks", &a.key]),
                    View::Unblocked(a.key.clone()),
                );
                r.query = a
                    .rule
                    .iter()
                    .map(|rule| ("rule".to_owned(), rule.clone()))
                    .collect();
                (r, &a.conn)
            }
        },
    })
}

/// Runs an admin command: one request, its answer printed. Returns the process' exit code.
pub fn run(command: AdminCommand) -> ExitCode {
    let (req, conn) = match request(&command, read_document) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ringlimit: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringlimit: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(client::call(conn, &req));
    match outcome {
        Ok(reply) => match print_reply(&req, conn.output, &reply) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(client::CallError::Usage(e)) => {
            eprintln!("ringlimit: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(hint) = e.hint() {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Prints a successful answer: the server's JSON, or the command's table.
fn print_reply(req: &ApiRequest, output: Output, reply: &client::Reply) -> Result<(), String> {
    let text = match output {
        Output::Json if reply.body.trim().is_empty() => return Ok(()),
        Output::Json => table::pretty_json(&reply.body)
            .map_err(|e| format!("the server's answer is not JSON ({e}): {}", reply.snippet()))?,
        Output::Table => {
            let value: Value = if reply.body.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&reply.body).map_err(|e| {
                    format!("the server's answer is not JSON ({e}): {}", reply.snippet())
                })?
            };
            table::render(&req.view, &value)
        }
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth a message.
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
    Ok(())
}

#[cfg(test)]
mod tests;
