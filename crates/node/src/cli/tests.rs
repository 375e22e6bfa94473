//! Arguments into requests, requests into URLs, answers into tables.

use super::client::{ServerError, base_url, url_for};
use super::table::{self, Table, pretty_json};
use super::*;
use crate::config::{Cli, Command};
use clap::Parser;
use reqwest::Method;
use serde_json::json;

fn parse(args: &[&str]) -> Result<AdminCommand, clap::Error> {
    let cli = Cli::try_parse_from(std::iter::once("ringlimit").chain(args.iter().copied()))?;
    match cli.command {
        Command::Admin(c) => Ok(c),
        Command::Serve(_) => panic!("parsed as serve"),
    }
}

fn no_file(path: &std::path::Path) -> Result<String, UsageError> {
    Err(UsageError(format!("no file {}", path.display())))
}

/// The request `args` make and the URL it goes to from the default address.
fn req(args: &[&str]) -> (ApiRequest, String) {
    let command = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let (r, conn) = request(&command, no_file).expect("request");
    let url = url_for(&base_url(&conn.addr).expect("addr"), &r).expect("url");
    (r, url.to_string())
}

#[test]
fn rules_commands_map_to_the_admin_rules_endpoints() {
    let (r, url) = req(&["rules", "list"]);
    assert_eq!(
        (r.method, r.view, r.auth),
        (Method::GET, View::RuleList, true)
    );
    assert_eq!(url, "http://127.0.0.1:8080/v1/admin/rules");

    let (r, url) = req(&["rules", "get", "free tier/x"]);
    assert_eq!((r.method, r.view), (Method::GET, View::Rule));
    assert_eq!(url, "http://127.0.0.1:8080/v1/admin/rules/free%20tier%2Fx");

    let (r, url) = req(&[
        "rules",
        "put",
        "api-free",
        "--limit",
        "100",
        "--period",
        "1m",
        "--algorithm",
        "token_bucket",
        "--burst",
        "150",
        "--mode",
        "owner",
        "--on-owner-unreachable",
        "closed",
        "--shadow",
        "--lease",
        "off",
        "--request-key",
        "apikey:{header:x-api-key}",
        "--if-match",
        "1767225600000.0.node-0",
    ]);
    assert_eq!(r.method, Method::PUT);
    assert_eq!(url, "http://127.0.0.1:8080/v1/admin/rules/api-free");
    assert_eq!(
        r.body,
        Some(json!({
            "limit": 100, "period": "1m", "algorithm": "token_bucket", "burst": 150,
            "mode": "owner", "on_owner_unreachable": "closed", "shadow": true, "lease": "off",
            "request_key": "apikey:{header:x-api-key}",
        }))
    );
    assert_eq!(r.if_match.as_deref(), Some("\"1767225600000.0.node-0\""));

    // Only what was given is sent: the server fills the rest as the rules file would.
    let (r, _) = req(&["rules", "put", "x", "--limit", "5", "--period", "10s"]);
    assert_eq!(r.body, Some(json!({"limit": 5, "period": "10s"})));
    assert_eq!(r.if_match, None);

    let (r, url) = req(&["rules", "delete", "x", "--if-match", "*"]);
    assert_eq!(
        (r.method, r.view),
        (Method::DELETE, View::Deleted("x".into()))
    );
    assert_eq!(url, "http://127.0.0.1:8080/v1/admin/rules/x");
    assert_eq!(r.if_match.as_deref(), Some("*"));
}

