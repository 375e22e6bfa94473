//! The cluster's protocol behaviour on whole nodes in memory (moved from the process tests of
//! `tests/tests/cluster.rs`, which ran in wall time): forming, exact limits and forwarding
//! across owners, batching, an owner killed or paused under load, a graceful leave and a
//! restart with the same id, readiness while leaving, ownership moves that keep consumption,
//! membership that stays stable under load, a partition healed.
//!
//! Virtual time makes latencies meaningless here (an in-memory forward takes no time), so the
//! process tests' latency bounds have no twin; their counts, states and answers do.

use super::{Cluster, NodeClient, Seen, inline, keys_owned_by, owner_of};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const PERIOD_MS: u64 = 60_000;
const IDS: [&str; 3] = ["n0", "n1", "n2"];

/// `allowed` of `key` (limit 5 per minute) checked on node `id`, and whether it was degraded.
async fn allowed(c: &Cluster, id: &str, key: &str) -> (bool, bool) {
    let s = c.seen(id, &inline(key, 5, PERIOD_MS)).await;
    (s.allowed, s.degraded)
}

/// Checks each key 12 times round-robin over `ids`; returns how many each key was allowed.
async fn admitted(c: &Cluster, ids: &[&str], keys: &[String]) -> Vec<usize> {
    let mut counts = vec![0; keys.len()];
    let mut turn = 0;
    for _ in 0..12 {
        for (i, k) in keys.iter().enumerate() {
            let (ok, degraded) = allowed(c, ids[turn % ids.len()], k).await;
            assert!(!degraded, "{k} answered degraded");
            counts[i] += usize::from(ok);
            turn += 1;
        }
    }
    counts
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// Keys of `owner` on the ring of [`IDS`] (limit 5 per minute).
fn owned(owner: &str, prefix: &str, n: usize) -> Vec<String> {
    keys_owned_by(&IDS, owner, prefix, n, (5, PERIOD_MS))
}

/// One check made by a load loop.
#[derive(Debug)]
struct Sample {
    /// When it was sent and answered, from the start of the load.
    sent: Duration,
    answered: Duration,
    seen: Option<Seen>,
}

/// Load loops, each cycling through its keys at one check every 4 ms (limit 100,000 per
/// minute, never denied), until finished.
struct Load {
    t0: Instant,
    stop: Arc<AtomicBool>,
    loops: tokio::task::JoinSet<Vec<Sample>>,
}

impl Load {
    /// Four loops over `clients` in turn.
    fn start(clients: &[NodeClient], keys: Arc<Vec<String>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let mut loops = tokio::task::JoinSet::new();
        for l in 0..4 {
            let (client, keys, stop) = (
                clients[l % clients.len()].clone(),
                keys.clone(),
                stop.clone(),
            );
            loops.spawn(async move {
                let mut samples = Vec::new();
                let mut i = l * 75;
                let mut tick = tokio::time::interval(Duration::from_millis(4));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let key = &keys[i % keys.len()];
                    i += 1;
                    let sent = t0.elapsed();
                    let seen = client
                        .try_http(
                            "POST",
                            "/v1/check",
                            &inline(key, 100_000, PERIOD_MS).to_string(),
                        )
                        .await
                        .filter(|r| r.status == 200 || r.status == 429)
                        .map(|r| Seen::of(r.status, &r.json()));
                    samples.push(Sample {
                        sent,
                        answered: t0.elapsed(),
                        seen,
                    });
                }
                samples
            });
        }
        Self { t0, stop, loops }
    }

    /// Stops the loops and returns every check they made.
    async fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = Vec::new();
        while let Some(done) = self.loops.join_next().await {
            samples.extend(done.expect("load loop"));
        }
        samples
    }
}

fn degraded(s: &&Sample) -> bool {
    matches!(s.seen, Some(Seen { degraded: true, .. }))
}

