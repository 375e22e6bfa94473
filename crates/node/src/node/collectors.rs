//! Each stage's metrics, declared as tables where they are counted and registered here with
//! what they read at scrape time: one list, in the order `/metrics` shows their families.

use super::edges::Edges;
use super::local::LocalState;
use super::membership::Members;
use super::peers::Peering;
use super::trust::Trust;
use crate::lifecycle::Lifecycle;
use crate::metrics::{self, Metrics};
use crate::rules::reload;
use crate::{admin, cluster, global, peers, replicas, rlqs, routing, rules};
use std::sync::Arc;

/// Registers every stage's metrics, each a table read from its source at scrape time (before
/// the node serves: the registry is then shared).
pub(super) fn register(
    m: &mut Metrics,
    trust: &Trust,
    local: &LocalState,
    members: &Members,
    peering: &Peering,
    edges: &Edges,
    lifecycle: &Arc<Lifecycle>,
) {
    let here = &local.local;
    m.scrape(crate::local::owned::METRICS, here.owned().clone());
    m.scrape(crate::local::copies::METRICS, here.copies().clone());
    m.scrape(routing::metrics::METRICS, peering.router.clone());
    let peer_counts = peers::metrics::PeerCounts {
        peers: peering.pool.clone(),
        server: peering.server.stats.clone(),
        handed_over: peering.handed_over.clone(),
        recall: peering.recall.stats.clone(),
    };
    m.scrape(peers::metrics::METRICS, Arc::new(peer_counts));
    m.scrape(cluster::metrics::MEMBERS, members.view.clone());
    m.scrape(
        cluster::metrics::PAUSES,
        members.membership.pauses().clone(),
    );
    m.scrape(replicas::metrics::METRICS, peering.replica_stats.clone());
    let lease_counts = crate::local::leases::LeaseCounts {
        leases: here.leases().clone(),
        clock: here.clock().clone(),
        stats: peering.lease_stats.clone(),
    };
    m.scrape(crate::local::leases::METRICS, Arc::new(lease_counts));
    m.scrape(
        crate::local::reservations::METRICS,
        here.reservations().clone(),
    );
    m.scrape(global::metrics::METRICS, local.global.clone());
    if let Some(regions) = &local.regions {
        m.scrape(crate::regions::METRICS, regions.clone());
    }
    m.scrape(crate::blocks::METRICS, here.blocks().clone());
    m.scrape(metrics::GOSSIP, members.gossip_stats.clone());
    m.scrape(metrics::HTTP_CONNECTIONS, edges.conns.clone());
    m.scrape(metrics::GRPC_CONNECTIONS, edges.grpc_conns.clone());
    m.scrape(rules::book::METRICS, local.book.clone());
    let tls = metrics::TlsCounts {
        http: edges.conns.clone(),
        grpc: edges.grpc_conns.clone(),
        certs: trust.certificates(),
    };
    m.scrape(metrics::TLS, Arc::new(tls));
    m.scrape(reload::RULES_RELOADS, local.rules.clone());
    m.scrape(reload::ENVOY_CONFIG_RELOADS, edges.envoy_status.clone());
    m.scrape(reload::RLQS_CONFIG_RELOADS, edges.rlqs_status.clone());
    m.scrape(rlqs::metrics::METRICS, local.rlqs.clone());
    m.scrape(cluster::clock::METRICS, members.clocks.clone());
    let top_counts = admin::top_keys::TopCounts {
        top: local.top.clone(),
        local: here.clone(),
    };
    m.scrape(admin::top_keys::METRICS, Arc::new(top_counts));
    m.scrape(crate::lifecycle::METRICS, lifecycle.clone());
    m.scrape(crate::durable::METRICS, local.durable_stats.clone());
}
