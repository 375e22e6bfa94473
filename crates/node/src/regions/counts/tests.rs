use super::*;
use crate::global::actor;
use ringlimit_core::limiter::test_support::{SEC, rule};
use ringlimit_core::link::framing;
use ringlimit_proto::Algorithm;

/// Aligned to 20 s.
const W0: u64 = 1_700_000_000 * SEC;
const PERIOD_MS: u64 = 20_000;

fn regions() -> Regions {
    let peers = [
        ("eu".to_owned(), "127.0.0.1:1".to_owned()),
        ("ap".to_owned(), "127.0.0.1:2".to_owned()),
    ];
    Regions::new("us", &peers, Duration::from_millis(200), None)
}

fn counters() -> GlobalCounters {
    let c = GlobalCounters::new(actor("n1", 1), 1_000);
    c.share_across_regions();
    c
}

fn update(id: u64, window: u64, current: u64, previous: u64) -> Update {
    Update {
        id,
        period_ms: PERIOD_MS,
        window,
        current,
        previous,
    }
}

fn of(node_id: &str, generation: u64, counts: Vec<Update>) -> ActorCounts {
    ActorCounts {
        node_id: node_id.to_owned(),
        generation,
        counts,
    }
}

/// Another region's counts are merged under actors qualified by its name: a node of the
/// same id here, or in a third region, counts apart; repeats change nothing.
#[test]
fn other_regions_actors_are_qualified_and_merged_by_maximum() {
    let (r, c) = (regions(), counters());
    let now = W0 + SEC;
    let w = now / (PERIOD_MS * 1_000_000);
    let lim = rule(Algorithm::FixedWindow, 100, PERIOD_MS, 100);
    for _ in 0..10 {
        assert!(c.check_in(7, &lim, true, now, 1).allowed);
    }
    // Node n1 of eu and of ap, the same id as this node's.
    let eu = [of("n1", 1, vec![update(7, w, 30, 0)])];
    assert_eq!(receive(&r, &c, "eu", &eu, now), Some(0));
    assert_eq!(receive(&r, &c, "eu", &eu, now), Some(0));
    let ap = [of("n1", 1, vec![update(7, w, 20, 0)])];
    assert_eq!(receive(&r, &c, "ap", &ap, now), Some(0));
    assert_eq!(c.totals(7, PERIOD_MS, w), (60, 0));
    // An older count lowers nothing.
    let older = [of("n1", 1, vec![update(7, w, 5, 0)])];
    assert_eq!(receive(&r, &c, "eu", &older, now), Some(0));
    assert_eq!(c.totals(7, PERIOD_MS, w), (60, 0));
    // The limit is one across the regions: 40 more here, not 90.
    let admitted = (0..100)
        .filter(|_| c.check_in(7, &lim, true, now, 1).allowed)
        .count();
    assert_eq!(admitted, 40);
    // What is relayed to the members: each qualified actor's counts, once.
    let (relayed, overflow) = c.take_foreign(now);
    assert!(!overflow);
    let names: Vec<(&str, u64, u64)> = relayed
        .iter()
        .map(|a| (a.node_id.as_str(), a.generation, a.counts[0].current))
        .collect();
    assert_eq!(names, [("ap/n1", 1, 20), ("eu/n1", 1, 30)]);
    assert!(c.take_foreign(now).0.is_empty());
    assert_eq!(c.stats.region_merged.load(Ordering::Relaxed), 4);
}

