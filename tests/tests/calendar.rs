//! Calendar windows through a real node's HTTP API: the reset of a monthly and a weekly window
//! in their time zones (`reset_at_ms`, `Retry-After`, `X-RateLimit-Reset`), and bad calendar
//! input refused with a 400 that changes nothing.

use anyhow::Result;
use reqwest::Method;
use ringlimit_node::NodeConfig;
use ringlimit_node::rules::RuleSet;
use ringlimit_tests::TestNode;
use serde_json::{Value, json};

const TOKEN: &str = "test-admin-token";

fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

/// The end (Unix ms) of the `unit` window containing `ms` in `zone`, by jiff alone.
fn window_end(ms: u64, zone: &str, unit: &str) -> u64 {
    let tz = jiff::tz::TimeZone::get(zone).expect("zone");
    let ts = jiff::Timestamp::from_millisecond(ms as i64).expect("instant");
    let d = ts.to_zoned(tz.clone()).date();
    let next = match unit {
        "month" => d.first_of_month().checked_add(jiff::Span::new().months(1)),
        _ => d.checked_add(
            jiff::Span::new().days(7 - i64::from(d.weekday().to_monday_zero_offset())),
        ),
    }
    .expect("date");
    let start = next
        .to_zoned(tz)
        .expect("zoned")
        .start_of_day()
        .expect("day");
    start.timestamp().as_millisecond() as u64
}

/// Checks `body` until denied; returns the denied answer's body, its headers and the instants
/// just before and after it.
async fn deny(
    node: &TestNode,
    body: &Value,
    limit: u64,
) -> Result<(Value, ringlimit_tests::Reply)> {
    for _ in 0..limit {
        let r = node.check(body).await?;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = node.check(body).await?;
    assert_eq!(r.status, 429, "{}", r.text);
    Ok((r.json()?, r))
}

fn assert_reset(
    body: &Value,
    r: &ringlimit_tests::Reply,
    before: u64,
    after: u64,
    zone: &str,
    unit: &str,
) {
    let (e1, e2) = (
        window_end(before, zone, unit),
        window_end(after, zone, unit),
    );
    let reset = body["reset_at_ms"].as_u64().unwrap_or(0);
    assert!(reset == e1 || reset == e2, "reset {reset}, expected {e1}");
    let retry = body["retry_after_ms"].as_u64().unwrap_or(0);
    assert!(
        retry <= reset - before && retry + 1 >= reset.saturating_sub(after),
        "retry_after_ms {retry} for a reset at {reset}"
    );
    assert_eq!(
        r.header("x-ratelimit-reset"),
        reset.div_ceil(1000).to_string()
    );
    assert_eq!(
        r.header("retry-after"),
        retry.div_ceil(1000).max(1).to_string()
    );
}

#[tokio::test]
async fn calendar_windows_reset_at_the_local_boundary() -> Result<()> {
    let mut config = NodeConfig::local("calendar");
    config.rules = RuleSet::from_yaml(
        "rules:\n  - { name: monthly, limit: 3, period: 1mo, algorithm: fixed_window, \
         calendar: true, timezone: Europe/Berlin }\n",
    )?;
    let node = TestNode::start(config).await?;

    let before = now_ms();
    let (body, r) = deny(&node, &json!({ "key": "acct", "rule": "monthly" }), 3).await?;
    let after = now_ms();
    assert_reset(&body, &r, before, after, "Europe/Berlin", "month");
    // The IETF fields: a month's `w` is its nominal 31 days.
    assert!(
        r.header("ratelimit-policy")
            .contains("\"monthly\";q=3;w=2678400"),
        "{}",
        r.header("ratelimit-policy")
    );

    let week = json!({
        "key": "acct", "limit": 2, "period": "1w", "algorithm": "fixed_window",
        "calendar": true, "timezone": "America/New_York",
    });
    let before = now_ms();
    let (body, r) = deny(&node, &week, 2).await?;
    let after = now_ms();
    assert_reset(&body, &r, before, after, "America/New_York", "week");
    node.stop().await
}

#[tokio::test]
async fn bad_calendar_input_is_a_400_that_changes_nothing() -> Result<()> {
    let mut config = NodeConfig::local("calendar-bad");
    config.admin_token = Some(TOKEN.into());
    let node = TestNode::start(config).await?;
    let base = json!({ "key": "k", "limit": 1, "algorithm": "fixed_window" });
    let with = |extra: Value| {
        let mut b = base.clone();
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    for (extra, code, words) in [
        (
            json!({ "period": "1d", "calendar": true, "timezone": "Mars/Olympus" }),
            "invalid_rule",
            "Mars/Olympus",
        ),
        (
            json!({ "period": "1mo" }),
            "invalid_period",
            "calendar: true",
        ),
        (
            json!({ "period": "1d", "calendar": true, "algorithm": "token_bucket" }),
            "invalid_rule",
            "fixed_window",
        ),
        (
            json!({ "period": "1h", "calendar": true }),
            "invalid_rule",
            "1d, 1w or 1mo",
        ),
        (
            json!({ "period": "1d", "period_ms": 1000 }),
            "invalid_request",
            "not both",
        ),
    ] {
        let r = node.check(&with(extra.clone())).await?;
        assert_eq!(r.status, 400, "{extra}: {}", r.text);
        let e = r.json()?;
        assert_eq!(e["error"], code, "{extra}: {e}");
        assert!(
            e["message"].as_str().unwrap_or("").contains(words),
            "{extra}: {e}"
        );
    }
    // Nothing was taken: the plain daily rule of the same numbers admits its one.
    let r = node
        .check(&with(json!({ "period": "1d", "calendar": true })))
        .await?;
    assert_eq!(r.status, 200, "{}", r.text);

    // The admin API refuses such rules alike, and keeps none.
    for rule in [
        json!({ "limit": 5, "period": "1mo", "algorithm": "fixed_window" }),
        json!({ "limit": 5, "period": "1d", "algorithm": "fixed_window", "calendar": true, "timezone": "Nowhere/City" }),
        json!({ "limit": 5, "period": "1d", "calendar": true }),
    ] {
        let r = node
            .admin(Method::PUT, "/v1/admin/rules/quota", TOKEN, Some(&rule))
            .await?;
        assert_eq!(r.status, 400, "{rule}: {}", r.text);
    }
    let r = node.check(&json!({ "key": "k", "rule": "quota" })).await?;
    assert_eq!(r.status, 404, "{}", r.text);
    let ok = json!({ "limit": 5, "period": "1mo", "algorithm": "fixed_window", "calendar": true, "timezone": "Asia/Kolkata" });
    let r = node
        .admin(Method::PUT, "/v1/admin/rules/quota", TOKEN, Some(&ok))
        .await?;
    assert!(r.status == 200 || r.status == 201, "{}", r.text);
    let before = now_ms();
    let (body, r) = deny(&node, &json!({ "key": "k", "rule": "quota" }), 5).await?;
    assert_reset(&body, &r, before, now_ms(), "Asia/Kolkata", "month");
    node.stop().await
}
