//! The cluster's protocol behaviour, on nodes wired over an in-memory network
//! (`ringlimit_core::link::memnet`) under tokio's paused clock and a manual engine clock: no
//! sockets, no real waiting. Each node is the real routing, peer facade and peer server; only
//! membership is set by hand (a view per node), so a test can make nodes disagree.

use crate::cluster::quorum::Quorum;
use crate::cluster::{Member, MemberState, View};
use crate::decide::Here;
use crate::engine::Engine;
use crate::global::{GlobalCounters, actor};
use crate::metrics::PeerRpcMetrics;
use crate::peers::reset::{self, ResetStatus};
use crate::peers::{PeerServer, Peers, Relay, ServerSettings, handover};
use crate::routing::Dispatcher;
use crate::rules::RuleSet;
use crate::rules::RuleSpec;
use arc_swap::ArcSwap;
use ringlimit_core::clock::ManualClock;
use ringlimit_core::link::PeerSettings;
use ringlimit_core::link::client::TIMEOUTS_TO_OPEN;
use ringlimit_core::link::memnet::MemNet;
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule, Ring};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_millis(25);
const OPEN_FOR: Duration = Duration::from_secs(1);
/// 5 per hour: nothing refills during a test.
const RULE: InlineRule = InlineRule {
    limit: 5,
    period_ms: 3_600_000,
    algorithm: Algorithm::TokenBucket,
    burst: None,
};

