//! What an all-or-nothing check holds until its request is known to be admitted, and how a
//! denied request gives it all back: here at once, at each other owner as one refund group,
//! all owners at once.

use super::{Here, Item, OwnerLink, ShareTaken, Site};
use crate::answer::given_back;
use crate::check::CheckError;
use crate::lease;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{Mark, PeerAnswer, PeerRefund};
use std::collections::HashMap;

/// What one check holds: where its cost was taken, and the mark to give it back under.
#[derive(Clone)]
pub enum Hold<L, H> {
    /// Taken here, under this mark.
    Here(H, Mark),
    /// Taken at another owner, under this mark.
    Owner(L, Mark),
    /// Taken from this member's fallback share (owner unreachable).
    Share(ShareTaken),
    /// Taken here and from the share (a key this node owned, without a majority).
    Both(H, Mark, ShareTaken),
    /// Taken from a slice of a lease this member holds.
    Lease(lease::SliceTaken),
}

/// Gives back every cost `holds` (by index of `items`) took, and makes each answer in
/// `results` read as if the request had never come. Refunds that cannot reach their owner
/// leave the cost taken (never more admitted; at worst a false deny until the bucket refills);
/// the site learns how many ([`Site::gave_back`]).
pub async fn give_back<I: Item, S: Site<I>>(
    site: &S,
    items: &[I],
    results: &mut [Option<Result<CheckAnswer, CheckError>>],
    holds: Vec<Option<Hold<S::Link, S::Here>>>,
) {
    let mut remote: HashMap<String, (S::Link, Vec<PeerRefund>)> = HashMap::new();
    for (i, hold) in holds.into_iter().enumerate() {
        let Some(hold) = hold else { continue };
        let item = &items[i];
        let mut cost = item.cost();
        match hold {
            Hold::Here(here, mark) => here.refund(item, mark),
            Hold::Share(taken) => {
                cost = taken.cost();
                site.refund_share(&taken);
            }
            Hold::Both(here, mark, taken) => {
                here.refund(item, mark);
                site.refund_share(&taken);
            }
            Hold::Lease(taken) => site.refund_lease(&taken),
            Hold::Owner(link, mark) => {
                remote
                    .entry(link.addr().to_owned())
                    .or_insert_with(|| (link.clone(), Vec::new()))
                    .1
                    .push(item.peer_refund(mark));
            }
        }
        if let Some(Ok(a)) = &mut results[i] {
            *a = given_back(*a, cost);
        }
    }
    let sends = remote.into_values().map(|(link, refunds)| async move {
        let n = refunds.len() as u64;
        match link.refund(refunds).await {
            Ok(answers) => answers
                .iter()
                .filter(|a| !matches!(a, PeerAnswer::Refunded))
                .count() as u64,
            Err(_) => n,
        }
    });
    let lost: u64 = futures::future::join_all(sends).await.into_iter().sum();
    site.gave_back(lost);
}
