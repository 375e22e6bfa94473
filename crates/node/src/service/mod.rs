//! The check service: the one front door every edge calls to decide checks — HTTP, forward
//! auth, gRPC (ringlimit.v1 and Envoy's RLS) and the peer port (an SDK's checks, and members'
//! forwarded ones). Checks, batches, all-or-nothing requests and reservations (reserve,
//! settle), with the timing and counting that go with them, recorded here once for every edge
//! ([`Edge`]): `ringlimit_checks_total`, `ringlimit_rule_checks_total`,
//! `ringlimit_edge_checks_total`, the check duration histogram and the top keys. No edge
//! reaches past it into the routing, the local state or the store; it knows nothing of HTTP
//! (or of any other transport). The admin side ([`crate::admin`]) and the lifecycle hooks
//! ([`crate::lifecycle`]) are beside it.
//!
//! # Layout
//! - this module — [`CheckService`]: checks and batches, and [`Outcome`], a decided check.
//! - [`all_or_nothing`] — one request held to several limits, all-or-nothing; forward auth's
//!   rules.
//! - [`reservations`] — a cost estimated now, settled later at the bucket's owner.
//! - [`peer`] — the checks of a frame that arrived on the peer port.
//! - [`clients`] — what a client SDK asks of owners over ringlimit.v1 beside checks: held
//!   checks, leases, give-backs, bounded by the client's ledger.

pub mod all_or_nothing;
pub mod clients;
pub mod peer;
pub mod reservations;

pub use crate::metrics::Edge;

use crate::blocks::{BlockSource, Hit};
use crate::local::Local;
use crate::metrics::{Metrics, seconds};
use crate::routing::Router;
use crate::rules::{Prepared, RuleSpec};
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::top_keys::TopKeys;
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;

/// Most checks in one batch, on every edge.
pub const MAX_BATCH: usize = 1000;

/// One check as an edge hands it over: may `key` spend `cost` under `rule` now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check<'a> {
    pub key: &'a str,
    pub rule: RuleSpec<'a>,
    pub cost: u64,
    /// Decide as a shadow rule whatever the rule says (an edge's own shadow setting, e.g. an
    /// envoyproxy/ratelimit `shadow_mode` descriptor).
    pub shadow: bool,
}

/// A decided check as every edge answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The answer as enforced: a shadow rule's is always allowed.
    pub answer: CheckAnswer,
    /// For a shadow rule, whether it would have denied; `None` for an enforced rule.
    pub shadow_denied: Option<bool>,
    /// The rule's period in ms (the IETF `w`).
    pub period_ms: u64,
    /// When it was decided, Unix ms on this node's clock (for the IETF `t`), rounded up like
    /// `reset_at_ms` (see [`ringlimit_core::answer::instant_ms`]).
    pub now_ms: u64,
    /// Answered by a block (see [`crate::blocks`]), of this source: not by the key's bucket.
    pub blocked: Option<BlockSource>,
}

impl Outcome {
    /// The outcome of `answer` under `resolved` at `now` (ns): a shadow rule never denies.
    pub fn new(mut answer: CheckAnswer, resolved: &Resolved, now: u64) -> Self {
        let mut shadow_denied = None;
        if resolved.shadow {
            let (a, denied) = ringlimit_core::all_or_nothing::shadowed(answer);
            (answer, shadow_denied) = (a, Some(denied));
        }
        Self {
            answer,
            shadow_denied,
            period_ms: resolved.rule.period_ns.div_ceil(NANOS_PER_MS),
            now_ms: ringlimit_core::answer::instant_ms(now),
            blocked: None,
        }
    }

    /// The outcome of a check of `p` answered at `now` (ns) by a block `hit`: denied (unless
    /// the rule is a shadow rule) until the block ends.
    pub fn blocked(p: &Prepared<'_>, hit: Hit, now: u64) -> Self {
        let answer = hit.answer(p.resolved.rule.limit, now / NANOS_PER_MS);
        Self {
            blocked: Some(hit.source),
            ..Self::new(answer, &p.resolved, now)
        }
    }
}

/// The node's checks, for every edge.
pub struct CheckService {
    local: Arc<Local>,
    router: Arc<Router>,
    metrics: Arc<Metrics>,
    /// The keys checked and denied most, per rule (for operators: `GET /v1/admin/top`).
    top: Arc<TopKeys>,
}

impl CheckService {
    /// Checks decided through `router` (shared with the admin side), counted and timed in
    /// `metrics`.
    pub fn new(
        local: Arc<Local>,
        router: Arc<Router>,
        metrics: Arc<Metrics>,
        top: Arc<TopKeys>,
    ) -> Self {
        Self {
            local,
            router,
            metrics,
            top,
        }
    }

    /// This service for a runtime of its own (an HTTP thread's): checks it forwards go on that
    /// runtime's copies of the members' clients (see [`Router::for_runtime`]).
    pub fn for_runtime(&self) -> Self {
        Self {
            local: self.local.clone(),
            router: Arc::new(self.router.for_runtime()),
            metrics: self.metrics.clone(),
            top: self.top.clone(),
        }
    }