/// A frame of a region not configured here (or of this very region) closes the link; bad
/// counts are refused and counted, and change no count.
#[test]
fn bad_frames_are_refused_without_changing_counts() {
    let (r, c) = (regions(), counters());
    let now = W0 + SEC;
    let w = now / (PERIOD_MS * 1_000_000);
    let good = [of("n1", 1, vec![update(7, w, 3, 0)])];
    assert_eq!(receive(&r, &c, "mars", &good, now), None);
    assert_eq!(receive(&r, &c, "us", &good, now), None);
    assert!(c.is_empty());

    let mut zero_period = update(7, w, 50, 0);
    zero_period.period_ms = 0;
    let bad = [
        of("n1", 1, vec![zero_period]),
        // Windows this node does not hold: long gone, far ahead, beyond any clock.
        of("n1", 1, vec![update(7, w - 5, 50, 0)]),
        of("n1", 1, vec![update(7, w + 3, 50, 0)]),
        of("n1", 1, vec![update(7, u64::MAX, 50, 0)]),
        // No node id; one that is too long once qualified.
        of("", 1, vec![update(7, w, 50, 0)]),
        of(
            &"x".repeat(wire::MAX_NODE_ID_BYTES - 2),
            1,
            vec![update(7, w, 50, 0)],
        ),
    ];
    assert_eq!(receive(&r, &c, "eu", &bad, now), Some(6));
    assert!(c.is_empty(), "no count changed");
    // Too many actors: the bound, the rest refused.
    let many: Vec<ActorCounts> = (0..wire::MAX_ACTORS_PER_FRAME + 3)
        .map(|n| of(&format!("n{n}"), 1, vec![update(7, w, 1, 0)]))
        .collect();
    assert_eq!(receive(&r, &c, "eu", &many, now), Some(3));
    assert_eq!(
        c.totals(7, PERIOD_MS, w),
        (wire::MAX_ACTORS_PER_FRAME as u64, 0)
    );
    assert_eq!(c.stats.region_refused.load(Ordering::Relaxed), 9);
}

/// The sender numbers its counts on the receiver's clock: a receiver 600 ms ahead of a
/// 1 s window is a window ahead, and its counts land where the receiver counts them.
#[test]
fn counts_are_numbered_on_the_receivers_clock() {
    const MS: u64 = 1_000_000;
    let ahead = 600 * MS as i64;
    // Halfway through the sender's window: the receiver is in its next one.
    let sender_now = W0 + 500 * MS;
    let receiver_now = sender_now + 600 * MS;
    let u = Update {
        id: 9,
        period_ms: 1_000,
        window: sender_now / (1_000 * MS),
        current: 4,
        previous: 2,
    };
    let moved = translate(&[u], ahead);
    assert_eq!(moved[0].window, u.window + 1);
    assert_eq!(moved[0].window, receiver_now / (1_000 * MS));
    assert_eq!((moved[0].current, moved[0].previous), (4, 2));
    assert_eq!(translate(&[u], 0), vec![u]);
    // Untranslatable windows are left out.
    let first = Update { window: 0, ..u };
    assert!(translate(&[first], -ahead).is_empty());

    // Received as numbered: merged in the receiver's current window.
    let (r, c) = (regions(), counters());
    let frame = [of("n2", 4, moved.clone())];
    assert_eq!(receive(&r, &c, "eu", &frame, receiver_now), Some(0));
    assert_eq!(c.totals(9, 1_000, moved[0].window), (4, 2));
    // Not translated, with the receiver two windows ahead: refused.
    let (r, c) = (regions(), counters());
    assert_eq!(
        receive(
            &r,
            &c,
            "eu",
            &[of("n2", 4, vec![u])],
            receiver_now + 2_000 * MS
        ),
        Some(1)
    );
    assert!(c.is_empty());
}