#[test]
fn rules_put_reads_a_json_or_yaml_file() {
    let command = parse(&["rules", "put", "x", "--file", "rule.yaml"]).expect("parse");
    let read = |_: &std::path::Path| Ok("limit: 5\nperiod: 1m\nshadow: true\n".to_owned());
    let (r, _) = request(&command, read).expect("request");
    assert_eq!(
        r.body,
        Some(json!({"limit": 5, "period": "1m", "shadow": true}))
    );
    let read = |_: &std::path::Path| Ok(r#"{"limit": 7, "period": "1h"}"#.to_owned());
    let (r, _) = request(&command, read).expect("request");
    assert_eq!(r.body, Some(json!({"limit": 7, "period": "1h"})));
    for bad in ["[1, 2]", "{\"limit\": ", "just words", "7"] {
        let read = |_: &std::path::Path| Ok(bad.to_owned());
        assert!(request(&command, read).is_err(), "{bad}");
    }
    let e = request(&command, no_file).expect_err("unreadable");
    assert!(e.to_string().contains("rule.yaml"), "{e}");
}

#[test]
fn usage_errors_are_clap_errors() {
    for args in [
        &["rules", "put", "x", "--limit", "5"][..],
        &["rules", "put", "x", "--period", "1m"],
        &["rules", "put", "x", "--file", "r.json", "--limit", "5"],
        &[
            "rules",
            "put",
            "x",
            "--limit",
            "5",
            "--period",
            "1m",
            "--algorithm",
            "nope",
        ],
        &["rules", "get"],
        &["top"],
        &["top", "--rule", "r", "-n", "0"],
        &["top", "--rule", "r", "-n", "1001"],
        &["top", "--rule", "r", "--by", "allowed"],
        &["keys", "get", "k"],
        &["keys", "get", "k", "--rule", "r", "--limit", "5"],
        &["keys", "get", "k", "--limit", "5"],
        &["keys", "get", "k", "--period-ms", "5"],
        &["cluster", "--output", "yaml"],
        &["cluster", "--timeout-ms", "0"],
    ] {
        assert!(parse(args).is_err(), "{args:?} parsed");
    }
}

#[test]
fn top_and_keys_map_to_their_queries() {
    let (r, url) = req(&["top", "--rule", "free tier"]);
    assert_eq!((r.method, r.view), (Method::GET, View::Top));
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/top?rule=free+tier&by=denied&n=10"
    );
    let (_, url) = req(&["top", "--rule", "r", "--by", "checks", "-n", "3"]);
    assert!(url.ends_with("/v1/admin/top?rule=r&by=checks&n=3"), "{url}");

    // Keys are any string: each goes into its path segment percent-encoded.
    let (r, url) = req(&["keys", "get", "user:42/a b?c#d%e", "--rule", "default"]);
    assert_eq!((r.method, r.view), (Method::GET, View::KeyState));
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/keys/user:42%2Fa%20b%3Fc%23d%25e?rule=default"
    );
    let (r, url) = req(&[
        "keys",
        "reset",
        "k",
        "--limit",
        "5",
        "--period-ms",
        "1000",
        "--algorithm",
        "sliding_log",
        "--burst",
        "7",
    ]);
    assert_eq!((r.method, r.view), (Method::POST, View::KeyReset));
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/keys/k/reset?limit=5&period_ms=1000&burst=7&algorithm=sliding_log"
    );
    // `.` and `..` cannot be path segments of a URL: said, never sent as something else.
    let command = parse(&["keys", "get", "..", "--rule", "r"]).expect("parse");
    let (r, conn) = request(&command, no_file).expect("request");
    assert!(url_for(&base_url(&conn.addr).expect("addr"), &r).is_err());
}

#[test]
fn cluster_sends_no_token() {
    let (r, url) = req(&["cluster", "--token", "secret-token-123"]);
    assert_eq!(
        (r.method, r.view, r.auth),
        (Method::GET, View::Cluster, false)
    );
    assert_eq!(url, "http://127.0.0.1:8080/v1/cluster");
}

