//! Batching on whole nodes in memory (moved from the hand-wired in-memory cluster): concurrent
//! checks for one owner travel as one frame; a large batch decided here gives the runtime back
//! every few decisions, and large batches decide in turn.

use super::{Cluster, inline, keys_owned_by};
use std::cell::RefCell;

const LIMIT: u64 = 5;
const PERIOD_MS: u64 = 3_600_000;
const TWO: [&str; 2] = ["n0", "n1"];

/// `n` distinct keys named `prefix:i`, checked at 5 per hour.
fn flood(prefix: &str, n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| inline(&format!("{prefix}:{i}"), LIMIT, PERIOD_MS))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn concurrent_checks_for_one_owner_travel_as_one_frame() {
    let c = Cluster::start(2, |_| {}).await;
    c.wait_all_alive(&TWO).await;
    let keys = keys_owned_by(&TWO, "n1", "k", 10, (LIMIT, PERIOD_MS));
    assert!(
        !c.seen("n0", &inline(&keys[0], LIMIT, PERIOD_MS))
            .await
            .degraded
    );
    let frames_before = c.forwarding("n0", "peer_frames").await;
    let bodies: Vec<_> = keys.iter().map(|k| inline(k, LIMIT, PERIOD_MS)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| c.seen("n0", b))).await;
    assert!(answers.iter().all(|x| x.allowed && !x.degraded));
    assert_eq!(
        c.forwarding("n0", "peer_frames").await - frames_before,
        1,
        "ten checks, one frame"
    );
    assert_eq!(c.forwarding("n0", "peer_checks").await, 11);
}

/// A large batch decided here gives the runtime back every few decisions, so a single check
/// sent beside it is answered before the batch ends (under a flood of batches, other keys'
/// checks no longer wait for whole batches: bench/keyflood.sh).
#[tokio::test(start_paused = true)]
async fn a_large_local_batch_lets_a_single_check_through_before_it_ends() {
    let c = Cluster::start(1, |_| {}).await;
    let batch = flood("flood", 1_000);
    let done = RefCell::new(Vec::new());
    // `join!` sends the batch first; the single check is decided only when the batch yields.
    tokio::join!(
        async {
            let answers = c.batch("n0", &batch).await;
            assert!(answers.iter().all(|a| a["allowed"] == true));
            done.borrow_mut().push("batch");
        },
        async {
            assert!(
                c.seen("n0", &inline("single", LIMIT, PERIOD_MS))
                    .await
                    .allowed
            );
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
    let c = Cluster::start(1, |_| {}).await;
    let (long, short) = (flood("long", 1_000), flood("short", 100));
    let done = RefCell::new(Vec::new());
    // Sent in this order; the short batch would end first if the two interleaved.
    tokio::join!(
        async {
            c.batch("n0", &long).await;
            done.borrow_mut().push("long");
        },
        async {
            c.batch("n0", &short).await;
            done.borrow_mut().push("short");
        },
        async {
            assert!(
                c.seen("n0", &inline("single", LIMIT, PERIOD_MS))
                    .await
                    .allowed
            );
            done.borrow_mut().push("single");
        },
    );
    assert_eq!(*done.borrow(), ["single", "long", "short"]);
}
