//! Blocks the client has been told of: an owner that answers a check denied by a block of its
//! key (and rule) says so ([`ringlimit_proto::peer::PeerAnswer::Blocked`]), and the client
//! answers that bucket's checks itself until the block's end — a blocked key costs the service
//! no round trip. At most [`MAX_BLOCKED`] buckets are kept (the oldest given up first: its
//! checks go to the owner again, which answers them blocked). A block lifted early at the
//! cluster holds here until the end the owner said.

use parking_lot::Mutex;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_proto::CheckAnswer;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most blocked buckets a client keeps.
pub const MAX_BLOCKED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the block ends, on the client's clock (ns).
    until_ns: u64,
    /// The owner's answer (denied; its `reset_at_ms` the block's end).
    answer: CheckAnswer,
    /// Which of the bucket's entries in `order` is this one.
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<u64, Entry>,
    /// Buckets in the order they were blocked, oldest first; an entry whose `seq` is no longer
    /// its bucket's (it ended, or was blocked again) is skipped.
    order: VecDeque<(u64, u64)>,
    seq: u64,
}

/// The blocked buckets, by bucket identity (a key under a rule).
#[derive(Debug)]
pub(crate) struct Blocked {
    max: usize,
    /// Buckets held: the one read a check makes while there are none.
    len: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Default for Blocked {
    fn default() -> Self {
        Self::new(MAX_BLOCKED)
    }
}

impl Blocked {
    /// At most `max` blocked buckets.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            len: AtomicUsize::new(0),
            inner: Mutex::default(),
        }
    }

    /// Keeps the block that denied bucket `id` with `answer` at `now` (ns): until `now` plus
    /// the answer's retry time. An admitted answer, or one without a retry time, is no block.
    pub(crate) fn insert(&self, id: u64, answer: &CheckAnswer, now: u64) {
        if answer.allowed || answer.retry_after_ms == 0 || self.max == 0 {
            return;
        }
        let until_ns = now.saturating_add(answer.retry_after_ms.saturating_mul(NANOS_PER_MS));
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.seq += 1;
        let seq = inner.seq;
        let entry = Entry {
            until_ns,
            answer: *answer,
            seq,
        };
        if inner.by_id.insert(id, entry).is_none() {
            while inner.by_id.len() > self.max {
                let Some((old, old_seq)) = inner.order.pop_front() else {
                    break;
                };
                if inner.by_id.get(&old).is_some_and(|e| e.seq == old_seq) {
                    inner.by_id.remove(&old);
                }
            }
        }
        inner.order.push_back((id, seq));
        // Stale entries of the order (buckets blocked again, or ended) are dropped once they
        // outnumber the live ones, so that the order stays within twice the bound.
        if inner.order.len() > 2 * self.max.max(inner.by_id.len()) {
            let by_id = &inner.by_id;
            inner
                .order
                .retain(|(id, seq)| by_id.get(id).is_some_and(|e| e.seq == *seq));
        }
        self.len.store(inner.by_id.len(), Ordering::Relaxed);
    }

    /// The answer for bucket `id` at `now` (ns) while a block is kept for it: denied, its retry
    /// time the block's rest.
    #[inline]
    pub(crate) fn find(&self, id: u64, now: u64) -> Option<CheckAnswer> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.find_held(id, now)
    }

    #[cold]
    fn find_held(&self, id: u64, now: u64) -> Option<CheckAnswer> {
        let mut inner = self.inner.lock();
        let e = *inner.by_id.get(&id)?;
        if e.until_ns <= now {
            inner.by_id.remove(&id);
            self.len.store(inner.by_id.len(), Ordering::Relaxed);
            return None;
        }
        Some(CheckAnswer {
            retry_after_ms: (e.until_ns - now).div_ceil(NANOS_PER_MS).max(1),
            ..e.answer
        })
    }

    /// Blocked buckets kept (ended ones not looked up since included).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::tests_answer as denied;

    const MS: u64 = NANOS_PER_MS;

    #[test]
    fn a_block_is_answered_until_its_end_with_its_rest() {
        let b = Blocked::new(10);
        assert_eq!(b.find(1, 0), None);
        b.insert(1, &denied(5_000), 1_000 * MS);
        let a = b.find(1, 1_000 * MS).expect("blocked");
        assert!(!a.allowed);
        assert_eq!(a.retry_after_ms, 5_000);
        assert_eq!(a.reset_at_ms, 1_005_000, "the owner's end");
        assert_eq!(
            b.find(1, 5_999 * MS + 1).map(|a| a.retry_after_ms),
            Some(1),
            "the rest, rounded up"
        );
        assert_eq!(b.find(2, 1_000 * MS), None, "another bucket");
        assert_eq!(b.find(1, 6_000 * MS), None, "ended at its end");
        assert_eq!(b.len(), 0, "and forgotten");
    }

    #[test]
    fn admitted_answers_and_answers_without_a_wait_are_no_block() {
        let b = Blocked::new(10);
        b.insert(
            1,
            &CheckAnswer {
                allowed: true,
                ..denied(0)
            },
            0,
        );
        b.insert(2, &denied(0), 0);
        assert_eq!(b.len(), 0);
        assert_eq!(b.find(1, 0), None);
    }

    #[test]
    fn at_most_max_buckets_are_kept_the_oldest_given_up_first() {
        let b = Blocked::new(3);
        for id in 1..=3 {
            b.insert(id, &denied(60_000), 0);
        }
        // Blocked again: kept with its new end, and counted as blocked last.
        b.insert(1, &denied(120_000), 0);
        assert_eq!(
            b.find(1, 90_000 * MS).map(|a| a.retry_after_ms),
            Some(30_000)
        );
        b.insert(4, &denied(60_000), 0);
        assert_eq!(b.len(), 3);
        assert_eq!(b.find(2, 0), None, "the oldest went");
        assert!(b.find(3, 0).is_some() && b.find(4, 0).is_some());
        // The order never grows past twice the bound, however often buckets are blocked again.
        for _ in 0..100 {
            b.insert(3, &denied(60_000), 0);
        }
        assert!(b.inner.lock().order.len() <= 6);
        assert_eq!(b.len(), 3);
    }
}

