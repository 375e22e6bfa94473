//! Time, injected. Algorithms take `now` as an argument; only the node's edge reads a clock.
//!
//! A reading is nanoseconds since the Unix epoch but **monotonic**: the system clock is read once
//! at start and advanced by a monotonic counter, so a wall-clock step (NTP) never refills or
//! drains a bucket. Wall time matters only for window numbering and the `reset_at_ms` of answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds per millisecond.
pub const NANOS_PER_MS: u64 = 1_000_000;

/// The wall clock now, in Unix milliseconds (0 before 1970): for what is stamped with a date
/// (reloads, rule versions), not for deciding checks, which read a [`Clock`].
pub fn unix_ms() -> u64 {
    unix_ns() / NANOS_PER_MS
}

/// The wall clock now, in Unix nanoseconds (0 before 1970).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A source of monotonic, Unix-anchored nanoseconds.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the Unix epoch; never goes backwards.
    fn now(&self) -> u64;
}

/// The process clock: Unix time at start plus a monotonic offset.
///
/// The offset comes from `quanta` (the calibrated TSC where the CPU has an invariant one, the
/// OS monotonic clock otherwise): one read per check, and `Instant::now` cost more than the
/// whole store lookup (28 ns vs ~14 ns, `cargo bench -p ringlimit-core --bench store`).
///
/// A calibrated counter runs a little fast or slow: measured here, 0.45 µs a second behind the
/// OS monotonic clock (about 39 ms a day: a node up for a week would drift past
/// `--max-clock-offset-ms`). So a thread of the process steers it every second towards Unix
/// time at start plus the OS monotonic clock (which NTP slews but never steps): by changing its
/// rate, at most 500 ppm either way ([`MAX_SLEW_PPB`]), never by a step, so a reading never
/// jumps and a wall-clock step still moves nothing. Every `SystemClock` of a process shares
/// that one anchor.
#[derive(Debug, Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    anchor: &'static Anchor,
}

/// The most the steering changes the clock's rate, in parts per billion: 500 ppm, NTP's own
/// limit for a slew (0.5 ms a second).
pub const MAX_SLEW_PPB: i64 = 500_000;

/// How often the clock is steered.
const STEER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where the clock stands: at counter reading `raw` it read `at`, and it runs `rate` (parts of
/// 2³² per nanosecond) faster or slower than the calibrated counter from there. Written only by
/// the steering thread, read by every check, under a sequence lock (readers never write, so
/// they share the cache line).
#[derive(Debug)]
struct Anchor {
    seq: AtomicU64,
    raw: AtomicU64,
    at: AtomicU64,
    rate: AtomicI64,
}

/// One reading of the [`Anchor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fix {
    raw: u64,
    at: u64,
    rate: i64,
}

/// Parts per billion as parts of 2³²: a reading then multiplies and shifts (a division per
/// check, in i128, made `SystemClock::now` 21 ns instead of 12).
fn rate_of(ppb: i64) -> i64 {
    ((i128::from(ppb) << 32) / 1_000_000_000) as i64
}

impl Fix {
    /// The anchor one steering step sets: at counter reading `raw` (`elapsed` calibrated
    /// nanoseconds after this anchor) the clock keeps its reading, and takes the rate that
    /// brings it onto `target` over the next `interval_ns`.
    fn steered(&self, raw: u64, elapsed: u64, target: u64, interval_ns: u64) -> Fix {
        let now = self.reading(elapsed);
        // Behind (positive) or ahead, saturated at what an i64 holds.
        let err = (i128::from(target) - i128::from(now))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        Fix {
            raw,
            at: now,
            rate: rate_of(steer(err, interval_ns)),
        }
    }

