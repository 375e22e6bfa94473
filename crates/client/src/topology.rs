//! What the client knows of the cluster: the ring of alive members, a link to each, and the
//! rules in force; and how it learns them (`GET /v1/cluster`, `GET /v1/rules` of any node).

use crate::builder::{Settings, http_base};
use ringlimit_core::check::Resolved;
use ringlimit_core::link::{PeerClient, PeerSettings, PeerStats};
use ringlimit_proto::Ring;
use ringlimit_proto::discovery::{ClusterInfo, RuleList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// An immutable snapshot: replaced whole on every refresh, read lock-free by every check.
pub(crate) struct Topology {
    pub ring: Ring,
    /// A link to every alive member, by node id.
    pub peers: HashMap<Arc<str>, Member>,
    /// `None` until the rules were fetched once.
    pub rules: Option<HashMap<String, Resolved>>,
    pub fetched_at: Option<Instant>,
}

pub(crate) struct Member {
    pub peer_addr: String,
    pub http: String,
    pub link: Arc<PeerClient>,
}

impl Topology {
    /// Before the first discovery: no members, no rules.
    pub fn empty() -> Self {
        Self {
            ring: Ring::new(Vec::<String>::new()),
            peers: HashMap::new(),
            rules: None,
            fetched_at: None,
        }
    }

    /// Members alive in the ring (at least 1, for sharing a limit).
    pub fn alive(&self) -> usize {
        self.ring.len().max(1)
    }

    /// The owner of bucket `id` and the link to it.
    pub fn owner(&self, id: u64) -> Option<(&Arc<str>, &Arc<PeerClient>)> {
        let owner = self.ring.owner(id)?;
        self.peers.get_key_value(owner).map(|(id, m)| (id, &m.link))
    }

    /// The member after `id`'s owner on the ring, and the link to it, when that link is up:
    /// the owner's first replica when the cluster keeps replicas (one that does not answers
    /// `not_replica`, and the fallback decides).
    pub fn replica(&self, id: u64) -> Option<(&Arc<str>, &Arc<PeerClient>)> {
        let next = *self.ring.replicas(id, 1).first()?;
        self.peers
            .get_key_value(next)
            .map(|(id, m)| (id, &m.link))
            .filter(|(_, link)| link.available())
    }

    /// Where to ask next time: alive members' HTTP addresses.
    pub fn http_addrs(&self) -> impl Iterator<Item = &str> {
        self.peers.values().map(|m| m.http.as_str())
    }

    /// The next topology from what a node said, keeping the links of members that stayed.
    pub fn next(
        &self,
        cluster: &ClusterInfo,
        rules: &RuleList,
        link: &Arc<PeerSettings>,
        stats: &Arc<PeerStats>,
        https: bool,
    ) -> Self {
        let mut peers = HashMap::new();
        for m in cluster.members.iter().filter(|m| m.state == "alive") {
            let Some(http) = http_base(&m.http_addr, https) else {
                tracing::debug!(member = %m.node_id, http = %m.http_addr, "member without a usable HTTP address");
                continue;
            };
            let id: Arc<str> = Arc::from(m.node_id.as_str());
            let link = match self.peers.get(&id) {
                Some(old) if old.peer_addr == m.peer_addr => old.link.clone(),
                _ => Arc::new(PeerClient::spawn(
                    m.peer_addr.clone(),
                    link.clone(),
                    stats.clone(),
                )),
            };
            peers.insert(
                id,
                Member {
                    peer_addr: m.peer_addr.clone(),
                    http,
                    link,
                },
            );
        }
        let known = rules
            .rules
            .iter()
            .filter_map(|r| Resolved::from_info(r).map(|k| (r.name.clone(), k)))
            .collect();
        Self {
            ring: Ring::new(peers.keys()),
            peers,
            rules: Some(known),
            fetched_at: Some(Instant::now()),
        }
    }
}

/// Why one node could not tell the cluster's state.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiscoveryError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("node of cluster {found:?}, not {expected:?}")]
    OtherCluster { found: String, expected: String },
}

