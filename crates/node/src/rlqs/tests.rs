//! Reports taken and answered without a cluster: matching, blanket rules, abandons, refusals,
//! and the owner's split. (Streams across nodes: `tests/tests/rlqs.rs`.)

use super::config::RlqsConfig;
use super::*;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use ringlimit_core::clock::{Clock, ManualClock};
use std::task::Waker;

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
    rlqs_with(DEFAULT_LIMITS).0
}

/// An [`Rlqs`] with `limits`, and its clock.
fn rlqs_with(limits: Limits) -> (Rlqs, Arc<ManualClock>) {
    let config = RlqsConfig::parse("t.yaml", CONFIG).expect("valid");
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let local = Arc::new(Local::alone(
        crate::rules::RuleSet::builtin(),
        100,
        clock.clone(),
    ));
    let r = Rlqs::with_limits(Arc::new(ArcSwap::from_pointee(config)), local, limits);
    (r, clock)
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

/// Client `i`'s address.
fn ip(i: u16) -> IpAddr {
    IpAddr::from([10, 0, (i >> 8) as u8, i as u8])
}

/// A stream of client 1.
fn open(r: &Rlqs) -> u64 {
    r.open(ip(1)).expect("open")
}

/// What an Envoy reading `stream` now gets: its answers (each message at most
/// [`MAX_ANSWER_BYTES`]) and, when the stream is over, how it ended.
struct Read {
    actions: Vec<BucketAction>,
    messages: usize,
    end: Option<Result<(), tonic::Status>>,
}

fn read(r: &Rlqs, stream: u64) -> Read {
    let mut got = Read {
        actions: Vec::new(),
        messages: 0,
        end: None,
    };
    loop {
        match r.poll_answer(stream, Waker::noop()) {
            Poll::Pending => return got,
            Poll::Ready(None) => {
                got.end = Some(Ok(()));
                return got;
            }
            Poll::Ready(Some(Err(status))) => {
                got.end = Some(Err(status));
                return got;
            }
            Poll::Ready(Some(Ok(resp))) => {
                assert!(
                    prost::Message::encoded_len(&resp) <= MAX_ANSWER_BYTES,
                    "an answer of {} bytes",
                    prost::Message::encoded_len(&resp)
                );
                got.messages += 1;
                got.actions.extend(resp.bucket_action);
            }
        }
    }
}

fn actions(r: &Rlqs, stream: u64) -> Vec<BucketAction> {
    read(r, stream).actions
}

/// The action for the bucket whose `name` (or `tenant`) is `value`.
fn for_bucket<'a>(got: &'a [BucketAction], key: &str, value: &str) -> Option<&'a BucketAction> {
    got.iter().find(|a| {
        a.bucket_id
            .as_ref()
            .is_some_and(|b| b.bucket.get(key).map(String::as_str) == Some(value))
    })
}

fn is_abandon(a: Option<&BucketAction>) -> bool {
    matches!(
        a.and_then(|a| a.bucket_action.as_ref()),
        Some(bucket_action::BucketAction::AbandonAction(_))
    )
}

#[test]
fn blanket_and_unmatched_buckets_are_answered_at_once() {
    let r = rlqs();
    let s = open(&r);
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
    let got = actions(&r, s);
    assert_eq!(got.len(), 2, "{got:?}");
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) =
        for_bucket(&got, "name", "blocked").and_then(|a| a.bucket_action)
    else {
        panic!("{got:?}")
    };
    assert_eq!(
        a.rate_limit_strategy.and_then(|s| s.strategy),
        Some(rate_limit_strategy::Strategy::BlanketRule(
            rate_limit_strategy::BlanketRule::DenyAll as i32
        ))
    );
    assert_eq!(a.assignment_time_to_live.map(|d| d.seconds), Some(10));
    assert!(is_abandon(for_bucket(&got, "name", "nothing")), "{got:?}");
    // The rule bucket waits for its owner's share; the unmatched one is forgotten.
    assert_eq!(r.buckets(), 2);
    assert_eq!(r.stats.abandons.load(Ordering::Relaxed), 1);
    assert_eq!(r.stats.by_rule.lock()["per-second"].allowed, 3);
}

