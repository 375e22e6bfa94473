//! The managed blocklist through the admin API: blocks put and lifted through this node (in
//! force here at once, announced to every member within a round: `crate::blocks_sync`), and
//! the blocks this node holds, listed a page at a time. Every change is logged with the admin
//! token's name, and listed with it.
//!
//! A change is read-your-writes: before the answer leaves, it is sent to every live member
//! (every member but the dead) and each is given [`CONFIRM_WITHIN`] to take it; the answer
//! names the members that did not (`unconfirmed`). Those still get it from the announcer's next
//! rounds (and everything, lifts included, once they answer again).

use super::Admin;
use crate::blocks::{BlockChange, BlockError, BlockSource, MAX_REASON_BYTES, Target};
use crate::cluster::MemberState;
use crate::rules::RuleSpec;
use futures::future::join_all;
use ringlimit_core::clock::NANOS_PER_MS;
use serde::Serialize;
use std::time::Duration;

/// How long a change waits for each member to take it before the answer leaves.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(1);

/// Most blocks listed in one page.
pub const MAX_PAGE: usize = 1000;
/// Blocks listed in a page when the request does not say.
pub const DEFAULT_PAGE: usize = 100;

/// Why a blocklist request was refused; each a 4xx.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockRequestError {
    #[error("{0}")]
    InvalidTarget(String),
    #[error("ttl {0}")]
    InvalidTtl(String),
    #[error("reason is {0} bytes; at most {MAX_REASON_BYTES} are kept")]
    ReasonTooLong(usize),
    #[error("{0}")]
    Full(BlockError),
    #[error("no block of {0:?} is held")]
    NotFound(String),
    #[error("no rule {0:?} is in force")]
    UnknownRule(String),
    #[error("cursor {0:?} is not one a listing gave")]
    InvalidCursor(String),
}

impl BlockRequestError {
    /// The error code the admin API answers with.
    pub fn code(&self) -> &'static str {
        match self {
            BlockRequestError::InvalidTarget(_) => "invalid_target",
            BlockRequestError::InvalidTtl(_) => "invalid_ttl",
            BlockRequestError::ReasonTooLong(_) => "invalid_reason",
            BlockRequestError::Full(_) => "too_many_blocks",
            BlockRequestError::NotFound(_) => "unknown_block",
            BlockRequestError::UnknownRule(_) => "unknown_rule",
            BlockRequestError::InvalidCursor(_) => "invalid_cursor",
        }
    }
}

/// A block as the admin API lists it.
#[derive(Debug, Clone, Serialize)]
pub struct AdminBlock {
    #[serde(flatten)]
    pub block: BlockChange,
    /// Ms until it ends, on this node's clock.
    pub remaining_ms: u64,
}

/// A change's answer: the block (a lift, for `DELETE`) and the live members that did not
/// confirm it within [`CONFIRM_WITHIN`] (empty: in force on every live member).
#[derive(Debug, Clone, Serialize)]
pub struct BlockChanged {
    #[serde(flatten)]
    pub block: AdminBlock,
    pub unconfirmed: Vec<String>,
}

/// One page of `GET /v1/admin/blocks`.
#[derive(Debug, Clone, Serialize)]
pub struct BlockPage {
    pub blocks: Vec<AdminBlock>,
    /// Held in all (after the filters).
    pub total: usize,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// What a listing asks for.
#[derive(Debug, Clone, Default)]
pub struct BlockFilter<'a> {
    pub rule: Option<&'a str>,
    /// Blocks whose reason contains this.
    pub reason: Option<&'a str>,
    pub source: Option<BlockSource>,
    pub cursor: Option<&'a str>,
    pub limit: Option<usize>,
}

/// The order blocks are listed in, and what a cursor names.
fn order_key(b: &BlockChange) -> String {
    format!("{}\u{0}{}", b.target, b.rule.as_deref().unwrap_or(""))
}

impl Admin {
    fn now_ms(&self) -> u64 {
        self.local.now() / NANOS_PER_MS
    }

    /// Sends `change` to every live member at once, each given [`CONFIRM_WITHIN`]; the ids of
    /// those that did not take it.
    async fn confirm(&self, change: &BlockChange) -> Vec<String> {
        let view = self.router.view();
        let asks = view
            .members
            .iter()
            .filter(|m| {
                *m.node_id != *view.self_id
                    && !matches!(m.state, MemberState::Dead | MemberState::Unseen)
            })
            .map(|m| async move {
                let sent = self
                    .pool
                    .blocks(&m.peer_addr, vec![change.clone()], CONFIRM_WITHIN);
                match tokio::time::timeout(CONFIRM_WITHIN, sent).await {
                    Ok(Ok(Some(_))) => None,
                    Ok(Ok(None)) => Some((m.node_id.clone(), "too old for blocks".to_owned())),
                    Ok(Err(e)) => Some((m.node_id.clone(), e.to_string())),
                    Err(_) => Some((
                        m.node_id.clone(),
                        format!("no answer in {CONFIRM_WITHIN:?}"),
                    )),
                }
            });
        let missed: Vec<_> = join_all(asks).await.into_iter().flatten().collect();
        for (member, error) in &missed {
            tracing::info!(target = %change.target, %member, %error, "block change not confirmed by a member; announced again later");
        }
        missed.into_iter().map(|(m, _)| m).collect()
    }

