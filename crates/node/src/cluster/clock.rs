//! Clock skew: every peer's clock offset, measured over the peer link, and the cluster clock
//! global windows are numbered on.
//!
//! Global rules number their windows by wall time, and every node counts into "its" window: a node
//! whose clock is off opens its next window early (or late), and each time traffic starts the rule
//! admitted up to twice its limit (measured: the docs' benchmarks page, "Clock skew"). So each node
//! measures each peer's offset like NTP does: it sends its wall time, the peer answers with its
//! own, and the offset is the peer's time minus the middle of the round trip, with half the round
//! trip as the error bound (the best of the last [`SAMPLES`] samples: queueing only ever adds to a
//! round trip). The **cluster clock** is then this node's wall time corrected by the median of the
//! offsets of every member, itself included at 0: one wrong clock among three moves nobody else's
//! median, and its own median puts it back on the others' time. With half the members wrong (2 of
//! 4), the median is the lower middle one: with two clocks, every node picks the earlier, so all
//! still agree (on the wrong one if the wrong half is behind). With more clocks than that and no
//! majority on one, nodes may pick different ones: windows are then shifted between them by up to
//! the skew, as before this module, never worse.

use crate::metrics::{Family, Series};
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Samples kept per peer; the one with the smallest round trip is the estimate.
pub const SAMPLES: usize = 8;

/// One peer's offset estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offset {
    /// The peer's wall clock minus this node's, ns.
    pub offset_ns: i64,
    /// Half the round trip of the sample it came from: the true offset is within this of it.
    pub error_ns: u64,
}

/// One clock sample: this node's wall time when it asked (`sent_ns`) and when the answer came
/// (`received_ns`), and the peer's wall time when it answered (`peer_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub sent_ns: u64,
    pub peer_ns: u64,
    pub received_ns: u64,
}

impl Sample {
    fn offset(&self) -> Option<Offset> {
        let rtt = self.received_ns.checked_sub(self.sent_ns)?;
        let middle = self.sent_ns + rtt / 2;
        Some(Offset {
            offset_ns: clamp_i64(i128::from(self.peer_ns) - i128::from(middle)),
            error_ns: rtt / 2,
        })
    }
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Every peer's offset, and the correction that puts this node on the cluster clock.
#[derive(Debug)]
pub struct Clocks {
    samples: Mutex<BTreeMap<Arc<str>, VecDeque<Offset>>>,
    /// The cluster clock minus this node's wall clock, ns (the median offset).
    correction_ns: AtomicI64,
    /// `--max-clock-offset-ms`: past this a clock is wrong.
    max_offset: Duration,
}

impl Default for Clocks {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_OFFSET)
    }
}

/// `--max-clock-offset-ms`'s default.
pub const DEFAULT_MAX_OFFSET: Duration = Duration::from_millis(250);

impl Clocks {
    /// No offsets measured yet; clocks further off than `max_offset` are wrong.
    pub fn new(max_offset: Duration) -> Self {
        Self {
            samples: Mutex::new(BTreeMap::new()),
            correction_ns: AtomicI64::new(0),
            max_offset,
        }
    }

    /// Past this a clock is wrong (`--max-clock-offset-ms`).
    pub fn max_offset(&self) -> Duration {
        self.max_offset
    }

    /// Whether this node's own clock is off the cluster's by more than the maximum.
    pub fn own_clock_off(&self) -> bool {
        u128::from(self.correction_ns().unsigned_abs()) > self.max_offset.as_nanos()
    }

    /// Records a sample of `peer`'s clock (a sample with a negative round trip, a clock that
    /// stepped back meanwhile, is dropped).
    pub fn record(&self, peer: &Arc<str>, sample: Sample) {
        let Some(offset) = sample.offset() else {
            return;
        };
        let mut samples = self.samples.lock();
        let kept = samples.entry(peer.clone()).or_default();
        if kept.len() == SAMPLES {
            kept.pop_front();
        }
        kept.push_back(offset);
        self.update(&samples);
    }

    /// Keeps only the peers in `members` (the others' offsets no longer count).
    pub fn retain(&self, members: &[Arc<str>]) {
        let mut samples = self.samples.lock();
        samples.retain(|id, _| members.contains(id));
        self.update(&samples);
    }

    fn update(&self, samples: &BTreeMap<Arc<str>, VecDeque<Offset>>) {
        let mut offsets: Vec<i64> = samples
            .values()
            .filter_map(best)
            .map(|o| o.offset_ns)
            .collect();
        offsets.push(0);
        offsets.sort_unstable();
        // The lower middle: with an even count, one side, the same on every node that sees it.
        let median = offsets[(offsets.len() - 1) / 2];
        self.correction_ns.store(median, Ordering::Relaxed);
    }

