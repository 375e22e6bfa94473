//! A key's bucket, read without consuming, and its reset on every member (the admin API).

use super::Admin;
use crate::cluster::View;
use crate::peers::reset::{self, MemberReset, ResetStatus};
use crate::routing::fallback_id;
use crate::rules::Prepared;
use crate::rules::RuleSpec;
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
        let state = self.dispatcher.check(&p).await?;
        Ok(KeyState {
            bucket: Bucket::of(&p, &self.dispatcher.view()),
            state,
        })
    }

    /// Drops the bucket of `key` under `rule` and its fallback buckets on every member that is
    /// not dead; each member's result is in the report.
    pub async fn reset(&self, key: &str, rule: RuleSpec<'_>) -> Result<ResetReport, CheckError> {
        let p = self.local.rules().prepare_check(key, rule, 0)?;
        let view = self.dispatcher.view();
        let (members, global_reset) = match p.resolved.mode {
            // Global checks never touch a store: there is nothing a reset could drop.
            Mode::Global => (Vec::new(), Some(GLOBAL_RESET)),
            Mode::Owner => {
                // The real bucket everywhere (a node that owned it before a ring change may
                // still hold it), and the fail-open share each node may have used.
                let ids = [p.id, fallback_id(p.id)];
                let members =
                    reset::everywhere(&view, &self.pool, &self.local, &ids, RESET_WAIT).await;
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
