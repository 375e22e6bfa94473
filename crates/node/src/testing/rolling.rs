//! A rolling restart under load on whole nodes in memory (the twin of the process test
//! `tests/tests/rolling.rs`, which rolls real `ringlimit` processes as Kubernetes rolls the
//! StatefulSet): three nodes seeded with each other, a quota rule of 20 a day with its keys
//! exhausted, the StatefulSet's 5 s leave delay; then one node at a time: SIGTERM, wait for its
//! clean exit, start it again with the same id and wait until every node shows all three
//! alive. A client keeps checking throughout, round-robin over the nodes in its rotation.

use super::{Cluster, NodeClient, Seen, seeds};
use crate::rules::RuleSet;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const QUOTA_RULE: &str = "roll-quota";
const QUOTA_LIMIT: u64 = 20;
const QUOTA_KEYS: usize = 100;
const OPEN_KEYS: usize = 2_000;
/// The over-admission the roll may cause: one admission per key over the whole roll (as the
/// process test bounds it); what remains is decided in the moment of a move.
const OVER_ADMISSION_BOUND: usize = QUOTA_KEYS;

fn quota_check(k: usize) -> Value {
    json!({ "key": format!("quota:{k}"), "rule": QUOTA_RULE })
}

fn open_check(i: usize) -> Value {
    json!({ "key": format!("open:{}", i % OPEN_KEYS), "limit": 1_000_000, "period_ms": 60_000 })
}

/// The client's rotation: which nodes it sends to, and which are being rolled.
#[derive(Default)]
struct Rotation {
    in_rotation: Mutex<[bool; 3]>,
    rolling: Mutex<[bool; 3]>,
}

impl Rotation {
    fn pick(&self, n: usize) -> Option<usize> {
        let live: Vec<usize> = {
            let r = self.in_rotation.lock().unwrap_or_else(|e| e.into_inner());
            (0..3).filter(|&i| r[i]).collect()
        };
        live.get(n % live.len().max(1)).copied()
    }

    fn set(&self, i: usize, on: bool) {
        self.in_rotation.lock().unwrap_or_else(|e| e.into_inner())[i] = on;
    }

    fn rolling(&self, i: usize) -> bool {
        self.rolling.lock().unwrap_or_else(|e| e.into_inner())[i]
    }

    fn set_rolling(&self, i: usize, on: bool) {
        self.rolling.lock().unwrap_or_else(|e| e.into_inner())[i] = on;
    }
}

/// What became of one check of the load.
#[derive(Debug)]
struct Sample {
    quota: bool,
    /// `None`: no answer (connection level).
    seen: Option<Seen>,
    /// The node was being rolled when the connection failed.
    rolling: bool,
    /// Answered by a node that had its SIGTERM and had not exited yet.
    leaving: bool,
}

