//! Failover to the replica: checks whose owner did not answer (lost connection, open circuit,
//! deadline) go to the owner's first live replica ([`super::Site::replica`]), which decides them
//! on its copies of their buckets and keeps those decisions for the owner; only a check no
//! replica answered falls back to the share, as without replicas. The replica may be this
//! member ([`Standby::Here`]: decided at once, [`super::Here::stand_in`]).

use super::{Here, Hold, Item, OwnerLink, Site};
use crate::link::ForwardError;
use crate::link::fanout::OwnerGroups;
use ringlimit_proto::peer::PeerAnswer;
use std::collections::HashMap;
use std::sync::Arc;

/// Who stands in for an owner that did not answer.
pub enum Standby<L, H> {
    /// This member, on its copy.
    Here(H),
    /// Another member (by id), reached over `L`.
    Member(Arc<str>, L),
}

/// Whether an owner's failure is one its replica stands in for. A full queue to the owner
/// ([`ForwardError::Shed`]) is not: the owner lives and decides, and two members deciding one
/// bucket at once is what replicas must not cause.
fn stands_in(e: &ForwardError) -> bool {
    matches!(
        e,
        ForwardError::CircuitOpen | ForwardError::Timeout | ForwardError::Lost
    )
}

/// One check's reply: from its owner, or from the replica that stood in for it.
type Reply = Result<PeerAnswer, ForwardError>;

/// The owners' `replies` to checks of `items` (by index), each reported to the site, with the
/// replies of owners that did not answer replaced by their replicas' where one answered (see
/// [`ask`]), and what a replica holds for each (an all-or-nothing check's, `all`). A check
/// no replica answered keeps its owner's error: the caller falls back to the share. Checks
/// answered as blocked are reported to the site ([`Site::blocked`]).
pub(super) async fn fill_in<I: Item, S: Site<I>>(
    site: &S,
    items: &[I],
    replies: Vec<(usize, Reply)>,
    all: bool,
) -> Vec<(usize, Reply, Option<Hold<S::Link, S::Here>>)> {
    let out = replied(site, items, replies, all).await;
    for (i, reply, _) in &out {
        if let Ok(PeerAnswer::Blocked { answer, source }) = reply {
            site.blocked(*i, &items[*i], answer, *source);
        }
    }
    out
}

async fn replied<I: Item, S: Site<I>>(
    site: &S,
    items: &[I],
    replies: Vec<(usize, Reply)>,
    all: bool,
) -> Vec<(usize, Reply, Option<Hold<S::Link, S::Here>>)> {
    let mut failed = Vec::new();
    let mut out = Vec::with_capacity(replies.len());
    for (i, reply) in replies {
        site.answered(&reply);
        match reply {
            Err(e) if stands_in(&e) => failed.push((i, e)),
            reply => out.push((i, reply, None)),
        }
    }
    if failed.is_empty() {
        return out;
    }
    let idx: Vec<usize> = failed.iter().map(|&(i, _)| i).collect();
    let mut rescued = ask(site, items, &idx, all).await;
    out.extend(failed.into_iter().map(|(i, e)| match rescued.remove(&i) {
        Some(r) => (i, Ok(r.reply), r.hold),
        None => (i, Err(e), None),
    }));
    out
}

/// A replica's answer to one check, and what it holds there (an all-or-nothing check's).
struct Rescued<L, H> {
    reply: PeerAnswer,
    hold: Option<Hold<L, H>>,
}

/// Sends the checks `failed` (indexes into `items`) to their owners' replicas, one group per
/// replica, all at once (`all`: all-or-nothing groups, a shadow check in a group of its own as
/// at its owner); those this member stands in for are decided here at once. Returns the
/// answers replicas gave, marked as theirs, by index; a check no replica answered (none live,
/// an error, an older peer) is left out.
async fn ask<I: Item, S: Site<I>>(
    site: &S,
    items: &[I],
    failed: &[usize],
    all: bool,
) -> HashMap<usize, Rescued<S::Link, S::Here>> {
    let mut out = HashMap::new();
    let mut groups = OwnerGroups::new();
    let now = site.now();
    for &i in failed {
        match site.replica(&items[i]) {
            None => {}
            Some(Standby::Here(here)) => {
                let (mut answer, mark) = here.stand_in(&items[i], now);
                answer.replica = true;
                site.replica_answered();
                let hold = mark.filter(|_| all).map(|m| Hold::Here(here, m));
                let reply = PeerAnswer::Answer(answer);
                out.insert(i, Rescued { reply, hold });
            }
            Some(Standby::Member(replica, link)) => {
                let shadow = (all && items[i].shadow()).then_some(i);
                groups.add((replica, shadow), &link, i);
            }
        }
    }
    if groups.is_empty() {
        return out;
    }
    let links = groups.clients();
    let replies = groups
        .send(
            |i| items[i].peer_check(),
            |link: S::Link, checks| async move { link.send_replica(checks, all).await },
        )
        .await;
    for (i, reply) in replies {
        let (reply, hold) = match (reply, links.get(&i)) {
            (Ok(PeerAnswer::Answer(mut a)), _) => {
                a.replica = true;
                (PeerAnswer::Answer(a), None)
            }
            (Ok(PeerAnswer::Blocked { mut answer, source }), _) => {
                answer.replica = true;
                (PeerAnswer::Blocked { answer, source }, None)
            }
            (Ok(PeerAnswer::Held { mut answer, mark }), Some(link)) => {
                answer.replica = true;
                let hold = Hold::Owner(link.clone(), mark);
                (PeerAnswer::Answer(answer), Some(hold))
            }
            _ => continue,
        };
        site.replica_answered();
        out.insert(i, Rescued { reply, hold });
    }
    out
}