#[test]
fn invalid_reports_end_the_stream_with_a_reason() {
    let r = rlqs();
    let s = open(&r);
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
    // A fault anywhere in a report: none of it is taken.
    let valid = usage(&[("name", "api"), ("tenant", "acme")], 1);
    assert!(matches!(
        r.report(s, report("edge", vec![valid, empty])),
        Err(ReportError::NoBucketId)
    ));
    assert_eq!(r.buckets(), 0);
    assert_eq!(r.stats.invalid_reports.load(Ordering::Relaxed), 4);
    r.fail(s, tonic::Status::invalid_argument("the reason"));
    let end = read(&r, s).end;
    assert!(
        matches!(&end, Some(Err(st)) if st.code() == tonic::Code::InvalidArgument && st.message() == "the reason"),
        "{end:?}"
    );
    // Read to its end, the stream is forgotten.
    assert_eq!(r.streams(), 0);
    assert!(r.state.lock().streams.is_empty());
}

#[test]
fn a_stopping_node_ends_every_assignment_and_takes_no_stream() {
    let r = rlqs();
    let s = open(&r);
    r.report(s, report("edge", vec![usage(&[("name", "blocked")], 0)]))
        .expect("valid");
    assert_eq!(actions(&r, s).len(), 1);
    r.stop();
    let got = read(&r, s);
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) = &got.actions[0].bucket_action
    else {
        panic!("{:?}", got.actions)
    };
    assert_eq!(
        a.assignment_time_to_live,
        Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 0,
            nanos: 0
        })
    );
    // Then the answers end (status OK).
    assert!(matches!(got.end, Some(Ok(()))), "{:?}", got.end);
    assert!(matches!(r.open(ip(1)), Err(OpenError::Stopping)));
    assert_eq!(r.stats.expired_on_stop.load(Ordering::Relaxed), 1);
    assert_eq!(r.bytes(), 0);
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
    let a = open(&r);
    let b = open(&r);
    let api = |t: &str| usage(&[("name", "api"), ("tenant", t)], 1);
    r.report(a, report("edge", vec![api("x"), api("y")]))
        .expect("valid");
    r.report(b, report("edge", vec![api("x")])).expect("valid");
    // Reported again: still three.
    r.report(a, report("edge", vec![api("x")])).expect("valid");
    assert_eq!(r.buckets(), 3);
    let one = BUCKET_BYTES + "nameapitenantx".len() + "per-second".len() + "x".len();
    assert_eq!(r.bytes(), 2 * STREAM_BYTES + 3 * one);
    r.close(a);
    assert_eq!(r.buckets(), 1);
    r.fail(b, tonic::Status::invalid_argument("test"));
    assert_eq!(r.buckets(), 0);
    assert_eq!(r.bytes(), 0);
    assert_eq!(r.clients(), 0);
    // Their answers end, and they are forgotten.
    assert!(matches!(read(&r, a).end, Some(Ok(()))));
    assert!(matches!(read(&r, b).end, Some(Err(_))));
    assert!(r.state.lock().streams.is_empty());
}

/// An id of `len` bytes: `{name: api, tenant: <tenant>, junk: ...}`.
fn long_id(tenant: &str, len: usize, fill: char) -> Vec<(String, String)> {
    let fixed = "nameapitenantjunk".len() + tenant.len();
    vec![
        ("name".into(), "api".into()),
        ("tenant".into(), tenant.into()),
        (
            "junk".into(),
            std::iter::repeat_n(fill, len.saturating_sub(fixed)).collect(),
        ),
    ]
}

fn usage_of(pairs: &[(String, String)]) -> BucketQuotaUsage {
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    usage(&pairs, 1)
}

