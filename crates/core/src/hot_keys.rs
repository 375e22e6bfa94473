//! Hot keys: which buckets a node (or an SDK client) sends most checks for, with bounded memory,
//! and which of them are hot enough to lease (a slice of the bucket, decided where checks arrive).
//!
//! Counting is Filtered Space-Saving (the `topk` crate): `k` counters hold every bucket whose
//! share of the checks exceeds 1/k, each with an error bound (its estimate minus the error is a
//! lower bound of its true count). Counts are halved at every tick, so a count is a rate: under a
//! steady `r` checks/s and ticks every `w` seconds it converges to `2·r·w`, reaching 7/8 of it
//! after three ticks. A bucket is *promoted* once the lower bound of its rate reaches
//! `promote_at` and *demoted* once the estimate of its rate falls below `demote_at` (lower):
//! a bucket checked steadily at the threshold does not flap.

use std::collections::HashSet;
use topk::FilteredSpaceSaving;

/// How hot keys are found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotSettings {
    /// Counters kept (memory: about 100 bytes each, alpha filter included).
    pub k: usize,
    /// Nanoseconds between ticks.
    pub tick_ns: u64,
    /// Checks per second at which a bucket is promoted (its rate's lower bound).
    pub promote_at: f64,
    /// Checks per second below which a promoted bucket is demoted (its rate's estimate).
    pub demote_at: f64,
}

impl Default for HotSettings {
    fn default() -> Self {
        Self {
            k: 256,
            tick_ns: 250_000_000,
            promote_at: 1_000.0,
            demote_at: 500.0,
        }
    }
}

/// Buckets promoted and demoted by one tick.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub promoted: Vec<u64>,
    pub demoted: Vec<u64>,
}

/// Hot-key detection over bucket ids (see the module doc). Not synchronised: the caller holds
/// it behind its own lock, and may sample (recording one check in `n` with weight `n`).
pub struct HotKeys {
    settings: HotSettings,
    sketch: FilteredSpaceSaving<u64>,
    promoted: HashSet<u64>,
}

impl std::fmt::Debug for HotKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotKeys")
            .field("settings", &self.settings)
            .field("promoted", &self.promoted.len())
            .finish_non_exhaustive()
    }
}

impl HotKeys {
    pub fn new(settings: HotSettings) -> Self {
        Self {
            sketch: FilteredSpaceSaving::new(settings.k.max(1)),
            settings,
            promoted: HashSet::new(),
        }
    }

    /// Counts `weight` checks of bucket `id`.
    pub fn record(&mut self, id: u64, weight: u64) {
        self.sketch.insert(id, weight);
    }

    /// Ends a tick: promotes and demotes by the rates counted so far, then halves the counts.
    /// Call it every `tick_ns`.
    pub fn tick(&mut self) -> Changes {
        // A steady rate r gives a count of 2·r·w (w the tick in seconds): rate = count / 2w.
        let per_count = 1e9 / (2.0 * self.settings.tick_ns.max(1) as f64);
        let mut changes = Changes::default();
        for (&id, c) in self.sketch.iter() {
            let lower = c.estimated_count().saturating_sub(c.associated_error()) as f64 * per_count;
            if lower >= self.settings.promote_at && self.promoted.insert(id) {
                changes.promoted.push(id);
            }
        }
        // A promoted bucket the sketch no longer tracks has a rate below its smallest counter.
        let (sketch, demote_at) = (&self.sketch, self.settings.demote_at);
        self.promoted.retain(|id| {
            let hot = sketch
                .get(id)
                .is_some_and(|c| c.estimated_count() as f64 * per_count >= demote_at);
            if !hot {
                changes.demoted.push(*id);
            }
            hot
        });
        changes.promoted.sort_unstable();
        changes.demoted.sort_unstable();
        self.sketch.decay(0.5);
        changes
    }

    /// Whether bucket `id` is promoted.
    pub fn is_hot(&self, id: u64) -> bool {
        self.promoted.contains(&id)
    }

    /// Buckets promoted.
    pub fn hot_count(&self) -> usize {
        self.promoted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Checks per tick of 250 ms for a rate in checks/s.
    fn per_tick(rate: f64) -> u64 {
        (rate / 4.0) as u64
    }

    /// One tick of traffic: `hot` at `rate` checks/s, and as many checks again spread over
    /// 100,000 cold buckets.
    fn tick_of(h: &mut HotKeys, rng: &mut rand::rngs::StdRng, hot: u64, rate: f64) -> Changes {
        let n = per_tick(rate);
        for _ in 0..n {
            h.record(hot, 1);
            h.record(rng.random_range(1_000..101_000), 1);
        }
        h.tick()
    }

    #[test]
    fn a_key_twice_the_threshold_is_promoted_within_a_second_among_cold_ones() {
        let mut h = HotKeys::new(HotSettings::default());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut promoted_after = None;
        for t in 1..=8 {
            let c = tick_of(&mut h, &mut rng, 1, 2_000.0);
            if c.promoted.contains(&1) && promoted_after.is_none() {
                promoted_after = Some(t);
            }
            assert!(
                c.promoted.iter().all(|&id| id == 1),
                "a cold key promoted: {c:?}"
            );
        }
        let ticks = promoted_after.expect("promoted");
        assert!(ticks <= 4, "after {ticks} ticks of 250 ms");
        assert_eq!(h.hot_count(), 1);
    }

    #[test]
    fn a_key_steady_at_the_threshold_does_not_flap() {
        let mut h = HotKeys::new(HotSettings::default());
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        // Promoted by a burst, then held at the threshold with ±20% wobble for 100 ticks.
        for _ in 0..4 {
            tick_of(&mut h, &mut rng, 1, 2_000.0);
        }
        assert!(h.is_hot(1));
        let (mut promotions, mut demotions) = (0, 0);
        for t in 0..100 {
            let rate = if t % 2 == 0 { 800.0 } else { 1_200.0 };
            let c = tick_of(&mut h, &mut rng, 1, rate);
            promotions += c.promoted.len();
            demotions += c.demoted.len();
        }
        assert_eq!((promotions, demotions), (0, 0));
        assert!(h.is_hot(1));
    }

    #[test]
    fn a_key_that_cools_down_is_demoted_within_a_few_ticks() {
        let mut h = HotKeys::new(HotSettings::default());
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..6 {
            tick_of(&mut h, &mut rng, 1, 4_000.0);
        }
        assert!(h.is_hot(1));
        let mut demoted_after = None;
        for t in 1..=6 {
            let c = tick_of(&mut h, &mut rng, 2, 100.0);
            if c.demoted.contains(&1) && demoted_after.is_none() {
                demoted_after = Some(t);
            }
        }
        let ticks = demoted_after.expect("demoted");
        assert!(ticks <= 4, "after {ticks} ticks");
        assert_eq!(h.hot_count(), 0);
    }

    #[test]
    fn memory_stays_bounded_by_k() {
        let mut h = HotKeys::new(HotSettings {
            k: 64,
            ..HotSettings::default()
        });
        for id in 0..1_000_000u64 {
            h.record(id, 1);
        }
        assert!(h.sketch.iter().count() <= 64);
        assert!(
            h.tick().promoted.is_empty(),
            "no key above 1/k of the traffic"
        );
    }
}
