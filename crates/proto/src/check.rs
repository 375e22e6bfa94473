//! A check ("may this key spend `cost` under this rule now?") and its answer.

use crate::Algorithm;
use crate::calendar::Calendar;
use serde::{Deserialize, Serialize};

/// A rule given in the request itself rather than by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InlineRule {
    /// Requests admitted per `period_ms`.
    pub limit: u64,
    /// The period in milliseconds (a calendar rule's nominal period: see
    /// [`crate::calendar::Unit::nominal_ns`]).
    pub period_ms: u64,
    pub algorithm: Algorithm,
    /// Capacity for token and leaky buckets; `None` means `limit`.
    pub burst: Option<u64>,
    /// Calendar windows (a fixed window's day, week or month in a time zone); `None` for
    /// windows counted from the epoch.
    pub calendar: Option<Calendar>,
}

/// Which rule a check is made under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "RuleRefWire", into = "RuleRefWire")]
pub enum RuleRef {
    /// A rule from the node's rules file (or built-in rules).
    Named(String),
    /// Parameters carried by the request.
    Inline(InlineRule),
}

/// An inline rule as peers of every version encode it (the fields before calendars).
#[derive(Clone, Copy, Serialize, Deserialize)]
struct PlainInline {
    limit: u64,
    period_ms: u64,
    algorithm: Algorithm,
    burst: Option<u64>,
}

/// A [`RuleRef`] on the wire. A rule without a calendar encodes as it always did, so peers and
/// SDKs of earlier versions read it; one with a calendar takes a variant of its own, appended,
/// which an earlier version cannot decode (rather than read as a plain window): a sender never
/// sends it to a peer below [`crate::peer::CALENDAR_SINCE`].
#[derive(Clone, Serialize, Deserialize)]
enum RuleRefWire {
    Named(String),
    Inline(PlainInline),
    Calendar(PlainInline, Calendar),
}

impl From<RuleRefWire> for RuleRef {
    fn from(w: RuleRefWire) -> Self {
        let inline = |p: PlainInline, calendar| {
            RuleRef::Inline(InlineRule {
                limit: p.limit,
                period_ms: p.period_ms,
                algorithm: p.algorithm,
                burst: p.burst,
                calendar,
            })
        };
        match w {
            RuleRefWire::Named(n) => RuleRef::Named(n),
            RuleRefWire::Inline(p) => inline(p, None),
            RuleRefWire::Calendar(p, c) => inline(p, Some(c)),
        }
    }
}

impl From<RuleRef> for RuleRefWire {
    fn from(r: RuleRef) -> Self {
        match r {
            RuleRef::Named(n) => RuleRefWire::Named(n),
            RuleRef::Inline(i) => {
                let p = PlainInline {
                    limit: i.limit,
                    period_ms: i.period_ms,
                    algorithm: i.algorithm,
                    burst: i.burst,
                };
                match i.calendar {
                    None => RuleRefWire::Inline(p),
                    Some(c) => RuleRefWire::Calendar(p, c),
                }
            }
        }
    }
}

impl RuleRef {
    /// Whether this is an inline rule with calendar windows (which only peers of
    /// [`crate::peer::CALENDAR_SINCE`] on can be sent).
    pub fn has_calendar(&self) -> bool {
        matches!(
            self,
            RuleRef::Inline(InlineRule {
                calendar: Some(_),
                ..
            })
        )
    }
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
