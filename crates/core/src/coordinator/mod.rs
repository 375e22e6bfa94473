//! The coordinator: where each check is decided — here, at its owner, or from the fallback
//! share — and how one request is held to several limits all-or-nothing. A node and the SDK
//! run this one code; what differs between them comes in through [`Site`] (routing, the
//! fallback's policy, counters) and [`Here`] (a node decides some checks itself; the SDK
//! never does: [`Nowhere`]).
//!
//! # Layout
//! - [`share`] — the fallback share as one type ([`Share`], [`ShareTaken`]), its salted bucket
//!   ids.
//! - [`owner`] — [`OwnerLink`]: how the coordinator reaches an owner (a [`crate::link::PeerClient`]).
//! - [`checks`] — one check, many checks (grouped by owner), one request all-or-nothing.
//! - [`hold`] — what an all-or-nothing check holds ([`Hold`]), and giving it all back.
//! - `replica` — failover: checks whose owner did not answer go to its replica first.

pub mod checks;
pub mod hold;
pub mod owner;
mod replica;
pub mod share;

#[cfg(test)]
mod tests;

pub use checks::{Batch, check, check_all};
pub use hold::Hold;
pub use owner::OwnerLink;
pub use replica::Standby;
pub use share::{Fallback, FallbackShare, Share, ShareTaken, fallback_id};

use crate::check::{CheckError, Resolved};
use crate::lease;
use crate::link::ForwardError;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{BlockSource, Mark, PeerAnswer, PeerCheck, PeerRefund};
use std::sync::Arc;

/// A check made ready to route: its bucket, its cost, its rule, and how it travels.
pub trait Item {
    /// The bucket's identity.
    fn id(&self) -> u64;
    fn cost(&self) -> u64;
    /// The rule resolved; `None`: a named rule never learnt (an SDK before any node answered).
    fn resolved(&self) -> Option<&Resolved>;
    /// The check as it travels to its owner.
    fn peer_check(&self) -> PeerCheck;
    /// The refund of what the owner took under `mark`.
    fn peer_refund(&self, mark: Mark) -> PeerRefund;

    /// A shadow rule's check: its denial is reported, never enforced.
    fn shadow(&self) -> bool {
        self.resolved().is_some_and(|r| r.shadow)
    }
}

/// Where one check is decided.
pub enum Route<L, H> {
    /// Here, by this member.
    Here(H),
    /// At its owner (by id), reached over `L`.
    Owner(Arc<str>, L),
    /// From the fallback share, with no owner to ask (a node without a majority, an SDK that
    /// knows no member or not the rule); `own`: also this member's exact bucket, for a key it
    /// owned under the last ring (admitted only when both admit).
    Share { own: Option<H> },
    /// Decided already, on a lease this member holds (see [`crate::lease`]): the answer, and
    /// what it took from the slice (`None`: denied, nothing taken), given back through
    /// [`Site::refund_lease`] when an all-or-nothing request is denied.
    Leased(CheckAnswer, Option<lease::SliceTaken>),
}

/// Why a check falls back to the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackCause {
    /// No owner to ask (see [`Route::Share`]).
    NoOwner,
    /// The owner did not answer.
    Unreachable(ForwardError),
}

/// What the caller that coordinates brings: its routing, its fallback, its counters.
pub trait Site<I: Item> {
    /// How an owner is reached.
    type Link: OwnerLink;
    /// How a check is decided here.
    type Here: Here<I>;

    /// Where `item` is decided.
    fn route(&self, item: &I) -> Route<Self::Link, Self::Here>;

    /// Now, on this member's clock.
    fn now(&self) -> u64;

    /// The answer without an owner, and what it took of the share (see [`Share::fall_back`]);
    /// an error only where the caller fails closed itself (an SDK in `FailMode::Closed`).
    fn fall_back(
        &self,
        item: &I,
        why: FallbackCause,
    ) -> Result<(CheckAnswer, Option<ShareTaken>), CheckError>;

    /// Gives back what [`Site::fall_back`] took.
    fn refund_share(&self, taken: &ShareTaken);

    /// Gives back to its slice what a check decided on a lease took ([`Route::Leased`]).
    fn refund_lease(&self, _taken: &lease::SliceTaken) {}

    /// Who stands in when `item`'s owner does not answer: the owner's first live replica
    /// (this member, or another and the link to it), which decides on its copy of the bucket.
    /// `None` (no replicas, or none live): the fallback share decides.
    fn replica(&self, _item: &I) -> Option<Standby<Self::Link, Self::Here>> {
        None
    }

