//! The coordinator's three ways to decide: one check ([`check`]), many checks grouped by owner
//! ([`Batch`]: one group, one frame per owner, all owners at once, answers in order), and one
//! request all-or-nothing ([`check_all`]).

use super::hold::give_back;
use super::{FallbackCause, Here, Hold, Item, OwnerLink, Route, Site, replica};
use crate::check::CheckError;
use crate::link::ForwardError;
use crate::link::fanout::{self, OwnerGroups};
use crate::rule::Mode;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::PeerAnswer;
use std::sync::Arc;

type Answered = Result<CheckAnswer, CheckError>;

/// Decides one check wherever it belongs.
pub async fn check<I: Item, S: Site<I>>(site: &S, item: &I) -> Answered {
    match site.route(item) {
        Route::Here(here) => Ok(here.decide(item)),
        Route::Leased(answer, _) => Ok(answer),
        Route::Share { own } => minority(site, item, own).map(|(a, _)| a),
        Route::Owner(_, link) => {
            site.forwarded();
            let sent = link.send(vec![item.peer_check()]).await;
            let reply = sent.and_then(|mut a| a.pop().ok_or(ForwardError::Mismatch));
            let items = std::slice::from_ref(item);
            let mut filled = replica::fill_in(site, items, vec![(0, reply)], false).await;
            match filled.pop() {
                Some((_, reply, _)) => settle(site, item, reply),
                None => Err(CheckError::Unavailable("no answer was produced")),
            }
        }
    }
}

/// A batch: many checks being decided, those decided here at one instant as they are added, each
/// owner's as one group sent by [`Batch::finish`].
pub struct Batch<L> {
    now: u64,
    /// By the index of the checks added with [`Batch::add`].
    results: Vec<Option<Answered>>,
    groups: OwnerGroups<Arc<str>, L>,
    /// Checks that could not be made ready: their place among all, and why.
    errors: Vec<(usize, CheckError)>,
}

impl<L: OwnerLink> Batch<L> {
    /// For up to `n` checks, those decided here at `now`.
    pub fn new(n: usize, now: u64) -> Self {
        Self {
            now,
            results: Vec::with_capacity(n),
            groups: OwnerGroups::new(),
            errors: Vec::new(),
        }
    }

    /// The next check: decided now here or from the share, or grouped for its owner.
    pub fn add<I: Item, S: Site<I, Link = L>>(&mut self, site: &S, item: &I) {
        let i = self.results.len();
        match site.route(item) {
            Route::Here(here) => self.results.push(Some(Ok(here.decide_at(item, self.now)))),
            Route::Leased(answer, _) => self.results.push(Some(Ok(answer))),
            Route::Share { own } => self
                .results
                .push(Some(minority(site, item, own).map(|(a, _)| a))),
            Route::Owner(owner, link) => {
                self.results.push(None);
                self.groups.add(owner, &link, i);
                site.forwarded();
            }
        }
    }

    /// The next check has no answer but `error` (it could not be made ready; it is not one of
    /// the `items` handed to [`Batch::finish`]).
    pub fn add_error(&mut self, error: CheckError) {
        self.errors
            .push((self.results.len() + self.errors.len(), error));
    }

    /// Sends each owner its group, all at once, and returns every answer in the order added
    /// (`items`: the checks given to [`Batch::add`], in order).
    pub async fn finish<I: Item, S: Site<I, Link = L>>(
        self,
        site: &S,
        items: &[I],
    ) -> Vec<Answered> {
        let Self {
            mut results,
            groups,
            errors,
            ..
        } = self;
        if !groups.is_empty() {
            let replies = groups
                .send(
                    |i| items[i].peer_check(),
                    |link, checks| async move { link.send(checks).await },
                )
                .await;
            for (i, reply, _) in replica::fill_in(site, items, replies, false).await {
                results[i] = Some(settle(site, &items[i], reply));
            }
        }
        let answered = results
            .into_iter()
            .map(|r| r.unwrap_or(Err(CheckError::Unavailable("no answer was produced"))));
        if errors.is_empty() {
            return answered.collect();
        }
        let mut all = Vec::with_capacity(answered.len() + errors.len());
        let mut answered = answered.fuse();
        for (at, error) in errors {
            while all.len() < at {
                match answered.next() {
                    Some(a) => all.push(a),
                    None => break,
                }
            }
            all.push(Err(error));
        }
        all.extend(answered);
        all
    }
}

