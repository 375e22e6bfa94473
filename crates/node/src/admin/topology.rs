//! What a client SDK routes by (ringlimit.v1's `Topology` and `WatchTopology`): the members in
//! this node's ring with their addresses, and the rules in force with their bucket-id seeds,
//! under a version that changes only when they do; and the changes to follow, without polling.

use super::Admin;
use crate::cluster::View;
use ringlimit_core::rule::LeaseMode;
use ringlimit_proto::discovery::RuleInfo;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::watch;

/// This node's topology as a client routes by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub node_id: String,
    pub cluster_id: String,
    /// A hash of `members` and `rules`: changes when they do.
    pub version: u64,
    /// The members in this node's ring, sorted by node id.
    pub members: Vec<TopologyMember>,
    /// The rules in force (file and admin API: those `GET /v1/rules` lists), sorted by name.
    pub rules: Vec<TopologyRule>,
}

/// One member of the ring and where it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopologyMember {
    pub node_id: String,
    /// Empty when it serves no gRPC (or predates gossiping its address).
    pub grpc_addr: String,
    pub http_addr: String,
    pub peer_addr: String,
}

/// One rule in force, with what a client needs beside `GET /v1/rules`' listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopologyRule {
    pub info: RuleInfo,
    /// Its buckets' id seed (`ringlimit_proto::identity::named_seed`).
    pub seed: u64,
    /// `lease: auto` and an algorithm that is leased (`ringlimit_core::lease::leasable`).
    pub leasable: bool,
}

/// What changes a topology: new membership views and rule sets. Both are `watch` channels:
/// a follower wakes on a change, never on a timer.
pub struct TopologyChanges {
    view: watch::Receiver<Arc<View>>,
    rules: watch::Receiver<u64>,
}

impl TopologyChanges {
    /// Resolves on the next view or rule set (not necessarily a different topology: compare
    /// versions); `false` once the node stops telling (it is shutting down).
    pub async fn changed(&mut self) -> bool {
        tokio::select! {
            r = self.view.changed() => r.is_ok(),
            r = self.rules.changed() => r.is_ok(),
        }
    }
}

impl Admin {
    /// The topology as this node sees it now.
    pub fn topology(&self) -> Topology {
        let view = self.router.view();
        let members: Vec<TopologyMember> = view
            .ring
            .members()
            .iter()
            .map(|id| {
                let m = view.members.iter().find(|m| *m.node_id == **id);
                let addr = |f: fn(&crate::cluster::Member) -> &String| {
                    m.map(|m| f(m).clone()).unwrap_or_default()
                };
                TopologyMember {
                    node_id: id.to_string(),
                    grpc_addr: addr(|m| &m.grpc_addr),
                    http_addr: addr(|m| &m.http_addr),
                    peer_addr: addr(|m| &m.peer_addr),
                }
            })
            .collect();
        let rules: Vec<TopologyRule> = self
            .local
            .rules()
            .rules()
            .iter()
            .map(|r| TopologyRule {
                info: r.info(),
                seed: r.seed,
                leasable: r.lease == LeaseMode::Auto
                    && ringlimit_core::lease::leasable(r.rule.algorithm),
            })
            .collect();
        Topology {
            node_id: view.self_id.to_string(),
            cluster_id: self.cluster_id.to_string(),
            version: version(&members, &rules),
            members,
            rules,
        }
    }

    /// Told of every change that may change [`Admin::topology`].
    pub fn topology_changes(&self) -> TopologyChanges {
        let mut view = self.view_updates.clone();
        view.mark_unchanged();
        let mut rules = self.local.rules().changes();
        rules.mark_unchanged();
        TopologyChanges { view, rules }
    }
}

/// The version of a topology of `members` and `rules`: xxh3 of their JSON (serde's field order
/// is fixed), so equal topologies have equal versions on every node of one build.
fn version(members: &[TopologyMember], rules: &[TopologyRule]) -> u64 {
    let bytes = serde_json::to_vec(&(members, rules)).unwrap_or_default();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, grpc: &str) -> TopologyMember {
        TopologyMember {
            node_id: id.into(),
            grpc_addr: grpc.into(),
            http_addr: "h".into(),
            peer_addr: "p".into(),
        }
    }

    #[test]
    fn the_version_follows_members_and_their_addresses() {
        let a = [member("a", "g1"), member("b", "g2")];
        let v = version(&a, &[]);
        assert_eq!(v, version(&a.clone(), &[]), "same topology, same version");
        assert_ne!(v, version(&a[..1], &[]), "a member left");
        assert_ne!(v, version(&[member("a", "g1"), member("b", "g3")], &[]));
    }
}
