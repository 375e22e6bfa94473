//! Rate shares of one bucket among many enforcers (Envoy's Rate Limit Quota Service): pure,
//! clock injected.
//!
//! An RLQS client (an Envoy) decides every request itself from an assignment, a rate; the
//! bucket's owner keeps the sum of all assigned rates within the rule's rate. Each member that
//! serves streams asks the owner for its streams' shares, giving their demands; the owner
//! keeps the latest demands of every member ([`QuotaBook`]) and splits the rate among all of
//! their streams ([`shares`]).
//!
//! Why rates and not the lease slices of [`crate::lease`]: an Envoy enforces a token bucket it
//! is given, for as long as the assignment lives, without asking again; a slice is a count
//! that runs out. A rate share keeps the sum exact the same way a slice does (what is
//! assigned never exceeds what the rule allows), without a round trip when a slice runs dry.

use std::collections::HashMap;

/// Each stream's demand is met with this much room to grow before the rate is split: a quiet
/// stream's next second is rarely exactly its last (Poisson arrivals), and it must not be
/// starved while the sum is under the limit. What a quiet stream does not use is lost to the
/// others, so the room is small (its token bucket's burst absorbs the rest).
pub const HEADROOM: f64 = 1.05;
/// Every stream is treated as asking at least this fraction of the rate: one that was idle for
/// a report keeps a trickle instead of being denied everything until its next assignment.
pub const FLOOR: f64 = 0.005;
/// Assigned rates sit on a grid of steps this far apart, rounded down: a share that moves a
/// little keeps the very same assignment, and Envoy keeps its token bucket's tokens (a changed
/// bucket starts anew, full in the Envoy releases before the one that carries the ratio over).
pub const STEP: f64 = 1.02;
/// Most streams one bucket is split among (beyond them, new streams get no share): bounds the
/// owner's memory and the split's cost.
pub const MAX_STREAMS: usize = 1024;
/// Most buckets the owner keeps shares of.
pub const MAX_BUCKETS: usize = 100_000;

