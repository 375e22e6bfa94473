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
//! map slot (a boxed key or an address, the `until`/`since` times, and shared `reason`/`by`
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
/// boxed key or an address, `until`, `since`, two shared strings), an auto block's index
/// entry, and the maps' spare capacity (a map at most half full after it grows).
pub const BYTES_PER_ENTRY: usize = 256;

/// Longest reason a managed block may give, in bytes.
pub const MAX_REASON_BYTES: usize = 256;

/// Default bound on blocks held per node (`--max-blocks`).
pub const DEFAULT_MAX_BLOCKS: usize = 1_000_000;