/// A view from `self_id` in which `ring` are the alive members.
fn view(self_id: &str, ring: &[&str]) -> View {
    View {
        self_id: Arc::from(self_id),
        members: ring
            .iter()
            .map(|id| Member {
                node_id: (*id).to_owned(),
                peer_addr: (*id).to_owned(),
                http_addr: String::new(),
                state: MemberState::Alive,
                generation: 0,
            })
            .collect(),
        ring: Ring::new(ring),
        peer_addrs: ring
            .iter()
            .map(|id| (Arc::from(*id), (*id).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        quorum: Quorum::of(ring.iter().map(|id| Arc::from(*id))),
    }
}

struct Node {
    engine: Arc<Engine>,
    view: Arc<ArcSwap<View>>,
    pool: Arc<Peers>,
    server: Arc<PeerServer>,
    dispatcher: Dispatcher,
    serving: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

impl Node {
    /// Node `id` (also its address), listening on `net`, seeing `ring`.
    fn start(net: &MemNet, id: &str, ring: &[&str]) -> Self {
        Self::start_with(net, id, ring, RuleSet::builtin())
    }

    /// [`Node::start`] with `rules` in force.
    fn start_with(net: &MemNet, id: &str, ring: &[&str], rules: RuleSet) -> Self {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
        let engine = Arc::new(Engine::new(rules, 10_000, clock));
        let here = Here::new(
            engine.clone(),
            Arc::new(GlobalCounters::new(actor(id, 0), 1000)),
        );
        let view = Arc::new(ArcSwap::from_pointee(view(id, ring)));
        let pool = Arc::new(Peers::new(PeerSettings {
            dialer: net.dialer(id),
            node_id: id.to_owned(),
            cluster_id: "ringlimit".into(),
            secret: None,
            deadline: DEADLINE,
            connect_timeout: Duration::from_millis(500),
            open_for: OPEN_FOR,
            queue: 64,
        }));
        let server = Arc::new(PeerServer::new(
            here.clone(),
            ServerSettings::open(id, "ringlimit"),
            Some(Relay {
                view: view.clone(),
                peers: pool.shared(),
            }),
        ));
        let serving = tokio::spawn(server.clone().run(net.listen(id)));
        let dispatcher = Dispatcher::new(
            here,
            view.clone(),
            pool.shared(),
            PeerRpcMetrics::unregistered(),
        );
        Self {
            engine,
            view,
            pool,
            server,
            dispatcher,
            serving,
        }
    }

    fn set_ring(&self, ring: &[&str]) {
        let id = self.view.load().self_id.clone();
        self.view.store(Arc::new(view(&id, ring)));
    }

    async fn check(&self, key: &str) -> CheckAnswer {
        let p = self
            .engine
            .prepare_check(key, RuleSpec::Inline(RULE), 1)
            .expect("valid check");
        self.dispatcher.check(&p).await.expect("answered")
    }

    fn bucket(key: &str) -> u64 {
        let resolved = ringlimit_core::check::Resolved::inline(&RULE).expect("valid rule");
        resolved.bucket(key, 1).expect("valid key")
    }

    fn holds(&self, key: &str) -> bool {
        self.engine.holds(Self::bucket(key))
    }
}

/// A key whose bucket `owner` owns under every ring in `rings` (with the owner each names).
fn key_owned(rings: &[(&[&str], &str)]) -> String {
    (0..10_000)
        .map(|i| format!("key:{i}"))
        .find(|k| {
            let id = Node::bucket(k);
            rings
                .iter()
                .all(|(ring, owner)| Ring::new(*ring).owner(id) == Some(*owner))
        })
        .expect("a key with those owners")
}

const ABC: &[&str] = &["a", "b", "c"];

#[tokio::test(start_paused = true)]
async fn a_check_is_decided_exactly_by_its_owner() {
    let net = MemNet::new();
    let nodes: Vec<Node> = ABC.iter().map(|id| Node::start(&net, id, ABC)).collect();
    let key = key_owned(&[(ABC, "b")]);
    let answers: Vec<CheckAnswer> =
        futures::future::join_all((0..7).map(|i| nodes[i % 3].check(&key))).await;
    let allowed = answers.iter().filter(|a| a.allowed).count();
    assert_eq!(allowed, 5, "exactly the limit, from whichever node");
    assert!(answers.iter().all(|a| !a.degraded));
    assert!(nodes[1].holds(&key) && !nodes[0].holds(&key) && !nodes[2].holds(&key));
    let forwarded: u64 = nodes
        .iter()
        .map(|n| n.dispatcher.stats.forwarded.load(Ordering::Relaxed))
        .sum();
    assert_eq!(forwarded, 5, "the checks that landed on a and c");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_owner_fails_open_at_the_deadline_then_at_once_until_it_answers_again() {
    let net = MemNet::new();
    let (a, _b) = (
        Node::start(&net, "a", &["a", "b"]),
        Node::start(&net, "b", &["a", "b"]),
    );
    let key = key_owned(&[(&["a", "b"], "b")]);
    assert!(!a.check(&key).await.degraded);
    net.stall("b");
    for _ in 0..TIMEOUTS_TO_OPEN {
        let started = Instant::now();
        let answer = a.check(&key).await;
        assert!(answer.degraded, "fail-open from a's share");
        assert_eq!(started.elapsed(), DEADLINE);
    }
    // The circuit is open: no more waiting on b.
    let started = Instant::now();
    assert!(a.check(&key).await.degraded);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        a.dispatcher.stats.fail_open.load(Ordering::Relaxed),
        u64::from(TIMEOUTS_TO_OPEN) + 1
    );
    // b answers again: after `open_for` the circuit closes on b's first answer.
    net.resume("b");
    tokio::time::sleep(OPEN_FOR).await;
    let answer = a.check(&key).await;
    assert!(!answer.degraded);
    // b's bucket: the warm-up, this check, and the first timed-out check, whose frame was on
    // the wire when b stalled and which b decided when it resumed (as a paused process does
    // with what is in its socket); the two others were dropped unsent, their callers gone.
    assert_eq!(answer.remaining, 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_to_the_owner_fails_open_at_once() {
    let net = MemNet::new();
    let (a, _b) = (
        Node::start(&net, "a", &["a", "b"]),
        Node::start(&net, "b", &["a", "b"]),
    );
    let key = key_owned(&[(&["a", "b"], "b")]);
    assert!(!a.check(&key).await.degraded);
    net.cut("a", "b");
    tokio::task::yield_now().await;
    let started = Instant::now();
    let answer = a.check(&key).await;
    assert!(answer.degraded);
    assert!(
        started.elapsed() < DEADLINE,
        "not waiting for a deadline: {:?}",
        started.elapsed()
    );
    // A rule that fails closed is denied instead (`closed_answer`), which the rules tests cover;
    // here: the share is a's half of the limit, rounded down: 5 / 2 = 2.
    let admitted = 1 + futures::future::join_all((0..5).map(|_| a.check(&key)))
        .await
        .iter()
        .filter(|a| a.allowed)
        .count();
    assert_eq!(admitted, 2);
}

#[tokio::test(start_paused = true)]
async fn concurrent_checks_for_one_owner_travel_as_one_frame() {
    let net = MemNet::new();
    let (a, b) = (
        Node::start(&net, "a", &["a", "b"]),
        Node::start(&net, "b", &["a", "b"]),
    );
    let keys: Vec<String> = (0..10)
        .map(|i| {
            (0..10_000)
                .map(|j| format!("k{i}:{j}"))
                .find(|k| Ring::new(["a", "b"]).owner(Node::bucket(k)) == Some("b"))
                .expect("a key of b")
        })
        .collect();
    assert!(!a.check(&keys[0]).await.degraded);
    let frames_before = b.server.stats.frames.load(Ordering::Relaxed);
    let answers = futures::future::join_all(keys.iter().map(|k| a.check(k))).await;
    assert!(answers.iter().all(|x| x.allowed && !x.degraded));
    assert_eq!(
        b.server.stats.frames.load(Ordering::Relaxed) - frames_before,
        1,
        "ten checks, one frame"
    );
    assert_eq!(a.pool.stats().checks.load(Ordering::Relaxed), 11);
}

#[tokio::test(start_paused = true)]
async fn a_check_sent_to_a_former_owner_is_relayed_to_the_owner() {
    let net = MemNet::new();
    let nodes: Vec<Node> = ABC.iter().map(|id| Node::start(&net, id, ABC)).collect();
    // b is leaving: in its own view the ring is a, c, and the key is c's; a has not heard yet.
    let key = key_owned(&[(ABC, "b"), (&["a", "c"], "c")]);
    nodes[1].set_ring(&["a", "c"]);
    let answers = [nodes[0].check(&key).await, nodes[0].check(&key).await];
    assert!(answers.iter().all(|x| x.allowed && !x.degraded));
    assert_eq!(answers[1].remaining, 3, "both decided on one bucket");
    assert!(nodes[2].holds(&key), "decided at c, the owner");
    assert!(!nodes[1].holds(&key), "not at b, which no longer owns it");
    assert_eq!(nodes[1].server.stats.relayed.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_ring_change_hands_live_buckets_to_their_new_owner() {
    let net = MemNet::new();
    let a = Node::start(&net, "a", &["a"]);
    let b = Node::start(&net, "b", &["a", "b"]);
    let moving = key_owned(&[(&["a", "b"], "b")]);
    let staying = key_owned(&[(&["a", "b"], "a")]);
    for key in [&moving, &staying] {
        a.check(key).await;
        a.check(key).await;
    }
    a.set_ring(&["a", "b"]);
    let now = a.engine.clock().now();
    let moved = handover::hand_over(&a.view.load(), &a.engine, &a.pool, now).await;
    assert_eq!(moved, 1);
    assert!(!a.holds(&moving) && b.holds(&moving) && a.holds(&staying));
    // The moved key kept its consumption: two taken at a, one more at b.
    assert_eq!(b.check(&moving).await.remaining, 2);
}

#[tokio::test(start_paused = true)]
async fn a_reset_reaches_every_member_and_reports_one_that_does_not_answer() {
    let net = MemNet::new();
    let nodes: Vec<Node> = ABC.iter().map(|id| Node::start(&net, id, ABC)).collect();
    let key = "reset-me";
    let rule = ringlimit_core::check::Resolved::inline(&RULE)
        .expect("valid")
        .rule;
    for n in &nodes {
        n.engine.decide(Node::bucket(key), &rule, 1);
    }
    net.stall("c");
    let within = Duration::from_millis(200);
    let started = Instant::now();
    let a = &nodes[0];
    let report = reset::everywhere(
        &a.view.load(),
        &a.pool,
        &a.engine,
        &[Node::bucket(key)],
        within,
    )
    .await;
    assert_eq!(
        started.elapsed(),
        within,
        "the silent member is waited on for the bound, no more"
    );
    let status: Vec<(&str, ResetStatus, Option<u64>)> = report
        .iter()
        .map(|r| (r.node_id.as_str(), r.status, r.removed))
        .collect();
    assert_eq!(
        status,
        [
            ("a", ResetStatus::Ok, Some(1)),
            ("b", ResetStatus::Ok, Some(1)),
            ("c", ResetStatus::Failed, None)
        ]
    );
    assert!(!nodes[0].holds(key) && !nodes[1].holds(key) && nodes[2].holds(key));
}

// ---- One request, several limits (all-or-nothing) ----

const LIMITS: &str = "
rules:
  - { name: per-ip, limit: 10, period: 1h }
  - { name: per-user, limit: 3, period: 1h }
  - { name: trial, limit: 1, period: 1h, shadow: true }
  - { name: tb, limit: 2, period: 1h, algorithm: token_bucket }
  - { name: lb, limit: 2, period: 1h, algorithm: leaky_bucket }
  - { name: fw, limit: 2, period: 1h, algorithm: fixed_window }
  - { name: sw, limit: 2, period: 1h, algorithm: sliding_window }
  - { name: sl, limit: 2, period: 1h, algorithm: sliding_log }
";

fn limits_cluster(net: &MemNet) -> Vec<Node> {
    let rules = RuleSet::from_yaml(LIMITS).expect("valid rules");
    ABC.iter()
        .map(|id| Node::start_with(net, id, ABC, rules.clone()))
        .collect()
}

impl Node {
    /// One all-or-nothing request of `(rule, key)` checks of cost 1 through this node.
    async fn check_all(&self, checks: &[(&str, &str)]) -> Vec<CheckAnswer> {
        let prepared: Vec<_> = checks
            .iter()
            .map(|(rule, key)| {
                self.engine
                    .prepare_check(key, RuleSpec::Named(rule), 1)
                    .expect("valid check")
            })
            .collect();
        self.dispatcher
            .check_all(&prepared)
            .await
            .into_iter()
            .map(|r| r.expect("answered"))
            .collect()
    }

    /// What the bucket of (`rule`, `key`) has left, read (cost 0) through this node.
    async fn remaining(&self, rule: &str, key: &str) -> u64 {
        let p = self
            .engine
            .prepare_check(key, RuleSpec::Named(rule), 0)
            .expect("valid check");
        self.dispatcher.check(&p).await.expect("answered").remaining
    }
}

/// A key whose bucket under the named `rule` `owner` owns in ring `ABC`.
fn named_key_owned(nodes: &[Node], rule: &str, prefix: &str, owner: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| {
            let (_, id) = nodes[0]
                .engine
                .prepare(k, RuleSpec::Named(rule), 1)
                .expect("valid");
            Ring::new(ABC).owner(id) == Some(owner)
        })
        .expect("a key with that owner")
}

fn admitted(answers: &[CheckAnswer]) -> bool {
    answers.iter().all(|a| a.allowed)
}

#[tokio::test(start_paused = true)]
async fn a_shared_ip_limit_and_user_limits_across_owners_admit_exactly_and_lose_nothing() {
    let net = MemNet::new();
    let nodes = limits_cluster(&net);
    // The IP's bucket on a, the users' on b and c.
    let ip = named_key_owned(&nodes, "per-ip", "ip", "a");
    let users: Vec<String> = ["b", "c", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, owner)| named_key_owned(&nodes, "per-user", &format!("user{i}"), owner))
        .collect();
    let mut per_user = [0u64; 4];
    let mut total = 0;
    for r in 0..30 {
        let u = r % 4;
        let answers = nodes[r % 3]
            .check_all(&[("per-user", &users[u]), ("per-ip", &ip)])
            .await;
        assert!(answers.iter().all(|a| !a.degraded));
        if admitted(&answers) {
            per_user[u] += 1;
            total += 1;
        }
    }
    assert_eq!(total, 10, "exactly the IP limit");
    assert_eq!(
        per_user,
        [3, 3, 2, 2],
        "no user over its 3, in arrival order"
    );
    // Users 2 and 3 were denied by the IP after their own limit admitted: given back.
    for (u, user) in users.iter().enumerate() {
        assert_eq!(
            nodes[u % 3].remaining("per-user", user).await,
            3 - per_user[u],
            "user {u}'s bucket shows exactly its admitted requests"
        );
    }
    assert_eq!(nodes[1].remaining("per-ip", &ip).await, 0);
    let refunded: u64 = nodes
        .iter()
        .map(|n| n.dispatcher.stats.refunded_requests.load(Ordering::Relaxed))
        .sum();
    assert_eq!(refunded, 20);
}

#[tokio::test(start_paused = true)]
async fn a_denied_request_leaves_every_algorithm_as_if_it_never_came() {
    let net = MemNet::new();
    let nodes = limits_cluster(&net);
    let algorithms = ["tb", "lb", "fw", "sw", "sl"];
    let keys: Vec<String> = algorithms
        .iter()
        .zip(["a", "b", "c", "a", "b"])
        .map(|(rule, owner)| named_key_owned(&nodes, rule, "k", owner))
        .collect();
    let blocker = named_key_owned(&nodes, "per-user", "blocked", "c");
    for _ in 0..3 {
        assert!(nodes[0].check_all(&[("per-user", &blocker)]).await[0].allowed);
    }
    let mut request: Vec<(&str, &str)> = algorithms
        .iter()
        .zip(&keys)
        .map(|(r, k)| (*r, k.as_str()))
        .collect();
    request.push(("per-user", &blocker));
    for through in 0..3 {
        let answers = nodes[through].check_all(&request).await;
        assert!(!admitted(&answers));
        assert!(!answers[5].allowed, "denied by the exhausted user");
        assert!(answers[..5].iter().all(|a| a.allowed && a.remaining == 2));
        for (rule, key) in algorithms.iter().zip(&keys) {
            assert_eq!(
                nodes[(through + 1) % 3].remaining(rule, key).await,
                2,
                "{rule}: nothing taken"
            );
        }
    }
    // Without the blocker, the same limits admit twice, then deny.
    request.pop();
    for expected in [true, true, false] {
        assert_eq!(admitted(&nodes[2].check_all(&request).await), expected);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_all_or_nothing_requests_never_admit_more_than_a_limit() {
    let net = MemNet::new();
    let nodes = limits_cluster(&net);
    let ip = named_key_owned(&nodes, "per-ip", "ip", "b");
    let users: Vec<String> = (0..8)
        .map(|i| named_key_owned(&nodes, "per-user", &format!("u{i}"), ABC[i % 3]))
        .collect();
    let requests = (0..48).map(|r| {
        let (node, user, ip) = (&nodes[r % 3], &users[r % 8], &ip);
        async move {
            let answers = node.check_all(&[("per-user", user), ("per-ip", ip)]).await;
            (r % 8, admitted(&answers))
        }
    });
    let results = futures::future::join_all(requests).await;
    let total = results.iter().filter(|(_, ok)| *ok).count();
    assert!(total <= 10, "never over the IP limit: {total}");
    for u in 0..8 {
        let n = results.iter().filter(|(v, ok)| *v == u && *ok).count();
        assert!(n <= 3, "user {u}: {n}");
    }
    // Whatever was admitted is exactly what the buckets show.
    assert_eq!(nodes[0].remaining("per-ip", &ip).await, 10 - total as u64);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_limit_is_decided_and_reported_but_never_blocks() {
    let net = MemNet::new();
    let nodes = limits_cluster(&net);
    let user = named_key_owned(&nodes, "per-user", "s", "b");
    let trial = named_key_owned(&nodes, "trial", "s", "c");
    for (r, node) in nodes.iter().enumerate() {
        let answers = node
            .check_all(&[("per-user", &user), ("trial", &trial)])
            .await;
        // The routing answers as decided; the service turns a shadow denial into an allowed
        // answer with `shadow_denied`. A shadow denial does not deny the request: the user's
        // limit took its cost every time.
        assert!(answers[0].allowed);
        assert_eq!(answers[1].allowed, r == 0, "the trial limit admits one");
    }
    assert_eq!(nodes[0].remaining("per-user", &user).await, 0);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_owner_answers_from_the_share_and_a_denial_gives_the_share_back() {
    let net = MemNet::new();
    let nodes = limits_cluster(&net);
    let user = named_key_owned(&nodes, "per-user", "cut", "c");
    let blocker = named_key_owned(&nodes, "per-ip", "blocker", "b");
    for _ in 0..10 {
        assert!(nodes[0].check_all(&[("per-ip", &blocker)]).await[0].allowed);
    }
    net.cut("a", "c");
    // a's share of per-user (3 over 3 members: 1) is taken, then given back on the denial.
    for _ in 0..3 {
        let answers = nodes[0]
            .check_all(&[("per-user", &user), ("per-ip", &blocker)])
            .await;
        assert!(answers[0].degraded && answers[0].allowed, "from a's share");
        assert!(!answers[1].allowed);
    }
    let alone = nodes[0].check_all(&[("per-user", &user)]).await;
    assert!(
        alone[0].degraded && alone[0].allowed,
        "the share was given back each time"
    );
    assert!(
        !nodes[0].check_all(&[("per-user", &user)]).await[0].allowed,
        "then the share of 1 is spent"
    );
    // c itself never saw any of it.
    assert_eq!(nodes[2].remaining("per-user", &user).await, 3);
}

const GLOBAL_AND_CLOSED: &str = "
rules:
  - { name: per-user, limit: 3, period: 1h }
  - { name: cap, limit: 4, period: 1h, mode: global }
  - { name: strict, limit: 5, period: 1h, on_owner_unreachable: closed }
";

#[tokio::test(start_paused = true)]
async fn a_global_limit_counts_only_when_the_request_is_admitted() {
    let net = MemNet::new();
    let rules = RuleSet::from_yaml(GLOBAL_AND_CLOSED).expect("valid rules");
    let nodes: Vec<Node> = ABC
        .iter()
        .map(|id| Node::start_with(&net, id, ABC, rules.clone()))
        .collect();
    let user = named_key_owned(&nodes, "per-user", "g", "b");
    // Three admitted: the global cap counts each (on a, where they land).
    for _ in 0..3 {
        assert!(admitted(
            &nodes[0]
                .check_all(&[("per-user", &user), ("cap", "all")])
                .await
        ));
    }
    // The user's limit denies: the cap is asked, never counted.
    for _ in 0..5 {
        let answers = nodes[0]
            .check_all(&[("per-user", &user), ("cap", "all")])
            .await;
        assert!(!answers[0].allowed && answers[1].allowed);
    }
    let p = nodes[0]
        .engine
        .prepare_check("all", RuleSpec::Named("cap"), 0)
        .expect("valid");
    let cap = nodes[0].dispatcher.check(&p).await.expect("answered");
    assert_eq!(cap.remaining, 1, "4 - the 3 admitted requests");
}

#[tokio::test(start_paused = true)]
async fn a_closed_rule_whose_owner_is_unreachable_denies_the_request_and_takes_nothing() {
    let net = MemNet::new();
    let rules = RuleSet::from_yaml(GLOBAL_AND_CLOSED).expect("valid rules");
    let nodes: Vec<Node> = ABC
        .iter()
        .map(|id| Node::start_with(&net, id, ABC, rules.clone()))
        .collect();
    let user = named_key_owned(&nodes, "per-user", "c", "b");
    let strict = named_key_owned(&nodes, "strict", "c", "c");
    net.cut("a", "c");
    let answers = nodes[0]
        .check_all(&[("per-user", &user), ("strict", &strict)])
        .await;
    assert!(answers[0].allowed && !answers[1].allowed && answers[1].degraded);
    assert_eq!(
        nodes[1].remaining("per-user", &user).await,
        3,
        "the user's cost was given back"
    );
}

impl Node {
    /// This node's view: `alive` of the last known `known`, without a majority.
    fn set_minority(&self, alive: &[&str], known: &[&str]) {
        let mut v = view(&self.view.load().self_id, alive);
        v.ring = Ring::new(known);
        v.quorum = Quorum {
            quorate: false,
            ..Quorum::of(known.iter().map(|id| Arc::from(*id)))
        };
        self.view.store(Arc::new(v));
    }
}

/// Regression (issue 15): in a 2 | 1 partition the lone node took ownership of every key and
/// both sides granted each key its whole limit (100–122% over). Without a majority a node owns
/// nothing: the others' keys get a third of the limit, degraded; its own keys the same, and no
/// more than their exact buckets still hold (what was spent before the partition stays spent).
#[tokio::test(start_paused = true)]
async fn a_node_without_a_majority_answers_every_key_from_its_share() {
    let net = MemNet::new();
    let nodes: Vec<Node> = ABC.iter().map(|id| Node::start(&net, id, ABC)).collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let of_a = key_owned(&[(ABC, "a"), (&["a", "c"], "a")]);
    let of_b = key_owned(&[(ABC, "b"), (&["a", "c"], "c")]);
    let fresh_of_b = (0..10_000)
        .map(|i| format!("fresh:{i}"))
        .find(|k| Ring::new(ABC).owner(Node::bucket(k)) == Some("b"))
        .expect("a key of b");
    for key in [&of_a, &of_b] {
        for _ in 0..5 {
            assert!(a.check(key).await.allowed);
        }
    }
    // b is cut off: a and c declared it dead; b sees neither of them.
    net.cut("a", "b");
    net.cut("c", "b");
    a.set_ring(&["a", "c"]);
    c.set_ring(&["a", "c"]);
    b.set_minority(&["b"], ABC);
    for (key, expected) in [(&of_a, 1), (&of_b, 0), (&fresh_of_b, 1)] {
        let answers: Vec<CheckAnswer> =
            futures::future::join_all((0..6).map(|_| b.check(key))).await;
        assert!(answers.iter().all(|x| x.degraded && x.limit == 5));
        let allowed = answers.iter().filter(|x| x.allowed).count();
        assert_eq!(
            allowed, expected,
            "b's share of 5 among the 3 it last knew, for {key}"
        );
    }
    assert!(b.holds(&fresh_of_b), "b decided its own key exactly too");
    assert_eq!(b.dispatcher.stats.minority.load(Ordering::Relaxed), 18);
    assert!(!b.holds(&of_a), "b took no ownership of a's key");
    // The majority side keeps deciding exactly: a's key stays spent.
    assert!(!a.check(&of_a).await.allowed && !c.check(&of_a).await.degraded);
    // An all-or-nothing request at b takes from the share and gives it back when denied.
    let rules = RuleSet::from_yaml(LIMITS).expect("valid rules");
    let lone = Node::start_with(&net, "d", &["d"], rules);
    lone.set_minority(&["d"], &["d", "e", "f"]);
    let both = [("per-user", "u1"), ("per-ip", "ip")];
    let first = lone.check_all(&both).await;
    assert!(admitted(&first) && first.iter().all(|x| x.degraded));
    // per-user's share of 3 among 3 is 1: the second request is denied and gives per-ip back.
    assert!(!admitted(&lone.check_all(&both).await));
    let mut ip = 0;
    for _ in 0..5 {
        ip += usize::from(admitted(&lone.check_all(&[("per-ip", "ip")]).await));
    }
    assert_eq!(
        ip, 2,
        "per-ip's share of 10 among 3 is 3, one held by the first request"
    );
    // Healed: b sees a majority again and forwards to the owner.
    net.heal("a", "b");
    net.heal("c", "b");
    b.set_ring(ABC);
    assert!(!b.check(&of_a).await.degraded);
}

/// `n` distinct keys named `prefix:i`.
fn flood_keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// A check of `RULE` for each of `keys`, prepared by `engine`.
fn prepared<'a>(engine: &Engine, keys: &'a [String]) -> Vec<crate::engine::Prepared<'a>> {
    keys.iter()
        .map(|k| {
            engine
                .prepare_check(k, RuleSpec::Inline(RULE), 1)
                .expect("valid check")
        })
        .collect()
}

/// A large batch decided here gives the runtime back every few decisions, so a single check
/// polled beside it is answered before the batch ends (under a flood of batches, other keys'
/// checks no longer wait for whole batches: bench/keyflood.sh).
#[tokio::test(start_paused = true)]
async fn a_large_local_batch_lets_a_single_check_through_before_it_ends() {
    let net = MemNet::new();
    let a = Node::start(&net, "a", &["a"]);
    let keys = flood_keys("flood", 1_000);
    let batch = prepared(&a.engine, &keys);
    let done = std::cell::RefCell::new(Vec::new());
    // `join!` polls the batch first; the single check only runs when the batch yields.
    tokio::join!(
        async {
            let answers = a.dispatcher.check_many(&batch).await;
            assert!(answers.iter().all(|r| r.as_ref().is_ok_and(|x| x.allowed)));
            done.borrow_mut().push("batch");
        },
        async {
            assert!(a.check("single").await.allowed);
            done.borrow_mut().push("single");
        },
    );
    assert_eq!(*done.borrow(), ["single", "batch"]);
}

/// Large batches on one thread decide one at a time, in turn: a second batch waits for the
/// first to finish deciding (so a single check waits behind one batch's slice, not one of each
/// batch's), while a single check still goes between the first batch's slices.
#[tokio::test(start_paused = true)]
async fn large_batches_on_one_thread_decide_in_turn() {
    let net = MemNet::new();
    let a = Node::start(&net, "a", &["a"]);
    let (long_keys, short_keys) = (flood_keys("long", 1_000), flood_keys("short", 100));
    let (long, short) = (
        prepared(&a.engine, &long_keys),
        prepared(&a.engine, &short_keys),
    );
    let done = std::cell::RefCell::new(Vec::new());
    // Polled in this order; the short batch would end first if the two interleaved.
    tokio::join!(
        async {
            a.dispatcher.check_many(&long).await;
            done.borrow_mut().push("long");
        },
        async {
            a.dispatcher.check_many(&short).await;
            done.borrow_mut().push("short");
        },
        async {
            assert!(a.check("single").await.allowed);
            done.borrow_mut().push("single");
        },
    );
    assert_eq!(*done.borrow(), ["single", "long", "short"]);
}
