//! The most denied (or most checked) keys of a rule across the cluster: each live member's
//! bounded top-K (counted where checks arrive, see [`ringlimit_core::top_keys`]), asked at once over
//! the peer port and merged here. A member that does not answer in time is reported, never
//! waited on longer.

use super::Admin;
use crate::cluster::MemberState;
use crate::metrics::{Family, Series};
use futures::future::join_all;
use ringlimit_proto::peer::{TopBy, TopKey};
use serde::Serialize;
use std::time::Duration;

/// Longest any one member may take to answer.
const TOP_WAIT: Duration = Duration::from_secs(2);
/// Most keys one request may ask for.
pub const MAX_N: usize = 1000;

/// One member's part in a top-keys answer.
#[derive(Debug, Serialize)]
pub struct MemberTop {
    pub node_id: String,
    /// `ok`, or `failed` (`error` says why: no answer in time, an older member).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/admin/top`'s answer.
#[derive(Debug, Serialize)]
pub struct TopReport {
    pub rule: String,
    pub by: &'static str,
    pub n: usize,
    /// What the counts cover: the current epoch of each member's counts and the one before.
    pub window: &'static str,
    /// Most counted first: `count` summed over members (an estimate, at most `error` over).
    pub keys: Vec<TopKey>,
    /// Whether every live member answered.
    pub complete: bool,
    pub members: Vec<MemberTop>,
}

impl Admin {
    /// The `n` keys of `rule` counted most `by` on every live member, merged.
    pub async fn top(&self, rule: &str, by: TopBy, n: usize) -> TopReport {
        let view = self.router.view();
        let now = self.local.now();
        let self_id = view.self_id.clone();
        let asks = view
            .members
            .iter()
            .filter(|m| !matches!(m.state, MemberState::Dead | MemberState::Unseen))
            .map(|m| {
                let self_id = self_id.clone();
                async move {
                    let got = if *m.node_id == *self_id {
                        Ok(Some(self.top.top(rule, by, n, now)))
                    } else {
                        let asked = self
                            .pool
                            .top_keys(&m.peer_addr, rule, by, n as u32, TOP_WAIT);
                        match tokio::time::timeout(TOP_WAIT, asked).await {
                            Ok(r) => r.map_err(|e| e.to_string()),
                            Err(_) => Err(format!("no answer within {TOP_WAIT:?}")),
                        }
                    };
                    (m.node_id.clone(), got)
                }
            });
        let mut lists = Vec::new();
        let mut members = Vec::new();
        for (node_id, got) in join_all(asks).await {
            members.push(match got {
                Ok(Some(keys)) => {
                    let m = MemberTop {
                        node_id,
                        status: "ok",
                        keys: Some(keys.len()),
                        error: None,
                    };
                    lists.push(keys);
                    m
                }
                Ok(None) => MemberTop {
                    node_id,
                    status: "failed",
                    keys: None,
                    error: Some("a member of an older version counts no top keys".into()),
                },
                Err(e) => MemberTop {
                    node_id,
                    status: "failed",
                    keys: None,
                    error: Some(e),
                },
            });
        }
        TopReport {
            rule: rule.to_owned(),
            by: match by {
                TopBy::Denied => "denied",
                TopBy::Checks => "checks",
            },
            n,
            window: "the last 5 to 10 minutes",
            complete: members.iter().all(|m| m.status == "ok"),
            keys: ringlimit_core::top_keys::merge(lists, n),
            members,
        }
    }
}

/// Series of `ringlimit_top_denied` at most: one per (rule, key) among the most denied.
pub const METRIC_SERIES: usize = 100;

/// What the top keys' metrics read: the counts, and the clock they are read on.
pub struct TopCounts {
    pub top: std::sync::Arc<ringlimit_core::top_keys::TopKeys>,
    pub local: std::sync::Arc<crate::local::Local>,
}

/// This node's top keys as metrics, read at scrape time: `ringlimit_top_denied{rule,key}` (the
/// [`METRIC_SERIES`] most denied keys over every rule, so the series stay few whatever the
/// keys), the rules tracked, the checks not counted beyond the cap and the rules replaced.
pub const METRICS: &[Family<TopCounts>] = &[
    Family::gauge_each(
        "top_denied",
        "Denied checks of this node's most denied keys (at most 100 series over every rule), \
         counted over the last 5 to 10 minutes (an estimate: Space-Saving).",
        &["rule", "key"],
        |t| {
            let most = t.top.most_denied(METRIC_SERIES, t.local.now());
            most.into_iter()
                .map(|(rule, k)| Series::new([rule, k.key], k.count))
                .collect()
        },
    ),
    Family::gauge(
        "top_rules",
        "Rules whose top keys this node counts (at most 128).",
        |t| t.top.rules() as u64,
    ),
    Family::counter(
        "top_untracked",
        "Checks not counted in top keys because 128 rules were counted already.",
        |t| t.top.untracked(),
    ),
    Family::counter(
        "top_rules_replaced",
        "Rules whose top keys this node stopped counting to count another rule's: the rule \
         counted least over the last 5 to 10 minutes (or not at all), once the other was \
         counted more.",
        |t| t.top.replaced(),
    ),
];