/// Asks one node for members and rules.
pub(crate) async fn fetch(
    http: &reqwest::Client,
    base: &str,
    settings: &Settings,
) -> Result<(ClusterInfo, RuleList), DiscoveryError> {
    let cluster: ClusterInfo = get_json(http, format!("{base}/v1/cluster")).await?;
    if cluster.cluster_id != settings.cluster_id {
        return Err(DiscoveryError::OtherCluster {
            found: cluster.cluster_id,
            expected: settings.cluster_id.clone(),
        });
    }
    let rules: RuleList = get_json(http, format!("{base}/v1/rules")).await?;
    Ok((cluster, rules))
}

/// GET `url`, a 2xx answer, its JSON body.
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: String,
) -> Result<T, reqwest::Error> {
    http.get(url).send().await?.error_for_status()?.json().await
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ringlimit_core::link::memnet::MemNet;
    use serde_json::json;
    use std::time::Duration;

    /// Link settings whose dials go nowhere (an in-memory network nobody listens on): links
    /// are made, none connects, and no socket is opened.
    pub(crate) fn nowhere() -> (Arc<PeerSettings>, Arc<PeerStats>) {
        let settings = PeerSettings {
            dialer: MemNet::new().dialer("client"),
            node_id: "sdk:test".into(),
            cluster_id: "ringlimit".into(),
            secret: None,
            client_token: None,
            deadline: Duration::from_millis(5),
            connect_timeout: Duration::from_millis(50),
            open_for: Duration::from_millis(250),
            queue: 16,
        };
        (Arc::new(settings), Arc::default())
    }

    /// A `/v1/cluster` answer: `(node_id, peer_addr, http_addr, state)` per member.
    pub(crate) fn cluster(members: &[(&str, &str, &str, &str)]) -> ClusterInfo {
        let members: Vec<_> = members
            .iter()
            .map(|(id, peer, http, state)| {
                json!({ "node_id": id, "peer_addr": peer, "http_addr": http, "state": state })
            })
            .collect();
        serde_json::from_value(json!({
            "node_id": "n0",
            "cluster_id": "ringlimit",
            "members": members,
        }))
        .expect("a cluster view")
    }

    /// A `/v1/rules` answer: `api` (10 a minute, token bucket), `closed` (fails closed, shadow,
    /// no leases) and `broken` (limit 0: no node would serve it).
    pub(crate) fn rules() -> RuleList {
        let rule = |name: &str, limit: u64, extra: serde_json::Value| {
            let mut r = json!({
                "name": name, "limit": limit, "period_ms": 60_000, "period": "1m",
                "algorithm": "token_bucket", "burst": limit, "mode": "owner",
                "on_owner_unreachable": "open",
            });
            if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
                r.extend(extra.clone());
            }
            r
        };
        serde_json::from_value(json!({ "rules": [
            rule("api", 10, json!({})),
            rule("closed", 4, json!({ "on_owner_unreachable": "closed", "shadow": true, "lease": "off" })),
            rule("broken", 0, json!({})),
        ]}))
        .expect("a rule list")
    }

    #[test]
    fn before_discovery_nothing_is_known_and_a_limit_is_shared_by_one() {
        let t = Topology::empty();
        assert_eq!(t.alive(), 1, "a share of a limit among at least one");
        assert!(t.owner(42).is_none() && t.replica(42).is_none());
        assert!(t.rules.is_none() && t.fetched_at.is_none());
        assert_eq!(t.http_addrs().count(), 0);
    }

    #[tokio::test]
    async fn the_ring_is_the_alive_members_with_a_usable_address() {
        let (link, stats) = nowhere();
        let view = cluster(&[
            ("n0", "10.0.0.1:7000", "10.0.0.1:8080", "alive"),
            ("n1", "10.0.0.2:7000", "http://10.0.0.2:8080/", "alive"),
            ("n2", "10.0.0.3:7000", "10.0.0.3:8080", "dead"),
            ("n3", "10.0.0.4:7000", "10.0.0.4:8080", "leaving"),
            ("n4", "10.0.0.5:7000", "no port", "alive"),
        ]);
        let t = Topology::empty().next(&view, &rules(), &link, &stats, false);
        assert_eq!(t.ring.members(), Ring::new(["n0", "n1"]).members());
        assert_eq!(t.alive(), 2);
        let mut http: Vec<&str> = t.http_addrs().collect();
        http.sort_unstable();
        assert_eq!(http, ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]);
        assert!(t.fetched_at.is_some());
        // Over HTTPS, the same members at https:// (an http:// address is not usable).
        let t = Topology::empty().next(&view, &rules(), &link, &stats, true);
        let mut http: Vec<&str> = t.http_addrs().collect();
        http.sort_unstable();
        assert_eq!(http, ["https://10.0.0.1:8080"]);
    }

    #[tokio::test]
    async fn each_bucket_goes_to_its_ring_owner_and_no_replica_without_a_link() {
        let (link, stats) = nowhere();
        let view = cluster(&[
            ("n0", "10.0.0.1:7000", "10.0.0.1:8080", "alive"),
            ("n1", "10.0.0.2:7000", "10.0.0.2:8080", "alive"),
            ("n2", "10.0.0.3:7000", "10.0.0.3:8080", "alive"),
        ]);
        let t = Topology::empty().next(&view, &rules(), &link, &stats, false);
        let ring = Ring::new(["n0", "n1", "n2"]);
        for id in (0..1_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            let (owner, link) = t.owner(id).expect("an owner");
            assert_eq!(Some(&**owner), ring.owner(id));
            assert!(Arc::ptr_eq(link, &t.peers[owner].link));
            // No link is up (nothing listens): the fallback decides, no replica is asked.
            assert!(t.replica(id).is_none());
        }
    }

    #[tokio::test]
    async fn links_are_kept_for_members_that_stay_where_they_were() {
        let (link, stats) = nowhere();
        let first = Topology::empty().next(
            &cluster(&[
                ("n0", "10.0.0.1:7000", "10.0.0.1:8080", "alive"),
                ("n1", "10.0.0.2:7000", "10.0.0.2:8080", "alive"),
            ]),
            &rules(),
            &link,
            &stats,
            false,
        );
        // n1 restarted at a new address; n2 joined.
        let next = first.next(
            &cluster(&[
                ("n0", "10.0.0.1:7000", "10.0.0.1:8080", "alive"),
                ("n1", "10.0.0.9:7000", "10.0.0.9:8080", "alive"),
                ("n2", "10.0.0.3:7000", "10.0.0.3:8080", "alive"),
            ]),
            &rules(),
            &link,
            &stats,
            false,
        );
        assert!(Arc::ptr_eq(&first.peers["n0"].link, &next.peers["n0"].link));
        assert!(!Arc::ptr_eq(
            &first.peers["n1"].link,
            &next.peers["n1"].link
        ));
        assert_eq!(next.peers["n1"].peer_addr, "10.0.0.9:7000");
        assert_eq!(next.ring.len(), 3);
    }

    #[tokio::test]
    async fn rules_are_resolved_as_nodes_resolve_them_and_unusable_ones_left_out() {
        let (link, stats) = nowhere();
        let t = Topology::empty().next(&cluster(&[]), &rules(), &link, &stats, false);
        let known = t.rules.as_ref().expect("rules fetched");
        let mut names: Vec<&str> = known.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["api", "closed"], "a rule with limit 0 is no rule");
        let api = known["api"];
        assert_eq!((api.rule.limit, api.shadow), (10, false));
        let closed = known["closed"];
        assert!(closed.shadow);
        assert_eq!(
            closed.on_unreachable,
            ringlimit_core::rule::OnOwnerUnreachable::Closed
        );
        assert_eq!(closed.lease, ringlimit_core::rule::LeaseMode::Off);
        // Named rules' buckets do not collide across names.
        assert_ne!(api.bucket("k", 1), closed.bucket("k", 1));
        // With no member alive, no owner, and a limit shared by one.
        assert!(t.owner(api.bucket("k", 1).expect("id")).is_none());
        assert_eq!(t.alive(), 1);
    }
}
