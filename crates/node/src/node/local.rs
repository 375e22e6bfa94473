//! The local-state stage: what this node holds and decides by itself. Opened before it joins
//! ([`Opened`]: the engine with its store and the rules in force, the book kept under
//! `--data-dir`), then completed once membership has given this incarnation its name
//! ([`LocalState`]: global counters, deciding here, the top keys, the RLQS shares).

use super::NodeError;
use super::membership::Members;
use crate::config::NodeConfig;
use crate::decide::Here;
use crate::engine::Engine;
use crate::global::{self, GlobalCounters};
use crate::rlqs::Rlqs;
use crate::rules::book::RuleBook;
use crate::rules::reload::RulesStatus;
use ringlimit_core::clock::SystemClock;
use ringlimit_core::top::TopKeys;
use std::sync::Arc;
use tokio::task::JoinSet;

/// What the node holds before it joins the cluster.
pub(super) struct Opened {
    engine: Arc<Engine>,
    book: Arc<RuleBook>,
    rules: Arc<RulesStatus>,
}

/// What the node holds and decides by itself.
pub(super) struct LocalState {
    /// Rules in force, the clock, and the buckets this node owns (and their copies, leases,
    /// reservations).
    pub(super) engine: Arc<Engine>,
    /// The file's rules and the admin API's.
    pub(super) book: Arc<RuleBook>,
    /// The rules file's reloads.
    pub(super) rules: Arc<RulesStatus>,
    /// The keys checks limited most, counted by the check service, asked by the admin API.
    pub(super) top: Arc<TopKeys>,
    /// Envoy RLQS streams served here, and the shares of the buckets this node owns.
    pub(super) rlqs: Arc<Rlqs>,
    /// `mode: global` rules: counters keyed by this incarnation, fed by what peers push.
    pub(super) global: Arc<GlobalCounters>,
    /// Deciding here: owned buckets or global counters.
    pub(super) here: Here,
}

impl Opened {
    /// Creates `--data-dir` and puts the rules in force (the file's, and the admin API's
    /// kept there).
    pub(super) fn open(config: &NodeConfig) -> Result<Self, NodeError> {
        let clock = config
            .clock
            .as_ref()
            .map_or_else(|| Arc::new(SystemClock::new()) as _, |c| c.0.clone());
        let engine = Arc::new(
            Engine::new(config.rules.clone(), config.max_keys, clock)
                .with_max_reservation_ttl_ms(config.max_reservation_ttl_ms),
        );
        if let Some(dir) = &config.data_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| NodeError::DataDir(format!("cannot create {}: {e}", dir.display())))?;
        }
        let book = Arc::new(
            RuleBook::open(engine.clone(), &config.node_id, config.data_dir.clone())
                .map_err(|e| NodeError::DataDir(e.to_string()))?,
        );
        Ok(Self {
            engine,
            book,
            rules: Arc::new(RulesStatus::new(config.rules_path.clone())),
        })
    }

    /// Deciding here, once membership has named this incarnation (global counts are kept
    /// under it) and measures the cluster clock (global windows are numbered on it); the
    /// top keys and the RLQS shares beside it.
    pub(super) fn decide_here(self, config: &NodeConfig, members: &Members) -> LocalState {
        let id = members.membership.chitchat_id();
        let global = Arc::new(
            GlobalCounters::new(
                global::actor(&id.node_id, id.generation_id),
                config.global_max_counters,
            )
            .with_clocks(members.clocks.clone()),
        );
        let here = Here::new(self.engine.clone(), global.clone());
        let rlqs = Arc::new(Rlqs::new(
            Arc::new(arc_swap::ArcSwap::from_pointee(config.rlqs_config.clone())),
            self.engine.clone(),
        ));
        LocalState {
            engine: self.engine,
            book: self.book,
            rules: self.rules,
            top: Arc::new(TopKeys::default()),
            rlqs,
            global,
            here,
        }
    }
}

impl LocalState {
    /// Sweeps expired reservations.
    pub(super) fn sweep(&self, tasks: &mut JoinSet<()>) {
        tasks.spawn(crate::reservations::upkeep(self.engine.clone()));
    }

    /// Reloads the rules file when it changes.
    pub(super) fn watch(&self, config: &NodeConfig, tasks: &mut JoinSet<()>) {
        if self.rules.source.is_some() {
            tasks.spawn(crate::rules::reload::watch(
                self.book.clone(),
                self.rules.clone(),
                config.rules_poll,
            ));
        }
    }
}
