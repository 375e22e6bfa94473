//! Regions: one limit shared by several clusters, one per region, without any check waiting on
//! the WAN. The pure arithmetic of both sides; the node carries the asks and grants.
//!
//! Leases across regions: every bucket of a rule shared across regions (`scope: regions`) has
//! a **home** region (a rendezvous hash of its id over the configured region names:
//! [`ringlimit_proto::region::home`]), whose owner of the bucket keeps the real bucket and
//! allocates it ([`Allocator`]). The owner of the bucket in **every** region, the home
//! included, decides the bucket's checks from its **allowance** ([`Allowances`]): slices the
//! home took from the real bucket for it, exact as leases are (see [`crate::lease`]: a
//! window's slice is a count in the window of its grant, a token bucket's tokens are spent
//! within a bounded time). Every interval (and early, a few times an interval, when its slices
//! run out) a region reports its demand and gives back what it did not spend, and is granted a
//! new slice: the home's [`budget`] for the interval (a window's rest spread over its time),
//! [`split`] max-min fair by the regions' demands; a fixed window's is its part of the whole
//! window split by demand projected to the window's end, paced over the window's rest
//! ([`window_share`]).
//!
//! A region that cannot renew keeps deciding on its slices until its allowance (renewed with
//! every grant, a few intervals long) expires, then falls back ([`OnRegionUnreachable`]):
//! `share` decides on a local bucket of the rule's limit divided by the number of configured
//! regions ([`fallback_rule`]), charged all along with what the region admitted on its slices;
//! `open` admits. Either answers `degraded`. The home, when a region's allowance ran out,
//! reserves for it what that fallback may admit (taken from the real bucket), so that with
//! `share` the regions together stay within the limit whichever region is cut off, the home
//! included (the others then fall back to their shares and the home, seeing them all away,
//! keeps only its own).
//!
//! Clocks: a slice's time is sent as a duration and counted by the region from its ask, before
//! the home took it, so it ends there no later than at the home whatever the clocks' offsets.
//! A window's slice, with the home's clock offset measured, ends where the offset places the
//! home's window end (within the ask's round trip of that bound): otherwise a region of small
//! demand lost its checks of every window's last half round trip. At the window's turn a region
//! may admit a new key's advance until the new window's first grant comes, charged as a new
//! key's is. The home's windows are on its clock; a fallback bucket's on the region's.

mod fair;
mod holder;
mod home;

pub use fair::{
    HEADROOM, InWindow, WindowShare, budget, need, split, split_with_room, want, window_share,
};
pub use holder::{Allowances, Due, Verdict};
pub use home::{Allocator, Owned, RealBucket, SeatTotals};

use crate::clock::NANOS_PER_MS;
use crate::limiter::Rule;
use ringlimit_proto::Algorithm;

/// Whether a rule's slices end with its window (fixed and sliding windows), rather than
/// refilling (token bucket).
fn windowed(rule: &Rule) -> bool {
    matches!(
        rule.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    )
}

pub use ringlimit_proto::discovery::OnRegionUnreachable;

/// Both sides' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSettings {
    /// How often a region reports and is granted.
    pub interval_ns: u64,
    /// How many intervals an allowance lasts past its ask (renewed by every grant): a region
    /// falls back after missing this many less one renewals.
    pub allowance_intervals: u64,
    /// Configured regions (ours and our `--region-peers`).
    pub regions: usize,
    /// Most reports a region sends early in one interval, per bucket.
    pub early_per_interval: u32,
    /// A region stops holding a bucket nobody checked in this many intervals.
    pub idle_intervals: u64,
}

impl RegionSettings {
    pub fn new(interval_ns: u64, regions: usize) -> Self {
        Self {
            interval_ns: interval_ns.max(NANOS_PER_MS),
            allowance_intervals: 3,
            regions: regions.max(1),
            early_per_interval: 2,
            idle_intervals: 30,
        }
    }

    /// How long an allowance lasts past its ask.
    pub fn allowance_ns(&self) -> u64 {
        self.interval_ns.saturating_mul(self.allowance_intervals)
    }
}

/// The local bucket a region falls back to with `share`: the same algorithm and period, the
/// limit (and burst) divided by the `regions`, at least 1.
pub fn fallback_rule(rule: &Rule, regions: usize) -> Rule {
    let n = regions.max(1) as u64;
    Rule {
        limit: (rule.limit / n).max(1),
        burst: (rule.burst / n).max(1),
        ..*rule
    }
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
