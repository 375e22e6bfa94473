//! One admin API change of a rule (or a read of it), decided where the rule's name is owned.
//!
//! Every node publishes the API rules it knows by gossip, but a node answering from its own copy
//! is not read-your-writes: a `PUT` through one node and a `DELETE` through another right after
//! found no rule there (404) and the rule lived on. So every change of a name — and every read
//! of one through the admin API — is decided by one member, the owner of the name on the ring
//! (`crate::admin::api_rules` routes it there over the peer port), in the order it arrives there.
//! The node that took the request merges the owner's entry into its own book before it answers,
//! so its next read sees the change too, and gossip takes it everywhere else within a second.
//!
//! This module is that decision, the same whether the request arrived here or at another member:
//! the change as the wire carries it ([`RuleChange`]), and its outcome ([`RuleChanged`]: the
//! owner's entry afterwards, and the refusal's code and message).

use super::api::Entry;
use super::book::{ChangeError, IfMatch, RuleBook};
use ringlimit_proto::identity::bucket_id;
use ringlimit_proto::peer::{RuleChange, RuleChanged, RuleOp};

/// The seed of a rule name's place on the ring (not a bucket's: any fixed value apart).
const RULE_NAME_SEED: u64 = 0x6164_6d69_6e72_756c; // "adminrul"

/// The place of rule `name` on the ring: its owner decides its admin API changes.
pub fn place(name: &str) -> u64 {
    bucket_id(RULE_NAME_SEED, name)
}

/// Makes `change` on `book` at wall time `now_ms`; `via` names the member the request arrived
/// at, for the log.
pub fn decide(book: &RuleBook, change: &RuleChange, now_ms: u64, via: &str) -> RuleChanged {
    let if_match = change.if_match.as_deref().map(IfMatch::parse);
    let name = &change.name;
    let by = &change.by;
    let result = match &change.op {
        RuleOp::Get => Ok(None),
        RuleOp::Put { spec_json } => match serde_json::from_str::<serde_json::Value>(spec_json) {
            Err(e) => {
                return refused(
                    book,
                    name,
                    "invalid_json",
                    format!("Body is not valid JSON: {e}"),
                );
            }
            Ok(spec) => book
                .put(name, spec.clone(), now_ms, by, if_match.as_ref())
                .map(|entry| {
                    tracing::info!(rule = %name, %by, %via, version = %entry.tag(),
                        fields = %spec, "API rule written");
                    Some(entry)
                }),
        },
        RuleOp::Delete => book
            .delete(name, now_ms, by, if_match.as_ref())
            .map(|entry| {
                tracing::info!(rule = %name, %by, %via, version = %entry.tag(), "API rule deleted");
                Some(entry)
            }),
    };
    match result {
        Ok(_) => outcome(book, name, None),
        Err(e) => {
            if matches!(e, ChangeError::Persist(_)) {
                tracing::warn!(rule = %name, %by, error = %e, "API rule changed but not saved");
            }
            refused(book, name, e.code(), e.to_string())
        }
    }
}

/// The outcome: `book`'s entry of `name` now, and the refusal if any.
fn outcome(book: &RuleBook, name: &str, refused: Option<(String, String)>) -> RuleChanged {
    RuleChanged {
        entry_json: book.api_entry(name).and_then(|e| to_json(&e)),
        refused,
    }
}

fn refused(book: &RuleBook, name: &str, code: &str, message: String) -> RuleChanged {
    outcome(book, name, Some((code.to_owned(), message)))
}

fn to_json(entry: &Entry) -> Option<String> {
    serde_json::to_string(entry).ok()
}

/// The owner's entry as it came back (an entry that does not parse is ignored: a newer node's).
pub fn entry_of(done: &RuleChanged) -> Option<Entry> {
    done.entry_json
        .as_deref()
        .and_then(|json| serde_json::from_str(json).ok())
}