#[test]
fn an_oversized_bucket_id_is_neither_kept_nor_answered() {
    let r = rlqs();
    let s = open(&r);
    // The probe: 200 reports, each a new bucket whose id carries 1 MiB of junk (the config
    // matches name and tenant and ignores the rest).
    for i in 0..200u32 {
        let junk = format!("{i:08}{}", "x".repeat(1 << 20));
        let u = usage(&[("name", "api"), ("tenant", "t1"), ("junk", &junk)], 1);
        r.report(s, report("edge", vec![u])).expect("valid");
        assert_eq!(r.bytes(), STREAM_BYTES, "after report {i}");
    }
    assert_eq!(r.buckets(), 0);
    assert_eq!(r.stats.refused_id_too_large.load(Ordering::Relaxed), 200);
    // Nothing to echo back.
    assert!(actions(&r, s).is_empty());
    // Too many pairs, however short, the same.
    let many: Vec<(String, String)> = (0..=MAX_ID_ENTRIES)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    r.report(s, report("edge", vec![usage_of(&many)]))
        .expect("valid");
    assert_eq!(r.stats.refused_id_too_large.load(Ordering::Relaxed), 201);
    // At the bound it is kept, and its rule key is within the rule keys' limit.
    let at_bound = long_id("t1", MAX_ID_BYTES, 'y');
    assert_eq!(id_bytes(at_bound.iter().map(|(k, v)| (k, v))), MAX_ID_BYTES);
    let mut u = usage_of(&at_bound);
    u.bucket_id
        .as_mut()
        .expect("id")
        .bucket
        .insert("tenant".into(), "z".repeat(3000));
    u.bucket_id
        .as_mut()
        .expect("id")
        .bucket
        .insert("junk".into(), "j".repeat(1000));
    r.report(s, report("edge", vec![usage_of(&at_bound), u]))
        .expect("valid");
    assert_eq!(r.buckets(), 2);
    let st = r.state.lock();
    for b in st.streams[&s].buckets.values() {
        let Some(Target::Rule { key, .. }) = b.matched.as_ref().map(|m| &m.target) else {
            panic!("{b:?}")
        };
        assert!(
            key.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES,
            "{}",
            key.len()
        );
    }
    drop(st);
    assert!(r.bytes() <= STREAM_BYTES + 2 * (BUCKET_BYTES + MAX_ID_BYTES + 600));
}

const SMALL: Limits = Limits {
    stream_buckets: 10,
    stream_bytes: 20_000,
    node_buckets: 100,
    node_bytes: 200_000,
};

#[test]
fn a_stream_and_the_node_hold_at_most_their_bytes() {
    let (r, _clock) = rlqs_with(SMALL);
    // One stream: ids of 3,000 bytes fill its 20,000 bytes before its 10 buckets.
    let s = open(&r);
    let usages = (0..10)
        .map(|i| usage_of(&long_id(&format!("s{i}"), 3000, 'a')))
        .collect();
    r.report(s, report("edge", usages)).expect("valid");
    let held = r.state.lock().streams[&s].used;
    assert!(held.bytes <= SMALL.stream_bytes, "{held:?}");
    assert_eq!(held.buckets, 5, "{held:?}");
    assert_eq!(r.stats.refused_stream_full.load(Ordering::Relaxed), 5);
    // The refused ones are abandoned as far as the stream has room for the abandons (charged
    // while unread).
    assert!(actions(&r, s).iter().all(|a| is_abandon(Some(a))));
    // Many clients and streams: the node never holds more than its bytes.
    for c in 2..40 {
        for _ in 0..3 {
            let Ok(s) = r.open(ip(c)) else { continue };
            let usages = (0..10)
                .map(|i| usage_of(&long_id(&format!("c{c}-{s}-{i}"), 3000, 'b')))
                .collect();
            r.report(s, report("edge", usages)).expect("valid");
            let total = r.state.lock().budget.total();
            assert!(total.bytes <= SMALL.node_bytes, "{total:?}");
            assert!(total.buckets <= SMALL.node_buckets, "{total:?}");
        }
    }
    // Full, shared among the clients, and what is charged is what is held.
    let st = r.state.lock();
    let mut sum = Use::default();
    for (id, s) in &st.streams {
        let pending: usize = s
            .pending
            .iter()
            .filter(|(_, a)| **a == Act::Abandon)
            .map(|(id, _)| abandon_bytes(id))
            .sum();
        let buckets: usize = s.buckets.values().map(|b| b.bytes).sum();
        let stream = if s.end.is_none() { STREAM_BYTES } else { 0 };
        assert_eq!(s.used.bytes, stream + buckets + pending, "stream {id}");
        assert_eq!(s.used.buckets, s.buckets.len(), "stream {id}");
        sum = sum.plus(s.used);
    }
    assert_eq!(sum, st.budget.total());
    assert!(st.budget.total().bytes > SMALL.node_bytes * 8 / 10);
}

