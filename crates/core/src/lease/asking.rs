//! The holder's side of leases on the wire, one code for a node and the SDK: asking owners for
//! slices when asks are due (one frame per owner, all owners at once) and giving back what
//! slices had left (as refunds under their grants' marks), over a connection of its own to
//! each owner ([`LeaseLink`]). What differs between a node and the SDK — who owns a bucket,
//! what a refund of a bucket the holder owns itself means — comes in through [`Owners`].

use super::{Due, Held, Release, Return};
use crate::link::{Session, SessionError, Sessions};
use ringlimit_proto::peer::{
    AnswerGroup, CALENDAR_SINCE, Frame, LEASE_SINCE, LeaseAsk, LeaseGrant, PeerAnswer, PeerRefund,
    RefundGroup,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long an owner may take to answer asks: checks go to the owner meanwhile, so this
/// bounds only how long the asking task waits.
const LEASE_WITHIN: Duration = Duration::from_millis(500);
/// How often held slices are looked at (expired ones go back) while any are held; an ask that
/// becomes due wakes the task at once.
const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// A connection of its own to a bucket owner, for leases: asks, and what slices had left.
pub struct LeaseLink(Session);

impl LeaseLink {
    pub fn new(session: Session) -> Self {
        Self(session)
    }

    /// The owner's peer address.
    pub fn addr(&self) -> &str {
        self.0.addr()
    }

    /// The owner's grants for `asks`, in order. An owner older than [`LEASE_SINCE`] grants
    /// nothing (an empty answer: its keys are decided there, as before). On an error the
    /// connection is dropped.
    /// An owner older than [`CALENDAR_SINCE`] is not sent asks of inline rules with calendar
    /// windows (its decoder would fail the whole frame): each is answered `unsupported` here.
    pub async fn ask(&mut self, asks: Vec<LeaseAsk>) -> Result<Vec<LeaseGrant>, SessionError> {
        let version = self.0.version().await?;
        if version < LEASE_SINCE {
            return Ok(Vec::new());
        }
        let unsupported = |_: &LeaseAsk| LeaseGrant::Error {
            code: "unsupported".to_owned(),
            message: format!(
                "the owner speaks peer protocol {version}; inline rules with calendar windows need {CALENDAR_SINCE}"
            ),
        };
        let older = version < CALENDAR_SINCE;
        let (sent, kept): (Vec<_>, Vec<_>) = asks
            .into_iter()
            .enumerate()
            .partition(|(_, a)| !(older && a.rule.has_calendar()));
        if sent.is_empty() {
            return Ok(kept.iter().map(|(_, a)| unsupported(a)).collect());
        }
        let order: Vec<usize> = sent.iter().map(|(i, _)| *i).collect();
        let asks = sent.into_iter().map(|(_, a)| a).collect();
        let grants = match self.exchange(Frame::Lease { asks }).await? {
            Frame::Leased { grants } => grants,
            other => return self.unexpected(other),
        };
        if kept.is_empty() {
            return Ok(grants);
        }
        // Back in the order asked: the owner's grants where sent, `unsupported` elsewhere.
        let mut out: Vec<Option<LeaseGrant>> = vec![None; order.len() + kept.len()];
        for (i, g) in order.into_iter().zip(grants) {
            out[i] = Some(g);
        }
        for (i, a) in &kept {
            out[*i] = Some(unsupported(a));
        }
        Ok(out.into_iter().map_while(|g| g).collect())
    }

    /// Gives back what slices had left, as refunds under their grants' marks; returns how
    /// many the owner applied.
    pub async fn give_back(&mut self, refunds: Vec<PeerRefund>) -> Result<usize, SessionError> {
        let frame = Frame::Refunds(vec![RefundGroup { id: 0, refunds }]);
        match self.exchange(frame).await? {
            Frame::Answers(groups) => Ok(groups
                .iter()
                .flat_map(|g: &AnswerGroup| &g.answers)
                .filter(|a| matches!(a, PeerAnswer::Refunded))
                .count()),
            other => self.unexpected(other),
        }
    }

    async fn exchange(&mut self, frame: Frame) -> Result<Frame, SessionError> {
        let reply = self.0.request(&frame, LEASE_WITHIN).await;
        if reply.is_err() {
            self.0.close();
        }
        reply
    }

    fn unexpected<T>(&mut self, other: Frame) -> Result<T, SessionError> {
        self.0.close();
        Err(SessionError::Unexpected(other.kind()))
    }
}

/// The asking task's counters.
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Answers to asks: slices granted, refused while the bucket denies, refused otherwise
    /// (kept by its owner, not leasable, an error), and asks that got no answer.
    pub granted: AtomicU64,
    pub denied: AtomicU64,
    pub refused: AtomicU64,
    pub unanswered: AtomicU64,
    /// Tokens granted in slices.
    pub tokens_granted: AtomicU64,
    /// Unused tokens given back to owners, and those that did not reach them (they stay
    /// taken: under-admission only).
    pub tokens_returned: AtomicU64,
    pub tokens_lost: AtomicU64,
}

