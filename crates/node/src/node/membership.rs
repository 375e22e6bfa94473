//! The membership stage: the address other nodes reach this one at, gossip started from the
//! seeds (chitchat, the view of the members and the ring, the pause detector), the members'
//! clocks, and the admin API's rules kept in step through gossip.

use super::NodeError;
use super::listeners::Endpoints;
use crate::cluster::Membership;
use crate::cluster::View;
use crate::cluster::clock::Clocks;
use crate::cluster::membership::{GossipSettings, Remembered};
use crate::cluster::pause::Pauses;
use crate::config::NodeConfig;
use crate::metrics::GossipStats;
use crate::rules::book::RuleBook;
use crate::rules::sync::Synced;
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinSet;

/// This node as a member of the cluster.
pub(super) struct Members {
    pub(super) membership: Arc<Membership>,
    /// The members and the ring, as last seen.
    pub(super) view: Arc<ArcSwap<View>>,
    /// Every member's clock offset, and the cluster clock global windows are numbered on.
    pub(super) clocks: Arc<Clocks>,
    /// What other nodes dial (as given, or the peer address bound).
    pub(super) advertise: String,
    /// Whether this node must hear from another member before it is ready.
    pub(super) needs_peers: bool,
    /// Set once the admin API's rules were merged from peers.
    pub(super) rules_synced: Arc<Synced>,
    /// The gossip socket's counts.
    pub(super) gossip_stats: Arc<GossipStats>,
}

impl Members {
    /// Resolves the advertised address, waits (bounded) for the seeds' names, and starts
    /// gossip: from here on other nodes learn of this one. `remembered`: the members of the
    /// ring this node last saw (kept under `--data-dir`), waited for.
    pub(super) async fn join(
        config: &NodeConfig,
        endpoints: &Endpoints,
        remembered: &[(String, String)],
    ) -> Result<Self, NodeError> {
        let (http_addr, peer_addr) = (endpoints.http_addr, endpoints.peer_addr);
        let advertise_text =
            if config.advertise.is_empty() || config.advertise == config.peer_addr.to_string() {
                peer_addr.to_string()
            } else {
                config.advertise.clone()
            };
        let advertise = resolve(&advertise_text).await?;
        // A wildcard address is reached at the advertised host, as the peer port is.
        let reached = |addr: SocketAddr| {
            if addr.ip().is_unspecified() {
                SocketAddr::new(advertise.ip(), addr.port()).to_string()
            } else {
                addr.to_string()
            }
        };
        let http_advertise = reached(http_addr);
        let grpc_advertise = endpoints.grpc_addr.map(reached).unwrap_or_default();
        let needs_peers = needs_peers(&config.seeds, &advertise_text, advertise);

        crate::cluster::seeds::wait_for_names(&config.seeds, config.seed_wait).await;
        let membership = Membership::start(
            GossipSettings {
                node_id: config.node_id.clone(),
                cluster_id: config.cluster_id.clone(),
                advertise,
                http_advertise,
                grpc_advertise,
                seeds: config.seeds.clone(),
                interval: config.gossip_interval,
                joining: needs_peers,
                remembered: Remembered {
                    members: remembered.to_vec(),
                    within: config.members_wait,
                },
            },
            endpoints.gossip.as_ref(),
            config
                .pauses
                .clone()
                .unwrap_or_else(|| Arc::new(Pauses::new(config.gossip_interval))),
        )
        .await?;
        let membership = Arc::new(membership);
        Ok(Self {
            view: membership.view_cell(),
            membership,
            clocks: Arc::new(Clocks::new(config.max_clock_offset)),
            advertise: advertise_text,
            needs_peers,
            rules_synced: Arc::new(Synced::default()),
            gossip_stats: endpoints.gossip_stats.clone(),
        })
    }

    /// Keeps the admin API's rules in step with the other members' through gossip.
    pub(super) fn sync_rules(
        &self,
        config: &NodeConfig,
        book: &Arc<RuleBook>,
        tasks: &mut JoinSet<()>,
    ) {
        tasks.spawn(crate::rules::sync::run(
            self.membership.chitchat(),
            self.membership.chitchat_id(),
            book.clone(),
            self.rules_synced.clone(),
            config.gossip_interval,
        ));
    }
}

/// Whether this node must hear from another member before it is ready: it was given seeds
/// other than itself.
fn needs_peers(seeds: &[String], advertise_text: &str, advertise: SocketAddr) -> bool {
    seeds
        .iter()
        .any(|s| s != advertise_text && s.parse::<SocketAddr>().ok() != Some(advertise))
}

async fn resolve(addr: &str) -> Result<SocketAddr, NodeError> {
    let err = |reason: String| NodeError::Advertise {
        addr: addr.to_owned(),
        reason,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("no address".into()))
}