    /// Decides one check that arrived at `edge` wherever it belongs; counted and timed when
    /// answered.
    pub async fn check(&self, edge: Edge, c: &Check<'_>) -> Result<Outcome, CheckError> {
        let start = self.local.now();
        let p = self.prepare(c, c.cost)?;
        let (outcome, end) = match self.block_of(&p, start) {
            Some(hit) => (self.blocked_outcome(&p, hit, start), self.local.now()),
            None => {
                let (answer, blocked) = self.router.check_blocked(&p).await?;
                let end = self.local.now();
                // Denied by a block its owner knows and this node does not yet: answered as
                // blocked (counted blocked at the owner).
                let outcome = Outcome {
                    blocked,
                    ..self.outcome(answer, &p, end)
                };
                (outcome, end)
            }
        };
        self.metrics.count_edge(edge, 1);
        self.metrics.check_duration.observe(seconds(start, end));
        Ok(outcome)
    }

    /// The outcome of an answer, counted.
    fn outcome(&self, answer: CheckAnswer, p: &Prepared<'_>, now: u64) -> Outcome {
        self.counted(Outcome::new(answer, &p.resolved, now), p, now)
    }

    /// `o`, counted in the check metrics and the top keys.
    fn counted(&self, o: Outcome, p: &Prepared<'_>, now: u64) -> Outcome {
        let shadow_denied = o.shadow_denied == Some(true);
        self.metrics.count(
            o.answer.allowed,
            shadow_denied,
            p.resolved.mode,
            p.spec.name(),
        );
        self.count_top(p, !o.answer.allowed || shadow_denied, now);
        o
    }

    /// The block `p`'s key is under at `now` (ns), if any: one relaxed load while there are
    /// none.
    #[inline]
    fn block_of(&self, p: &Prepared<'_>, now: u64) -> Option<Hit> {
        self.local
            .blocks()
            .table
            .find(p.key, p.id, now / NANOS_PER_MS)
    }

    /// The outcome of a check answered by a block, counted as a denial (and as blocked).
    fn blocked_outcome(&self, p: &Prepared<'_>, hit: Hit, now: u64) -> Outcome {
        self.metrics
            .count_blocked(p.spec.name(), hit.source.as_str());
        self.counted(Outcome::blocked(p, hit, now), p, now)
    }

    /// Counts a decided check into the top keys (a shadow rule's would-be denials as denials:
    /// who a new limit would stop).
    fn count_top(&self, p: &Prepared<'_>, denied: bool, now: u64) {
        let counted = ringlimit_core::top_keys::Counted::of(denied, now);
        if counted.is_nothing() {
            return;
        }
        let rule = p.spec.policy_name();
        self.top.count(&rule, p.id, p.key, counted, now);
    }

    /// Decides many checks that arrived at `edge` at once (each owner's as one group); answers
    /// in order, an invalid check's error in its place. Timed as one.
    pub async fn check_many(
        &self,
        edge: Edge,
        checks: &[Check<'_>],
    ) -> Vec<Result<Outcome, CheckError>> {
        let start = self.local.now();
        let mut results: Vec<Option<Result<Outcome, CheckError>>> =
            Vec::with_capacity(checks.len());
        let mut prepared = Vec::with_capacity(checks.len());
        for c in checks {
            match self.prepare(c, c.cost) {
                Ok(p) => match self.block_of(&p, start) {
                    Some(hit) => results.push(Some(Ok(self.blocked_outcome(&p, hit, start)))),
                    None => {
                        results.push(None);
                        prepared.push(p);
                    }
                },
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let blocked = results.iter().filter(|r| matches!(r, Some(Ok(_)))).count() as u64;
        let mut decided = self
            .router
            .check_many(&prepared)
            .await
            .into_iter()
            .zip(&prepared);
        let end = self.local.now();
        let mut answered = 0;
        let results = results
            .into_iter()
            .map(|slot| match slot {
                Some(error) => error,
                None => match decided.next() {
                    Some((Ok((a, blocked)), p)) => {
                        answered += 1;
                        // Denied by a block its owner knows and this node does not yet.
                        Ok(Outcome {
                            blocked,
                            ..self.outcome(a, p, end)
                        })
                    }
                    Some((Err(e), _)) => Err(e),
                    None => Err(CheckError::Unavailable("no answer was produced")),
                },
            })
            .collect();
        self.metrics.count_edge(edge, answered + blocked);
        self.metrics.batch_duration.observe(seconds(start, end));
        results
    }

    /// A service over `local` alone, counted in `metrics` (tests' bare peer servers): a view of
    /// this node alone, so every check is decided here.
    #[cfg(test)]
    pub fn alone(local: Arc<Local>, metrics: Arc<Metrics>) -> Self {
        let view = crate::cluster::View::solo("alone", "127.0.0.1:1", "127.0.0.1:2");
        let peers = Arc::new(crate::peers::Peers::new(crate::peers::test_settings(
            ringlimit_core::link::dial::tcp(),
            "alone",
            "c",
        )));
        let view = Arc::new(arc_swap::ArcSwap::from_pointee(view));
        let router = Router::new(local.clone(), view, peers.shared(), metrics.peer_rpc());
        Self::new(local, Arc::new(router), metrics, Arc::default())
    }

    /// Validates a check at `cost` (nothing is consumed).
    fn prepare<'a>(&self, c: &Check<'a>, cost: u64) -> Result<Prepared<'a>, CheckError> {
        let mut p = self.local.rules().prepare_check(c.key, c.rule, cost)?;
        p.resolved.shadow |= c.shadow;
        Ok(p)
    }
}