/// Who owns what, as the holder sees it now (a snapshot: a node's view, the SDK's topology).
pub trait Owners {
    /// The member that owns bucket `id` and its peer address; `None` when no other member
    /// does (the holder owns it itself, or knows no owner).
    fn owner(&self, id: u64) -> Option<(Arc<str>, String)>;
    /// The ring's members: every lease is released when they change (owners may have).
    fn ring(&self) -> Vec<Arc<str>>;
    /// Gives back here what a slice of a bucket with no other owner had left (a node that owns
    /// it now); returns whether it was given back.
    fn refund_here(&self, _refund: &PeerRefund) -> bool {
        false
    }
}

/// Asks and gives back for one holder until dropped.
pub struct Asker {
    held: Arc<Held>,
    sessions: Sessions,
    stats: Arc<LeaseStats>,
    links: HashMap<Arc<str>, LeaseLink>,
    ring: Vec<Arc<str>>,
}

impl Asker {
    pub fn new(held: Arc<Held>, sessions: Sessions, stats: Arc<LeaseStats>) -> Self {
        Self {
            held,
            sessions,
            stats,
            links: HashMap::new(),
            ring: Vec::new(),
        }
    }

    /// Runs until dropped: wakes when an ask is due (and every [`SWEEP_EVERY`] while slices
    /// are held), reads who owns what from `owners`, the time from `now`.
    pub async fn run<O: Owners>(mut self, owners: impl Fn() -> O, now: impl Fn() -> u64) {
        loop {
            if self.held.count() == 0 {
                self.held.wake.notified().await;
            } else {
                tokio::select! {
                    () = self.held.wake.notified() => {}
                    () = tokio::time::sleep(SWEEP_EVERY) => {}
                }
            }
            self.step(&owners(), &now).await;
        }
    }

    /// One round: releases every lease when the ring changed, sends the asks due, gives back
    /// what is due back.
    pub async fn step<O: Owners>(&mut self, owners: &O, now: &impl Fn() -> u64) {
        let ring = owners.ring();
        if ring != self.ring {
            if !self.ring.is_empty() {
                let n = self.held.release_all(Release::Ring);
                tracing::debug!(released = n, "ring changed; leases released");
            }
            self.ring = ring;
        }
        let due = self.held.due(now());
        self.ask(owners, due, now).await;
        let back = self.held.returns(now());
        self.give_back(owners, back).await;
    }