    /// The reading `elapsed` calibrated nanoseconds after the anchor.
    #[inline]
    fn reading(&self, elapsed: u64) -> u64 {
        let adj = (i128::from(elapsed) * i128::from(self.rate)) >> 32;
        let elapsed = (i128::from(elapsed) + adj).max(0);
        self.at
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// The rate that brings the clock onto its target over the next `interval_ns`, given that it
/// is `err_ns` behind it now (negative: ahead), within [`MAX_SLEW_PPB`]. Proportional only: a
/// counter `d` ppb off settles `d` ns (per second of interval) from its target, under a µs.
fn steer(err_ns: i64, interval_ns: u64) -> i64 {
    let ppb = i128::from(err_ns) * 1_000_000_000 / i128::from(interval_ns.max(1));
    ppb.clamp(-i128::from(MAX_SLEW_PPB), i128::from(MAX_SLEW_PPB)) as i64
}

impl Anchor {
    fn load(&self) -> Fix {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let fix = Fix {
                raw: self.raw.load(Ordering::Relaxed),
                at: self.at.load(Ordering::Relaxed),
                rate: self.rate.load(Ordering::Relaxed),
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return fix;
            }
        }
    }

    /// Only the steering thread (and the first use) writes.
    fn store(&self, fix: Fix) {
        self.seq.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.raw.store(fix.raw, Ordering::Relaxed);
        self.at.store(fix.at, Ordering::Relaxed);
        self.rate.store(fix.rate, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }
}

/// The process's clock: its counter, its anchor, and the OS monotonic clock's reading at the
/// start with the Unix time then (the target the steering follows).
fn process_clock() -> &'static (quanta::Clock, Anchor) {
    static CLOCK: std::sync::OnceLock<(quanta::Clock, Anchor)> = std::sync::OnceLock::new();
    CLOCK.get_or_init(|| {
        // Calibrate first: `quanta` calibrates against the OS clock on the first `Clock::new`
        // of a process, for up to 200 ms under load. Reading the wall clock before it put a
        // node's clock behind by that long (13 ms seen in CI).
        let clock = quanta::Clock::new();
        // Then the wall clock, read between two counter reads and two monotonic reads, the origin
        // their midpoints; the tightest of a few tries, since a thread preempted in the middle
        // of one pairs readings microseconds apart, an offset the steering would then keep.
        let _ = (std::time::Instant::now(), unix_ns(), clock.raw());
        // (spread of the counter reads, origin, monotonic instant, Unix time)
        let pair = || {
            let before = clock.raw();
            let early = std::time::Instant::now();
            let unix = unix_ns();
            let late = std::time::Instant::now();
            let after = clock.raw();
            let origin = before.saturating_add(after.saturating_sub(before) / 2);
            let mono = early + late.saturating_duration_since(early) / 2;
            (clock.delta_as_nanos(before, after), origin, mono, unix)
        };
        let (_, origin, mono, unix) = (1..8).fold(pair(), |best, _| {
            let next = pair();
            if next.0 < best.0 { next } else { best }
        });
        let anchor = Anchor {
            seq: AtomicU64::new(0),
            raw: AtomicU64::new(origin),
            at: AtomicU64::new(unix),
            rate: AtomicI64::new(0),
        };
        let steered = clock.clone();
        let interval = u64::try_from(STEER_EVERY.as_nanos()).unwrap_or(u64::MAX);
        // Without the thread the clock still works, only unsteered.
        let _ = std::thread::Builder::new()
            .name("ringlimit-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(STEER_EVERY);
                    // Set once this closure's caller returns (long before a second is up).
                    let Some((_, anchor)) = CLOCK.get() else {
                        continue;
                    };
                    // The target read between two counter reads (their midpoint is its
                    // instant); a sample the thread was preempted in the middle of is skipped.
                    let before = steered.raw();
                    let since = mono.elapsed();
                    let after = steered.raw();
                    if steered.delta_as_nanos(before, after) > 20_000 {
                        continue;
                    }
                    let raw = before.saturating_add(after.saturating_sub(before) / 2);
                    let target =
                        unix.saturating_add(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX));
                    let fix = anchor.load();
                    let elapsed = steered.delta_as_nanos(fix.raw, raw);
                    anchor.store(fix.steered(raw, elapsed, target, interval));
                }
            });
        (clock, anchor)
    })
}

impl SystemClock {
    pub fn new() -> Self {
        let (clock, anchor) = process_clock();
        Self {
            clock: clock.clone(),
            anchor,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        let fix = self.anchor.load();
        fix.reading(self.clock.delta_as_nanos(fix.raw, self.clock.raw()))
    }
}

/// A clock that moves only when told to: for tests and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ns)))
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.advance(ms * NANOS_PER_MS);
    }

    /// Sets the reading; refuses to go backwards, as a monotonic clock would.
    pub fn set(&self, ns: u64) {
        self.0.fetch_max(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_unix_anchored_and_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        // After 2020-01-01.
        assert!(a > 1_577_836_800 * 1_000_000_000);
    }

    #[test]
    fn a_clock_steered_against_a_drifting_counter_settles_under_a_microsecond_and_never_steps_back()
    {
        // A counter 450 ppb slow (as measured here) and an anchor 2 ms behind its target at
        // the start: steered each second, the clock comes within a µs and stays there, and no
        // re-anchoring moves a reading backwards.
        let second = 1_000_000_000u64;
        let mut fix = Fix {
            raw: 0,
            at: 1_000,
            rate: 0,
        };
        let target = |raw: u64| 1_000 + 2_000_000 + raw + raw * 450 / 1_000_000_000;
        let mut last = 0;
        let mut err = 0i64;
        for step in 1..=60u64 {
            let raw = step * second;
            // Readings within the second never go back, nor across the re-anchoring.
            for k in 0..10 {
                let r = fix.reading(raw - second + k * second / 10 - fix.raw);
                assert!(r >= last, "step {step}: {r} < {last}");
                last = r;
            }
            let now = fix.reading(raw - fix.raw);
            assert!(now >= last);
            err = target(raw) as i64 - now as i64;
            fix = fix.steered(raw, raw - fix.raw, target(raw), second);
            assert_eq!(fix.at, now, "a step keeps the reading");
        }
        assert!(err.abs() <= 1_000, "settled {err} ns off");
        // 2 ms at 500 ppm takes 4 s: the slew is bounded, never a step.
        assert_eq!(steer(2_000_000, second), MAX_SLEW_PPB);
        assert_eq!(steer(-2_000_000, second), -MAX_SLEW_PPB);
        assert_eq!(steer(450, second), 450);
    }

    #[test]
    fn every_system_clock_of_a_process_reads_one_anchor() {
        let (a, b) = (SystemClock::new(), SystemClock::new());
        let (x, y, z) = (a.now(), b.now(), a.now());
        assert!(x <= y && y <= z, "{x} {y} {z}");
        let wall = unix_ns();
        assert!(wall.abs_diff(y) < 50_000_000, "{y} vs {wall}");
    }

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(1_000);
        c.advance(5);
        assert_eq!(c.now(), 1_005);
        c.set(10);
        assert_eq!(c.now(), 1_005);
    }
}
