//! Each stage's counters, registered with the Prometheus registry and read at scrape time:
//! one list, in the order `/metrics` shows their families.

use super::edges::Edges;
use super::local::LocalState;
use super::membership::Members;
use super::peers::Peering;
use super::trust::Trust;
use crate::lifecycle::Lifecycle;
use crate::metrics::{ConnCollector, GossipCollector, Metrics, Server};
use crate::rules::reload::{ReloadCollector, Reloaded};
use std::sync::Arc;

/// Registers every stage's collector (before the node serves: the registry is then shared).
pub(super) fn register(
    metrics: &mut Metrics,
    trust: &Trust,
    local: &LocalState,
    members: &Members,
    peers: &Peering,
    edges: &Edges,
    lifecycle: &Arc<Lifecycle>,
) {
    let here = &local.local;
    metrics.register(crate::local::owned::OwnedCollector(here.owned().clone()));
    metrics.register(crate::local::copies::CopiesCollector(here.copies().clone()));
    metrics.register(crate::routing::metrics::RoutingCollector(
        peers.router.clone(),
    ));
    metrics.register(crate::peers::metrics::PeersCollector {
        peers: peers.pool.clone(),
        server: peers.server.stats.clone(),
        handed_over: peers.handed_over.clone(),
        recall: peers.recall.stats.clone(),
    });
    metrics.register(crate::cluster::metrics::MembersCollector(
        members.view.clone(),
    ));
    metrics.register(crate::cluster::metrics::PausesCollector(
        members.membership.pauses().clone(),
    ));
    metrics.register(crate::replicas::ReplicaCollector {
        stats: peers.replica_stats.clone(),
    });
    metrics.register(crate::local::leases::LeaseCollector {
        leases: here.leases().clone(),
        clock: here.clock().clone(),
        stats: peers.lease_stats.clone(),
    });
    metrics.register(crate::local::reservations::ReservationCollector(
        here.reservations().clone(),
    ));
    metrics.register(crate::global::metrics::GlobalCollector(
        local.global.clone(),
    ));
    metrics.register(GossipCollector(members.gossip_stats.clone()));
    for (stats, server) in [
        (&edges.conns, Server::Http),
        (&edges.grpc_conns, Server::Grpc),
    ] {
        metrics.register(ConnCollector {
            stats: stats.clone(),
            server,
        });
    }
    metrics.register(crate::rules::book::BookCollector(local.book.clone()));
    metrics.register(crate::metrics::TlsCollector {
        http: edges.conns.clone(),
        grpc: edges.grpc_conns.clone(),
        certs: trust.certificates(),
    });
    for (status, of) in [
        (&local.rules, Reloaded::Rules),
        (&edges.envoy_status, Reloaded::Envoy),
        (&edges.rlqs_status, Reloaded::Rlqs),
    ] {
        metrics.register(ReloadCollector {
            status: status.clone(),
            of,
        });
    }
    metrics.register(crate::rlqs::metrics::RlqsCollector(local.rlqs.clone()));
    metrics.register(crate::cluster::clock::ClockCollector(
        members.clocks.clone(),
    ));
    metrics.register(crate::admin::top_keys::TopCollector {
        top: local.top.clone(),
        local: here.clone(),
    });
    metrics.register(crate::lifecycle::ReadyCollector(lifecycle.clone()));
}
