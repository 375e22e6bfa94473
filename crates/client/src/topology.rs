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
