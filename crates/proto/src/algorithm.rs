//! The limiting algorithms a rule can name.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a bucket decides. Wire names are the snake_case strings of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Capacity `burst`, refilled continuously at `limit / period`.
    #[default]
    TokenBucket,
    /// At most `limit` per aligned window of `period`.
    FixedWindow,
    /// Weighted two-window counter: the previous window counts in proportion to its overlap.
    SlidingWindow,
    /// Exact: the timestamps of admitted requests in the last `period`.
    SlidingLog,
    /// A meter of capacity `burst` draining at `limit / period`.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in wire order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ];

    /// The contract's name for this algorithm.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// Whether `burst` (a capacity distinct from `limit`) means anything for this algorithm.
    pub const fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    /// A stable one-byte code, used when hashing a bucket's identity.
    pub const fn code(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 1,
            Algorithm::FixedWindow => 2,
            Algorithm::SlidingWindow => 3,
            Algorithm::SlidingLog => 4,
            Algorithm::LeakyBucket => 5,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of [`Algorithm::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown algorithm {0:?}; expected one of token_bucket, fixed_window, sliding_window, sliding_log, leaky_bucket"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
        }
        assert!("token-bucket".parse::<Algorithm>().is_err());
    }
}
