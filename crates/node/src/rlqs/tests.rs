//! Reports taken and answered without a cluster: matching, blanket rules, abandons, refusals,
//! and the owner's split. (Streams across nodes: `tests/tests/rlqs.rs`.)

use super::config::RlqsConfig;
use super::*;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use ringlimit_core::clock::ManualClock;

const CONFIG: &str = r#"
domains:
  - domain: edge
    buckets:
      - bucket: { name: api, tenant: "*" }
        rule: per-second
        key: "{tenant}"
      - bucket: { name: blocked }
        blanket: deny_all
"#;

fn rlqs() -> Rlqs {
    let config = RlqsConfig::parse("t.yaml", CONFIG).expect("valid");
    let engine = Arc::new(Engine::new(
        crate::rules::RuleSet::builtin(),
        100,
        Arc::new(ManualClock::new(1_000_000_000_000)),
    ));
    Rlqs::new(Arc::new(ArcSwap::from_pointee(config)), engine)
}

fn usage(pairs: &[(&str, &str)], allowed: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

type Rx = mpsc::Receiver<Result<RateLimitQuotaResponse, tonic::Status>>;

fn open(r: &Rlqs) -> (u64, Rx) {
    let (tx, rx) = mpsc::channel(16);
    (r.open(tx).expect("open"), rx)
}

fn actions(rx: &mut Rx) -> Vec<BucketAction> {
    let mut out = Vec::new();
    while let Ok(Ok(resp)) = rx.try_recv() {
        out.extend(resp.bucket_action);
    }
    out
}

#[test]
fn blanket_and_unmatched_buckets_are_answered_at_once() {
    let r = rlqs();
    let (s, mut rx) = open(&r);
    r.report(
        s,
        report(
            "edge",
            vec![
                usage(&[("name", "blocked")], 0),
                usage(&[("name", "nothing")], 0),
                usage(&[("name", "api"), ("tenant", "acme")], 3),
            ],
        ),
    )
    .expect("valid");
    let got = actions(&mut rx);
    assert_eq!(got.len(), 2, "{got:?}");
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) = &got[0].bucket_action else {
        panic!("{got:?}")
    };
    assert_eq!(
        a.rate_limit_strategy.and_then(|s| s.strategy),
        Some(rate_limit_strategy::Strategy::BlanketRule(
            rate_limit_strategy::BlanketRule::DenyAll as i32
        ))
    );
    assert_eq!(a.assignment_time_to_live.map(|d| d.seconds), Some(10));
    assert!(matches!(
        got[1].bucket_action,
        Some(bucket_action::BucketAction::AbandonAction(_))
    ));
    // The rule bucket waits for its owner's share; the unmatched one is forgotten.
    assert_eq!(r.buckets(), 2);
    assert_eq!(r.stats.abandons.load(Ordering::Relaxed), 1);
    assert_eq!(r.stats.by_rule.lock()["per-second"].allowed, 3);
}

#[test]
fn invalid_reports_end_the_stream_with_a_reason() {
    let r = rlqs();
    let (s, _rx) = open(&r);
    assert!(matches!(
        r.report(s, report("", vec![usage(&[("name", "api")], 1)])),
        Err(ReportError::NoDomain)
    ));
    r.report(s, report("edge", vec![])).expect("a domain");
    // Later reports may leave the domain out, not change it.
    r.report(s, report("", vec![])).expect("same domain");
    assert!(matches!(
        r.report(s, report("other", vec![])),
        Err(ReportError::OtherDomain(..))
    ));
    let mut empty = usage(&[], 1);
    assert!(matches!(
        r.report(s, report("edge", vec![empty.clone()])),
        Err(ReportError::NoBucketId)
    ));
    empty.bucket_id = None;
    assert!(matches!(
        r.report(s, report("edge", vec![empty])),
        Err(ReportError::NoBucketId)
    ));
}

