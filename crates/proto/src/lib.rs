//! Wire types shared by ringlimit nodes and the client SDK.
//!
//! No I/O and no async runtime here: only the values that cross a process boundary, so the
//! node's HTTP layer, the peer protocol and the SDK agree on them by construction.
//!
//! # Layout
//! - [`check`]: a check request (key, rule, cost) and its answer.
//! - [`algorithm`]: the closed set of limiting algorithms and their wire names.

pub mod algorithm;
pub mod check;

pub use algorithm::{Algorithm, UnknownAlgorithm};
pub use check::{CheckAnswer, CheckRequest, InlineRule, RuleRef};
