//! The local-state stage: what this node holds and decides by itself. Opened before it joins
//! ([`Opened`]: the rules in force and the book kept under `--data-dir`), then completed once
//! membership has given this incarnation its name ([`LocalState`]: global counters, deciding
//! here — owned buckets, replica copies, leases, reservations — the top keys, the RLQS
//! shares).

use super::NodeError;
use super::membership::Members;
use crate::config::NodeConfig;
use crate::durable::disk::Disk;
use crate::durable::{Durable, DurableStats};
use crate::global::{self, GlobalCounters};
use crate::local::Local;
use crate::rlqs::Rlqs;
use crate::rules::InForce;
use crate::rules::book::RuleBook;
use crate::rules::reload::RulesStatus;
use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::top_keys::TopKeys;
use std::sync::Arc;
use tokio::task::JoinSet;

/// What the node holds before it joins the cluster.
pub(super) struct Opened {
    in_force: Arc<InForce>,
    clock: Arc<dyn Clock>,
    book: Arc<RuleBook>,
    rules: Arc<RulesStatus>,
    /// The bucket file under `--data-dir`, stamped for this node (checked before joining).
    disk: Option<Disk>,
    /// The members of the ring this node last saw, kept in the bucket file: waited for once
    /// it joins.
    pub(super) remembered: Vec<(String, String)>,
}

/// What the node holds and decides by itself.
pub(super) struct LocalState {
    /// Deciding here: the rules in force, the clock, the buckets this node owns, their
    /// copies, leases and reservations, and the global counters.
    pub(super) local: Arc<Local>,
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
    /// The disk follower of the owned buckets (`--data-dir`), restored already.
    pub(super) durable: Option<Arc<Durable>>,
    /// Its counters (zero without `--data-dir`).
    pub(super) durable_stats: Arc<DurableStats>,
    /// `--region` and `--region-peers`: allowances, the home's allocation, region links.
    pub(super) regions: Option<Arc<crate::regions::Regions>>,
}

impl Opened {
    /// Creates `--data-dir` and puts the rules in force (the file's, and the admin API's
    /// kept there).
    pub(super) fn open(config: &NodeConfig) -> Result<Self, NodeError> {
        let clock = config
            .clock
            .as_ref()
            .map_or_else(|| Arc::new(SystemClock::new()) as _, |c| c.0.clone());
        let in_force = Arc::new(InForce::new(config.rules.clone()));
        if let Some(dir) = &config.data_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| NodeError::DataDir(format!("cannot create {}: {e}", dir.display())))?;
        }
        let book = Arc::new(
            RuleBook::open(in_force.clone(), &config.node_id, config.data_dir.clone())
                .map_err(|e| NodeError::DataDir(e.to_string()))?,
        );
        Ok(Self {
            in_force,
            clock,
            book,
            rules: Arc::new(RulesStatus::new(config.rules_path.clone())),
            disk: None,
            remembered: Vec::new(),
        })
    }

    /// Opens the bucket file under `--data-dir` (off the runtime's threads: opening it waits
    /// for the disk). A corrupt or foreign bucket file stops the node here, before it joins.
    pub(super) async fn open_disk(mut self, config: &NodeConfig) -> Result<Self, NodeError> {
        let Some(dir) = config.data_dir.clone() else {
            return Ok(self);
        };
        let (cluster, node) = (config.cluster_id.clone(), config.node_id.clone());
        let opened = tokio::task::spawn_blocking(move || {
            let disk = Disk::open(&dir, &cluster, &node)?;
            let members = disk.members()?;
            Ok::<_, crate::durable::disk::DiskError>((disk, members))
        })
        .await
        .map_err(|e| NodeError::DataDir(format!("opening the bucket file: {e}")))?;
        let (disk, members) = opened.map_err(|e| NodeError::DataDir(e.to_string()))?;
        self.disk = Some(disk);
        self.remembered = members;
        Ok(self)
    }

    /// Deciding here, once membership has named this incarnation (global counts are kept
    /// under it) and measures the cluster clock (global windows are numbered on it); the
    /// top keys and the RLQS shares beside it. With `--data-dir`, the disk follower (see
    /// [`LocalState::restore`]).
    pub(super) fn decide_here(self, config: &NodeConfig, members: &Members) -> LocalState {
        let id = members.membership.chitchat_id();
        let global = Arc::new(
            GlobalCounters::new(
                global::actor(&id.node_id, id.generation_id),
                config.global_max_counters,
            )
            .with_clocks(members.clocks.clone()),
        );
        let mut local = Local::new(self.in_force, self.clock, config.max_keys, global.clone())
            .with_max_reservation_ttl_ms(config.max_reservation_ttl_ms)
            .with_blocks(Arc::new(crate::blocks::Blocklist::new(
                &config.node_id,
                config.max_blocks,
            )));
        if self.disk.is_some() {
            local = local.with_persistence(config.persist_min_period_ns);
        }
        let local = Arc::new(local);
        let regions = config.regions.as_ref().map(|c| {
            let regions = Arc::new(crate::regions::Regions::new(
                &c.name,
                &c.peers,
                c.interval,
                c.secret.clone(),
            ));
            local.share_across_regions(regions.clone());
            global.share_across_regions();
            regions
        });
        let durable_stats = Arc::new(DurableStats::default());
        let durable = self
            .disk
            .map(|disk| Arc::new(Durable::new(disk, local.clone(), durable_stats.clone())));
        if let Some(dir) = &config.data_dir {
            load_blocks(&local, dir);
        }
        let rlqs = Arc::new(Rlqs::new(
            Arc::new(arc_swap::ArcSwap::from_pointee(config.rlqs_config.clone())),
            local.clone(),
        ));
        LocalState {
            local,
            book: self.book,
            rules: self.rules,
            top: Arc::new(TopKeys::default()),
            rlqs,
            global,
            durable,
            durable_stats,
            regions,
        }
    }
}