    /// Blocks `target` (a key, or `cidr:NET/LEN`) under every rule for `ttl` (`1h`), asked by
    /// token `by`, in force on every live member that confirms it; the block as listed.
    pub async fn put_block(
        &self,
        target: &str,
        ttl: &str,
        reason: &str,
        by: &str,
    ) -> Result<BlockChanged, BlockRequestError> {
        let t =
            Target::parse(target).map_err(|e| BlockRequestError::InvalidTarget(e.to_string()))?;
        let ttl_ms = crate::rules::parse_period(ttl)
            .map_err(BlockRequestError::InvalidTtl)?
            .div_ceil(NANOS_PER_MS);
        if reason.len() > MAX_REASON_BYTES {
            return Err(BlockRequestError::ReasonTooLong(reason.len()));
        }
        let now_ms = self.now_ms();
        let until_ms = now_ms.saturating_add(ttl_ms);
        let blocks = self.local.blocks();
        // Later than any change of the target held (a lift in this same ms included).
        let since_ms = blocks
            .table
            .version(&t)
            .map_or(now_ms, |v| now_ms.max(v.saturating_add(1)));
        blocks
            .table
            .put_managed(&t, (since_ms, until_ms), reason, by)
            .map_err(BlockRequestError::Full)?;
        let change = BlockChange {
            target: t.to_string(),
            rule: None,
            source: BlockSource::Managed,
            since_ms,
            until_ms,
            reason: reason.to_owned(),
            by: by.to_owned(),
            lifted: false,
        };
        blocks.outbox.push(change.clone());
        blocks.touch();
        tracing::info!(target = %change.target, %by, ttl_ms, reason, "block added");
        let unconfirmed = self.confirm(&change).await;
        Ok(BlockChanged {
            block: AdminBlock {
                block: change,
                remaining_ms: ttl_ms,
            },
            unconfirmed,
        })
    }

    /// Lifts the managed block of `target`, or with `rule`, the automatic block of the key
    /// under that rule; asked by token `by`, lifted on every live member that confirms it; the
    /// lift (remembered until `until_ms`, the lifted block's end).
    pub async fn delete_block(
        &self,
        target: &str,
        rule: Option<&str>,
        by: &str,
    ) -> Result<BlockChanged, BlockRequestError> {
        let now_ms = self.now_ms();
        let blocks = self.local.blocks();
        let (lifted, change) = match rule {
            Some(rule) => {
                let (_, id) = self
                    .local
                    .rules()
                    .prepare(target, RuleSpec::Named(rule), 0)
                    .map_err(|_| BlockRequestError::UnknownRule(rule.to_owned()))?;
                let lifted = blocks
                    .table
                    .remove_auto((id, target, rule), (now_ms, 0), by, now_ms);
                (lifted, (target.to_owned(), Some(rule), BlockSource::Auto))
            }
            None => {
                let t = Target::parse(target)
                    .map_err(|e| BlockRequestError::InvalidTarget(e.to_string()))?;
                let lifted = blocks.table.remove_managed(&t, (now_ms, 0), by, now_ms);
                (lifted, (t.to_string(), None, BlockSource::Managed))
            }
        };
        let Some(until_ms) = lifted else {
            return Err(BlockRequestError::NotFound(target.to_owned()));
        };
        let (target, rule, source) = change;
        // The lift travels with the lifted block's end: members remember it until then.
        let change = BlockChange {
            target: target.clone(),
            rule: rule.map(str::to_owned),
            source,
            since_ms: now_ms,
            until_ms,
            reason: String::new(),
            by: by.to_owned(),
            lifted: true,
        };
        blocks.outbox.push(change.clone());
        blocks.touch();
        tracing::info!(%target, rule, %by, "block lifted");
        let unconfirmed = self.confirm(&change).await;
        Ok(BlockChanged {
            block: AdminBlock {
                block: change,
                remaining_ms: 0,
            },
            unconfirmed,
        })
    }

    /// A page of the blocks this node holds (every member holds the same, a round apart).
    pub fn list_blocks(&self, f: &BlockFilter<'_>) -> Result<BlockPage, BlockRequestError> {
        let now_ms = self.now_ms();
        let mut all: Vec<(String, BlockChange)> = self
            .local
            .blocks()
            .table
            .all(now_ms)
            .into_iter()
            .filter(|b| !b.is_lift())
            .filter(|b| f.rule.is_none_or(|r| b.rule.as_deref() == Some(r)))
            .filter(|b| f.reason.is_none_or(|r| b.reason.contains(r)))
            .filter(|b| f.source.is_none_or(|s| b.source == s))
            .map(|b| (order_key(&b), b))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let total = all.len();
        let after = match f.cursor {
            None => None,
            Some(c) => Some(
                decode_cursor(c).ok_or_else(|| BlockRequestError::InvalidCursor(c.to_owned()))?,
            ),
        };
        let start = after.map_or(0, |a| all.partition_point(|(k, _)| *k <= a));
        let limit = f.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
        let page: Vec<_> = all.iter().skip(start).take(limit).collect();
        let next_cursor = (start + page.len() < total)
            .then(|| page.last().map(|(k, _)| encode_cursor(k)))
            .flatten();
        Ok(BlockPage {
            blocks: page
                .into_iter()
                .map(|(_, b)| AdminBlock {
                    remaining_ms: b.until_ms.saturating_sub(now_ms),
                    block: b.clone(),
                })
                .collect(),
            total,
            next_cursor,
        })
    }
}

fn encode_cursor(k: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k)
}

fn decode_cursor(c: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .ok()?;
    String::from_utf8(bytes).ok()
}