#[test]
fn a_stopping_node_ends_every_assignment_and_takes_no_stream() {
    let r = rlqs();
    let (s, mut rx) = open(&r);
    r.report(s, report("edge", vec![usage(&[("name", "blocked")], 0)]))
        .expect("valid");
    assert_eq!(actions(&mut rx).len(), 1);
    r.stop();
    let got = actions(&mut rx);
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) = &got[0].bucket_action else {
        panic!("{got:?}")
    };
    assert_eq!(
        a.assignment_time_to_live,
        Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 0,
            nanos: 0
        })
    );
    // The stream's sender is gone: the answers end.
    assert!(matches!(
        rx.try_recv(),
        Err(mpsc::error::TryRecvError::Disconnected)
    ));
    assert!(r.open(mpsc::channel(1).0).is_none());
    assert_eq!(r.stats.expired_on_stop.load(Ordering::Relaxed), 1);
}

#[test]
fn the_owner_splits_a_rule_rate_among_members_streams() {
    let r = rlqs();
    let ask = |streams: Vec<(u64, u64)>| QuotaAsk {
        key: "acme".into(),
        rule: RuleRef::Named("per-second".into()),
        held: false,
        streams: streams
            .into_iter()
            .map(|(id, d)| QuotaStream {
                id,
                demand_milli: d * 1000,
            })
            .collect(),
    };
    // per-second: 10 a second. n1's one stream asks 16, n2's two ask 1 each.
    r.owner.answer("n1", &[ask(vec![(1, 16)])]);
    let b = r.owner.answer("n2", &[ask(vec![(1, 1), (2, 1)])]);
    let QuotaAnswer::Shares { milli: b } = &b[0] else {
        panic!("{b:?}")
    };
    let quiet = to_milli(ringlimit_core::quota::HEADROOM);
    assert_eq!(b, &vec![quiet, quiet]);
    let a = r.owner.answer("n1", &[ask(vec![(1, 16)])]);
    assert_eq!(
        a,
        vec![QuotaAnswer::Shares {
            milli: vec![10_000 - 2 * quiet]
        }]
    );
    // An unknown rule is named.
    let mut bad = ask(vec![(1, 1)]);
    bad.rule = RuleRef::Named("nope".into());
    assert!(matches!(
        &r.owner.answer("n1", &[bad])[0],
        QuotaAnswer::Error { code, .. } if code == "unknown_rule"
    ));
    assert_eq!(r.owner.buckets(), 1);
}

#[test]
fn buckets_are_counted_as_streams_come_and_go() {
    let r = rlqs();
    let (a, _rx_a) = open(&r);
    let (b, _rx_b) = open(&r);
    let api = |t: &str| usage(&[("name", "api"), ("tenant", t)], 1);
    r.report(a, report("edge", vec![api("x"), api("y")]))
        .expect("valid");
    r.report(b, report("edge", vec![api("x")])).expect("valid");
    // Reported again: still three.
    r.report(a, report("edge", vec![api("x")])).expect("valid");
    assert_eq!(r.buckets(), 3);
    r.close(a);
    assert_eq!(r.buckets(), 1);
    r.fail(b, tonic::Status::invalid_argument("test"));
    assert_eq!(r.buckets(), 0);
}

#[test]
fn a_node_full_of_buckets_abandons_new_ones() {
    let r = rlqs();
    let mut rxs = Vec::new();
    let api = |t: String| usage(&[("name", "api"), ("tenant", &t)], 1);
    for s in 0..MAX_BUCKETS / MAX_BUCKETS_PER_STREAM {
        let (id, rx) = open(&r);
        rxs.push(rx);
        let usages = (0..MAX_BUCKETS_PER_STREAM)
            .map(|i| api(format!("{s}-{i}")))
            .collect();
        r.report(id, report("edge", usages)).expect("valid");
    }
    assert_eq!(r.buckets(), MAX_BUCKETS);
    let (id, mut rx) = open(&r);
    r.report(id, report("edge", vec![api("one-more".into())]))
        .expect("valid");
    let got = actions(&mut rx);
    assert!(
        matches!(
            got.first().and_then(|a| a.bucket_action.as_ref()),
            Some(bucket_action::BucketAction::AbandonAction(_))
        ),
        "{got:?}"
    );
    assert_eq!(r.buckets(), MAX_BUCKETS);
}