/// Through a client: an owner's blocked answer keeps the bucket's checks in-process.
#[cfg(test)]
mod through_the_client {
    use super::tests_answer as denied;
    use crate::{Check, Client};
    use ringlimit_core::coordinator::Site;
    use ringlimit_proto::peer::BlockSource;
    use std::time::Duration;

    #[tokio::test]
    async fn a_bucket_answered_blocked_is_denied_in_process_until_the_blocks_end() {
        let client = crate::testing::unreachable(Client::builder()).await;
        let blocked = Check::inline("user:1", 5, Duration::from_secs(10));
        let other = Check::inline("user:2", 5, Duration::from_secs(10));
        let topo = client.inner.topology.load_full();
        let (topo, p) = client.prepare(topo, &blocked).await.expect("valid");
        // As the coordinator reports an owner's `PeerAnswer::Blocked`.
        client
            .inner
            .site(&topo)
            .blocked(0, &p, &denied(60_000), BlockSource::Managed);
        let a = client.check(&blocked).await.expect("an answer");
        assert!(!a.allowed && !a.degraded, "{a:?}");
        assert!(
            a.retry_after_ms > 59_000 && a.retry_after_ms <= 60_000,
            "{a:?}"
        );
        let all = client.check_many(&[blocked.clone(), other.clone()]).await;
        assert!(all[0].as_ref().is_ok_and(|a| !a.allowed && !a.degraded));
        assert!(all[1].as_ref().is_ok_and(|a| a.allowed && a.degraded));
        let s = client.stats();
        assert_eq!((s.blocked, s.blocked_buckets), (2, 1));
        // Neither went to an owner nor to the fallback: the other key alone fell back.
        assert_eq!((s.checks_sent, s.degraded), (0, 1));
    }
}

#[cfg(test)]
pub(crate) fn tests_answer(retry_after_ms: u64) -> CheckAnswer {
    CheckAnswer {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_at_ms: 1_000_000 + retry_after_ms,
        retry_after_ms,
        degraded: false,
        replica: false,
        leased: false,
    }
}
