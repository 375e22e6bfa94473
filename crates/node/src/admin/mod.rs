//! The admin side of a node, beside the check service (not inside it): rules written, deleted
//! and listed through the admin API, a key's state and its reset across the cluster, the
//! cluster and rules views, and the metrics text. What the edges call for anything but checks
//! and readiness; no edge reaches past it into the routing, the peers or the local state.
//!
//! # Layout
//! - this module — [`Admin`] and what it is made of ([`Parts`]).
//! - [`keys`] — a key's bucket state and its reset across the cluster.
//! - [`blocks`] — the managed blocklist: blocks put, lifted and listed.
//! - [`api_rules`] — rules written, deleted and listed through the admin API, decided at the
//!   member that owns the rule's name.
//! - [`tokens`] — the admin tokens: names, roles, the file they are reloaded from.
//! - [`topology`] — what a client SDK routes by (ringlimit.v1's Topology), and its changes.
//! - [`top_keys`] — the most denied (or checked) keys of a rule, merged across members.
//! - [`views`] — the cluster, rules and admin-rules views, and the metrics text.

pub mod api_rules;
pub mod blocks;
pub mod keys;
pub mod tokens;
pub mod top_keys;
pub mod topology;
pub mod views;

use crate::durable::DurableStats;
use crate::local::Local;
use crate::metrics::Metrics;
use crate::peers::Peers;
use crate::routing::Router;
use crate::rules::book::RuleBook;
use crate::rules::reload::RulesStatus;
use ringlimit_core::top_keys::TopKeys;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// What the admin side is made of (see `node::edges::front_door`).
pub struct Parts {
    pub local: Arc<Local>,
    /// The routing the check service uses too: a key's state is read where a check would be.
    pub router: Arc<Router>,
    pub pool: Arc<Peers>,
    pub metrics: Arc<Metrics>,
    /// The rules file's reloads.
    pub rules: Arc<RulesStatus>,
    pub cluster_id: Arc<str>,
    /// The rules in force and the admin API's changes to them.
    pub book: Arc<RuleBook>,
    /// Buckets this node sent to their new owners after ring changes (counted by
    /// [`crate::lifecycle::Lifecycle::hand_over`]).
    pub handed_over: Arc<AtomicU64>,
    /// The keys this node's checks limited most (counted by the check service).
    pub top: Arc<TopKeys>,
    /// The disk follower's counters and last error (`--data-dir`).
    pub durable: Arc<DurableStats>,
    /// Told of every new membership view (ringlimit.v1's WatchTopology follows it).
    pub view_updates: tokio::sync::watch::Receiver<Arc<crate::cluster::View>>,
    /// `--region`: this node's regions (`None`: one region).
    pub regions: Option<Arc<crate::regions::Regions>>,
}

/// The node's admin API and views, for every edge.
pub struct Admin {
    local: Arc<Local>,
    router: Arc<Router>,
    pool: Arc<Peers>,
    metrics: Arc<Metrics>,
    rules: Arc<RulesStatus>,
    cluster_id: Arc<str>,
    book: Arc<RuleBook>,
    handed_over: Arc<AtomicU64>,
    top: Arc<TopKeys>,
    durable: Arc<DurableStats>,
    view_updates: tokio::sync::watch::Receiver<Arc<crate::cluster::View>>,
    regions: Option<Arc<crate::regions::Regions>>,
}

impl Admin {
    pub fn new(p: Parts) -> Self {
        Self {
            local: p.local,
            router: p.router,
            pool: p.pool,
            metrics: p.metrics,
            rules: p.rules,
            cluster_id: p.cluster_id,
            book: p.book,
            handed_over: p.handed_over,
            top: p.top,
            view_updates: p.view_updates,
            regions: p.regions,
            durable: p.durable,
        }
    }
}