/// Only `scope: regions` buckets go to other regions: the full set first, then what
/// changed; too many changes wait for a full set instead.
#[test]
fn only_shared_buckets_go_out_full_set_first() {
    let c = counters();
    let lim = rule(Algorithm::FixedWindow, 100, PERIOD_MS, 100);
    let now = W0 + SEC;
    let w = now / (PERIOD_MS * 1_000_000);
    let out = Outbox::new(2, 2);
    c.check_in(1 << 40, &lim, true, now, 3);
    c.check_in(2 << 40, &lim, false, now, 5);
    out.collect(&c, now);
    let (full, is_full) = out.take(0, &c, now);
    assert!(is_full);
    assert_eq!(full, vec![update(1 << 40, w, 3, 0)]);
    assert_eq!(out.take(0, &c, now), (Vec::new(), false));
    c.check_in(1 << 40, &lim, true, now, 1);
    out.collect(&c, now);
    assert_eq!(
        out.take(0, &c, now),
        (vec![update(1 << 40, w, 4, 0)], false)
    );
    // The other link has not sent its full set yet: it still gets it whole.
    assert_eq!(out.take(1, &c, now), (vec![update(1 << 40, w, 4, 0)], true));
    // At the cap on published buckets, new ones do not go (they are counted unpublished).
    for id in 3..6u64 {
        c.check_in(id << 40, &lim, true, now, 1);
    }
    out.collect(&c, now);
    let (set, is_full) = out.take(0, &c, now);
    assert!(!is_full);
    assert_eq!(
        set.len(),
        1,
        "one more published, the other two wait: {set:?}"
    );
    assert!((3..6u64).any(|id| set[0] == update(id << 40, w, 1, 0)));
    // A lost frame: the full set again.
    out.lost(0);
    let (set, is_full) = out.take(0, &c, now);
    assert!(is_full);
    assert_eq!(set.len(), 2);
}

/// A node without regions keeps no shared dirty set (nothing would take it).
#[test]
fn without_regions_nothing_is_kept_for_them() {
    let c = GlobalCounters::new(actor("n1", 1), 1_000);
    let lim = rule(Algorithm::FixedWindow, 100, PERIOD_MS, 100);
    c.check_in(1, &lim, true, W0, 1);
    assert!(c.take_shared_dirty().is_empty());
    assert_eq!(c.take_dirty().len(), 1);
}

/// How a test's peer server dials its members on `net` as `id` (it relays asks only).
fn sessions(
    net: &ringlimit_core::link::memnet::MemNet,
    id: &str,
) -> ringlimit_core::link::Sessions {
    ringlimit_core::link::Sessions::new(Arc::new(crate::peers::test_settings(
        net.dialer(id),
        id,
        "c",
    )))
}

/// A node (`local`) of region `name` with `peers`, its wall clock at `now`.
fn node(name: &str, peers: &[(&str, &str)], now: u64) -> (Arc<Regions>, Arc<Local>) {
    let peers: Vec<(String, String)> = peers
        .iter()
        .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()))
        .collect();
    let secret: Arc<[u8]> = Arc::from(&b"the-region-secret"[..]);
    let regions = Arc::new(Regions::new(
        name,
        &peers,
        Duration::from_millis(200),
        Some(secret),
    ));
    let clock = Arc::new(ringlimit_core::clock::ManualClock::new(now));
    let rules = Arc::new(crate::rules::InForce::new(crate::rules::RuleSet::builtin()));
    let counters = Arc::new(counters());
    let local = Arc::new(Local::new(rules, clock, 100, counters));
    (regions, local)
}

