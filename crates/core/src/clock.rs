//! Time, injected. Algorithms take `now` as an argument; only the node's edge reads a clock.
//!
//! A reading is nanoseconds since the Unix epoch but **monotonic**: the system clock is read once
//! at start and advanced by a monotonic counter, steered towards the OS wall clock by its rate
//! and never back (see [`SystemClock`]): a wall-clock step back (NTP, an operator) never drains
//! a bucket, and one forward refills a bucket by at most 60 s, as a pause that long would. Wall
//! time matters only for window numbering and the `reset_at_ms` of answers.

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
/// whole store lookup (measured: the docs' benchmarks page, "The store path against governor").
///
/// A calibrated counter runs a little fast or slow (enough that a node up for a week would
/// drift past `--max-clock-offset-ms`; measured: `bench/notes/clock-skew.md`), and
/// the OS clock itself may be set after the node started (NTP's first sync, a VM resumed). So a
/// thread of the process re-anchors it every second on the OS wall clock ([`steer_once`]):
///
/// - by its rate, at most 500 ppm either way ([`MAX_SLEW_PPB`], NTP's own limit for a slew): a
///   reading never jumps, and a bucket sees time run at most 0.05% fast or slow;
/// - never back: a clock ahead of the OS (the OS clock set back) is slowed down, 0.5 ms a second,
///   however far ahead it is (an hour takes 83 days, and peers see the offset meanwhile);
/// - forward by a step only when more than [`STEP_FORWARD_OVER`] (1 s) and at most
///   [`STEP_FORWARD_MAX`] (60 s) behind: slewing 1 s takes over half an hour, so that is the OS
///   clock being set (NTP's first sync, a VM resumed), not drift, and a step forward refills a
///   bucket by no more than a pause that long would. Further behind (an OS clock set far ahead,
///   maybe by mistake), it slews at 500 ppm rather than refill every bucket at once: restart the
///   node to take the OS clock's time. Steps and gaps over 1 s are logged.
///
/// Every `SystemClock` of a process shares that one anchor.
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

/// Behind the OS wall clock by more than this (and at most [`STEP_FORWARD_MAX`]), the clock
/// steps forward to it instead of slewing (1 s takes 2,000 s at [`MAX_SLEW_PPB`]).
pub const STEP_FORWARD_OVER: u64 = 1_000_000_000;

/// The largest step forward: what a bucket may be refilled by at once, as by a pause that long.
pub const STEP_FORWARD_MAX: u64 = 60_000_000_000;

/// A target read with the counter around it taking longer than this is skipped: the thread was
/// preempted in the middle, so the reading pairs instants microseconds apart.
const MAX_SAMPLE_SPREAD_NS: u64 = 20_000;

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
/// check, in i128, made `SystemClock::now` much slower; the docs' benchmarks page,
/// "The store path against governor").
fn rate_of(ppb: i64) -> i64 {
    ((i128::from(ppb) << 32) / 1_000_000_000) as i64
}

