//! Decide here: the one place a check that this node answers itself is decided, whether it
//! belongs to a bucket this node owns ([`Engine`]) or to a global rule ([`GlobalCounters`]).
//! Checks routed here, batches and checks that peers forward all come through it.

use crate::global::GlobalCounters;
use crate::local::{Engine, Prepared};
use ringlimit_core::answer::given_back;
use ringlimit_core::check::Resolved;
use ringlimit_core::rule::Mode;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use std::sync::Arc;

/// Where an owner-mode check is decided here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// This node's bucket (it owns it, or a peer sent it here as the owner).
    Bucket,
    /// This node's copy, as the replica of an owner that does not answer
    /// (see [`Engine::decide_copy`]).
    Copy,
}

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

    /// Decides at `now` a check that may have to give back its cost (all-or-nothing): the
    /// answer, and the mark of what it took (`None` when nothing was taken). Global counters
    /// cannot give back (their G-counters only grow), so a global check here takes its cost
    /// for good and is never marked.
    pub fn hold_at(
        &self,
        id: u64,
        resolved: &Resolved,
        cost: u64,
        now: u64,
    ) -> (CheckAnswer, Option<Mark>) {
        self.hold_on(On::Bucket, id, resolved, cost, now)
    }

    /// [`Here::hold_at`] on this node's bucket or its copy.
    pub fn hold_on(
        &self,
        on: On,
        id: u64,
        resolved: &Resolved,
        cost: u64,
        now: u64,
    ) -> (CheckAnswer, Option<Mark>) {
        match (resolved.mode, on) {
            (Mode::Global, _) => (self.global.answer(id, &resolved.rule, now, cost), None),
            (Mode::Owner, On::Bucket) => self.engine.hold(id, &resolved.rule, cost, now),
            (Mode::Owner, On::Copy) => self.engine.hold_copy(id, &resolved.rule, cost, now),
        }
    }

    /// Decides bucket `id` at `now` on this node's bucket or, as the owner's replica, on its
    /// copy (see [`Here::decide_at`]).
    pub fn decide_on(
        &self,
        on: On,
        id: u64,
        resolved: &Resolved,
        cost: u64,
        now: u64,
    ) -> CheckAnswer {
        match (resolved.mode, on) {
            (Mode::Owner, On::Copy) => self.engine.decide_copy(id, &resolved.rule, cost, now),
            _ => self.decide_at(id, resolved, cost, now),
        }
    }

    /// Gives back what [`Here::hold_at`] took under `mark`.
    pub fn refund(&self, id: u64, resolved: &Resolved, cost: u64, mark: Mark) {
        self.refund_at(id, resolved, cost, mark, self.now());
    }

    /// [`Here::refund`] at `now` (an owner giving back its own group does so at the instant
    /// it decided: exactly).
    fn refund_at(&self, id: u64, resolved: &Resolved, cost: u64, mark: Mark, now: u64) {
        if resolved.mode == Mode::Owner {
            self.engine.refund(id, &resolved.rule, cost, mark, now);
        }
    }

    /// Decides one request's checks that belong here, all-or-nothing at `now`: when any
    /// non-shadow check denies (or is `None`: invalid here), what the others took is given
    /// back before answering. Returns each answer with the mark of what it still holds.
    pub fn decide_all(
        &self,
        checks: &[Option<(u64, Resolved, u64)>],
        now: u64,
    ) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        self.decide_all_on(checks, now, |_| On::Bucket)
    }

    /// [`Here::decide_all`], check `i` decided where `on(i)` says (its bucket, or its copy).
    pub fn decide_all_on(
        &self,
        checks: &[Option<(u64, Resolved, u64)>],
        now: u64,
        on: impl Fn(usize) -> On,
    ) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        let mut out: Vec<_> = checks
            .iter()
            .enumerate()
            .map(|(i, c)| c.map(|(id, r, cost)| self.hold_on(on(i), id, &r, cost, now)))
            .collect();
        let denied = checks.iter().zip(&out).any(|(c, a)| match (c, a) {
            (Some((_, r, _)), Some((a, _))) => !a.allowed && !r.shadow,
            _ => true,
        });
        if denied {
            for (c, a) in checks.iter().zip(out.iter_mut()) {
                if let (Some((id, r, cost)), Some((answer, mark))) = (c, a)
                    && let Some(m) = mark.take()
                {
                    self.refund_at(*id, r, *cost, m, now);
                    *answer = given_back(*answer, *cost);
                }
            }
        }
        out
    }
}