/// Puts the managed blocks kept under `--data-dir` back in force (a file that cannot be read
/// is logged: the node's peers send it every block they hold when it joins).
fn load_blocks(local: &Local, dir: &std::path::Path) {
    match crate::blocks_sync::load(dir) {
        Ok(blocks) => {
            let now_ms = local.now() / ringlimit_core::clock::NANOS_PER_MS;
            let kept = local.blocks().apply(&blocks, |_, _| None, now_ms);
            if kept > 0 {
                tracing::info!(kept, "managed blocks restored from --data-dir");
            }
        }
        Err(e) => tracing::warn!(error = %e, "managed blocks not restored"),
    }
}

impl LocalState {
    /// Restores the buckets and copies kept on disk (off the runtime's threads), before
    /// anything is served: the peer port and HTTP start after this.
    pub(super) async fn restore(&self) -> Result<(), NodeError> {
        let Some(durable) = self.durable.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || durable.restore())
            .await
            .map_err(|e| NodeError::DataDir(format!("restoring buckets: {e}")))?
            .map(|_| ())
            .map_err(|e| NodeError::DataDir(e.to_string()))
    }

    /// Writes the durable buckets' changes to disk every `--persist-interval-ms`, and the
    /// ring's members whenever they change.
    pub(super) fn persist(&self, config: &NodeConfig, members: &Members, tasks: &mut JoinSet<()>) {
        if let Some(durable) = &self.durable {
            tasks.spawn(durable.clone().run(config.persist_interval));
            tasks.spawn(
                durable
                    .clone()
                    .remember_members(members.membership.updates()),
            );
        }
    }

    /// Sweeps expired reservations, and ended blocks.
    pub(super) fn sweep(&self, tasks: &mut JoinSet<()>) {
        tasks.spawn(crate::blocks::sweep(
            self.local.blocks().clone(),
            self.local.clock().clone(),
        ));
        tasks.spawn(crate::local::reservations::upkeep(
            self.local.reservations().clone(),
            self.local.clock().clone(),
        ));
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
