//! Printing answers: aligned tables (a small aligner of our own: columns padded to their widest
//! cell, two spaces apart, no colours — a table crate would bring more than the few lines it
//! saves), and the server's JSON pretty-printed in the server's own field order.
//!
//! Answers are read as loose JSON ([`Value`]): a field missing or of another type (an older or
//! newer node) prints `-`, never a panic. Cells come from clients' keys and the server's text:
//! control characters are escaped, so a key cannot move the cursor or break a row.

use super::View;
use serde_json::Value;
use std::fmt::Write as _;

/// A table: an optional header row, rows of cells, some columns aligned right.
#[derive(Debug, Default)]
pub struct Table {
    header: Option<Vec<String>>,
    right: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a header row.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: Some(header.iter().map(|h| (*h).to_owned()).collect()),
            ..Table::default()
        }
    }

    /// A table of `field  value` lines, without a header.
    pub fn pairs(pairs: Vec<(&str, String)>) -> Self {
        let mut t = Table::default();
        for (field, value) in pairs {
            t.row(vec![field.to_owned(), value]);
        }
        t
    }

    /// Aligns columns `cols` (from 0) to the right: numbers.
    pub fn right(mut self, cols: &[usize]) -> Self {
        self.right = cols.to_vec();
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table's lines, each ending in a newline, without trailing spaces.
    pub fn render(&self) -> String {
        let lines: Vec<&Vec<String>> = self.header.iter().chain(self.rows.iter()).collect();
        let columns = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for line in &lines {
            for (i, cell) in line.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in lines {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                if self.right.contains(&i) {
                    text.extend(std::iter::repeat_n(' ', pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `s` with control characters escaped (`\n`, `\u{1b}`): one line, no terminal escapes.
pub fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A field of `v` as a cell: strings as they are, numbers and booleans written, `-` when
/// missing or null.
pub fn cell(v: &Value, field: &str) -> String {
    show(v.get(field))
}

fn show(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => other.to_string(),
    }
}

fn u64_of(v: &Value, field: &str) -> Option<u64> {
    v.get(field).and_then(Value::as_u64)
}

fn list<'a>(v: &'a Value, field: &str) -> &'a [Value] {
    v.get(field)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A period in milliseconds as the rules file writes it: `1m`, `250ms`, `1d`.
pub fn period(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (unit, suffix) in UNITS {
        if ms >= unit && ms.is_multiple_of(unit) {
            return format!("{}{suffix}", ms / unit);
        }
    }
    format!("{ms}ms")
}

/// Unix milliseconds as an RFC 3339 UTC time, to the millisecond.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn time_of(v: &Value, field: &str) -> String {
    u64_of(v, field).map_or_else(|| cell(v, field), utc)
}

/// A rule's period: as the server writes it (`period`), else from `period_ms`.
fn rule_period(rule: &Value) -> String {
    match (
        rule.get("period").and_then(Value::as_str),
        u64_of(rule, "period_ms"),
    ) {
        (Some(p), _) => p.to_owned(),
        (None, Some(ms)) => period(ms),
        (None, None) => "-".into(),
    }
}

/// A successful answer as the command's table (`value` is `null` for an empty body).
pub fn render(view: &View, value: &Value) -> String {
    match view {
        View::RuleList => rule_list(value),
        View::Rule => rule(value),
        View::Deleted(name) => format!("rule {} deleted\n", clean(name)),
        View::Top => top(value),
        View::Cluster => cluster(value),
        View::KeyState => key_state(value),
        View::KeyReset => key_reset(value),
        View::BlockList => block_list(value),
        View::Block => block_list(&serde_json::json!({ "blocks": [value], "total": 1 })),
        View::Unblocked(key) => format!("{} unblocked\n", clean(key)),
    }
}

/// `GET /v1/admin/rules`: a row per rule, then where they came from and the last reload.
pub fn rule_list(v: &Value) -> String {
    let mut t = Table::new(&[
        "NAME",
        "LIMIT",
        "PERIOD",
        "ALGORITHM",
        "MODE",
        "SOURCE",
        "VERSION",
        "UPDATED BY",
    ])
    .right(&[1]);
    for r in list(v, "rules") {
        let mut mode = cell(r, "mode");
        if r.get("shadow").and_then(Value::as_bool) == Some(true) {
            mode.push_str(" (shadow)");
        }
        t.row(vec![
            cell(r, "name"),
            cell(r, "limit"),
            rule_period(r),
            cell(r, "algorithm"),
            mode,
            cell(r, "source"),
            cell(r, "version"),
            cell(r, "updated_by"),
        ]);
    }
    let mut out = if t.is_empty() {
        "no rules\n".to_owned()
    } else {
        t.render()
    };
    let _ = writeln!(
        out,
        "\nrules file: {}; generation {}; reloads ok {}, refused {}",
        clean(&cell(v, "source")),
        cell(v, "generation"),
        cell(v, "reloads_ok"),
        cell(v, "reloads_error"),
    );
    if let Some(last) = v.get("last_reload").filter(|l| l.is_object()) {
        let _ = write!(
            out,
            "last reload: {} at {}",
            clean(&cell(last, "result")),
            time_of(last, "at_ms")
        );
        if let Some(e) = last.get("error").and_then(Value::as_str) {
            let _ = write!(out, ": {}", clean(e));
        }
        out.push('\n');
    }
    out
}

/// Fields a rule's detail shows in this order (others follow as the server gave them).
const RULE_FIELDS: [&str; 16] = [
    "name",
    "limit",
    "period",
    "period_ms",
    "algorithm",
    "burst",
    "mode",
    "on_owner_unreachable",
    "shadow",
    "lease",
    "request_key",
    "source",
    "version",
    "updated_at_ms",
    "updated_by",
    "updated_on",
];

/// One rule (`rules get`, `rules put`): a `field  value` line per field.
pub fn rule(v: &Value) -> String {
    let mut pairs = vec![
        ("name", cell(v, "name")),
        ("limit", cell(v, "limit")),
        ("period", rule_period(v)),
        ("algorithm", cell(v, "algorithm")),
        ("burst", cell(v, "burst")),
        ("mode", cell(v, "mode")),
        ("on_owner_unreachable", cell(v, "on_owner_unreachable")),
        ("shadow", cell(v, "shadow")),
        ("lease", cell(v, "lease")),
        ("request_key", cell(v, "request_key")),
        ("source", cell(v, "source")),
    ];
    if v.get("version").is_some() {
        pairs.extend([
            ("version", cell(v, "version")),
            ("updated_at", time_of(v, "updated_at_ms")),
            ("updated_by", cell(v, "updated_by")),
            ("updated_on", cell(v, "updated_on")),
        ]);
    }
    let mut t = Table::pairs(pairs);
    if let Some(fields) = v.as_object() {
        for (field, value) in fields {
            if !RULE_FIELDS.contains(&field.as_str()) {
                t.row(vec![field.clone(), show(Some(value))]);
            }
        }
    }
    t.render()
}

/// `GET /v1/admin/top`: the keys, what they were counted by, and the members that failed.
pub fn top(v: &Value) -> String {
    let mut t = Table::new(&["KEY", "COUNT", "±ERROR"]).right(&[1, 2]);
    for k in list(v, "keys") {
        t.row(vec![cell(k, "key"), cell(k, "count"), cell(k, "error")]);
    }
    let mut out = if t.is_empty() {
        "no keys counted\n".to_owned()
    } else {
        t.render()
    };
    let _ = writeln!(
        out,
        "\nrule {}, by {}, top {}; window: {}",
        clean(&cell(v, "rule")),
        clean(&cell(v, "by")),
        cell(v, "n"),
        clean(&cell(v, "window")),
    );
    out.push_str(&members_line(v));
    out
}

/// Blocks as `GET /v1/admin/blocks` lists them.
pub fn block_list(v: &Value) -> String {
    let mut t = Table::new(&["TARGET", "RULE", "SOURCE", "UNTIL", "LEFT", "BY", "REASON"]);
    for b in list(v, "blocks") {
        let left = u64_of(b, "remaining_ms").map_or_else(|| "-".to_owned(), period);
        t.row(vec![
            cell(b, "target"),
            b.get("rule")
                .filter(|r| !r.is_null())
                .map_or_else(|| "*".to_owned(), |_| cell(b, "rule")),
            cell(b, "source"),
            time_of(b, "until_ms"),
            left,
            cell(b, "by"),
            cell(b, "reason"),
        ]);
    }
    let mut out = if t.is_empty() {
        "no blocks\n".to_owned()
    } else {
        t.render()
    };
    if let Some(total) = u64_of(v, "total").filter(|n| *n > 1) {
        let _ = writeln!(out, "\n{total} blocks");
    }
    if let Some(next) = v.get("next_cursor").and_then(Value::as_str) {
        let _ = writeln!(out, "more: --cursor {}", clean(next));
    }
    out
}

/// Whether every member answered, and those that did not (top keys, resets).
fn members_line(v: &Value) -> String {
    let members = list(v, "members");
    let failed: Vec<String> = members
        .iter()
        .filter(|m| m.get("status").and_then(Value::as_str) != Some("ok"))
        .map(|m| {
            let mut s = format!("{} {}", cell(m, "node_id"), cell(m, "status"));
            if let Some(e) = m.get("error").and_then(Value::as_str) {
                let _ = write!(s, " ({e})");
            }
            clean(&s)
        })
        .collect();
    let complete = v.get("complete").and_then(Value::as_bool);
    match (complete, failed.is_empty()) {
        (Some(true), true) => {
            let n = members.len();
            let s = if n == 1 { "" } else { "s" };
            format!("complete: {n} of {n} member{s} answered\n")
        }
        (_, true) => format!("complete: {}\n", show(v.get("complete"))),
        (_, false) => format!(
            "incomplete: {} of {} members did not answer: {}\n",
            failed.len(),
            members.len(),
            failed.join(", ")
        ),
    }
}

/// `GET /v1/cluster`: who answers, the quorum, the members, the forwarding counters.
pub fn cluster(v: &Value) -> String {
    let quorate = match v.get("quorate").and_then(Value::as_bool) {
        Some(true) => "quorate",
        Some(false) => "NOT quorate (sees no majority: answers from fallback shares)",
        None => "quorum unknown",
    };
    let mut out = format!(
        "node {} of cluster {}: {}; {} in the ring, {} known\n\n",
        clean(&cell(v, "node_id")),
        clean(&cell(v, "cluster_id")),
        quorate,
        cell(v, "ring_members"),
        cell(v, "known_members"),
    );
    let mut t = Table::new(&["NODE", "STATE", "HTTP", "PEER", "GRPC"]);
    for m in list(v, "members") {
        // A member without `--grpc` (or one that predates the field) has no gRPC address.
        let grpc = match cell(m, "grpc_addr") {
            a if a.is_empty() => "-".to_owned(),
            a => a,
        };
        t.row(vec![
            cell(m, "node_id"),
            cell(m, "state"),
            cell(m, "http_addr"),
            cell(m, "peer_addr"),
            grpc,
        ]);
    }
    out.push_str(&t.render());
    // The counters are under `forwarding` (read them at the top level too).
    let counters = v.get("forwarding").filter(|f| f.is_object()).unwrap_or(v);
    let names = [
        "forwarded",
        "fail_open",
        "fail_closed",
        "replica",
        "minority",
        "handed_over",
    ];
    let shown: Vec<String> = names
        .iter()
        .filter(|n| counters.get(**n).is_some())
        .map(|n| format!("{n} {}", cell(counters, n)))
        .collect();
    if !shown.is_empty() {
        let _ = writeln!(out, "\n{}", shown.join(", "));
    }
    // Regions (`--region`): each one's link, and this node's allowances and demand there.
    let regions = list(v, "regions");
    if !regions.is_empty() {
        let _ = writeln!(out, "\nregion {}", clean(&cell(v, "region")));
        let mut t = Table::new(&[
            "REGION",
            "STATE",
            "ALLOWANCE",
            "DEMAND/S",
            "RTT MS",
            "OFFSET MS",
        ]);
        for r in regions {
            t.row(vec![
                cell(r, "name"),
                cell(r, "state"),
                cell(r, "allowance"),
                cell(r, "demand"),
                cell(r, "rtt_ms"),
                cell(r, "offset_ms"),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

/// Where a key's bucket is: shared by `keys get` and `keys reset`.
fn bucket_pairs(v: &Value) -> Vec<(&'static str, String)> {
    let owner = match (v.get("owner"), v.get("is_owner").and_then(Value::as_bool)) {
        (Some(Value::Null), _) => "none (global: decided on every node)".to_owned(),
        (o, Some(true)) => format!("{} (the node asked)", show(o)),
        (o, _) => show(o),
    };
    let rule = match v.get("rule") {
        Some(Value::Null) => "inline".to_owned(),
        r => show(r),
    };
    vec![
        ("key", cell(v, "key")),
        ("rule", rule),
        ("mode", cell(v, "mode")),
        ("bucket", cell(v, "bucket_id")),
        ("owner", owner),
        ("asked", cell(v, "node_id")),
    ]
}

/// `GET /v1/admin/keys/{key}`: the bucket and its state.
pub fn key_state(v: &Value) -> String {
    let mut pairs = bucket_pairs(v);
    let empty = Value::Null;
    let s = v.get("state").unwrap_or(&empty);
    let retry = u64_of(s, "retry_after_ms")
        .map_or_else(|| cell(s, "retry_after_ms"), |ms| format!("{ms} ms"));
    pairs.extend([
        ("allowed", cell(s, "allowed")),
        ("limit", cell(s, "limit")),
        ("remaining", cell(s, "remaining")),
        ("reset_at", time_of(s, "reset_at_ms")),
        ("retry_after", retry),
        ("degraded", cell(s, "degraded")),
    ]);
    Table::pairs(pairs).render()
}

/// `POST /v1/admin/keys/{key}/reset`: what each member dropped.
pub fn key_reset(v: &Value) -> String {
    let mut out = Table::pairs(bucket_pairs(v)).render();
    let _ = writeln!(out, "removed: {} bucket(s)\n", cell(v, "removed"));
    let mut t = Table::new(&["NODE", "STATUS", "REMOVED", "ERROR"]).right(&[2]);
    for m in list(v, "members") {
        t.row(vec![
            cell(m, "node_id"),
            cell(m, "status"),
            cell(m, "removed"),
            cell(m, "error"),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&members_line(v));
    if let Some(note) = v.get("global_reset").and_then(Value::as_str) {
        let _ = writeln!(out, "global rule: {}", clean(note));
    }
    out
}

/// `text` (JSON) indented two spaces a level, its fields in the order the server wrote them and
/// its numbers and strings as written. An error when `text` is not one JSON value.
pub fn pretty_json(text: &str) -> Result<String, serde_json::Error> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)?;
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    let mut chars = text.trim().chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                if let Some(close) = chars.next_if(|c| matches!(c, '}' | ']')) {
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out.push('\n');
    Ok(out)
}
