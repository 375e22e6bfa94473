//! Time, injected. Algorithms take `now` as an argument; only the node's edge reads a clock.
//!
//! A reading is nanoseconds since the Unix epoch but **monotonic**: the system clock is read once
//! at start and advanced by a monotonic counter, so a wall-clock step (NTP) never refills or
//! drains a bucket. Wall time matters only for window numbering and the `reset_at_ms` of answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
#[derive(Debug, Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: u64,
    origin_unix_ns: u64,
}

impl SystemClock {
    pub fn new() -> Self {
        // Calibrate first: `quanta` calibrates against the OS clock on the first `Clock::new`
        // of a process, for up to 200 ms under load. Reading the wall clock before it put a
        // node's clock behind by that long (13 ms seen in CI). The wall clock is then read
        // between two counter reads, and the origin is their midpoint.
        let clock = quanta::Clock::new();
        let before = clock.raw();
        let origin_unix_ns = unix_ns();
        let after = clock.raw();
        let origin = before.saturating_add(after.saturating_sub(before) / 2);
        Self {
            origin,
            clock,
            origin_unix_ns,
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
        let elapsed = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        self.origin_unix_ns.saturating_add(elapsed)
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
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(1_000);
        c.advance(5);
        assert_eq!(c.now(), 1_005);
        c.set(10);
        assert_eq!(c.now(), 1_005);
    }
}
