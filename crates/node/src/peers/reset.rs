//! Bucket reset across the cluster (the admin API's `POST /v1/admin/keys/{key}/reset`): every
//! member is asked ([`Peers::reset`]: a connection of its own) to drop the given bucket
//! identities; this node drops them from its own store. A member that does not answer within
//! the bound is reported as failed, never waited on longer.

use super::Peers;
use crate::cluster::{MemberState, View};
use crate::local::Local;
use futures::future::join_all;
use serde::Serialize;
use std::time::Duration;

/// One member's part in a reset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberReset {
    pub node_id: String,
    /// `ok`: answered (`removed` buckets dropped); `failed`: no answer (`error` says why);
    /// `skipped`: declared dead, not contacted (a node that comes back starts empty).
    pub status: ResetStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetStatus {
    Ok,
    Failed,
    Skipped,
}

impl MemberReset {
    fn ok(node_id: &str, removed: u64) -> Self {
        Self {
            node_id: node_id.to_owned(),
            status: ResetStatus::Ok,
            removed: Some(removed),
            error: None,
        }
    }

    fn failed(node_id: &str, error: String) -> Self {
        Self {
            node_id: node_id.to_owned(),
            status: ResetStatus::Failed,
            removed: None,
            error: Some(error),
        }
    }
}

/// Drops `ids` from `local` and from every other member of `view` that is not dead, each asked
/// at once and given at most `within`. One entry per member, in the view's order.
pub async fn everywhere(
    view: &View,
    peers: &Peers,
    local: &Local,
    ids: &[u64],
    within: Duration,
) -> Vec<MemberReset> {
    let asks = view.members.iter().map(|m| async move {
        if *m.node_id == *view.self_id {
            let removed = local.reset(ids);
            return MemberReset::ok(&m.node_id, removed);
        }
        if m.state == MemberState::Dead {
            return MemberReset {
                node_id: m.node_id.clone(),
                status: ResetStatus::Skipped,
                removed: None,
                error: Some("declared dead; not contacted".into()),
            };
        }
        match tokio::time::timeout(within, peers.reset(&m.peer_addr, ids)).await {
            Ok(Ok(removed)) => MemberReset::ok(&m.node_id, removed),
            Ok(Err(e)) => MemberReset::failed(&m.node_id, e.to_string()),
            Err(_) => MemberReset::failed(&m.node_id, format!("no answer within {within:?}")),
        }
    });
    join_all(asks).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Member;
    use ringlimit_core::limiter::Rule;
    use ringlimit_proto::{Algorithm, Ring};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn member(id: &str, addr: &str, state: MemberState) -> Member {
        Member {
            node_id: id.into(),
            peer_addr: addr.into(),
            http_addr: String::new(),
            state,
            generation: 0,
        }
    }

    fn peers() -> Peers {
        Peers::new(ringlimit_core::link::PeerSettings {
            dialer: ringlimit_core::link::dial::tcp(),
            node_id: "me".into(),
            cluster_id: "ringlimit".into(),
            secret: None,
            client_token: None,
            deadline: Duration::from_millis(25),
            connect_timeout: Duration::from_millis(500),
            open_for: Duration::from_secs(1),
            queue: 16,
        })
    }

    /// This node drops its own buckets; a member that accepts but never answers is reported
    /// failed within the bound; a dead one is skipped; nothing waits longer than `within`.
    #[tokio::test]
    async fn reports_each_member_within_the_bound() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let silent_addr = silent.local_addr().expect("addr").to_string();
        // Accepts and holds connections without a word: the handshake never completes.
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let view = View {
            self_id: Arc::from("me"),
            members: vec![
                member("dead", "127.0.0.1:1", MemberState::Dead),
                member("me", "127.0.0.1:2", MemberState::Alive),
                member("silent", &silent_addr, MemberState::Alive),
            ],
            ring: Ring::new(["me", "silent"]),
            peer_addrs: BTreeMap::new(),
            quorum: crate::cluster::quorum::Quorum::solo(&Arc::from("me")),
        };
        let local = Local::alone(
            crate::rules::RuleSet::default(),
            100,
            Arc::new(ringlimit_core::clock::ManualClock::new(1)),
        );
        let rule = Rule {
            algorithm: Algorithm::TokenBucket,
            limit: 5,
            period_ns: 1_000_000_000,
            burst: 5,
        };
        assert!(local.bucket(7, &rule, 1).hold(1).0.allowed);
        let within = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let report = everywhere(&view, &peers(), &local, &[7, 8], within).await;
        assert!(started.elapsed() < within * 5, "{:?}", started.elapsed());
        let status: Vec<(&str, ResetStatus, Option<u64>)> = report
            .iter()
            .map(|r| (r.node_id.as_str(), r.status, r.removed))
            .collect();
        assert_eq!(
            status,
            [
                ("dead", ResetStatus::Skipped, None),
                ("me", ResetStatus::Ok, Some(1)),
                ("silent", ResetStatus::Failed, None),
            ]
        );
        assert_eq!(local.owned().len(), 0);
        hold.abort();
    }
}
