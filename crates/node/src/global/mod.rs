//! Global rules: `mode: global` rules are decided by every node at once, from its own count
//! plus the counts its peers push — eventual consistency with a bounded error, no forwarding.
//!
//! For hot keys and cluster-wide quotas, where sending every check to one owner would make that
//! owner the bottleneck. Each node keeps, per bucket and window, a G-counter (`crdts`) of the
//! hits each node admitted ([`counters`]); it pushes its own changed counts to every other live
//! member every `--global-publish-ms` ([`publish`], [`push`]) and merges what the others push;
//! a check is admitted when the merged estimate plus its cost fits the limit ([`decide`]). A
//! member that is new, restarted or reconnected is sent the full set: this node's counts and
//! every other actor's it holds, so that it also learns the counts of nodes that are gone.
//!
//! # What each algorithm means in global mode
//! Windows are aligned to the Unix epoch (`unix_ms / period_ms`), or for calendar windows to
//! the rule's calendar (local dates, Mondays or months since 1970: [`numbering`]), so every
//! node numbers them alike; only two windowed counts per bucket are replicated.
//! - `fixed_window`: at most `limit` per aligned window, cluster-wide; with `calendar: true`,
//!   per local day, week or month of the rule's time zone.
//! - `sliding_window`: the weighted two-window estimate `previous × (1 − f) + current` over the
//!   cluster-wide counts, as on one node.
//! - `token_bucket`, `leaky_bucket`, `sliding_log`: approximated by the sliding-window counter
//!   over `limit` per `period`; `burst` is ignored (a cost above `limit` is refused as invalid).
//!   A bucket's refill has no windowed CRDT form; the sliding counter is the closest estimate
//!   that G-counters give, and it never admits more than the rule's long-run rate.
//!
//! # The error bound
//! A node does not see its peers' most recent hits: those since their last publish round, up
//! to one `--global-publish-ms` (half on average; each round goes to every peer at once over
//! the peer protocol, so delivery adds a one-way delay, not a gossip round). At a cluster-wide
//! rate `R` spread over `n` nodes, a window over-admits about `R × (n − 1)/n × interval / 2` on
//! average, reached only when the limit is hit mid-window. The last tenth of each window's
//! quota is published faster (every `interval / 5` at most), which shrinks that term five-fold
//! where it matters; `bench/global.sh` measures the result per interval. Under a partition each
//! side admits at most the limit minus what it saw of the other side (its merged counts
//! remain), so the cluster admits at most `sides × limit` while split; a dead member's counts
//! still count until its window ends.
//!
//! # Across regions
//! A `scope: regions` global rule is one limit across regions: each node also sends its own
//! counts of such buckets to the other regions' entry nodes, numbered on the receiver's clock
//! (the offset is measured on the region link), and an entry node relays what it merged to its
//! members as other actors' counts (`crate::regions::counts`). A region hears another's hits
//! up to one interval (or one WAN round trip, when longer) plus one one-way WAN delay late, and
//! a member of a region of several nodes one more interval after its entry node: a window may
//! over-admit about `R × (interval + one-way delay + interval)` at a rate `R` elsewhere, plus
//! the hits within the offset's error of a window's edge.
//!
//! Restarts lose nothing but what was never sent: a restarted node is a new actor
//! (`node_id@generation`), and the full sets of its peers relay every actor's counts they hold,
//! its own previous life's included, before it turns ready (readiness waits for a full set from
//! every alive peer, at most the readiness grace). A rolling restart that waits for readiness
//! therefore keeps every count, as long as one node that holds them stays up. A node stopped
//! with SIGTERM sends its peers a last full set once its HTTP has drained; one killed loses its
//! hits since its last publish round (up to one interval, fewer near a limit). Relaying is
//! bounded by `--global-max-published` buckets per full set (see [`publish`]).
//!
//! # Answers
//! A global check is never forwarded and never `degraded`: losing peers only means hearing
//! fewer counts. `remaining`, `reset_at_ms` and `retry_after_ms` are computed from the merged
//! counts as if no other traffic came (other nodes' hits may make a retry wait longer).
//!
//! # Layout
//! - [`wire`] — one bucket's counts as they travel (own, and relayed per actor), and their
//!   validation.
//! - [`numbering`] — how a bucket's windows are numbered, plain periods or a calendar's.
//! - [`actor`] — a node incarnation as a G-counter actor (`node_id@generation`).
//! - [`counters`] — per-window G-counters, caps, expiry, merging what peers send.
//! - [`decide`] — the pure decision over merged counts.
//! - [`metrics`] — the counters and their stats as metrics.
//! - [`publish`] — what each round sends: changed buckets, within the budget and the cap.
//! - [`push`] — one connection per live peer, resynchronised whole after any loss.

pub mod actor;
pub mod counters;
pub mod decide;
pub mod metrics;
pub mod numbering;
pub mod publish;
pub mod push;
pub mod wire;

pub use actor::actor;
pub use counters::GlobalCounters;
pub use publish::PublishSettings;

use ringlimit_core::limiter::Rule;
use ringlimit_proto::CheckAnswer;

/// Default cap on the windows one node holds (own and merged, all buckets).
pub const DEFAULT_MAX_WINDOWS: usize = 100_000;
/// Default cap on the buckets one node publishes at once.
pub const DEFAULT_MAX_PUBLISHED: usize = 10_000;
/// Default budget: global-counter updates a node receives per second from all its peers together
/// (about 25 bytes each over TCP: 500 KB/s, and little CPU to merge), split among the publishing
/// nodes. It was 2,000 while counts travelled in gossip datagrams; over the peer link that left hot
/// keys' counts waiting seconds, where 20,000 keeps none waiting at any cluster size measured
/// (`bench/scale.sh`: `bench/notes/efficiency-and-scale.md`, "The budget's default").
pub const DEFAULT_GOSSIP_BUDGET: u64 = 20_000;

impl GlobalCounters {
    /// Decides a global check and phrases the contract's answer (never degraded); `shared`:
    /// the rule is `scope: regions` (its counts also go to the other regions).
    pub fn answer(&self, id: u64, rule: &Rule, shared: bool, now: u64, cost: u64) -> CheckAnswer {
        ringlimit_core::answer::answer(&self.check_in(id, rule, shared, now, cost), rule)
    }
}