/// Decides one request's checks all-or-nothing: admitted only when every non-shadow check
/// admits; otherwise every check that took its cost gives it back before this returns.
///
/// 1. Global checks decided here are asked first without counting (their G-counters cannot
///    give back).
/// 2. Owner checks are decided at once: this member's through [`Here::decide_all`], each other
///    owner's as one all-or-nothing group (it gives back itself when its group denies), an
///    unreachable owner's from the fallback share (or denied, for a `closed` rule).
/// 3. Admitted so far: the global checks now count (a concurrent request may have taken
///    the room meanwhile; such a late denial denies the request, and global checks that
///    counted already stay counted: never more admitted, at worst a false deny).
/// 4. Denied: refunds go to every owner that holds a cost, all at once.
pub async fn check_all<I: Item, S: Site<I>>(site: &S, items: &[I]) -> Vec<Answered>
where
    S::Here: Clone,
{
    let now = site.now();
    let mut results: Vec<Option<Answered>> = vec![None; items.len()];
    let mut holds: Vec<Option<Hold<S::Link, S::Here>>> = (0..items.len()).map(|_| None).collect();
    let mut local: Vec<usize> = Vec::new();
    let mut here = None;
    let mut groups = OwnerGroups::new();
    let mut global: Vec<(usize, S::Here)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match site.route(item) {
            Route::Here(h) if item.resolved().is_some_and(|r| r.mode == Mode::Global) => {
                results[i] = Some(Ok(h.peek(item, now)));
                global.push((i, h));
            }
            Route::Here(h) => {
                local.push(i);
                here = Some(h);
            }
            Route::Leased(answer, taken) => {
                results[i] = Some(Ok(answer));
                holds[i] = taken.map(Hold::Lease);
            }
            Route::Share { own } => match minority(site, item, own) {
                Ok((a, hold)) => {
                    results[i] = Some(Ok(a));
                    holds[i] = hold;
                }
                Err(e) => results[i] = Some(Err(e)),
            },
            Route::Owner(owner, link) => {
                // A shadow check travels in a group of its own: the owner may not know it
                // is one (an edge's own shadow setting), and must not let its denial give
                // back the others'.
                let group = (owner, item.shadow().then_some(i));
                groups.add(group, &link, i);
                site.forwarded();
            }
        }
    }
    if let Some(h) = here {
        let mine: Vec<&I> = local.iter().map(|&i| &items[i]).collect();
        for (&i, decided) in local.iter().zip(h.decide_all(&mine, now)) {
            if let Some((answer, mark)) = decided {
                results[i] = Some(Ok(answer));
                holds[i] = mark.map(|m| Hold::Here(h.clone(), m));
            }
        }
    }
    let links = groups.clients();
    let replies = groups
        .send(
            |i| items[i].peer_check(),
            |link, checks| async move { link.send_all(checks).await },
        )
        .await;
    // The owners that did not answer: their replicas decide those checks, all-or-nothing per
    // replica; what they hold is refunded there (see `replica`).
    for (i, reply, held) in replica::fill_in(site, items, replies, true).await {
        let item = &items[i];
        if held.is_some() {
            holds[i] = held;
        }
        if let Ok(PeerAnswer::Held { answer, mark }) = reply {
            results[i] = Some(Ok(answer));
            holds[i] = links.get(&i).map(|l| Hold::Owner(l.clone(), mark));
            continue;
        }
        let mut taken = None;
        results[i] = Some(fanout::settle(reply, |e| {
            let (a, t) = site.fall_back(item, FallbackCause::Unreachable(e))?;
            taken = t;
            Ok(a)
        }));
        if let Some(t) = taken {
            holds[i] = Some(Hold::Share(t));
        }
    }
    let blocks = |r: &Option<Answered>, item: &I| match r {
        Some(Ok(a)) => !a.allowed && !item.shadow(),
        _ => true,
    };
    let mut denied = results.iter().zip(items).any(|(r, p)| blocks(r, p));
    if !denied {
        for (i, h) in &global {
            let item = &items[*i];
            results[*i] = Some(Ok(h.decide_at(item, now)));
            if blocks(&results[*i], item) {
                denied = true;
                break;
            }
        }
    }
    if denied {
        give_back(site, items, &mut results, holds).await;
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(CheckError::Unavailable("no answer was produced"))))
        .collect()
}

/// Turns the owner's reply to one check (or its replica's) — or their absence — into an
/// answer.
fn settle<I: Item, S: Site<I>>(
    site: &S,
    item: &I,
    reply: Result<PeerAnswer, ForwardError>,
) -> Answered {
    fanout::settle(reply, |e| {
        site.fall_back(item, FallbackCause::Unreachable(e))
            .map(|(a, _)| a)
    })
}

/// The answer without an owner: the fallback share; for a key this member owned under the
/// last ring (`own`), its exact bucket too, which knows what was spent before it lost the
/// owners: admitted only when both admit. Also what the answer holds, for an all-or-nothing
/// request to give back.
#[allow(clippy::type_complexity)]
fn minority<I: Item, S: Site<I>>(
    site: &S,
    item: &I,
    own: Option<S::Here>,
) -> Result<(CheckAnswer, Option<Hold<S::Link, S::Here>>), CheckError> {
    let (share, taken) = site.fall_back(item, FallbackCause::NoOwner)?;
    let Some(here) = own.filter(|_| share.allowed) else {
        return Ok((share, taken.map(Hold::Share)));
    };
    let (exact, mark) = here.hold_at(item, site.now());
    if !exact.allowed {
        if let Some(t) = &taken {
            site.refund_share(t);
        }
        return Ok((
            CheckAnswer {
                degraded: true,
                ..exact
            },
            None,
        ));
    }
    let hold = match (mark, taken) {
        (Some(m), Some(t)) => Some(Hold::Both(here, m, t)),
        (Some(m), None) => Some(Hold::Here(here, m)),
        (None, taken) => taken.map(Hold::Share),
    };
    let answer = CheckAnswer {
        remaining: share.remaining.min(exact.remaining),
        ..share
    };
    Ok((answer, hold))
}