/// Replaces `three_nodes_admit_exactly_the_limit_per_key` (process test): three nodes form a
/// cluster; whichever node a check lands on, each key admits exactly its limit, every node
/// forwards exactly the checks of keys it does not own (its ring agrees with [`owner_of`]),
/// and a batch to one node is as exact and travels to each owner in few frames.
#[tokio::test(start_paused = true)]
async fn three_nodes_admit_exactly_and_forward_what_they_do_not_own() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = keys("exact", 50);
    let mut expect_forwarded = [0u64; 3];
    let mut turn = 0;
    for _ in 0..12 {
        for k in &keys {
            let n = turn % 3;
            expect_forwarded[n] += u64::from(owner_of(&IDS, k, 5, PERIOD_MS) != IDS[n]);
            turn += 1;
        }
    }
    assert_eq!(admitted(&c, &IDS, &keys).await, vec![5; 50]);
    let mut forwarded = [0u64; 3];
    for (i, id) in IDS.iter().enumerate() {
        forwarded[i] = c.forwarding(id, "forwarded").await;
    }
    assert_eq!(forwarded, expect_forwarded);
    assert_eq!(c.sum_forwarding(&IDS, "fail_open").await, 0);

    // One batch of 300 checks (30 keys × 10, interleaved) to one node.
    let before = c.view("n0").await;
    let batch: Vec<_> = (0..300)
        .map(|i| inline(&format!("batch:{}", i % 30), 5, PERIOD_MS))
        .collect();
    let results = c.batch("n0", &batch).await;
    assert_eq!(results.len(), 300);
    let mut allowed = vec![Vec::new(); 30];
    for (i, a) in results.iter().enumerate() {
        let s = Seen::of(if a["allowed"] == true { 200 } else { 429 }, a);
        assert!(!s.degraded, "batch item {i} degraded: {a}");
        allowed[i % 30].push(s.allowed);
    }
    for (key, seq) in allowed.iter().enumerate() {
        // In order within the batch: the first five of each key pass.
        assert_eq!(seq, &[[true; 5], [false; 5]].concat(), "batch:{key}");
    }
    let after = c.view("n0").await;
    let delta = |counter: &str| {
        after["forwarding"][counter].as_u64().unwrap_or(0)
            - before["forwarding"][counter].as_u64().unwrap_or(0)
    };
    let not_owned = (0..300)
        .filter(|i| owner_of(&IDS, &format!("batch:{}", i % 30), 5, PERIOD_MS) != "n0")
        .count() as u64;
    assert_eq!(delta("forwarded"), not_owned);
    let (frames, checks) = (delta("peer_frames"), delta("peer_checks"));
    assert!(
        frames >= 1 && checks > 10 * frames,
        "{checks} checks in {frames} frames"
    );
    assert_eq!(after["forwarding"]["fail_open"], 0);
}

/// Replaces `owner_killed_survivors_fail_open`: under load on the survivors, an owner is
/// killed. No check fails; none is degraded before the kill; its keys are answered degraded
/// (fail-open) until the survivors declare it dead and take it out of their rings; after that
/// every key is decided by a live owner again.
#[tokio::test(start_paused = true)]
async fn owner_killed_survivors_fail_open() {
    // No replicas: the fallback share is what this test is about (`testing::replicas`).
    let mut c = Cluster::start(3, |c| c.replicas = 0).await;
    c.wait_all_alive(&IDS).await;
    let load_keys: Arc<Vec<String>> = Arc::new(keys("load", 300));
    assert!(
        load_keys
            .iter()
            .any(|k| owner_of(&IDS, k, 100_000, PERIOD_MS) == "n2")
    );
    let survivors = [c.client("n0"), c.client("n1")];
    let load = Load::start(&survivors, load_keys.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = load.t0.elapsed();
    c.kill("n2").await;
    let mut states = Vec::new();
    for id in ["n0", "n1"] {
        states.push(c.wait_out_of_ring(id, "n2", 2).await);
    }
    let healed_at = load.t0.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let samples = load.finish().await;

    let failures: Vec<&Sample> = samples.iter().filter(|s| s.seen.is_none()).collect();
    assert!(failures.is_empty(), "failed checks: {failures:?}");
    let before_kill = samples
        .iter()
        .filter(|s| s.answered < killed_at)
        .filter(degraded)
        .count();
    let during = samples
        .iter()
        .filter(|s| s.answered >= killed_at && s.sent <= healed_at)
        .filter(degraded)
        .count();
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent > healed_at).collect();
    assert_eq!(before_kill, 0, "degraded answers while every owner was up");
    assert!(during > 0, "no degraded answer after the owner was killed");
    assert!(!after.is_empty(), "no load after the heal");
    assert_eq!(
        after.iter().copied().filter(degraded).count(),
        0,
        "degraded after the heal"
    );
    for s in &states {
        assert_eq!(s.as_deref(), Some("dead"), "killed node shown as {s:?}");
    }
    for id in ["n0", "n1"] {
        for k in load_keys.iter() {
            let s = c.seen(id, &inline(k, 100_000, PERIOD_MS)).await;
            assert!(!s.degraded, "{k} via {id} degraded after the heal");
        }
        assert!(
            c.forwarding(id, "fail_open").await > 0,
            "{id} never failed open"
        );
    }
    // New keys on the survivors' ring are exact again.
    let fresh = keys("after-kill", 10);
    assert_eq!(admitted(&c, &["n0", "n1"], &fresh).await, vec![5; 10]);
}