/// Splits `rate` among streams of the given demands (per second): max-min fair on the
/// demands with [`HEADROOM`] (those that ask less than an equal part get what they ask, the
/// rest split what is left evenly), then what no stream asked for is spread evenly, so that a
/// stream whose demand grows has room before its next assignment. The shares sum to `rate`.
pub fn shares(rate: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 || rate.is_nan() || rate <= 0.0 {
        return vec![0.0; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    let floor = rate * FLOOR;
    let want = |i: usize| (demands[i].max(0.0) * HEADROOM).clamp(floor, f64::MAX);
    order.sort_by(|&a, &b| want(a).total_cmp(&want(b)));
    let mut out = vec![0.0; n];
    let mut left = rate;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (n - k) as f64;
        let give = want(i).min(fair);
        out[i] = give;
        left -= give;
    }
    if left > 0.0 {
        let extra = left / n as f64;
        for s in &mut out {
            *s += extra;
        }
    }
    out
}

/// What the owner answers a member's ask.
#[derive(Debug, Clone, PartialEq)]
pub enum Allocation {
    /// Each asked stream's rate per second, in the order asked.
    Shares(Vec<f64>),
    /// The owner took the bucket over lately and has not heard from every member yet: keep
    /// what you were assigned (the previous owner's shares summed within the rate).
    Warming,
}

/// One member's streams of one bucket, as last asked.
#[derive(Debug, Clone)]
struct Member {
    streams: Vec<(u64, f64)>,
    seen_ns: u64,
}

#[derive(Debug, Clone, Default)]
struct Table {
    /// When this owner first heard of the bucket from a member that held shares already.
    warm_from_ns: Option<u64>,
    members: HashMap<String, Member>,
    last_ns: u64,
}

/// The owner's side: the latest demands of every member's streams of the buckets it owns.
#[derive(Debug)]
pub struct QuotaBook {
    /// A member not heard from in this long is forgotten (its streams ended or it died).
    forget_ns: u64,
    /// How long a bucket taken over from another owner waits for every member.
    warm_ns: u64,
    buckets: HashMap<u64, Table>,
}

impl QuotaBook {
    /// A book that forgets a member after `forget_ns` of silence and waits `warm_ns` before
    /// splitting a bucket taken over (both a few of the members' asking intervals).
    pub fn new(forget_ns: u64, warm_ns: u64) -> Self {
        Self {
            forget_ns,
            warm_ns,
            buckets: HashMap::new(),
        }
    }

    /// Buckets with shares kept here.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// `member` asks for its `streams` (id, demand per second) of bucket `id` of `rate` per
    /// second; `held` says whether it holds shares of it already (from this owner or an
    /// earlier one). Returns each stream's share, or [`Allocation::Warming`].
    pub fn ask(
        &mut self,
        id: u64,
        rate: f64,
        member: &str,
        streams: &[(u64, f64)],
        held: bool,
        now: u64,
    ) -> Allocation {
        if !self.buckets.contains_key(&id) && self.buckets.len() >= MAX_BUCKETS {
            self.expire(now);
            if self.buckets.len() >= MAX_BUCKETS {
                // Full: no share (the member keeps what it has, or falls back).
                return Allocation::Shares(vec![0.0; streams.len()]);
            }
        }
        let fresh = !self.buckets.contains_key(&id);
        let table = self.buckets.entry(id).or_default();
        if fresh && held {
            table.warm_from_ns = Some(now);
        }
        table.last_ns = now;
        let forget = self.forget_ns;
        table
            .members
            .retain(|_, m| now.saturating_sub(m.seen_ns) <= forget);
        if streams.is_empty() {
            table.members.remove(member);
            return Allocation::Shares(Vec::new());
        }
        let mut kept: Vec<(u64, f64)> = streams.to_vec();
        let others: usize = table
            .members
            .iter()
            .filter(|(m, _)| m.as_str() != member)
            .map(|(_, m)| m.streams.len())
            .sum();
        kept.truncate(MAX_STREAMS.saturating_sub(others));
        table.members.insert(
            member.to_owned(),
            Member {
                streams: kept.clone(),
                seen_ns: now,
            },
        );
        if let Some(from) = table.warm_from_ns {
            if now.saturating_sub(from) < self.warm_ns {
                return Allocation::Warming;
            }
            table.warm_from_ns = None;
        }
        // Every stream of every member, this member's first (their shares are the answer).
        let mut demands: Vec<f64> = kept.iter().map(|s| s.1).collect();
        for (name, m) in &table.members {
            if name != member {
                demands.extend(m.streams.iter().map(|s| s.1));
            }
        }
        let all = shares(rate, &demands);
        let mut mine: Vec<f64> = all[..kept.len()].to_vec();
        // Streams beyond the bound get nothing.
        mine.resize(streams.len(), 0.0);
        Allocation::Shares(mine)
    }

    /// Forgets buckets no member asked about within the forget time.
    pub fn expire(&mut self, now: u64) {
        let forget = self.forget_ns;
        self.buckets
            .retain(|_, t| now.saturating_sub(t.last_ns) <= forget);
    }
}

/// `rate` rounded down to the [`STEP`] grid (0 stays 0).
pub fn on_grid(rate: f64) -> f64 {
    if rate.is_nan() || rate <= 0.0 {
        return 0.0;
    }
    // A hair above the exact step, so that a grid value maps to itself despite rounding.
    let k = (rate.ln() / STEP.ln() + 1e-9).floor();
    STEP.powf(k)
}

/// A rate as a token bucket Envoy enforces: `(max_tokens, tokens_per_fill, fill_interval_s)`,
/// or `None` for a rate under one token an hour (deny all). The bucket holds `burst_ns` of the
/// rate (at least one token).
///
/// The fill interval is whole seconds: Envoy's filter divides `tokens_per_fill` by the whole
/// seconds of `fill_interval` (under a second it divides by zero, and admits everything). The
/// interval is long enough (up to an hour) for `tokens_per_fill` to carry the rate within 1%,
/// rounded down; Envoy refills continuously at that rate, so a long interval is not bursty.
pub fn token_bucket(rate: f64, burst_ns: u64) -> Option<(u32, u32, u64)> {
    if rate.is_nan() || rate <= 0.0 {
        return None;
    }
    let fill_s = (100.0 / rate).ceil().clamp(1.0, 3600.0);
    let per_fill = (rate * fill_s).floor().min(f64::from(u32::MAX));
    if per_fill < 1.0 {
        return None;
    }
    let burst = (rate * burst_ns as f64 / 1e9)
        .ceil()
        .clamp(1.0, f64::from(u32::MAX));
    Some((burst as u32, per_fill as u32, fill_s as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn sum(v: &[f64]) -> f64 {
        v.iter().sum()
    }

    #[test]
    fn quiet_streams_get_their_demand_and_the_heavy_one_the_rest() {
        // 100/s; one stream asks 160, nine ask 4.4 each (the 80/20 skew at twice the limit).
        let mut d = vec![160.0];
        d.extend([4.4; 9]);
        let s = shares(100.0, &d);
        assert!((sum(&s) - 100.0).abs() < 1e-9);
        for q in &s[1..] {
            assert!(*q >= 4.4 * HEADROOM - 1e-9, "{s:?}");
        }
        assert!((s[0] - (100.0 - 9.0 * 4.4 * HEADROOM)).abs() < 1e-9);
    }

    #[test]
    fn under_the_limit_the_surplus_is_spread_evenly() {
        // Asked: 10 with headroom, and the floor (0.5); what is left is spread.
        let s = shares(100.0, &[10.0, 0.0]);
        let extra = (100.0 - 10.0 * HEADROOM - 0.5) / 2.0;
        assert!((sum(&s) - 100.0).abs() < 1e-9);
        assert!((s[0] - (10.0 * HEADROOM + extra)).abs() < 1e-9, "{s:?}");
        assert!((s[1] - (0.5 + extra)).abs() < 1e-9);
    }

    #[test]
    fn equal_demands_over_the_limit_split_evenly() {
        let s = shares(90.0, &[100.0, 100.0, 100.0]);
        for x in s {
            assert!((x - 30.0).abs() < 1e-9);
        }
    }

    #[test]
    fn nothing_to_split_is_nothing() {
        assert!(shares(100.0, &[]).is_empty());
        assert_eq!(shares(0.0, &[1.0, 2.0]), vec![0.0, 0.0]);
        assert_eq!(shares(f64::NAN, &[1.0]), vec![0.0]);
    }

    #[test]
    fn members_share_one_rate_and_the_silent_are_forgotten() {
        let mut book = QuotaBook::new(3 * S, S);
        let Allocation::Shares(a) = book.ask(7, 100.0, "n1", &[(1, 50.0), (2, 50.0)], false, 0)
        else {
            panic!("warming")
        };
        assert!((sum(&a) - 100.0).abs() < 1e-9);
        let Allocation::Shares(b) = book.ask(7, 100.0, "n2", &[(1, 50.0)], false, S / 2) else {
            panic!("warming")
        };
        // Three equal streams now: n2's is a third.
        assert!((b[0] - 100.0 / 3.0).abs() < 1e-9, "{b:?}");
        let Allocation::Shares(a) = book.ask(7, 100.0, "n1", &[(1, 50.0), (2, 50.0)], true, S)
        else {
            panic!("warming")
        };
        assert!((sum(&a) + b[0] - 100.0).abs() < 1e-9);
        // n2 silent for longer than the forget time: n1 has it all again.
        let Allocation::Shares(a) = book.ask(7, 100.0, "n1", &[(1, 50.0), (2, 50.0)], true, 5 * S)
        else {
            panic!("warming")
        };
        assert!((sum(&a) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_bucket_taken_over_waits_to_hear_from_every_member() {
        let mut book = QuotaBook::new(3 * S, S);
        // n1 held shares from the previous owner: this owner waits a second.
        assert_eq!(
            book.ask(9, 100.0, "n1", &[(1, 80.0)], true, 0),
            Allocation::Warming
        );
        assert_eq!(
            book.ask(9, 100.0, "n2", &[(1, 20.0)], true, S / 2),
            Allocation::Warming
        );
        let Allocation::Shares(a) = book.ask(9, 100.0, "n1", &[(1, 80.0)], true, S) else {
            panic!("still warming")
        };
        // n2's 20 (with headroom) is known: n1 gets the rest.
        assert!((a[0] - (100.0 - 20.0 * HEADROOM)).abs() < 1e-9, "{a:?}");
        // A bucket nobody held starts at once.
        assert!(matches!(
            book.ask(10, 100.0, "n1", &[(1, 1.0)], false, 0),
            Allocation::Shares(_)
        ));
    }

    #[test]
    fn a_member_with_no_streams_left_is_removed() {
        let mut book = QuotaBook::new(3 * S, S);
        book.ask(7, 100.0, "n1", &[(1, 50.0)], false, 0);
        book.ask(7, 100.0, "n2", &[], false, 0);
        let Allocation::Shares(a) = book.ask(7, 100.0, "n1", &[(1, 50.0)], true, 1) else {
            panic!()
        };
        assert!((a[0] - 100.0).abs() < 1e-9);
        book.expire(10 * S);
        assert_eq!(book.buckets(), 0);
    }

    #[test]
    fn streams_beyond_the_bound_get_nothing() {
        let mut book = QuotaBook::new(3 * S, S);
        let many: Vec<(u64, f64)> = (0..MAX_STREAMS as u64 + 5).map(|i| (i, 1.0)).collect();
        let Allocation::Shares(a) = book.ask(1, 1000.0, "n1", &many, false, 0) else {
            panic!()
        };
        assert_eq!(a.len(), many.len());
        assert!(a[MAX_STREAMS..].iter().all(|x| *x == 0.0));
        assert!((sum(&a) - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn token_buckets_fill_at_the_rate_in_whole_seconds() {
        // 80/s: 160 tokens every 2 s, half a second of burst.
        assert_eq!(token_bucket(80.0, S / 2), Some((40, 160, 2)));
        // 10,000/s: every second.
        assert_eq!(token_bucket(10_000.0, S / 2), Some((5000, 10_000, 1)));
        // 4.9/s: 102 tokens every 21 s (4.857/s, within 1%, under).
        assert_eq!(token_bucket(4.9, S), Some((5, 102, 21)));
        // Under a token an hour: none.
        assert_eq!(token_bucket(0.0001, S), None);
        assert_eq!(token_bucket(0.0, S), None);
        // At least a token of burst.
        assert_eq!(token_bucket(0.5, 0), Some((1, 100, 200)));
    }

    #[test]
    fn rates_round_down_to_the_grid_and_grid_values_stay() {
        for r in [0.3, 1.0, 4.44, 48.7, 51.2, 100.0, 12_345.0] {
            let g = on_grid(r);
            assert!(g <= r + 1e-9 && g * STEP > r, "{r} -> {g}");
            assert!((on_grid(g) - g).abs() < 1e-12, "{g}");
        }
        // Rates within a step of each other round to one assignment.
        let g = on_grid(51.2);
        assert_eq!(on_grid(g * (1.0 + (STEP - 1.0) / 2.0)), g);
        assert_eq!(on_grid(g * STEP * 0.999), g);
        assert_eq!(on_grid(0.0), 0.0);
    }

    #[test]
    fn an_idle_stream_keeps_a_trickle() {
        let s = shares(100.0, &[500.0, 0.0]);
        assert!((s[1] - 100.0 * FLOOR).abs() < 1e-9, "{s:?}");
    }
}