#[tokio::test(start_paused = true)]
async fn rolling_restart_under_load_keeps_exhausted_keys_exhausted() {
    let yaml = format!(
        "rules:\n  - name: {QUOTA_RULE}\n    limit: {QUOTA_LIMIT}\n    period: 1d\n    \
         algorithm: token_bucket\n    mode: owner\n    on_owner_unreachable: open\n"
    );
    let rules = RuleSet::from_yaml(&yaml).expect("rules");
    let mut c = Cluster::start(3, |cfg| {
        cfg.rules = rules.clone();
        cfg.seeds = seeds(3);
        cfg.leave_delay = Duration::from_secs(5);
    })
    .await;
    let ids = ["n0", "n1", "n2"];
    c.wait_all_alive(&ids).await;

    // Exhaust every quota key: 20 checks each through batches, then single checks until an
    // exact (not degraded) answer denies it.
    for (b, first) in (0..QUOTA_KEYS).step_by(50).enumerate() {
        let checks: Vec<Value> = (first..first + 50)
            .flat_map(|k| std::iter::repeat_n(quota_check(k), QUOTA_LIMIT as usize))
            .collect();
        let results = c.batch(ids[b % 3], &checks).await;
        assert!(
            results
                .iter()
                .all(|r| r["allowed"] == true && r["degraded"] == false)
        );
    }
    for k in 0..QUOTA_KEYS {
        let s = c.seen(ids[k % 3], &quota_check(k)).await;
        assert_eq!(
            s,
            Seen {
                allowed: false,
                degraded: false
            },
            "quota:{k}"
        );
    }

    let rotation = Arc::new(Rotation::default());
    for i in 0..3 {
        rotation.set(i, true);
    }
    let leaving: Arc<Mutex<[bool; 3]>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<NodeClient> = ids.iter().map(|id| c.client(id)).collect();
    let mut loops = tokio::task::JoinSet::new();
    for l in 0..4 {
        let (rotation, leaving, stop, clients) = (
            rotation.clone(),
            leaving.clone(),
            stop.clone(),
            clients.clone(),
        );
        loops.spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(4));
            let mut n = l * 1_000_003;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                let Some(node) = rotation.pick(n) else {
                    continue;
                };
                // One check in four on a quota key.
                let quota = n % 4 == 0;
                let body = if quota {
                    quota_check(n / 4 % QUOTA_KEYS)
                } else {
                    open_check(n)
                };
                let was_leaving = leaving.lock().unwrap_or_else(|e| e.into_inner())[node];
                let reply = clients[node]
                    .try_http("POST", "/v1/check", &body.to_string())
                    .await;
                let seen = reply.map(|r| Seen::of(r.status, &r.json()));
                let rolling = seen.is_none() && rotation.rolling(node);
                if seen.is_none() {
                    rotation.set(node, false);
                }
                samples.push(Sample {
                    quota,
                    seen,
                    rolling,
                    leaving: was_leaving && seen.is_some(),
                });
            }
            samples
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t0 = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        rotation.set_rolling(i, true);
        leaving.lock().unwrap_or_else(|e| e.into_inner())[i] = true;
        c.terminate(id);
        for other in ids.iter().filter(|o| *o != id) {
            c.wait(&format!("{other} takes {id} out of its ring"), || async {
                c.state_of(other, id).await.as_deref() != Some("alive")
                    && c.view(other).await["ring_members"] == 2
            })
            .await;
        }
        c.wait_exit(id).await;
        leaving.lock().unwrap_or_else(|e| e.into_inner())[i] = false;
        rotation.set(i, false);
        c.restart(id).await;
        c.wait_all_alive(&ids).await;
        // Back in the client's rotation once its readiness says so (it does: restart waited).
        rotation.set(i, true);
        rotation.set_rolling(i, false);
    }
    let roll = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    while let Some(done) = loops.join_next().await {
        samples.extend(done.expect("load loop"));
    }

    let failed: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.seen.is_none() && !s.rolling)
        .collect();
    let open_denied = samples
        .iter()
        .filter(|s| !s.quota && matches!(s.seen, Some(Seen { allowed: false, .. })))
        .count();
    let quota_answers = samples
        .iter()
        .filter(|s| s.quota && s.seen.is_some())
        .count();
    let over = samples
        .iter()
        .filter(|s| s.quota && matches!(s.seen, Some(Seen { allowed: true, .. })))
        .count();
    let from_leaving = samples.iter().filter(|s| s.leaving).count();
    eprintln!(
        "in-memory roll: {} checks, roll {roll:?} (virtual); over-admission {over} of \
         {quota_answers} answers on exhausted keys; {from_leaving} answered by leaving nodes",
        samples.len()
    );
    assert!(
        failed.is_empty(),
        "failed checks from nodes that were up: {failed:?}"
    );
    assert_eq!(open_denied, 0, "open keys denied");
    assert!(from_leaving > 0, "no answer from a leaving node");
    assert!(
        quota_answers > 1_000,
        "only {quota_answers} answers on quota keys"
    );
    assert!(over <= OVER_ADMISSION_BOUND, "over-admission {over}");

    // Final state: every quota key still exhausted, read (cost 0) through every node.
    for id in ids {
        for k in 0..QUOTA_KEYS {
            let mut peek = quota_check(k);
            peek["cost"] = 0.into();
            let body = c.check(id, &peek).await.json();
            assert!(
                body["remaining"] == 0 && body["degraded"] == false,
                "quota:{k} via {id}: {body}"
            );
        }
    }
}