#[test]
fn addresses_with_or_without_a_scheme_or_a_prefix() {
    let cases = [
        ("127.0.0.1:9000", "http://127.0.0.1:9000/v1/cluster"),
        ("localhost:9000/", "http://localhost:9000/v1/cluster"),
        (
            "https://rl.example:8443",
            "https://rl.example:8443/v1/cluster",
        ),
        (
            "https://gw.example/ringlimit/",
            "https://gw.example/ringlimit/v1/cluster",
        ),
        ("http://[::1]:8080?x=1", "http://[::1]:8080/v1/cluster"),
    ];
    let (r, _) = req(&["cluster"]);
    for (addr, want) in cases {
        let url = url_for(&base_url(addr).expect(addr), &r).expect("url");
        assert_eq!(url.as_str(), want, "{addr}");
    }
    for bad in ["", "ftp://host:21", "http://", "http://exa mple"] {
        assert!(base_url(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn if_match_is_quoted_once() {
    assert_eq!(if_match_header("v1"), "\"v1\"");
    assert_eq!(if_match_header("\"v1\""), "\"v1\"");
    assert_eq!(if_match_header("*"), "*");
}

#[test]
fn server_errors_read_the_error_body() {
    let (r, _) = req(&["rules", "get", "x"]);
    let e = ServerError::of(
        404,
        r#"{"error":"unknown_rule","message":"no rule named x"}"#,
        &r,
        true,
    );
    assert_eq!(e.to_string(), "unknown_rule: no rule named x (HTTP 404)");
    assert_eq!(e.hint, None);
    let e = ServerError::of(401, r#"{"error":"unauthorized","message":"m"}"#, &r, false);
    assert!(e.hint.is_some_and(|h| h.contains("RINGLIMIT_ADMIN_TOKEN")));
    let e = ServerError::of(404, r#"{"error":"not_found","message":"m"}"#, &r, true);
    assert!(e.hint.is_some_and(|h| h.contains("admin API")));
    // Not the API's error object (a proxy's page): its status and the start of the body.
    let e = ServerError::of(502, "<html>\nBad gateway</html>", &r, true);
    assert_eq!(e.to_string(), "HTTP 502: <html> Bad gateway</html>");
    let e = ServerError::of(500, "", &r, true);
    assert_eq!(e.to_string(), "HTTP 500");
}

#[test]
fn tables_align_columns_and_escape_control_characters() {
    let mut t = Table::new(&["KEY", "COUNT"]).right(&[1]);
    t.row(vec!["user:1".into(), "7".into()]);
    t.row(vec!["k\u{1b}[2J\n".into(), "1234".into()]);
    assert_eq!(
        t.render(),
        "KEY           COUNT\nuser:1            7\nk\\u{1b}[2J\\n   1234\n"
    );
    // No trailing spaces, short rows tolerated.
    let mut t = Table::new(&["A", "B"]);
    t.row(vec!["long value".into()]);
    assert_eq!(t.render(), "A           B\nlong value\n");
}

#[test]
fn periods_and_times_read_as_people_write_them() {
    assert_eq!(table::period(60_000), "1m");
    assert_eq!(table::period(250), "250ms");
    assert_eq!(table::period(1_500), "1500ms");
    assert_eq!(table::period(86_400_000), "1d");
    assert_eq!(table::period(7_200_000), "2h");
    assert_eq!(table::period(0), "0ms");
    assert_eq!(table::utc(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(table::utc(951_782_400_123), "2000-02-29T00:00:00.123Z");
    assert_eq!(table::utc(1_767_225_605_997), "2026-01-01T00:00:05.997Z");
}

#[test]
fn rule_list_table() {
    let v = json!({
        "source": "built-in", "generation": 1, "loaded_at_ms": 1, "reloads_ok": 0,
        "reloads_error": 0, "last_reload": null,
        "rules": [
            {"name": "default", "limit": 100, "period_ms": 60000, "period": "1m",
             "algorithm": "token_bucket", "burst": 100, "mode": "owner",
             "on_owner_unreachable": "open", "shadow": false, "lease": "auto", "source": "file"},
            {"name": "api-free", "limit": 5, "period_ms": 10000, "algorithm": "sliding_log",
             "burst": null, "mode": "global", "shadow": true, "source": "api",
             "version": "1767225600000.0.node-0", "updated_by": "admin"},
        ],
    });
    assert_eq!(
        table::render(&View::RuleList, &v),
        "\
NAME      LIMIT  PERIOD  ALGORITHM     MODE             SOURCE  VERSION                 UPDATED BY
default     100  1m      token_bucket  owner            file    -                       -
api-free      5  10s     sliding_log   global (shadow)  api     1767225600000.0.node-0  admin

rules file: built-in; generation 1; reloads ok 0, refused 0
"
    );
    let v = json!({"rules": [], "last_reload": {"at_ms": 0, "result": "error", "error": "bad"}});
    let text = table::render(&View::RuleList, &v);
    assert!(text.starts_with("no rules\n"), "{text}");
    assert!(
        text.contains("last reload: error at 1970-01-01T00:00:00.000Z: bad"),
        "{text}"
    );
}

#[test]
fn rule_detail_shows_every_field() {
    let v = json!({"name": "x", "limit": 5, "period_ms": 60000, "period": "1m",
        "algorithm": "fixed_window", "burst": null, "mode": "owner",
        "on_owner_unreachable": "open", "shadow": false, "lease": "auto", "source": "api",
        "version": "v", "updated_at_ms": 0, "updated_by": "admin", "updated_on": "node-1",
        "something_new": [1]});
    let text = table::render(&View::Rule, &v);
    for line in [
        "name                  x\n",
        "period                1m\n",
        "burst                 -\n",
        "updated_at            1970-01-01T00:00:00.000Z\n",
        "updated_on            node-1\n",
        "something_new         [1]\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}

#[test]
fn top_cluster_and_keys_tables() {
    let v = json!({"rule": "r", "by": "denied", "n": 10, "window": "last 5-10 min",
        "keys": [{"key": "user:1", "count": 120, "error": 0}, {"key": "u2", "count": 3, "error": 2}],
        "complete": false,
        "members": [{"node_id": "node-0", "status": "ok", "keys": 2},
                    {"node_id": "node-2", "status": "failed", "error": "no answer in 2s"}]});
    assert_eq!(
        table::render(&View::Top, &v),
        "\
KEY     COUNT  ±ERROR
user:1    120       0
u2          3       2

rule r, by denied, top 10; window: last 5-10 min
incomplete: 1 of 2 members did not answer: node-2 failed (no answer in 2s)
"
    );

    let v = json!({"node_id": "node-0", "cluster_id": "ringlimit", "ring_members": 2,
        "quorate": true, "known_members": 2,
        "members": [
            {"node_id": "node-0", "peer_addr": "127.0.0.1:7946", "http_addr": "127.0.0.1:8080", "state": "alive",
             "grpc_addr": "127.0.0.1:9090"},
            {"node_id": "node-1", "peer_addr": "127.0.0.1:7947", "http_addr": "127.0.0.1:8081", "state": "dead",
             "grpc_addr": ""}],
        "forwarding": {"forwarded": 3, "fail_open": 1, "fail_closed": 0, "replica": 0,
                       "minority": 0, "handed_over": 0, "peer_frames": 3}});
    assert_eq!(
        table::render(&View::Cluster, &v),
        "\
node node-0 of cluster ringlimit: quorate; 2 in the ring, 2 known

NODE    STATE  HTTP            PEER            GRPC
node-0  alive  127.0.0.1:8080  127.0.0.1:7946  127.0.0.1:9090
node-1  dead   127.0.0.1:8081  127.0.0.1:7947  -

forwarded 3, fail_open 1, fail_closed 0, replica 0, minority 0, handed_over 0
"
    );

    let v = json!({"node_id": "eu-0", "cluster_id": "ringlimit", "ring_members": 1,
        "quorate": true, "known_members": 1, "members": [], "region": "eu",
        "regions": [
            {"name": "eu", "state": "up", "allowance": 7, "demand": 12.5, "rtt_ms": null,
             "offset_ms": null},
            {"name": "us", "state": "unreachable", "allowance": 3, "demand": 4.0, "rtt_ms": 81.2,
             "offset_ms": -0.4}]});
    let text = table::render(&View::Cluster, &v);
    assert!(
        text.ends_with(
            "\
region eu
REGION  STATE        ALLOWANCE  DEMAND/S  RTT MS  OFFSET MS
eu      up           7          12.5      -       -
us      unreachable  3          4.0       81.2    -0.4
"
        ),
        "{text}"
    );

    let v = json!({"key": "user:42", "rule": "default", "mode": "owner",
        "bucket_id": "00ff00ff00ff00ff", "owner": "node-1", "node_id": "node-0", "is_owner": false,
        "state": {"allowed": true, "limit": 100, "remaining": 99, "reset_at_ms": 0,
                  "retry_after_ms": 0, "degraded": false}});
    let text = table::render(&View::KeyState, &v);
    for line in [
        "key          user:42\n",
        "owner        node-1\n",
        "remaining    99\n",
        "retry_after  0 ms\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }

    let v = json!({"key": "k", "rule": null, "mode": "global", "bucket_id": "1", "owner": null,
        "node_id": "node-0", "is_owner": false, "removed": 2, "complete": true,
        "members": [{"node_id": "node-0", "status": "ok", "removed": 2},
                    {"node_id": "node-1", "status": "ok", "removed": 0}],
        "global_reset": "not supported"});
    let text = table::render(&View::KeyReset, &v);
    for line in [
        "rule    inline\n",
        "owner   none (global: decided on every node)\n",
        "removed: 2 bucket(s)\n",
        "NODE    STATUS  REMOVED  ERROR\n",
        "node-0  ok            2  -\n",
        "complete: 2 of 2 members answered\n",
        "global rule: not supported\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}

#[test]
fn tables_of_unexpected_answers_do_not_panic() {
    let odd = [
        json!(null),
        json!([]),
        json!("text"),
        json!({"rules": "no", "members": 3, "keys": [1, "x", null], "state": 7}),
        json!({"members": [null, 1, {"node_id": {"a": 1}}], "forwarding": []}),
    ];
    let views = [
        View::RuleList,
        View::Rule,
        View::Top,
        View::Cluster,
        View::KeyState,
        View::KeyReset,
        View::Deleted("x\n".into()),
    ];
    for v in &odd {
        for view in &views {
            let _ = table::render(view, v);
        }
    }
}

#[test]
fn json_is_pretty_printed_in_the_server_order() {
    let text = r#"{"b":1,"a":[],"c":{},"d":[{"x":"a,b:{[\"]}"},2.50],"e":null}"#;
    assert_eq!(
        pretty_json(text).expect("json"),
        r#"{
  "b": 1,
  "a": [],
  "c": {},
  "d": [
    {
      "x": "a,b:{[\"]}"
    },
    2.50
  ],
  "e": null
}
"#
    );
    assert_eq!(pretty_json(" [ ] ").expect("json"), "[]\n");
    assert!(pretty_json("{\"a\":").is_err());
    assert!(pretty_json("<html>").is_err());
}

/// Every byte class a key may hold comes back out of the URL's path exactly as it went in:
/// the URL parser drops tabs and newlines from what it parses, so they must be encoded first.
#[test]
fn keys_reach_the_path_byte_for_byte() {
    let keys = [
        "a\tb",
        "a\nb",
        "a\r\nb",
        "\ta",
        "b\n",
        "100%",
        "%41",
        "%2e%2E",
        "a/b",
        "a?b",
        "a#b",
        "a b",
        " ",
        "\u{e9}t\u{e9} \u{1f600}",
        "+",
        "a+b",
        "a\\b",
        "\\",
        "a\u{0}b\u{7f}c\u{1b}[31m",
        ".a",
        "...",
        "a;b=c&d",
        "[::1]",
    ];
    for key in keys {
        for (cmd, tail) in [("get", None), ("reset", Some("reset"))] {
            let (r, url) = req(&["keys", cmd, key, "--rule", "r"]);
            assert_eq!(r.path[3], key);
            let url = reqwest::Url::parse(&url).expect("url");
            let segments: Vec<&str> = url.path_segments().expect("segments").collect();
            assert_eq!(
                segments.len(),
                4 + usize::from(tail.is_some()),
                "{key:?}: {url}"
            );
            let decoded = percent_encoding::percent_decode_str(segments[3])
                .decode_utf8()
                .expect("utf-8");
            assert_eq!(decoded, key, "{key:?} went as {url}");
            assert_eq!(segments.get(4).copied(), tail, "{key:?}: {url}");
            assert_eq!(url.query(), Some("rule=r"), "{key:?}: {url}");
        }
    }
    // A rule name too: tabs and all.
    let (_, url) = req(&["rules", "get", "a\tb"]);
    assert!(url.ends_with("/v1/admin/rules/a%09b"), "{url}");
    // Below a prefix in --addr.
    let command = parse(&["keys", "get", "a\tb", "--rule", "r"]).expect("parse");
    let (r, _) = request(&command, no_file).expect("request");
    let url = url_for(&base_url("http://h:1/rl/").expect("addr"), &r).expect("url");
    assert_eq!(url.as_str(), "http://h:1/rl/v1/admin/keys/a%09b?rule=r");
}

#[test]
fn blocks_commands_map_to_the_admin_blocks_endpoints() {
    let (r, url) = req(&["blocks", "list", "--source", "auto", "--limit", "10"]);
    assert_eq!((r.method, r.view), (Method::GET, View::BlockList));
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/blocks?source=auto&limit=10"
    );
    let (r, url) = req(&[
        "blocks",
        "add",
        "cidr:203.0.113.0/24",
        "--ttl",
        "1h",
        "--reason",
        "abuse",
    ]);
    assert_eq!((r.method, r.view), (Method::PUT, View::Block));
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/blocks/cidr:203.0.113.0%2F24"
    );
    assert_eq!(r.body, Some(json!({ "ttl": "1h", "reason": "abuse" })));
    let (r, url) = req(&["blocks", "remove", "user:42", "--rule", "login"]);
    assert_eq!(r.method, Method::DELETE);
    assert_eq!(
        url,
        "http://127.0.0.1:8080/v1/admin/blocks/user:42?rule=login"
    );
    assert!(parse(&["blocks", "add", "k"]).is_err(), "--ttl is required");
}

#[test]
fn blocks_are_listed_as_a_table() {
    let page = json!({ "blocks": [
        { "target": "cidr:203.0.113.0/24", "rule": null, "source": "managed",
          "since_ms": 0, "until_ms": 3_600_000, "remaining_ms": 3_600_000,
          "reason": "abuse", "by": "ops" },
        { "target": "user:42", "rule": "login", "source": "auto",
          "since_ms": 0, "until_ms": 900_000, "remaining_ms": 900_000,
          "reason": "auto", "by": "n1" },
    ], "total": 3, "next_cursor": "abc" });
    let text = table::render(&View::BlockList, &page);
    assert!(text.contains("cidr:203.0.113.0/24"), "{text}");
    assert!(text.contains("login"), "{text}");
    assert!(text.contains("more: --cursor abc"), "{text}");
}
