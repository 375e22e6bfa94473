//! A check ("may this key spend `cost` under this rule now?") and its answer.

use crate::Algorithm;
use serde::{Deserialize, Serialize};

/// A rule given in the request itself rather than by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InlineRule {
    /// Requests admitted per `period_ms`.
    pub limit: u64,
    /// The period in milliseconds.
    pub period_ms: u64,
    pub algorithm: Algorithm,
    /// Capacity for token and leaky buckets; `None` means `limit`.
    pub burst: Option<u64>,
}

/// Which rule a check is made under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RuleRef {
    /// A rule from the node's rules file (or built-in rules).
    Named(String),
    /// Parameters carried by the request.
    Inline(InlineRule),
}

/// One check, as the node's core receives it after the edge has parsed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRequest {
    /// The client identity, 1 to 512 bytes.
    pub key: String,
    pub rule: RuleRef,
    /// Tokens to take; 0 reads the state without consuming.
    pub cost: u64,
}

/// The answer to a check, as the contract's JSON body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAnswer {
    pub allowed: bool,
    pub limit: u64,
    /// Whole requests (of cost 1) still admissible now.
    pub remaining: u64,
    /// Unix ms when the bucket is full again (or its window resets).
    pub reset_at_ms: u64,
    /// 0 when allowed, else the wait in ms until this request would be admitted.
    pub retry_after_ms: u64,
    /// True when made without the key's owner (fail-open path).
    pub degraded: bool,
    /// True when decided by the owner's replica, on its copy of the bucket, because the owner
    /// did not answer. Set by the node that asked the replica: it never travels between
    /// peers (the peer protocol's answers keep their shape).
    #[serde(skip)]
    pub replica: bool,
    /// True when decided by this node (or SDK) on a lease: a slice of the bucket its owner
    /// granted it (hot keys). Set where it was decided; never travels between peers.
    #[serde(skip)]
    pub leased: bool,
}

impl CheckAnswer {
    /// Limits of a key.
    pub const MAX_KEY_BYTES: usize = 512;
}