    /// Sends the asks due, one frame per owner, all owners at once.
    async fn ask<O: Owners>(&mut self, owners: &O, due: Vec<Due>, now: &impl Fn() -> u64) {
        if due.is_empty() {
            return;
        }
        let held = self.held.clone();
        let by_owner = self.by_owner(
            owners,
            due,
            |d| d.id,
            |d| {
                // No other member owns the bucket now: its checks are decided without a lease.
                held.release(d.id, Release::Ring);
            },
        );
        let sends = self.links.iter_mut().filter_map(|(owner, link)| {
            let due = by_owner.get(owner)?;
            let asks = due.iter().map(|d| d.ask.clone()).collect();
            Some(async move { (owner.clone(), link.ask(asks).await) })
        });
        let answers = futures::future::join_all(sends).await;
        let now = now();
        let s = &self.stats;
        for (owner, answer) in answers {
            let Some(due) = by_owner.get(&owner) else {
                continue;
            };
            let grants = match answer {
                Ok(grants) => grants,
                Err(e) => {
                    tracing::debug!(%owner, error = %e, "lease asks unanswered");
                    s.unanswered.fetch_add(due.len() as u64, Ordering::Relaxed);
                    for d in due {
                        self.held.unanswered(d.id, now);
                    }
                    continue;
                }
            };
            let mut grants = grants.into_iter();
            for d in due {
                // An owner older than protocol 6 answers nothing: its keys stay there.
                let g = grants.next().unwrap_or_else(|| LeaseGrant::Error {
                    code: "unsupported".to_owned(),
                    message: "the owner does not lease".to_owned(),
                });
                let counter = match &g {
                    LeaseGrant::Granted { tokens, .. } => {
                        s.tokens_granted.fetch_add(*tokens, Ordering::Relaxed);
                        &s.granted
                    }
                    LeaseGrant::Refused { answer } if !answer.allowed => &s.denied,
                    LeaseGrant::Refused { .. } | LeaseGrant::Error { .. } => &s.refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.held.answered(d, g, now);
            }
        }
    }

    /// Gives back what slices had left: to each owner as one refund frame, or here.
    async fn give_back<O: Owners>(&mut self, owners: &O, back: Vec<Return>) {
        if back.is_empty() {
            return;
        }
        let s = self.stats.clone();
        let by_owner = self.by_owner(
            owners,
            back,
            |r| r.id,
            |r| {
                let counter = if owners.refund_here(&r.refund) {
                    &s.tokens_returned
                } else {
                    &s.tokens_lost
                };
                counter.fetch_add(r.refund.cost, Ordering::Relaxed);
            },
        );
        let sends = self.links.iter_mut().filter_map(|(owner, link)| {
            let back = by_owner.get(owner)?;
            let refunds: Vec<PeerRefund> = back.iter().map(|r| r.refund.clone()).collect();
            let tokens: u64 = refunds.iter().map(|r| r.cost).sum();
            Some(async move { (link.give_back(refunds).await, tokens) })
        });
        for (result, tokens) in futures::future::join_all(sends).await {
            let counter = if result.is_ok() {
                &s.tokens_returned
            } else {
                &s.tokens_lost
            };
            counter.fetch_add(tokens, Ordering::Relaxed);
        }
    }

    /// `items` grouped by their bucket's owner, with a link open to each owner (links to
    /// members that left, or moved, are dropped); `mine` takes those no other member owns.
    fn by_owner<T, O: Owners>(
        &mut self,
        owners: &O,
        items: Vec<T>,
        id: impl Fn(&T) -> u64,
        mut mine: impl FnMut(T),
    ) -> HashMap<Arc<str>, Vec<T>> {
        let mut out: HashMap<Arc<str>, Vec<T>> = HashMap::new();
        for item in items {
            let Some((member, addr)) = owners.owner(id(&item)) else {
                mine(item);
                continue;
            };
            let link = self
                .links
                .entry(member.clone())
                .or_insert_with(|| LeaseLink::new(self.sessions.open(&addr)));
            if link.addr() != addr {
                *link = LeaseLink::new(self.sessions.open(&addr));
            }
            out.entry(member).or_default().push(item);
        }
        self.links
            .retain(|m, _| out.contains_key(m) || self.ring.contains(m));
        out
    }
}