/// Replaces `graceful_leave_and_rejoin`: a node's keys are forwarded to it; stopped gracefully
/// (SIGTERM), it leaves the survivors' rings at once — during its leave delay and after it
/// exits its keys are owned by a survivor, never degraded; restarted with the same id it joins
/// again and its keys are forwarded to it and decided there.
#[tokio::test(start_paused = true)]
async fn graceful_leave_and_rejoin() {
    let mut c = Cluster::start(3, |c| c.leave_delay = Duration::from_secs(5)).await;
    c.wait_all_alive(&IDS).await;
    let before = owned("n2", "before", 20);
    for k in &before {
        assert_eq!(allowed(&c, "n0", k).await, (true, false), "{k}");
    }
    assert!(c.forwarding("n0", "forwarded").await >= 20);

    let sent = Instant::now();
    c.terminate("n2");
    for id in ["n0", "n1"] {
        let state = c.wait_out_of_ring(id, "n2", 2).await;
        assert_eq!(state.as_deref(), Some("leaving"), "n2 seen by {id}");
    }
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "leaving took {:?}",
        sent.elapsed()
    );
    // Still within its leave delay: n2 answers, but its keys are the survivors' now.
    assert!(c.try_http("n2", "GET", "/healthz", "").await.is_some());
    for (i, k) in owned("n2", "during", 40).iter().enumerate() {
        assert_eq!(
            allowed(&c, IDS[i % 2], k).await,
            (true, false),
            "{k} while n2 leaves"
        );
    }
    c.wait_exit("n2").await;
    for (i, k) in owned("n2", "after", 40).iter().enumerate() {
        assert_eq!(
            allowed(&c, IDS[i % 2], k).await,
            (true, false),
            "{k} after n2 exited"
        );
    }
    assert_eq!(c.sum_forwarding(&["n0", "n1"], "fail_open").await, 0);

    c.restart("n2").await;
    c.wait_all_alive(&IDS).await;
    assert_eq!(c.view("n2").await["ring_members"], 3);
    let forwarded_before = [
        c.forwarding("n0", "forwarded").await,
        c.forwarding("n1", "forwarded").await,
    ];
    let back = owned("n2", "back", 20);
    for (i, k) in back.iter().enumerate() {
        assert_eq!(
            allowed(&c, IDS[i % 2], k).await,
            (true, false),
            "{k} after the rejoin"
        );
        // Decided at n2: its own peek sees the token taken.
        let peek = json!({ "key": k, "limit": 5, "period_ms": PERIOD_MS, "cost": 0 });
        let body = c.check("n2", &peek).await.json();
        assert_eq!(body["remaining"], 4, "{k} at n2: {body}");
        assert_eq!(body["degraded"], false, "{k} at n2: {body}");
    }
    for (i, before) in forwarded_before.iter().enumerate() {
        let now = c.forwarding(IDS[i], "forwarded").await;
        assert_eq!(now - before, 10, "{} forwarded", IDS[i]);
    }
    let keys = keys("after-rejoin", 10);
    assert_eq!(admitted(&c, &IDS, &keys).await, vec![5; 10]);
}

