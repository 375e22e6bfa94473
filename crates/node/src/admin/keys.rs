//! A key's bucket, read without consuming, and its reset on every member (the admin API's
//! `POST /v1/admin/keys/{key}/reset`): every member is asked ([`Peers::reset`]: a connection of
//! its own; the receiving side is `peers/server/reset.rs`) to drop the bucket's identities;
//! this node drops them from its own store. A member that does not answer within the bound is
//! reported as failed, never waited on longer.

use super::Admin;
use crate::cluster::{MemberState, View};
use crate::local::Local;
use crate::peers::Peers;
use crate::routing::fallback_id;
use crate::rules::Prepared;
use crate::rules::RuleSpec;
use futures::future::join_all;
use ringlimit_core::check::CheckError;
use ringlimit_core::rule::Mode;
use ringlimit_proto::CheckAnswer;
use serde::Serialize;
use std::time::Duration;

/// Longest a reset waits for any one member (connect, handshake, answer).
const RESET_WAIT: Duration = Duration::from_secs(2);

/// Why global counters are not reset (stated in the answer of a reset of a global rule's key).
const GLOBAL_RESET: &str = "not supported: global rules count in grow-only G-counters that nodes \
    merge by maximum, so a count dropped here would come back with the next gossip from peers; \
    the key's counts expire with their window (at most two periods)";

/// A key's bucket and who decides it.
#[derive(Debug, Serialize)]
pub struct Bucket {
    pub key: String,
    /// The named rule; `null` for an inline rule.
    pub rule: Option<String>,
    pub mode: &'static str,
    /// The bucket's 64-bit identity, 16 hex digits.
    pub bucket_id: String,
    /// The owner in this node's ring; `null` for a global rule (decided on every node).
    pub owner: Option<String>,
    /// This node.
    pub node_id: String,
    pub is_owner: bool,
}

impl Bucket {
    fn of(p: &Prepared<'_>, view: &View) -> Self {
        let owner = match p.resolved.mode {
            Mode::Global => None,
            Mode::Owner => view.ring.owner(p.id),
        };
        Bucket {
            key: p.key.to_owned(),
            rule: p.spec.name().map(str::to_owned),
            mode: p.resolved.mode.as_str(),
            bucket_id: format!("{:016x}", p.id),
            // An empty ring (never in a running node) means this node decides.
            is_owner: p.resolved.mode == Mode::Owner && owner.is_none_or(|o| o == &*view.self_id),
            owner: owner.map(str::to_owned),
            node_id: view.self_id.to_string(),
        }
    }
}

/// A key's bucket and its state.
#[derive(Debug, Serialize)]
pub struct KeyState {
    #[serde(flatten)]
    pub bucket: Bucket,
    /// A cost-0 check's answer, decided where a check would be: nothing consumed.
    pub state: CheckAnswer,
}

/// What a reset did, member by member.
#[derive(Debug, Serialize)]
pub struct ResetReport {
    #[serde(flatten)]
    pub bucket: Bucket,
    /// Buckets dropped, summed over members (the key's bucket at its owner, fallback shares
    /// wherever the owner was once unreachable).
    pub removed: u64,
    /// Whether every member that is not dead answered.
    pub complete: bool,
    pub members: Vec<MemberReset>,
    /// Only for a global rule: why its counters are not reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_reset: Option<&'static str>,
}

impl Admin {
    /// The bucket of `key` under `rule`, its owner and its state, read with a cost-0 check
    /// routed like any check (degraded when the owner is away).
    pub async fn key_state(&self, key: &str, rule: RuleSpec<'_>) -> Result<KeyState, CheckError> {
        let p = self.local.rules().prepare_check(key, rule, 0)?;
        let state = self.router.check(&p).await?;
        Ok(KeyState {
            bucket: Bucket::of(&p, &self.router.view()),
            state,
        })
    }

    /// Drops the bucket of `key` under `rule` and its fallback buckets on every member that is
    /// not dead; each member's result is in the report.
    pub async fn reset(&self, key: &str, rule: RuleSpec<'_>) -> Result<ResetReport, CheckError> {
        let p = self.local.rules().prepare_check(key, rule, 0)?;
        let view = self.router.view();
        let (members, global_reset) = match p.resolved.mode {
            // Global checks never touch a store: there is nothing a reset could drop.
            Mode::Global => (Vec::new(), Some(GLOBAL_RESET)),
            Mode::Owner => {
                // The real bucket everywhere (a node that owned it before a ring change may
                // still hold it), and the fail-open share each node may have used.
                let ids = [p.id, fallback_id(p.id)];
                let members = everywhere(&view, &self.pool, &self.local, &ids, RESET_WAIT).await;
                (members, None)
            }
        };
        let removed = members.iter().filter_map(|m| m.removed).sum();
        let acked = members
            .iter()
            .filter(|m| m.status == ResetStatus::Ok)
            .count();
        let failed: Vec<&str> = members
            .iter()
            .filter(|m| m.status == ResetStatus::Failed)
            .map(|m| m.node_id.as_str())
            .collect();
        let bucket = Bucket::of(&p, &view);
        tracing::info!(
            // Debug: a key may hold newlines, which must not start a forged log line.
            key = ?p.key,
            rule = bucket.rule.as_deref().unwrap_or("(inline)"),
            bucket_id = %bucket.bucket_id,
            removed,
            acked,
            ?failed,
            "admin reset performed"
        );
        Ok(ResetReport {
            complete: failed.is_empty(),
            bucket,
            removed,
            members,
            global_reset,
        })
    }
}

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
        let skipped = match m.state {
            MemberState::Dead => Some("declared dead; not contacted"),
            MemberState::Unseen => Some("not seen since this node started; not contacted"),
            _ => None,
        };
        if let Some(why) = skipped {
            return MemberReset {
                node_id: m.node_id.clone(),
                status: ResetStatus::Skipped,
                removed: None,
                error: Some(why.into()),
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
            grpc_addr: String::new(),
            state,
            generation: 0,
        }
    }

    fn peers() -> Peers {
        Peers::new(crate::peers::test_settings(
            ringlimit_core::link::dial::tcp(),
            "me",
            "ringlimit",
        ))
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
            awaited: Vec::new(),
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
            calendar: None,
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
