//! Blocks: keys (and networks) shut out for a while, answered on the node a request reaches —
//! no forward to the key's owner, no bucket touched.
//!
//! Two sources put a block in force:
//! - **auto**: a rule's `block: { after, within, for, max }` policy. The key's owner counts the
//!   key's denials beside its bucket ([`Offenders`]: exact, since every check of the key is
//!   decided there) and, when `after` denials fall within `within`, blocks the key under that
//!   rule for `for`, doubled on each repeat up to `max`. The owner announces it to every member
//!   over the peer link (the announcer, `crate::blocks_sync`), so every member — the key's
//!   replica included — keeps it.
//! - **managed**: an operator's `PUT /v1/admin/blocks/{key}` (a key under every rule, or a
//!   network `cidr:203.0.113.0/24` / an IPv6 prefix, matching keys built from `{client_ip}`).
//!   Announced the same way; a member that joins (or restarts) is sent every block held; kept
//!   under `--data-dir` with the API rules.
//!
//! # The table ([`Blocks`])
//! One per node. Three maps under one read-mostly lock:
//! - managed keys: `HashMap<key, Entry>` — O(1);
//! - auto blocks: `HashMap<bucket id, AutoEntry>` — O(1) on the bucket identity the check has
//!   computed already (the rule and the key), so a blocked check hashes nothing more;
//! - networks: one `HashMap<masked address, Entry>` per prefix length present, IPv4 and IPv6
//!   apart, looked up longest prefix first: at most 33 + 129 lookups, bounded whatever the
//!   number of entries. A key matches when it is an address, or `prefix:address` (what a
//!   `{client_ip}` template such as `ip:{client_ip}` makes).
//!
//! An empty table costs a check one relaxed atomic load ([`Blocks::find`]): no lock, no hash.
//!
//! **Expiry is exact**: a block is in force while `now < until` on the deciding node's clock,
//! checked at every lookup; the sweeper ([`Blocks::sweep`]) only frees memory and counts what
//! ended.
//!
//! **Bounded**: at most `--max-blocks` entries (all sources together). Each entry holds its
//! map slot (a boxed key or an address, the `until`/`since` times, and the `reason`/`by`
//! strings) — at most [`BYTES_PER_ENTRY`] bytes plus the key's and reason's own bytes, with
//! the map's spare capacity counted. When full, a new managed block is refused with a clear
//! error (nothing changes); a new auto block replaces the auto block nearest its end (an
//! index ordered by `until`), or is dropped when it would end sooner than all of them.
//!
//! # Layout
//! - this module — the types every part shares.
//! - [`target`] — what a block names (a key or a network), parsed and matched.
//! - [`table`] — [`Blocks`]: the node's table, lookup, bounds, expiry, listing.
//! - [`offenders`] — [`Offenders`]: an owner's denial counts and the blocks they earn.

pub mod offenders;
pub mod table;
pub mod target;

pub use offenders::{Offenders, Policy};
pub use ringlimit_proto::peer::{BlockChange, BlockSource};
pub use table::{BlockError, Blocks, Hit, Listed};
pub use target::Target;

/// The most a block's entry holds besides its key's and its reason's bytes: the map slot (a
/// boxed key or an address, `until`, `since`, the reason and author strings), an auto block's
/// index entry, and the maps' spare capacity (a map at most half full after it grows).
pub const BYTES_PER_ENTRY: usize = 256;

/// Longest reason a managed block may give, in bytes.
pub const MAX_REASON_BYTES: usize = 256;

/// Default bound on blocks held per node (`--max-blocks`).
pub const DEFAULT_MAX_BLOCKS: usize = 1_000_000;

pub mod outbox;
pub use outbox::Outbox;

use std::sync::Arc;

/// A node's blocks: its table, its offenders (as the owner of their keys), and what it has to
/// announce to the other members.
#[derive(Debug)]
pub struct Blocklist {
    pub table: Blocks,
    pub offenders: Offenders,
    pub outbox: Outbox,
    /// Who decides this node's automatic blocks (its id), as they are listed.
    node_id: Arc<str>,
    /// Managed blocks changed since they were last saved.
    dirty: std::sync::atomic::AtomicBool,
}

impl Default for Blocklist {
    fn default() -> Self {
        Self::new("local", DEFAULT_MAX_BLOCKS)
    }
}

impl Blocklist {
    /// The blocks of node `node_id`, at most `max` held (and as many offenders counted).
    pub fn new(node_id: &str, max: usize) -> Self {
        Self {
            table: Blocks::new(max),
            offenders: Offenders::new(max),
            outbox: Outbox::new(max.min(outbox::MAX_PENDING)),
            node_id: node_id.into(),
            dirty: Default::default(),
        }
    }