    /// Each peer's offset estimate now.
    pub fn offsets(&self) -> BTreeMap<Arc<str>, Offset> {
        self.samples
            .lock()
            .iter()
            .filter_map(|(id, s)| Some((id.clone(), best(s)?)))
            .collect()
    }

    /// The cluster clock minus this node's wall clock, ns.
    pub fn correction_ns(&self) -> i64 {
        self.correction_ns.load(Ordering::Relaxed)
    }

    /// `local_ns` (this node's wall time) on the cluster clock.
    pub fn cluster_ns(&self, local_ns: u64) -> u64 {
        let corrected = i128::from(local_ns) + i128::from(self.correction_ns());
        u64::try_from(corrected.max(0)).unwrap_or(u64::MAX)
    }
}

/// Nanoseconds as the seconds a metric shows.
fn seconds(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// Every member's clock as metrics, read at scrape time.
pub const METRICS: &[Family<Clocks>] = &[
    Family::gauge_each(
        "clock_offset_seconds",
        "Each member's wall clock minus this node's, measured over the peer link every second \
         (the best of the last 8 samples; half its round trip is the error).",
        &["peer"],
        |c| {
            c.offsets()
                .iter()
                .map(|(peer, o)| Series::new([&**peer], seconds(o.offset_ns)))
                .collect()
        },
    ),
    Family::gauge_each(
        "clock_offset_error_seconds",
        "The error bound of each member's clock offset: half the round trip of its sample.",
        &["peer"],
        |c| {
            c.offsets()
                .iter()
                .map(|(peer, o)| {
                    let error = i64::try_from(o.error_ns).unwrap_or(i64::MAX);
                    Series::new([&**peer], seconds(error))
                })
                .collect()
        },
    ),
    Family::gauge_f64(
        "clock_correction_seconds",
        "The cluster clock (the median of every member's) minus this node's wall clock: \
         what global windows are numbered on.",
        |c| seconds(c.correction_ns()),
    ),
];

/// The sample with the smallest round trip.
fn best(samples: &VecDeque<Offset>) -> Option<Offset> {
    samples.iter().min_by_key(|o| o.error_ns).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const T: u64 = 1_767_225_600_000 * MS;

    fn sample(skew_ms: i64, rtt_ms: u64) -> Sample {
        let sent_ns = T;
        let received_ns = T + rtt_ms * MS;
        let peer_ns = (i128::from(T + rtt_ms * MS / 2) + i128::from(skew_ms) * 1_000_000) as u64;
        Sample {
            sent_ns,
            peer_ns,
            received_ns,
        }
    }

    #[test]
    fn an_offset_is_the_peers_time_minus_the_round_trips_middle() {
        let c = Clocks::default();
        let b: Arc<str> = Arc::from("b");
        c.record(&b, sample(3_000, 4));
        c.record(&b, sample(3_001, 1));
        c.record(&b, sample(2_990, 40));
        let o = c.offsets()[&b];
        assert_eq!(
            o,
            Offset {
                offset_ns: 3_001 * MS as i64,
                error_ns: MS / 2
            },
            "the best sample"
        );
        let back = Sample {
            sent_ns: T,
            peer_ns: T,
            received_ns: T - 1,
        };
        c.record(&b, back);
        assert_eq!(
            c.offsets()[&b].error_ns,
            MS / 2,
            "a clock that stepped back is ignored"
        );
    }

    /// One wrong clock among three: the others keep their time, the wrong one is put back.
    #[test]
    fn the_cluster_clock_is_the_median_of_every_members() {
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        // Seen from a right node: one peer right, one 10 s ahead.
        let right = Clocks::default();
        right.record(&a, sample(0, 1));
        right.record(&b, sample(10_000, 1));
        assert_eq!(right.correction_ns(), 0);
        // Seen from the node 10 s ahead: both peers 10 s behind it.
        let ahead = Clocks::default();
        ahead.record(&a, sample(-10_000, 1));
        ahead.record(&b, sample(-10_000, 1));
        assert_eq!(ahead.correction_ns(), -10_000 * MS as i64);
        assert_eq!(ahead.cluster_ns(T + 10_000 * MS), T);
        // Alone, or with the peers gone: its own clock.
        ahead.retain(&[]);
        assert_eq!(ahead.correction_ns(), 0);
    }

    /// Half the cluster wrong (2 of 4): the lower middle, one side's time.
    #[test]
    fn with_half_wrong_the_lower_middle_wins() {
        let c = Clocks::default();
        for (id, skew) in [("b", 0), ("c", 7_000), ("d", 7_000)] {
            c.record(&Arc::from(id), sample(skew, 1));
        }
        assert_eq!(c.correction_ns(), 0);
        let wrong = Clocks::default();
        for (id, skew) in [("b", 0), ("c", -7_000), ("d", -7_000)] {
            wrong.record(&Arc::from(id), sample(skew, 1));
        }
        assert_eq!(wrong.correction_ns(), -7_000 * MS as i64);
    }
}
