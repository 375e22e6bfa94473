//! Log lines that a flood could repeat, let through at most once per interval with how many
//! were held back since: a line per refused socket once wrote tens of MB of log in seconds (the
//! docs' benchmarks page, "Hardening findings").

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Lets a log line through at most once per `every`, counting those held back.
#[derive(Debug)]
pub struct LogGate {
    every: Duration,
    /// When a line last passed, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogGate {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(lines held back since the last one)` when this line may be written.
    pub fn pass(&self) -> Option<u64> {
        let mut s = self.state.lock();
        let now = Instant::now();
        if s.0.is_some_and(|t| now.duration_since(t) < self.every) {
            s.1 += 1;
            return None;
        }
        let held = std::mem::take(&mut s.1);
        s.0 = Some(now);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_passes_per_interval_and_counts_the_rest() {
        let gate = LogGate::new(Duration::from_secs(3600));
        assert_eq!(gate.pass(), Some(0));
        assert_eq!(gate.pass(), None);
        assert_eq!(gate.pass(), None);
        let open = LogGate::new(Duration::ZERO);
        assert_eq!(open.pass(), Some(0));
        assert_eq!(open.pass(), Some(0));
    }
}