    /// Marks the managed blocks changed (to be saved).
    pub fn touch(&self) {
        self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the managed blocks changed since the last call.
    pub fn take_dirty(&self) -> bool {
        self.dirty.swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Puts in force the changes a member announced, at `now_ms`; `id_of(key, rule)` is the
    /// bucket identity of `key` under `rule` (`None`: a rule this node does not know: the
    /// automatic block is not kept, and the key's owner still answers it). Returns how many
    /// changed something here.
    pub fn apply(
        &self,
        changes: &[BlockChange],
        id_of: impl Fn(&str, &str) -> Option<u64>,
        now_ms: u64,
    ) -> u64 {
        let mut kept = 0;
        for c in changes {
            let reason = clip(&c.reason, MAX_REASON_BYTES);
            let by = clip(&c.by, MAX_REASON_BYTES);
            let lift = c.is_lift();
            let changed = match (c.source, c.rule.as_deref()) {
                (BlockSource::Auto, Some(rule)) => match id_of(&c.target, rule) {
                    Some(id) if lift => self
                        .table
                        .remove_auto((id, &c.target, rule), (c.since_ms, c.until_ms), by, now_ms)
                        .is_some(),
                    Some(id) => self.table.put_auto(
                        (id, &c.target, rule),
                        (c.since_ms, c.until_ms),
                        by,
                        now_ms,
                    ),
                    None => false,
                },
                (BlockSource::Auto, None) => false,
                (BlockSource::Managed, _) => match Target::parse(&c.target) {
                    Ok(t) if lift => {
                        self.table
                            .remove_managed(&t, (c.since_ms, c.until_ms), by, now_ms)
                            .is_some()
                            // A lift remembered is saved too.
                            || c.until_ms > now_ms
                    }
                    Ok(t) if c.until_ms > now_ms => self
                        .table
                        .put_managed(&t, (c.since_ms, c.until_ms), reason, by)
                        .unwrap_or(false),
                    _ => false,
                },
            };
            if changed && c.source == BlockSource::Managed {
                self.touch();
            }
            kept += u64::from(changed);
        }
        kept
    }

    /// Counts a denial of `key`'s bucket `id` under rule `rule` (and its policy) at its owner,
    /// at `now_ms`; a block earned is put in force here and announced.
    pub fn denied(&self, (id, key, rule): (u64, &str, &str), policy: &Policy, now_ms: u64) {
        let Some(until_ms) = self.offenders.denied(id, policy, now_ms) else {
            return;
        };
        if self
            .table
            .put_auto((id, key, rule), (now_ms, until_ms), &self.node_id, now_ms)
        {
            tracing::info!(key, rule, until_ms, "key blocked after repeated denials");
            self.outbox.push(BlockChange {
                target: key.to_owned(),
                rule: Some(rule.to_owned()),
                source: BlockSource::Auto,
                since_ms: now_ms,
                until_ms,
                reason: "auto".into(),
                by: self.node_id.to_string(),
                lifted: false,
            });
        }
    }
}

use crate::metrics::{Family, load};

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The blocks' metrics, read at scrape time (`ringlimit_blocked_checks_total` is counted where
/// checks are answered: [`crate::metrics::Metrics::count_blocked`]).
pub const METRICS: &[Family<Blocklist>] = &[
    Family::gauge_by(
        "blocks",
        "Blocks held by this node, by source (auto: decided by a key's owner from its rule's block policy; managed: the admin API's), ended ones until the next sweep (within a second).",
        "source",
        &[
            ("auto", |b| b.table.held().0 as u64),
            ("managed", |b| b.table.held().1 as u64),
        ],
    ),
    Family::counter_by(
        "blocks_added",
        "Blocks put in force on this node (decided here, announced by a member, or asked for through the admin API), by source.",
        "source",
        &[
            ("auto", |b| load(&b.table.stats.added_auto)),
            ("managed", |b| load(&b.table.stats.added_managed)),
        ],
    ),
    Family::counter_by(
        "blocks_expired",
        "Blocks that ended on this node (swept), by source.",
        "source",
        &[
            ("auto", |b| load(&b.table.stats.expired_auto)),
            ("managed", |b| load(&b.table.stats.expired_managed)),
        ],
    ),
    Family::counter_by(
        "blocks_dropped",
        "Blocks not kept: automatic blocks given up or refused at --max-blocks (full), and changes not announced because the outbox was full (announce; their owner still answers them blocked).",
        "reason",
        &[
            ("full", |b| load(&b.table.stats.dropped_full)),
            ("announce", |b| load(&b.outbox.dropped)),
        ],
    ),
];

/// How often ended blocks are freed (their answers never waited for it).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Frees ended blocks and stale offenders every [`SWEEP_EVERY`], until dropped.
pub async fn sweep(blocks: Arc<Blocklist>, clock: Arc<dyn ringlimit_core::clock::Clock>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now_ms = clock.now() / ringlimit_core::clock::NANOS_PER_MS;
        blocks.table.sweep(now_ms);
        blocks.offenders.sweep(now_ms);
    }
}