/// Over a real region link (the in-memory network, manual clocks, tokio's paused time): the
/// sender measures the receiver's clock 700 ms ahead, numbers its counts of a 1 s window on
/// it (the next window), and the receiver merges them under the qualified actor; a bucket of
/// a `scope: region` rule never crosses.
#[tokio::test(start_paused = true)]
async fn counts_cross_a_region_link_on_the_receivers_clock() {
    use ringlimit_core::link::memnet::MemNet;
    const MS: u64 = 1_000_000;
    let net = MemNet::new();
    let t = W0 + 100 * MS;
    let (eu, eu_local) = node("eu", &[("us", "us-entry")], t + 700 * MS);
    let server = crate::peers::PeerServer::new(
        eu_local.clone(),
        crate::peers::ServerSettings::open("eu-entry", "eu-cluster"),
        None,
    )
    .with_regions(Some(eu.clone()), sessions(&net, "eu-entry"));
    tokio::spawn(Arc::new(server).run(net.listen("eu-entry")));

    let (us, us_local) = node("us", &[("eu", "eu-entry")], t);
    let lim = rule(Algorithm::FixedWindow, 100, 1_000, 100);
    let us_counters = us_local.global().clone();
    assert!(us_counters.check_in(1, &lim, true, t, 6).allowed);
    assert!(us_counters.check_in(2, &lim, false, t, 4).allowed);
    let mut tasks = JoinSet::new();
    spawn(
        us.clone(),
        us_local.clone(),
        "n1".to_owned(),
        net.dialer("us-n1"),
        (Duration::from_millis(50), 100),
        &mut tasks,
    );

    let w = t / (1_000 * MS);
    let eu_counters = eu_local.global().clone();
    let mut arrived = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if eu_counters.totals(1, 1_000, w + 1) == (6, 0) {
            arrived = true;
            break;
        }
    }
    assert!(arrived, "no counts in eu's window {}", w + 1);
    let offset = us.offset("eu").expect("measured");
    assert_eq!(offset.offset_ns, 700 * MS as i64);
    assert_eq!(us.view(t)[1].offset_ms, Some(700.0));
    // Under the sender's region-qualified actor, relayed to eu's members as such.
    let (relayed, _) = eu_counters.take_foreign(t + 700 * MS);
    assert_eq!(relayed.len(), 1);
    assert_eq!(relayed[0].node_id, "us/n1");
    // Nothing of the scope: region bucket, nor in the sender's own numbering.
    assert_eq!(eu_counters.totals(2, 1_000, w + 1), (0, 0));
    assert_eq!(eu_counters.totals(1, 1_000, w), (0, 0));
    assert_eq!(eu_counters.stats.region_refused.load(Ordering::Relaxed), 0);

    // More hits go as a change, in the same window.
    assert!(us_counters.check_in(1, &lim, true, t, 3).allowed);
    let mut arrived = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if eu_counters.totals(1, 1_000, w + 1) == (9, 0) {
            arrived = true;
            break;
        }
    }
    assert!(arrived, "the change did not cross");
    tasks.abort_all();
}

/// The receiving end on a real region link: counts from a region not configured there close
/// the link and change nothing; bad counts are answered with how many were refused.
#[tokio::test(start_paused = true)]
async fn the_receiver_closes_on_an_unknown_region_and_counts_refusals() {
    use ringlimit_core::link::memnet::MemNet;
    let net = MemNet::new();
    let now = W0 + SEC;
    let (eu, eu_local) = node("eu", &[("us", "us-entry")], now);
    let server = crate::peers::PeerServer::new(
        eu_local.clone(),
        crate::peers::ServerSettings::open("eu-entry", "eu-cluster"),
        None,
    )
    .with_regions(Some(eu.clone()), sessions(&net, "eu-entry"));
    tokio::spawn(Arc::new(server).run(net.listen("eu-entry")));
    let dialer = net.dialer("x");
    let open = || {
        link::dial(
            &*dialer,
            "eu-entry",
            "us/x",
            eu.secret(),
            Duration::from_secs(1),
        )
    };
    let w = now / (PERIOD_MS * 1_000_000);
    let frame = |region: &str, counts| Frame::RegionCounts {
        region: region.to_owned(),
        sent_ns: 5,
        counts,
    };

    let (mut conn, version) = open().await.expect("link");
    assert_eq!(version, ringlimit_proto::peer::PROTOCOL_VERSION);
    let counts = vec![of("x", 1, vec![update(7, w, 3, 0)])];
    framing::send(&mut conn, &frame("mars", counts.clone()))
        .await
        .expect("sent");
    assert!(
        framing::recv(&mut conn, Duration::from_secs(1))
            .await
            .is_err(),
        "closed"
    );
    assert!(eu_local.global().is_empty());

    let (mut conn, _) = open().await.expect("link");
    let mut bad = counts.clone();
    bad.push(of("y", 1, vec![update(7, w + 9, 3, 0)]));
    framing::send(&mut conn, &frame("us", bad))
        .await
        .expect("sent");
    match framing::recv(&mut conn, Duration::from_secs(1)).await {
        Ok(Frame::RegionCountsAck {
            sent_ns, refused, ..
        }) => assert_eq!((sent_ns, refused), (5, 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(eu_local.global().totals(7, PERIOD_MS, w), (3, 0));
}
