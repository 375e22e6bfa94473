//! Decide here: the one place a check that this node answers itself is decided, whether it
//! belongs to a bucket this node owns ([`Engine`]) or to a global rule ([`GlobalCounters`]).
//! Checks routed here, batches and checks that peers forward all come through it.

use crate::engine::{Engine, Prepared};
use crate::global::GlobalCounters;
use ringlimit_core::check::Resolved;
use ringlimit_core::rule::Mode;
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;

/// Owner buckets and global counters, side by side.
#[derive(Debug, Clone)]
pub struct Here {
    engine: Arc<Engine>,
    global: Arc<GlobalCounters>,
}

impl Here {
    pub fn new(engine: Arc<Engine>, global: Arc<GlobalCounters>) -> Self {
        Self { engine, global }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn global(&self) -> &Arc<GlobalCounters> {
        &self.global
    }

    /// Now, on the engine's clock.
    pub fn now(&self) -> u64 {
        self.engine.clock().now()
    }

    /// Decides bucket `id` under `resolved` at `now` here: from the global counters for a
    /// global rule (never forwarded, never degraded), else from this node's store.
    pub fn decide_at(&self, id: u64, resolved: &Resolved, cost: u64, now: u64) -> CheckAnswer {
        match resolved.mode {
            Mode::Global => self.global.answer(id, &resolved.rule, now, cost),
            Mode::Owner => self.engine.decide_at(id, &resolved.rule, cost, now),
        }
    }

    /// Decides a prepared check here now (an owner check reads the clock as late as it can:
    /// see `Store::check_now`).
    pub fn decide(&self, p: &Prepared<'_>) -> CheckAnswer {
        match p.resolved.mode {
            Mode::Global => self
                .global
                .answer(p.id, &p.resolved.rule, self.now(), p.cost),
            Mode::Owner => self.engine.decide(p.id, &p.resolved.rule, p.cost),
        }
    }
}