#[test]
fn one_client_at_its_share_cannot_crowd_out_another() {
    let (r, _clock) = rlqs_with(SMALL);
    let api = |t: String| usage(&[("name", "api"), ("tenant", &t)], 1);
    // Client 1: ten streams of ten buckets fill the node's hundred.
    let hog: Vec<u64> = (0..10)
        .map(|s| {
            let id = r.open(ip(1)).expect("open");
            let usages = (0..10).map(|i| api(format!("hog-{s}-{i}"))).collect();
            r.report(id, report("edge", usages)).expect("valid");
            id
        })
        .collect();
    assert_eq!(r.buckets(), 100);
    // Client 2's new bucket is admitted: one of client 1's gives way (abandoned).
    let s = r.open(ip(2)).expect("open");
    r.report(s, report("edge", vec![api("mine-0".into())]))
        .expect("valid");
    assert_eq!(r.buckets(), 100);
    assert_eq!(r.state.lock().budget.of(ip(2)).buckets, 1);
    assert!(
        actions(&r, s).is_empty(),
        "client 2's bucket waits for its share"
    );
    let abandoned: Vec<u64> = hog
        .iter()
        .copied()
        .filter(|h| is_abandon(actions(&r, *h).first()))
        .collect();
    assert_eq!(abandoned.len(), 1);
    assert_eq!(r.stats.evicted_buckets.load(Ordering::Relaxed), 1);
    // Client 1, over its share, gets no more (on the stream that has room).
    let h = abandoned[0];
    r.report(h, report("edge", vec![api("hog-more".into())]))
        .expect("valid");
    assert!(is_abandon(for_bucket(
        &actions(&r, h),
        "tenant",
        "hog-more"
    )));
    // Client 2 up to its share (50, on streams of 10).
    let mut mine = vec![s];
    for i in 1..60 {
        if i % 10 == 0 {
            mine.push(r.open(ip(2)).expect("open"));
        }
        let s = *mine.last().expect("a stream");
        r.report(s, report("edge", vec![api(format!("mine-{i}"))]))
            .expect("valid");
    }
    let st = r.state.lock();
    assert_eq!(st.budget.of(ip(2)).buckets, 50);
    assert_eq!(st.budget.of(ip(1)).buckets, 50);
    drop(st);
    assert_eq!(r.stats.refused_client_share.load(Ordering::Relaxed), 1 + 10);
    // A third client's first bucket: admitted too.
    let s3 = r.open(ip(3)).expect("open");
    r.report(s3, report("edge", vec![api("third".into())]))
        .expect("valid");
    assert_eq!(r.state.lock().budget.of(ip(3)).buckets, 1);
    assert!(actions(&r, s3).is_empty());
}

/// The hostile client's probe (`bench/rlqs_probe.py`) at the node's own bounds: ten streams of
/// 10,000 buckets from one client, then a well-behaved Envoy's new bucket.
#[test]
fn a_full_node_still_admits_a_new_clients_bucket() {
    let r = rlqs();
    let api = |t: String| usage(&[("name", "api"), ("tenant", &t)], 1);
    let limits = DEFAULT_LIMITS;
    for s in 0..limits.node_buckets / limits.stream_buckets {
        let id = r.open(ip(1)).expect("open");
        let usages = (0..limits.stream_buckets)
            .map(|i| api(format!("{s}-{i}")))
            .collect();
        r.report(id, report("edge", usages)).expect("valid");
    }
    assert_eq!(r.buckets(), limits.node_buckets);
    assert!(r.bytes() <= limits.node_bytes);
    let id = r.open(ip(2)).expect("open");
    r.report(id, report("edge", vec![api("one-more".into())]))
        .expect("valid");
    let got = actions(&r, id);
    assert!(!is_abandon(got.first()), "{got:?}");
    assert_eq!(r.state.lock().budget.of(ip(2)).buckets, 1);
    assert_eq!(r.buckets(), limits.node_buckets);
}

#[test]
fn a_client_holding_only_streams_gives_way_too() {
    let limits = Limits {
        node_bytes: 10 * STREAM_BYTES,
        ..SMALL
    };
    let (r, _clock) = rlqs_with(limits);
    let hog: Vec<u64> = (0..10).map(|_| r.open(ip(1)).expect("open")).collect();
    assert!(matches!(r.open(ip(1)), Err(OpenError::Full)));
    assert_eq!(r.stats.refused_streams.load(Ordering::Relaxed), 1);
    // Another client's stream: one of client 1's is ended, and says why.
    let s = r.open(ip(2)).expect("open");
    let ended: Vec<tonic::Status> = hog
        .iter()
        .filter_map(|h| match read(&r, *h).end {
            Some(Err(status)) => Some(status),
            _ => None,
        })
        .collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].code(), tonic::Code::ResourceExhausted);
    assert_eq!(r.stats.evicted_streams.load(Ordering::Relaxed), 1);
    assert_eq!(r.streams(), 10);
    assert!(r.bytes() <= limits.node_bytes);
    r.report(s, report("edge", vec![usage(&[("name", "blocked")], 1)]))
        .expect("valid");
}

