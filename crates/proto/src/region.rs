//! Regions: one limit shared by several clusters (one per region). Which region is a bucket's
//! home (its allocator), and what regions ask of a home and are granted, per bucket.
//!
//! Pure values and one pure function, so that every node of every region names the same home
//! for a bucket whatever its build.

use crate::RuleRef;
use crate::mark::Mark;
use serde::{Deserialize, Serialize};

/// The home region of bucket `id` among the configured `regions` (every region's own list:
/// its name and its `--region-peers`' names): the index of the name with the highest
/// rendezvous weight. Stable under any order of the list, and independent of which regions
/// are up (a home that is cut off stays the home; the others fall back). `None` for no regions.
pub fn home<S: AsRef<str>>(id: u64, regions: &[S]) -> Option<usize> {
    regions
        .iter()
        .enumerate()
        .max_by_key(|(_, name)| (weight(id, name.as_ref()), name.as_ref().to_owned()))
        .map(|(i, _)| i)
}

/// The rendezvous weight of region `name` for bucket `id`: xxh3 of the name, seeded by the id.
fn weight(id: u64, name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), id ^ 0x7265_6769_6f6e) // "region"
}

/// The `cluster_id` a region link's hello carries and its proofs are bound to: regions are
/// different clusters, so their own ids would not match.
pub const REGION_CONTEXT: &str = "ringlimit-regions";
/// Most asks in one `RegionAsks` frame (a region sends more in several).
pub const MAX_ASKS_PER_FRAME: usize = 4_096;
/// Most slices one ask gives back, and most unanswered asks it names.
pub const MAX_BACK_PER_ASK: usize = 8;
/// Most counts in one `RegionCounts` frame (about 45 bytes each: under 1 MB).
pub const MAX_COUNTS_PER_FRAME: usize = 20_000;

/// One ask of a `RegionAsks` frame: the asking region's number for it, echoed in its grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionAskEntry {
    pub seq: u64,
    pub ask: RegionAsk,
}

/// One grant of a `RegionGrants` frame, for the ask numbered `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionGrantEntry {
    pub seq: u64,
    pub grant: RegionGrant,
}

/// A slice a region gives back: `tokens` it did not spend of a grant taken under `mark`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceBack {
    pub tokens: u64,
    pub mark: Mark,
}

/// A region's report on one bucket to its home: what it asked of the bucket lately, what it
/// gives back, and the ask for its next slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionAsk {
    pub key: String,
    pub rule: RuleRef,
    /// Checks asked of the bucket in the region since its last report (denied ones
    /// included), per second, in thousandths.
    pub demand_milli: u64,
    /// Unspent slices given back (exact, under their grants' marks).
    pub back: Vec<SliceBack>,
    /// Admitted before the region's first grant of the bucket (its advance), to be charged.
    pub advance: u64,
    /// Sent before the interval was up (its slice ran out): sized for the time since its last.
    pub early: bool,
    /// The region stops holding the bucket (idle): nothing to reserve for it.
    pub leaving: bool,
    /// Tokens the region still holds in the slices it keeps (a token bucket's are not given
    /// back, which would lose the refill since their grant): its next slice is that much
    /// smaller. A fixed window's home splits the window by what each region used of its
    /// grants, their sum less this.
    pub held: u64,
    /// Asks of this bucket the region gave up waiting for (their `seq`): a grant that was
    /// lost on the way is given back to the bucket by the home.
    pub unanswered: Vec<u64>,
    /// What a report tells beyond the fields above: carried beside the ask by the frames of
    /// [`crate::peer::REGION_TALLY_SINCE`] ([`TalliedAsk`]), never in an older frame's ask.
    #[serde(skip)]
    pub tally: Option<AskTally>,
}

impl RegionAsk {
    /// The ask as a link of an older version carries it: what a lost ask admitted ahead of
    /// its grants is told as an advance again (charged twice when only its grant was lost:
    /// fewer admissions, never more), what it gave back is lost with it.
    pub fn untallied(mut self) -> Self {
        if let Some(t) = self.tally.take() {
            let again: u64 = t.again.iter().map(|a| a.advance).sum();
            self.advance = self.advance.saturating_add(again);
        }
        self
    }
}

/// A region's count of a bucket's checks, and what its lost asks carried.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskTally {
    /// Checks asked of the bucket in the region since it began holding it (in cost, denied
    /// ones included): the home counts a window's demand by the differences, exact whatever
    /// the time between reports and whichever of them were lost.
    pub asked_total: u64,
    /// Checks admitted on the bucket's fallback in the region since it began holding it (its
    /// allowance expired): a home that reserved for the region while it was away gives the
    /// rest of that reservation back to the bucket.
    pub fallback_total: u64,
    /// `asked_total` when the home's window last turned, as the region's measure of the home
    /// clock's offset placed the turn (0: not placed): the first report of a window tells
    /// exactly which of its checks are the new window's.
    pub asked_at_turn: u64,
    /// Asks given up as lost (at most [`MAX_BACK_PER_ASK`]): what they gave back and admitted
    /// ahead of their grants, applied by a home that never saw them.
    pub again: Vec<AskAgain>,
}

/// What the ask numbered `seq`, given up as lost, gave back and told as its advance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskAgain {
    pub seq: u64,
    pub back: Vec<SliceBack>,
    pub advance: u64,
}

/// One ask of a `RegionAsksTallied` or `RegionRelayTallied` frame, its tally beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TalliedAsk {
    pub seq: u64,
    pub ask: RegionAsk,
    pub tally: AskTally,
}

impl From<RegionAskEntry> for TalliedAsk {
    fn from(mut e: RegionAskEntry) -> Self {
        let tally = e.ask.tally.take().unwrap_or_default();
        Self {
            seq: e.seq,
            ask: e.ask,
            tally,
        }
    }
}

impl From<TalliedAsk> for RegionAskEntry {
    fn from(t: TalliedAsk) -> Self {
        let mut ask = t.ask;
        ask.tally = Some(t.tally);
        Self { seq: t.seq, ask }
    }
}

/// The home's answer to one [`RegionAsk`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegionGrant {
    /// `tokens` taken from the bucket for the region (possibly 0: the allowance is renewed all
    /// the same), spendable within `valid_ns` of its ask (a window's slice ends with its
    /// window), given back under `mark`; the region's allowance lasts `allowance_ns` from its
    /// ask. `limit` and `reset_at_ms` word the region's answers.
    Granted {
        tokens: u64,
        mark: Mark,
        valid_ns: u64,
        allowance_ns: u64,
        limit: u64,
        reset_at_ms: u64,
    },
    /// The ask was invalid at the home (a rule it does not know, not shared across regions);
    /// the contract's code.
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_stable_under_order_and_spread() {
        let a = ["eu", "us", "ap"];
        let b = ["ap", "eu", "us"];
        let mut counts = [0u32; 3];
        for id in 0..3_000u64 {
            let x = a[home(id, &a).unwrap_or(0)];
            let y = b[home(id, &b).unwrap_or(0)];
            assert_eq!(x, y);
            counts[home(id, &a).unwrap_or(0)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        assert_eq!(home::<&str>(1, &[]), None);
    }
}
