//! The owner's side of RLQS: members ask the owner of a rule's bucket for their streams' shares
//! of its rate (`Quota` frames, or a direct call when this node owns the bucket).

use crate::local::Local;
use crate::rules::RuleSpec;
use parking_lot::Mutex;
use ringlimit_core::quota::{Allocation, QuotaBook};
use ringlimit_proto::peer::{QuotaAnswer, QuotaAsk};
use std::sync::Arc;

/// A member not heard from in this long is forgotten by the owner: members ask every
/// [`super::ASK_EVERY`], so this is several missed asks.
const FORGET_NS: u64 = 3_000_000_000;
/// How long an owner that took a bucket over waits to hear from every member (two asks).
const WARM_NS: u64 = 1_100_000_000;

/// Shares of the buckets this node owns.
pub struct QuotaOwner {
    local: Arc<Local>,
    book: Mutex<QuotaBook>,
}

/// Thousandths of a request per second, as the frames carry rates.
pub fn to_milli(rate: f64) -> u64 {
    if rate.is_nan() || rate <= 0.0 {
        0
    } else {
        (rate * 1000.0).round().min(u64::MAX as f64) as u64
    }
}

/// The rate of thousandths `milli`.
pub fn from_milli(milli: u64) -> f64 {
    milli as f64 / 1000.0
}

impl QuotaOwner {
    pub fn new(local: Arc<Local>) -> Self {
        Self {
            local,
            book: Mutex::new(QuotaBook::new(FORGET_NS, WARM_NS)),
        }
    }

    /// Buckets whose shares this node keeps.
    pub fn buckets(&self) -> usize {
        self.book.lock().buckets()
    }

    /// The answers to `member`'s asks, in order.
    pub fn answer(&self, member: &str, asks: &[QuotaAsk]) -> Vec<QuotaAnswer> {
        let now = self.local.now();
        let mut book = self.book.lock();
        book.expire(now);
        asks.iter()
            .map(|ask| {
                let (resolved, id) =
                    match self
                        .local
                        .rules()
                        .prepare(&ask.key, RuleSpec::of(&ask.rule), 1)
                    {
                        Ok(p) => p,
                        Err(e) => {
                            return QuotaAnswer::Error {
                                code: e.code().to_owned(),
                                message: e.to_string(),
                            };
                        }
                    };
                let streams: Vec<(u64, f64)> = ask
                    .streams
                    .iter()
                    .map(|s| (s.id, from_milli(s.demand_milli)))
                    .collect();
                match book.ask(id, rate_of(&resolved.rule), member, &streams, ask.held, now) {
                    Allocation::Warming => QuotaAnswer::Warming,
                    Allocation::Shares(s) => QuotaAnswer::Shares {
                        milli: s.into_iter().map(to_milli).collect(),
                    },
                }
            })
            .collect()
    }
}

impl crate::peers::server::QuotaShares for QuotaOwner {
    fn answer(&self, member: &str, asks: &[QuotaAsk]) -> Vec<QuotaAnswer> {
        QuotaOwner::answer(self, member, asks)
    }
}

/// A rule's rate, requests per second: its limit over its period.
pub fn rate_of(rule: &ringlimit_core::limiter::Rule) -> f64 {
    rule.limit as f64 * 1e9 / rule.period_ns.max(1) as f64
}
