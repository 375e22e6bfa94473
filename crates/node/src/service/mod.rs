//! The check service: what every edge calls. Checks, batches, a key's state and reset, the
//! cluster and rules views and the metrics text, with the timing and counting that go with
//! them. No edge reaches past it into the routing, the engine or the store; it knows nothing
//! of HTTP (or of any other transport).
//!
//! # Layout
//! - this module — [`CheckService`]: checks and batches.
//! - [`keys`] — a key's bucket state and its reset across the cluster (admin).
//! - [`views`] — the cluster, rules and admin-rules views, and the metrics snapshot.

pub mod keys;
pub mod views;

use crate::cluster::View;
use crate::decide::Here;
use crate::engine::{Prepared, RuleSpec};
use crate::forward::PeerPool;
use crate::metrics::{Metrics, seconds};
use crate::reload::RulesStatus;
use crate::routing::Dispatcher;
use ringlimit_core::check::CheckError;
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One check as an edge hands it over: may `key` spend `cost` under `rule` now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check<'a> {
    pub key: &'a str,
    pub rule: RuleSpec<'a>,
    pub cost: u64,
}

/// What the service is made of (see `node::run`).
pub struct Parts {
    pub here: Here,
    pub dispatcher: Dispatcher,
    pub pool: Arc<PeerPool>,
    pub metrics: Arc<Metrics>,
    pub rules: Arc<RulesStatus>,
    pub cluster_id: Arc<str>,
    pub ready: Arc<AtomicBool>,
}

/// The node's API, for every edge.
pub struct CheckService {
    here: Here,
    dispatcher: Dispatcher,
    pool: Arc<PeerPool>,
    metrics: Arc<Metrics>,
    rules: Arc<RulesStatus>,
    cluster_id: Arc<str>,
    ready: Arc<AtomicBool>,
    /// Buckets this node sent to their new owners after ring changes.
    handed_over: AtomicU64,
}

impl CheckService {
    pub fn new(p: Parts) -> Self {
        Self {
            here: p.here,
            dispatcher: p.dispatcher,
            pool: p.pool,
            metrics: p.metrics,
            rules: p.rules,
            cluster_id: p.cluster_id,
            ready: p.ready,
            handed_over: AtomicU64::new(0),
        }
    }

    /// Whether this node answers checks yet (readiness).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Decides one check wherever it belongs; counted and timed when answered.
    pub async fn check(&self, c: &Check<'_>) -> Result<CheckAnswer, CheckError> {
        let start = self.here.now();
        let p = self.prepare(c, c.cost)?;
        let answer = self.dispatcher.check(&p).await?;
        self.metrics.count(answer.allowed, p.resolved.mode);
        self.metrics
            .check_duration
            .observe(seconds(start, self.here.now()));
        Ok(answer)
    }

    /// Decides many checks at once (each owner's as one group); answers in order, an invalid
    /// check's error in its place. Timed as one.
    pub async fn check_many(&self, checks: &[Check<'_>]) -> Vec<Result<CheckAnswer, CheckError>> {
        let start = self.here.now();
        let mut results: Vec<Option<Result<CheckAnswer, CheckError>>> =
            Vec::with_capacity(checks.len());
        let mut prepared = Vec::with_capacity(checks.len());
        for c in checks {
            match self.prepare(c, c.cost) {
                Ok(p) => {
                    results.push(None);
                    prepared.push(p);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut decided = self
            .dispatcher
            .check_many(&prepared)
            .await
            .into_iter()
            .zip(prepared.iter().map(|p| p.resolved.mode));
        let results = results
            .into_iter()
            .map(|slot| match slot {
                Some(error) => error,
                None => match decided.next() {
                    Some((Ok(a), mode)) => {
                        self.metrics.count(a.allowed, mode);
                        Ok(a)
                    }
                    Some((Err(e), _)) => Err(e),
                    None => Err(CheckError::Unavailable("no answer was produced")),
                },
            })
            .collect();
        self.metrics
            .batch_duration
            .observe(seconds(start, self.here.now()));
        results
    }

    /// Validates a check at `cost` (nothing is consumed).
    fn prepare<'a>(&self, c: &Check<'a>, cost: u64) -> Result<Prepared<'a>, CheckError> {
        self.here.engine().prepare_check(c.key, c.rule, cost)
    }

    /// Keeps a client per alive member (called on every membership change).
    pub fn follow_members(&self, view: &View) {
        self.pool.sync(view);
    }

    /// Hands the buckets this node no longer owns under `view` to their new owners (called
    /// when the ring changed); returns how many moved.
    pub async fn hand_over(&self, view: &View) -> usize {
        let moved = crate::forward::handover::hand_over(
            view,
            self.here.engine().store(),
            self.pool.settings(),
            self.here.now(),
        )
        .await;
        self.handed_over.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}
