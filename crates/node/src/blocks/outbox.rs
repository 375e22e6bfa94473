//! Block changes waiting to be announced to the other members: coalesced by target (the
//! latest change of a target is all that travels) and bounded, so that a storm of new blocks
//! costs bounded memory here and bounded bytes on the peer link. A change that finds the
//! outbox full is not announced: members that do not learn a block still forward the key's
//! checks to its owner, which holds the block and answers them blocked.

use super::BlockChange;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most changes waiting at once.
pub const MAX_PENDING: usize = 100_000;

/// Changes to announce.
#[derive(Debug)]
pub struct Outbox {
    max: usize,
    pending: Mutex<HashMap<(String, Option<String>), BlockChange>>,
    /// Changes not announced because the outbox was full.
    pub dropped: AtomicU64,
    ready: tokio::sync::Notify,
}

impl Outbox {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            pending: Mutex::default(),
            dropped: AtomicU64::new(0),
            ready: tokio::sync::Notify::new(),
        }
    }

    /// Queues `change` (replacing a waiting change of its target).
    pub fn push(&self, change: BlockChange) {
        let mut pending = self.pending.lock();
        let slot = (change.target.clone(), change.rule.clone());
        if pending.len() >= self.max && !pending.contains_key(&slot) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.insert(slot, change);
        drop(pending);
        self.ready.notify_one();
    }

    /// Takes at most `n` waiting changes.
    pub fn take(&self, n: usize) -> Vec<BlockChange> {
        let mut pending = self.pending.lock();
        if pending.len() <= n {
            return pending.drain().map(|(_, c)| c).collect();
        }
        let keys: Vec<_> = pending.keys().take(n).cloned().collect();
        keys.iter().filter_map(|k| pending.remove(k)).collect()
    }

    /// Changes waiting.
    pub fn len(&self) -> usize {
        self.pending.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until a change is queued.
    pub async fn wait(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_proto::peer::BlockSource;

    fn change(target: &str, until_ms: u64) -> BlockChange {
        BlockChange {
            target: target.into(),
            rule: Some("r".into()),
            source: BlockSource::Auto,
            since_ms: 0,
            until_ms,
            reason: "auto".into(),
            by: "n".into(),
            lifted: false,
        }
    }

    #[test]
    fn changes_coalesce_by_target_and_a_full_outbox_drops_new_ones() {
        let o = Outbox::new(2);
        o.push(change("a", 1));
        o.push(change("a", 2));
        o.push(change("b", 1));
        o.push(change("c", 1));
        assert_eq!(o.len(), 2);
        assert_eq!(o.dropped.load(Ordering::Relaxed), 1);
        let mut taken = o.take(1);
        taken.extend(o.take(10));
        taken.sort_by(|x, y| x.target.cmp(&y.target));
        assert_eq!(
            taken
                .iter()
                .map(|c| (c.target.as_str(), c.until_ms))
                .collect::<Vec<_>>(),
            [("a", 2), ("b", 1)]
        );
        assert!(o.is_empty());
    }
}