/// Replaces `readyz_is_503_while_leaving`: from SIGTERM on, `/readyz` says 503 and never 200
/// again while the node keeps serving through its leave delay; then it exits cleanly.
#[tokio::test(start_paused = true)]
async fn readyz_is_503_while_leaving() {
    let mut c = Cluster::start(3, |c| c.leave_delay = Duration::from_secs(1)).await;
    c.terminate("n1");
    let sent = Instant::now();
    let mut seen = Vec::new();
    while sent.elapsed() < Duration::from_millis(900) {
        let status = c
            .try_http("n1", "GET", "/readyz", "")
            .await
            .map(|r| r.status);
        seen.push((sent.elapsed(), status));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.wait_exit("n1").await;
    let first_503 = seen.iter().position(|(_, s)| *s == Some(503));
    let first_503 = first_503.unwrap_or_else(|| panic!("never 503 while leaving: {seen:?}"));
    assert!(
        seen[first_503..].iter().all(|(_, s)| *s == Some(503)),
        "ready again while leaving: {seen:?}"
    );
}

/// Replaces `paused_owner_is_bypassed_then_returns`: an owner stops answering (SIGSTOP: its
/// connections stay open, nothing moves). Forwards to it miss their deadline and are answered
/// degraded; failure detection takes it out of the ring; resumed, it is alive everywhere
/// again and decides its keys.
#[tokio::test(start_paused = true)]
async fn paused_owner_is_bypassed_then_returns() {
    // No replicas: the fallback share is what this test is about (`testing::replicas`).
    let c = Cluster::start(3, |c| c.replicas = 0).await;
    c.wait_all_alive(&IDS).await;
    let keys: Arc<Vec<String>> = Arc::new(keys("pause", 300));
    let load = Load::start(&[c.client("n0"), c.client("n1")], keys);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let paused_at = load.t0.elapsed();
    c.pause("n2").await;
    for id in ["n0", "n1"] {
        c.wait_out_of_ring(id, "n2", 2).await;
    }
    c.resume("n2").await;
    c.wait_all_alive(&IDS).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let samples = load.finish().await;
    let failures: Vec<&Sample> = samples.iter().filter(|s| s.seen.is_none()).collect();
    assert!(failures.is_empty(), "failed checks: {failures:?}");
    let late = samples
        .iter()
        .filter(|s| s.answered - s.sent >= Duration::from_millis(100))
        .count();
    assert_eq!(late, 0, "checks waited on the paused owner");
    let degraded_after = samples
        .iter()
        .filter(|s| s.sent >= paused_at)
        .filter(degraded)
        .count();
    assert!(
        degraded_after > 0,
        "no degraded answer while the owner was paused"
    );

    for k in owned("n2", "resumed", 10) {
        assert_eq!(
            allowed(&c, "n0", &k).await,
            (true, false),
            "{k} after the resume"
        );
        let peek = json!({ "key": k, "limit": 5, "period_ms": PERIOD_MS });
        assert_eq!(c.remaining("n2", &peek).await, 4, "{k} at n2");
    }
}

/// Replaces `live_members_are_never_declared_dead`: under a steady load over every node for
/// 4 s, no poll of any node ever shows a member not alive, and no answer is degraded.
#[tokio::test(start_paused = true)]
async fn live_members_are_never_declared_dead() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let clients: Vec<NodeClient> = IDS.iter().map(|id| c.client(id)).collect();
    let load = Load::start(&clients, Arc::new(keys("steady", 300)));
    let mut not_alive = Vec::new();
    while load.t0.elapsed() < Duration::from_secs(4) {
        for id in IDS {
            let alive = c.alive(id).await;
            if alive != IDS {
                not_alive.push((load.t0.elapsed(), id, alive));
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let samples = load.finish().await;
    assert!(not_alive.is_empty(), "{not_alive:?}");
    assert!(samples.iter().all(|s| s.seen.is_some()), "failed checks");
    assert_eq!(samples.iter().filter(degraded).count(), 0);
}

/// Replaces `ownership_moves_keep_consumption`: exhausted keys stay exhausted when ownership
/// moves — a fourth node joins (the keys it now owns are handed over to it), then a node
/// leaves gracefully (its keys are handed to the others).
#[tokio::test(start_paused = true)]
async fn ownership_moves_keep_consumption() {
    let mut c = Cluster::start(3, |_| {}).await;
    c.wait_all_alive(&IDS).await;
    let keys = keys("move", 300);
    for (i, k) in keys.iter().enumerate() {
        for j in 0..5 {
            assert_eq!(allowed(&c, IDS[(i + j) % 3], k).await, (true, false), "{k}");
        }
    }
    async fn admitted(c: &Cluster, ids: &[&str], keys: &[String]) -> usize {
        let mut n = 0;
        for (i, k) in keys.iter().enumerate() {
            n += usize::from(allowed(c, ids[i % ids.len()], k).await.0);
        }
        n
    }

    let joiner = c.join().await;
    let all = ["n0", "n1", "n2", joiner.as_str()];
    c.wait_all_alive(&all).await;
    let moved = keys
        .iter()
        .filter(|k| owner_of(&all, k, 5, PERIOD_MS) == joiner)
        .count() as u64;
    assert!(moved > 0);
    c.wait("handover to the joiner", || async {
        c.sum_forwarding(&all, "handed_over").await >= moved
    })
    .await;
    assert_eq!(
        admitted(&c, &all, &keys).await,
        0,
        "keys moved to the joiner admitted again"
    );

    c.stop("n1").await;
    let rest = ["n0", "n2", joiner.as_str()];
    c.wait_all_alive(&rest).await;
    assert_eq!(
        admitted(&c, &rest, &keys).await,
        0,
        "keys of the leaver admitted again"
    );
}

/// A node cut off from the others (gossip and peer RPC) is dropped from their rings; healed,
/// it is seen again.
#[tokio::test(start_paused = true)]
async fn partitioned_node_is_dropped_and_returns_when_healed() {
    let c = Cluster::start(3, |_| {}).await;
    c.wait("three alive", || async { c.alive("n0").await.len() == 3 })
        .await;
    c.cut("n2", "n0").await;
    c.cut("n2", "n1").await;
    c.wait("n2 dropped", || async {
        c.alive("n0").await == ["n0", "n1"]
    })
    .await;
    c.heal("n2", "n0").await;
    c.heal("n2", "n1").await;
    c.wait("n2 back", || async { c.alive("n0").await.len() == 3 })
        .await;
}
