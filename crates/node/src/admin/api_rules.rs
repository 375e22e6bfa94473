//! Rules through the admin API: write, delete, read one, and how the admin listing shows where
//! each rule in force came from.
//!
//! A change of a name, or a read of it, is decided by the member that owns the name on the ring
//! (see [`crate::rules::change`]): here when this node owns it, else sent to the owner over the
//! peer port. The owner's entry comes back and is merged here before the answer, so the next
//! request through this node sees the change too. An owner that does not answer makes the
//! change fail (503 `unavailable`: retry) rather than be decided here, where another node's
//! next request could not see it.

use super::Admin;
use crate::rules::api::Entry;
use crate::rules::book::ChangeError;
use crate::rules::change::{self, entry_of};
use ringlimit_proto::discovery::RuleInfo;
use ringlimit_proto::peer::{RuleChange, RuleOp};
use serde::Serialize;
use std::time::Duration;

/// How long the owner of a rule's name may take to answer a change.
const OWNER_WITHIN: Duration = Duration::from_secs(2);

/// A rule as `GET /v1/admin/rules` lists it: its fields, where it came from, and for an API
/// rule, the version of its last change.
#[derive(Debug, Clone, Serialize)]
pub struct AdminRule {
    #[serde(flatten)]
    pub info: RuleInfo,
    /// `file` (the rules file, or built in) or `api`.
    pub source: &'static str,
    /// The version of the last change (what `If-Match` names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at_ms: Option<u64>,
    /// The admin token that made the last change (its name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
    /// The node the last change was made on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_on: Option<String>,
}

/// Why an admin API rule request failed.
#[derive(Debug, thiserror::Error)]
pub enum RuleRequestError {
    /// Refused by the rule book (here or at the name's owner): the code, and the message.
    #[error("{1}")]
    Refused(String, String),
    /// The member that owns the name did not answer.
    #[error("{0}")]
    Unavailable(String),
}

impl From<ChangeError> for RuleRequestError {
    fn from(e: ChangeError) -> Self {
        RuleRequestError::Refused(e.code().to_owned(), e.to_string())
    }
}

/// What a `PUT` or `DELETE` asks of a rule, as the HTTP edge gives it.
#[derive(Debug, Clone)]
pub struct RuleRequest<'a> {
    pub name: &'a str,
    /// The `If-Match` header, if any.
    pub if_match: Option<&'a str>,
    /// The admin token's name.
    pub by: &'a str,
}

impl Admin {
    /// Every rule in force with its source.
    pub fn admin_rule_list(&self) -> Vec<AdminRule> {
        let api = self.book.api_in_force();
        self.local
            .rules()
            .rules()
            .iter()
            .map(|r| {
                let entry = api.get(&r.name);
                AdminRule {
                    info: r.info(),
                    source: if entry.is_some() { "api" } else { "file" },
                    version: entry.map(Entry::tag),
                    updated_at_ms: entry.map(|e| e.version.ms),
                    updated_by: entry.map(|e| e.author().to_owned()),
                    updated_on: entry.map(|e| e.version.node.clone()),
                }
            })
            .collect()
    }

    /// One rule in force, as listed (a read at the name's owner first, so that a change made
    /// through another node is seen); `None` when no rule has that name.
    pub async fn admin_rule(&self, name: &str, by: &str) -> Option<AdminRule> {
        let get = RuleRequest {
            name,
            if_match: None,
            by,
        };
        // A read the owner cannot answer is answered from what this node knows.
        let _ = self.at_owner(&get, RuleOp::Get).await;
        self.listed(name)
    }

    fn listed(&self, name: &str) -> Option<AdminRule> {
        self.admin_rule_list()
            .into_iter()
            .find(|r| r.info.name == name)
    }

    /// Creates or replaces API rule `name` with `spec` (a JSON object of the rules file's
    /// fields), at the name's owner.
    pub async fn put_rule(
        &self,
        req: &RuleRequest<'_>,
        spec: &serde_json::Value,
    ) -> Result<AdminRule, RuleRequestError> {
        let op = RuleOp::Put {
            spec_json: spec.to_string(),
        };
        self.at_owner(req, op).await?;
        self.listed(req.name)
            .ok_or_else(|| ChangeError::NotFound(req.name.to_owned()).into())
    }

    /// Deletes API rule `name`, at the name's owner.
    pub async fn delete_rule(&self, req: &RuleRequest<'_>) -> Result<(), RuleRequestError> {
        self.at_owner(req, RuleOp::Delete).await.map(|_| ())
    }

    /// This node's wall time in ms (on this node's clock): what rule versions are made of.
    fn wall_ms(&self) -> u64 {
        self.local.now() / ringlimit_core::clock::NANOS_PER_MS
    }

    /// Makes `op` at the member that owns `req.name` (here, or over the peer port) and merges
    /// the owner's entry into this node's book.
    async fn at_owner(
        &self,
        req: &RuleRequest<'_>,
        op: RuleOp,
    ) -> Result<Option<Entry>, RuleRequestError> {
        let change = RuleChange {
            name: req.name.to_owned(),
            op,
            if_match: req.if_match.map(str::to_owned),
            by: req.by.to_owned(),
        };
        let view = self.router.view();
        let owner = view
            .ring
            .owner(change::place(req.name))
            .filter(|o| **o != *view.self_id);
        let writes = !matches!(change.op, RuleOp::Get);
        if writes && !view.quorum.quorate {
            return Err(RuleRequestError::Unavailable(
                "This node does not see a majority of the cluster; change rules through a node \
                 that does."
                    .into(),
            ));
        }
        let done = match owner.and_then(|o| Some((o, view.peer_addrs.get(o)?))) {
            None => change::decide(&self.book, &change, self.wall_ms(), &view.self_id),
            Some((owner, addr)) => {
                match self
                    .pool
                    .rule_change(addr, change.clone(), OWNER_WITHIN)
                    .await
                {
                    Ok(Some(done)) => done,
                    // An owner of an older version decides nothing: as older nodes did.
                    Ok(None) => change::decide(&self.book, &change, self.wall_ms(), &view.self_id),
                    Err(e) => {
                        return Err(RuleRequestError::Unavailable(format!(
                            "Rule {:?} is kept by node {owner}, which did not answer ({e}); \
                             retry.",
                            req.name
                        )));
                    }
                }
            }
        };
        let entry = entry_of(&done);
        if let Some(e) = &entry {
            // The owner's entry, for this node's next request (nothing new when decided here).
            self.book.adopt(req.name, e.clone());
        }
        if done.refused.is_none() {
            self.book.count_request(&change.op);
        }
        match done.refused {
            Some((code, message)) => Err(RuleRequestError::Refused(code, message)),
            None => Ok(entry),
        }
    }
}