#[test]
fn a_count_no_envoy_can_report_is_refused_and_counters_saturate() {
    let r = rlqs();
    let s = open(&r);
    let api = |allowed| usage(&[("name", "api"), ("tenant", "acme")], allowed);
    r.report(s, report("edge", vec![api(5)])).expect("valid");
    // 2^64-1 requests in one report: refused, the counter unchanged (it wrapped to 4).
    let e = r.report(s, report("edge", vec![api(u64::MAX)]));
    assert!(
        matches!(
            e,
            Err(ReportError::TooManyRequests {
                what: "allowed",
                count: u64::MAX
            })
        ),
        "{e:?}"
    );
    let mut denied = api(0);
    denied.num_requests_denied = MAX_REPORTED_REQUESTS + 1;
    assert!(r.report(s, report("edge", vec![denied])).is_err());
    assert_eq!(r.stats.by_rule.lock()["per-second"].allowed, 5);
    assert_eq!(r.stats.by_rule.lock()["per-second"].denied, 0);
    // At the bound it is taken, and a counter near its end stays there.
    r.stats
        .by_rule
        .lock()
        .get_mut("per-second")
        .expect("counted")
        .allowed = u64::MAX - 1;
    r.report(s, report("edge", vec![api(MAX_REPORTED_REQUESTS)]))
        .expect("valid");
    assert_eq!(r.stats.by_rule.lock()["per-second"].allowed, u64::MAX);
}

#[test]
fn answers_are_bounded_messages_of_the_latest_action_per_bucket() {
    let (r, clock) = rlqs_with(DEFAULT_LIMITS);
    let s = open(&r);
    // 2,000 blanket buckets with ids of 2,000 bytes: 4 MB of answers, in messages of 1 MiB.
    let usages = (0..2000)
        .map(|i| {
            let mut id = long_id(&format!("{i}"), 2000, 'q');
            id[0].1 = "blocked".into();
            usage_of(&id)
        })
        .collect();
    r.report(s, report("edge", usages)).expect("valid");
    let got = read(&r, s);
    assert_eq!(got.actions.len(), 2000);
    assert!((4..=6).contains(&got.messages), "{} messages", got.messages);
    // Unread answers are not piled up: a refresh replaces what waits for the same bucket.
    for _ in 0..4 {
        clock.advance(6_000_000_000);
        r.sweep(clock.now());
    }
    let st = r.state.lock();
    assert_eq!(st.streams[&s].pending.len(), 2000);
    drop(st);
    // An Envoy that reads nothing for 30 s loses its stream and all it held.
    assert_eq!(r.stats.dropped_streams.load(Ordering::Relaxed), 0);
    clock.advance(31_000_000_000);
    r.sweep(clock.now());
    assert_eq!(r.stats.dropped_streams.load(Ordering::Relaxed), 1);
    assert_eq!(r.bytes(), 0);
    let end = read(&r, s).end;
    assert!(
        matches!(&end, Some(Err(st)) if st.code() == tonic::Code::ResourceExhausted),
        "{end:?}"
    );
}

/// One round of this node alone: it owns every rule bucket.
async fn round_alone(r: &Rlqs) {
    let view = crate::cluster::View::solo("alone", "127.0.0.1:1", "127.0.0.1:2");
    let peers = crate::peers::Peers::new(crate::peers::test_settings(
        ringlimit_core::link::dial::tcp(),
        "alone",
        "c",
    ));
    r.round(&peers, &view).await;
}