    /// A replica answered a check its owner did not.
    fn replica_answered(&self) {}

    /// `item` was grouped to go to its owner.
    fn forwarded(&self) {}

    /// An owner replied (or not) to one check.
    fn answered(&self, _reply: &Result<PeerAnswer, ForwardError>) {}

    /// The check `item`, at `index` among those handed to the coordinator, was denied
    /// (`answer`) by a block of `source` that its owner (or the replica standing in) knows: a
    /// caller that has not heard of the block yet still answers it as blocked.
    fn blocked(&self, _index: usize, _item: &I, _answer: &CheckAnswer, _source: BlockSource) {}

    /// An all-or-nothing request gave back what it held; `lost` refunds did not reach their
    /// owner (their costs stay taken: a false deny at worst).
    fn gave_back(&self, _lost: u64) {}
}

/// Deciding here: a node's own buckets and global counters.
pub trait Here<I> {
    /// Decides `item` now (reading the clock as late as it can).
    fn decide(&self, item: &I) -> CheckAnswer;
    /// Decides `item` at `now` (one instant for a whole batch).
    fn decide_at(&self, item: &I, now: u64) -> CheckAnswer;
    /// Decides at `now` a check that may have to give its cost back: the answer and the mark
    /// of what it took (`None`: nothing that can be given back).
    fn hold_at(&self, item: &I, now: u64) -> (CheckAnswer, Option<Mark>);
    /// Gives back what [`Here::hold_at`] took under `mark`.
    fn refund(&self, item: &I, mark: Mark);
    /// Decides one request's checks that belong here, all-or-nothing at `now`; each answer
    /// with the mark of what it still holds (`None`: not decided).
    fn decide_all(&self, items: &[&I], now: u64) -> Vec<Option<(CheckAnswer, Option<Mark>)>>;
    /// What a global check would answer at `now`, without counting it.
    fn peek(&self, item: &I, now: u64) -> CheckAnswer;
    /// Decides `item` at `now` on this member's copy of its bucket, as the replica of an owner
    /// that did not answer: the answer and the mark of what it took (given back through
    /// [`Here::refund`]).
    fn stand_in(&self, item: &I, now: u64) -> (CheckAnswer, Option<Mark>);
}

/// A member's deciding, borrowed: what a [`Site`] hands out per route (`Route::Here(&local)`).
impl<I, H: Here<I> + ?Sized> Here<I> for &H {
    #[inline]
    fn decide(&self, item: &I) -> CheckAnswer {
        (**self).decide(item)
    }
    #[inline]
    fn decide_at(&self, item: &I, now: u64) -> CheckAnswer {
        (**self).decide_at(item, now)
    }
    #[inline]
    fn hold_at(&self, item: &I, now: u64) -> (CheckAnswer, Option<Mark>) {
        (**self).hold_at(item, now)
    }
    fn refund(&self, item: &I, mark: Mark) {
        (**self).refund(item, mark)
    }
    fn decide_all(&self, items: &[&I], now: u64) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        (**self).decide_all(items, now)
    }
    fn peek(&self, item: &I, now: u64) -> CheckAnswer {
        (**self).peek(item, now)
    }
    fn stand_in(&self, item: &I, now: u64) -> (CheckAnswer, Option<Mark>) {
        (**self).stand_in(item, now)
    }
}

/// A site that never decides here (the SDK): no value of it exists, so [`Route::Here`] never
/// does either.
#[derive(Debug, Clone, Copy)]
pub enum Nowhere {}

impl<I> Here<I> for Nowhere {
    fn decide(&self, _: &I) -> CheckAnswer {
        match *self {}
    }
    fn decide_at(&self, _: &I, _: u64) -> CheckAnswer {
        match *self {}
    }
    fn hold_at(&self, _: &I, _: u64) -> (CheckAnswer, Option<Mark>) {
        match *self {}
    }
    fn refund(&self, _: &I, _: Mark) {
        match *self {}
    }
    fn decide_all(&self, _: &[&I], _: u64) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        match *self {}
    }
    fn peek(&self, _: &I, _: u64) -> CheckAnswer {
        match *self {}
    }
    fn stand_in(&self, _: &I, _: u64) -> (CheckAnswer, Option<Mark>) {
        match *self {}
    }
}