impl Fix {
    /// The anchor one steering step sets: at counter reading `raw` (`elapsed` calibrated
    /// nanoseconds after this anchor) the clock keeps its reading and takes the rate that
    /// brings it onto `target` over the next `interval_ns`; or, more than
    /// [`STEP_FORWARD_OVER`] (and at most [`STEP_FORWARD_MAX`]) behind `target`, reads
    /// `target` from there (never a step back).
    fn steered(&self, raw: u64, elapsed: u64, target: u64, interval_ns: u64) -> Fix {
        let now = self.reading(elapsed);
        if (STEP_FORWARD_OVER + 1..=STEP_FORWARD_MAX).contains(&target.saturating_sub(now)) {
            return Fix {
                raw,
                at: target,
                rate: 0,
            };
        }
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

/// What the steering reads: a calibrated counter and the OS wall clock. The process's are
/// `quanta` and [`SystemTime`]; tests give their own.
trait Sources {
    /// The counter's raw reading.
    fn raw(&self) -> u64;
    /// Calibrated nanoseconds from raw reading `from` to `to`.
    fn delta_ns(&self, from: u64, to: u64) -> u64;
    /// The OS wall clock, Unix nanoseconds.
    fn wall_ns(&self) -> u64;
}

/// The process's sources.
struct OsSources(quanta::Clock);

impl Sources for OsSources {
    fn raw(&self) -> u64 {
        self.0.raw()
    }
    fn delta_ns(&self, from: u64, to: u64) -> u64 {
        self.0.delta_as_nanos(from, to)
    }
    fn wall_ns(&self) -> u64 {
        unix_ns()
    }
}

/// What one steering step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steered {
    /// The sample was preempted: nothing changed.
    Skipped,
    /// The rate was set to close `err_ns` (positive: the clock was behind the OS clock).
    Slewed { err_ns: i64 },
    /// The clock was more than [`STEP_FORWARD_OVER`] behind: it stepped forward by `by_ns`.
    Stepped { by_ns: u64 },
}

impl Steered {
    /// Whether the clock is now more than [`STEP_FORWARD_OVER`] off the OS clock, to be slewed
    /// for over half an hour (the OS clock was set back, or far ahead).
    fn far_off(self) -> bool {
        matches!(self, Steered::Slewed { err_ns } if err_ns.unsigned_abs() > STEP_FORWARD_OVER)
    }
}

/// One steering step of `anchor` onto the OS wall clock of `sources` (see [`SystemClock`]).
fn steer_once(sources: &impl Sources, anchor: &Anchor, interval_ns: u64) -> Steered {
    // The target read between two counter reads (their midpoint is its instant).
    let before = sources.raw();
    let target = sources.wall_ns();
    let after = sources.raw();
    if sources.delta_ns(before, after) > MAX_SAMPLE_SPREAD_NS {
        return Steered::Skipped;
    }
    let raw = before.saturating_add(after.saturating_sub(before) / 2);
    let fix = anchor.load();
    let elapsed = sources.delta_ns(fix.raw, raw);
    let now = fix.reading(elapsed);
    let next = fix.steered(raw, elapsed, target, interval_ns);
    anchor.store(next);
    if next.at > now {
        Steered::Stepped {
            by_ns: next.at - now,
        }
    } else {
        Steered::Slewed {
            err_ns: (i128::from(target) - i128::from(now))
                .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
        }
    }
}

/// The process's clock: its counter and its anchor, steered by a thread of its own.
fn process_clock() -> &'static (quanta::Clock, Anchor) {
    static CLOCK: std::sync::OnceLock<(quanta::Clock, Anchor)> = std::sync::OnceLock::new();
    CLOCK.get_or_init(|| {
        // Calibrate first: `quanta` calibrates against the OS clock on the first `Clock::new`
        // of a process, for up to 200 ms under load. Reading the wall clock before it put a
        // node's clock behind by that long (seen in CI, in the clock-skew process test).
        let clock = quanta::Clock::new();
        // Then the wall clock, read between two counter reads, the origin their midpoint; the
        // tightest of a few tries, since a thread preempted in the middle of one pairs readings
        // microseconds apart, an offset the steering would then have to slew away.
        let _ = (unix_ns(), clock.raw());
        // (spread of the counter reads, origin, Unix time)
        let pair = || {
            let before = clock.raw();
            let unix = unix_ns();
            let after = clock.raw();
            let origin = before.saturating_add(after.saturating_sub(before) / 2);
            (clock.delta_as_nanos(before, after), origin, unix)
        };
        let (_, origin, unix) = (1..8).fold(pair(), |best, _| {
            let next = pair();
            if next.0 < best.0 { next } else { best }
        });
        let anchor = Anchor {
            seq: AtomicU64::new(0),
            raw: AtomicU64::new(origin),
            at: AtomicU64::new(unix),
            rate: AtomicI64::new(0),
        };
        let sources = OsSources(clock.clone());
        let interval = u64::try_from(STEER_EVERY.as_nanos()).unwrap_or(u64::MAX);
        // Without the thread the clock still works, only unsteered.
        let _ = std::thread::Builder::new()
            .name("ringlimit-clock".into())
            .spawn(move || {
                // Whether the last step found the clock far off (logged once, not every second).
                let mut far_off = false;
                loop {
                    std::thread::sleep(STEER_EVERY);
                    // Set once this closure's caller returns (long before a second is up).
                    let Some((_, anchor)) = CLOCK.get() else {
                        continue;
                    };
                    let done = steer_once(&sources, anchor, interval);
                    match done {
                        Steered::Stepped { by_ns } => tracing::warn!(
                            step_ms = by_ns / NANOS_PER_MS,
                            "this process's clock stepped forward onto the OS clock, which was \
                             set ahead by more than 1 s: buckets refill as after a pause that long"
                        ),
                        Steered::Slewed { err_ns } if done.far_off() && !far_off => {
                            tracing::warn!(
                                behind_ms = err_ns / NANOS_PER_MS as i64,
                                "this process's clock is off the OS clock by more than 1 s (the \
                                 OS clock was set back, or more than 60 s ahead): it is slewed at \
                                 0.5 ms a second, never stepped back; restart the node to take \
                                 the OS clock's time at once"
                            );
                        }
                        _ => {}
                    }
                    if done != Steered::Skipped {
                        far_off = done.far_off();
                    }
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
        // A counter 450 ppb slow (a drift seen on a real host) and an anchor 2 ms behind its target
        // at the start: steered each second, the clock comes within a µs and stays there, and no
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

    /// True time moves only when told; the counter runs `slow_ppb` slow against it (what its
    /// calibration got wrong) and the OS wall clock is true time plus an offset an operator
    /// (or NTP) may set. A read of the wall clock may be preempted for `preempt_ns`.
    struct Fake {
        true_ns: std::cell::Cell<u64>,
        slow_ppb: u64,
        wall_offset: std::cell::Cell<i64>,
        preempt_ns: std::cell::Cell<u64>,
    }

    impl Fake {
        fn new(start: u64, slow_ppb: u64) -> Self {
            Self {
                true_ns: start.into(),
                slow_ppb,
                wall_offset: 0.into(),
                preempt_ns: 0.into(),
            }
        }
        fn advance(&self, ns: u64) {
            self.true_ns.set(self.true_ns.get() + ns);
        }
        fn wall(&self) -> u64 {
            (i128::from(self.true_ns.get()) + i128::from(self.wall_offset.get())) as u64
        }
        /// The process clock's reading now, as [`SystemClock::now`] computes it.
        fn reading(&self, anchor: &Anchor) -> u64 {
            let fix = anchor.load();
            fix.reading(self.delta_ns(fix.raw, self.raw()))
        }
    }

    impl Sources for Fake {
        fn raw(&self) -> u64 {
            let t = self.true_ns.get();
            t - t / 1_000_000_000 * self.slow_ppb
        }
        fn delta_ns(&self, from: u64, to: u64) -> u64 {
            to.saturating_sub(from)
        }
        fn wall_ns(&self) -> u64 {
            self.advance(self.preempt_ns.replace(0));
            self.wall()
        }
    }

    /// Steps the fake `seconds` times a second apart, reading the clock ten times a second:
    /// readings never go back, and within a second they never move more than a second at
    /// 500 ppm (no step) unless `steps` allows them. Returns the last reading's error.
    fn run(fake: &Fake, anchor: &Anchor, seconds: u64, last: &mut u64) -> (i64, Vec<Steered>) {
        let second = 1_000_000_000;
        let mut done = Vec::new();
        for _ in 0..seconds {
            for _ in 0..10 {
                fake.advance(second / 10);
                let r = fake.reading(anchor);
                assert!(r >= *last, "back: {r} < {last}");
                *last = r;
            }
            done.push(steer_once(fake, anchor, second));
            let r = fake.reading(anchor);
            assert!(r >= *last, "back at the re-anchoring: {r} < {last}");
            *last = r;
        }
        (fake.wall() as i64 - fake.reading(anchor) as i64, done)
    }

    fn anchor_at(fake: &Fake, at: u64) -> Anchor {
        Anchor {
            seq: AtomicU64::new(0),
            raw: AtomicU64::new(fake.raw()),
            at: AtomicU64::new(at),
            rate: AtomicI64::new(0),
        }
    }

    /// The steering thread's step, on injected sources: a counter 450 ppb slow over a day stays
    /// within a µs of the OS clock; the OS clock set 5 s ahead is followed by one logged step
    /// forward; set 0.5 s ahead, or 2 s back, it is followed by a slew at 500 ppm, never a
    /// reading back; a preempted sample changes nothing.
    #[test]
    fn the_clock_follows_the_os_wall_clock_by_its_rate_and_never_goes_back() {
        let second = 1_000_000_000u64;
        let fake = Fake::new(1_700_000_000 * second, 450);
        let anchor = anchor_at(&fake, fake.wall() - 2_000_000);
        let mut last = 0;
        let (err, done) = run(&fake, &anchor, 86_400, &mut last);
        assert!(err.abs() <= 1_000, "{err} ns off after a day");
        assert!(done.iter().all(|d| matches!(d, Steered::Slewed { .. })));

        // Set 5 s ahead: one step forward by 5 s, then on it.
        fake.wall_offset.set(5 * second as i64);
        let before = fake.reading(&anchor);
        let (err, done) = run(&fake, &anchor, 3, &mut last);
        let Steered::Stepped { by_ns } = done[0] else {
            panic!("{done:?}");
        };
        assert!(by_ns.abs_diff(5 * second) < 1_000_000, "{by_ns}");
        assert!(last - before < 9 * second, "more than the step");
        assert!(err.abs() <= 1_000, "{err} ns off after the step");

        // Set 0.5 s ahead: slewed, 1,000 s at 500 ppm; never faster.
        fake.wall_offset.set(5 * second as i64 + 500_000_000);
        let (err, done) = run(&fake, &anchor, 500, &mut last);
        assert!(done.iter().all(|d| matches!(d, Steered::Slewed { .. })));
        assert!((249_000_000..=251_000_000).contains(&err), "{err}");
        let (err, _) = run(&fake, &anchor, 600, &mut last);
        assert!(err.abs() <= 1_000, "{err} ns off after the slew");

        // Set 2 s back: the clock is ahead; it slows down, never steps back (4,000 s).
        fake.wall_offset.set(3 * second as i64 + 500_000_000);
        let (err, done) = run(&fake, &anchor, 2_000, &mut last);
        assert!(done.iter().all(|d| matches!(d, Steered::Slewed { .. })));
        assert!((-1_001_000_000..=-999_000_000).contains(&err), "{err}");
        let (err, _) = run(&fake, &anchor, 2_100, &mut last);
        assert!(err.abs() <= 1_000, "{err} ns off after slewing back");

        // Set 2 minutes ahead (beyond the largest step): slewed, as a clock set back is.
        fake.wall_offset
            .set(3 * second as i64 + 500_000_000 + 120 * second as i64);
        let (err, done) = run(&fake, &anchor, 10, &mut last);
        assert!(done.iter().all(|d| d.far_off()), "{done:?}");
        assert!(err > 119 * second as i64, "{err}");

        // A sample preempted for 50 µs is skipped.
        let fix = anchor.load();
        fake.preempt_ns.set(50_000);
        assert_eq!(steer_once(&fake, &anchor, second), Steered::Skipped);
        assert_eq!(anchor.load(), fix);
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