/// The strategy and TTL (ns) of an assignment, `None` for anything else.
fn assigned(a: Option<&BucketAction>) -> Option<(rate_limit_strategy::Strategy, u64)> {
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(q)) =
        a.and_then(|a| a.bucket_action.as_ref())
    else {
        return None;
    };
    let ttl = q.assignment_time_to_live?;
    let ttl_ns =
        u64::try_from(ttl.seconds).ok()? * 1_000_000_000 + u64::try_from(ttl.nanos).ok()?;
    Some((q.rate_limit_strategy?.strategy?, ttl_ns))
}

fn deny_all() -> rate_limit_strategy::Strategy {
    rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::DenyAll as i32)
}

#[tokio::test]
async fn a_blocked_keys_buckets_deny_all_until_the_block_ends() {
    let (r, clock) = rlqs_with(DEFAULT_LIMITS);
    let s = open(&r);
    let api = |t: &str| usage(&[("name", "api"), ("tenant", t)], 1);
    r.report(s, report("edge", vec![api("acme"), api("other")]))
        .expect("valid");
    round_alone(&r).await;
    let got = actions(&r, s);
    for t in ["acme", "other"] {
        assert!(
            matches!(
                assigned(for_bucket(&got, "tenant", t)),
                Some((rate_limit_strategy::Strategy::TokenBucket(_), _))
            ),
            "{t}: {got:?}"
        );
    }
    let blocks = r.local.blocks();
    let now_ms = || clock.now() / NANOS_PER_MS;

    // A managed block of the rule bucket's key, for 3 s: a deny-all at the next round, living
    // no longer than the block (the entry's TTL is 10 s); the other tenant's bucket is untouched.
    let acme = crate::blocks::Target::parse("acme").expect("a key");
    blocks
        .table
        .put_managed(&acme, (now_ms(), now_ms() + 3_000), "abuse", "ops")
        .expect("room");
    round_alone(&r).await;
    let got = actions(&r, s);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        assigned(for_bucket(&got, "tenant", "acme")),
        Some((deny_all(), 3_000_000_000))
    );
    // Not pushed again while it holds (its TTL ends with the block); a longer block is.
    clock.advance_ms(1_000);
    round_alone(&r).await;
    assert!(actions(&r, s).is_empty());
    blocks
        .table
        .put_managed(&acme, (now_ms(), now_ms() + 3_600_000), "longer", "ops")
        .expect("room");
    round_alone(&r).await;
    let got = actions(&r, s);
    assert_eq!(
        assigned(for_bucket(&got, "tenant", "acme")),
        Some((deny_all(), 10_000_000_000)),
        "at most the entry's TTL"
    );
    // Refreshed before that TTL lapses, as long as the block holds.
    clock.advance_ms(5_001);
    round_alone(&r).await;
    let got = actions(&r, s);
    assert_eq!(
        assigned(for_bucket(&got, "tenant", "acme")).map(|a| a.0),
        Some(deny_all())
    );

    // Lifted: the next round gives the bucket its share again.
    clock.advance_ms(1_000);
    assert!(
        blocks
            .table
            .remove_managed(&acme, (now_ms(), 0), "ops", now_ms())
            .is_some()
    );
    round_alone(&r).await;
    let got = actions(&r, s);
    assert!(
        matches!(
            assigned(for_bucket(&got, "tenant", "acme")),
            Some((
                rate_limit_strategy::Strategy::TokenBucket(_),
                10_000_000_000
            ))
        ),
        "{got:?}"
    );

    // An automatic block of the key under this rule, ending on its own: denied, then the
    // share again at the first round after its end.
    let (_, id) = r
        .local
        .rules()
        .prepare("other", crate::rules::RuleSpec::Named("per-second"), 1)
        .expect("a rule");
    assert!(blocks.table.put_auto(
        (id, "other", "per-second"),
        (now_ms(), now_ms() + 2_000),
        "n1",
        now_ms()
    ));
    round_alone(&r).await;
    let got = actions(&r, s);
    assert_eq!(
        assigned(for_bucket(&got, "tenant", "other")),
        Some((deny_all(), 2_000_000_000))
    );
    clock.advance_ms(2_000);
    // The Envoy keeps reporting (denied requests count as demand): its bucket is not quiet.
    r.report(s, report("edge", vec![api("other")]))
        .expect("valid");
    round_alone(&r).await;
    let got = actions(&r, s);
    assert!(
        matches!(
            assigned(for_bucket(&got, "tenant", "other")),
            Some((rate_limit_strategy::Strategy::TokenBucket(_), _))
        ),
        "{got:?}"
    );
}
