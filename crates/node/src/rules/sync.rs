//! API rules through gossip. Every node publishes every API entry it knows — its own changes and
//! those it merged — under its own chitchat keys `rule:{name}` (a small JSON entry), and each
//! round merges what every other node publishes ([`crate::rules::book::RuleBook::merge`]: the
//! newest version of each name wins). Publishing what it merged, not only what it wrote, keeps
//! every rule in the cluster's state after its writer is gone, and lets a node that joins, or
//! returns from a partition, learn every rule from any one peer.
//!
//! Polled each gossip round rather than driven by chitchat's key events: events do not fire for
//! keys that arrived before the listener, nor for deletes, and a scan of a few hundred small keys
//! a round costs nothing.

use crate::rules::api::Entry;
use crate::rules::book::RuleBook;
use chitchat::{Chitchat, ChitchatId};
use ringlimit_core::clock::unix_ms;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

/// Chitchat key prefix of API rules.
pub const PREFIX: &str = "rule:";
/// How often deletes older than their keep time are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Whether this node has merged its peers' API rules at least once (readiness waits for it).
#[derive(Debug, Default)]
pub struct Synced(AtomicBool);

impl Synced {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Merges peers' entries and publishes this node's, every `every`, until the task is dropped.
pub async fn run(
    chitchat: Arc<Mutex<Chitchat>>,
    self_id: ChitchatId,
    book: Arc<RuleBook>,
    synced: Arc<Synced>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = book.changes();
    // What this node publishes now, by name (its JSON), to write only what differs.
    let mut published: HashMap<String, String> = HashMap::new();
    let mut publish = true;
    // The gossip version of each peer key merged already: unchanged entries are not parsed
    // and merged again every round.
    let mut seen: HashMap<(ChitchatId, String), u64> = HashMap::new();
    let mut pruned_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                publish = true;
            }
        }
        let (found, peers) = scan(&chitchat, &self_id, &mut seen).await;
        if book.merge(found) > 0 {
            publish = true;
        }
        if peers && !synced.0.swap(true, Ordering::AcqRel) {
            tracing::debug!("API rules merged from peers");
        }
        if pruned_at.elapsed() >= PRUNE_EVERY {
            pruned_at = tokio::time::Instant::now();
            book.prune(unix_ms());
        }
        if std::mem::take(&mut publish) {
            changes.borrow_and_update();
            publish_all(&chitchat, &book, &mut published).await;
        }
    }
}

/// The API entries other nodes publish that changed since the last scan (`seen`: the gossip
/// version of each key merged, kept for the keys still there), and whether any other node has
/// state.
async fn scan(
    chitchat: &Mutex<Chitchat>,
    self_id: &ChitchatId,
    seen: &mut HashMap<(ChitchatId, String), u64>,
) -> (Vec<(String, Entry)>, bool) {
    let cc = chitchat.lock().await;
    let mut found = Vec::new();
    let mut peers = false;
    let mut still = HashMap::with_capacity(seen.len());
    for (id, state) in cc.node_states() {
        if id == self_id {
            continue;
        }
        peers = true;
        for (key, value) in state.iter_prefix(PREFIX) {
            let at = (id.clone(), key.to_owned());
            if seen.get(&at) != Some(&value.version) {
                let name = &key[PREFIX.len()..];
                match serde_json::from_str::<Entry>(&value.value) {
                    Ok(entry) => found.push((name.to_owned(), entry)),
                    Err(e) => {
                        tracing::debug!(node = %id.node_id, key, error = %e, "malformed API rule in gossip")
                    }
                }
            }
            still.insert(at, value.version);
        }
    }
    *seen = still;
    (found, peers)
}

/// Writes this node's keys for every entry the book has that differs from what it publishes,
/// and deletes those of entries the book forgot.
async fn publish_all(
    chitchat: &Mutex<Chitchat>,
    book: &RuleBook,
    published: &mut HashMap<String, String>,
) {
    let entries = book.api_entries();
    let mut writes = Vec::new();
    for (name, entry) in &entries {
        match serde_json::to_string(entry) {
            Ok(json) if published.get(name) != Some(&json) => writes.push((name.clone(), json)),
            Ok(_) => {}
            Err(e) => tracing::warn!(rule = %name, error = %e, "API rule not publishable"),
        }
    }
    let known: std::collections::HashSet<&String> = entries.iter().map(|(n, _)| n).collect();
    let gone: Vec<String> = published
        .keys()
        .filter(|n| !known.contains(n))
        .cloned()
        .collect();
    if writes.is_empty() && gone.is_empty() {
        return;
    }
    let mut cc = chitchat.lock().await;
    let state = cc.self_node_state();
    for (name, json) in writes {
        state.set(format!("{PREFIX}{name}"), &json);
        published.insert(name, json);
    }
    for name in gone {
        state.delete(&format!("{PREFIX}{name}"));
        published.remove(&name);
    }
}
