//! What a client SDK in any language asks of the key's owner over ringlimit.v1, beside its
//! checks: checks held so that they can be given back (an all-or-nothing group decided at
//! several owners), slices of hot buckets (leases), and give-backs of what those took. Each
//! client has a ledger ([`Holds`]) of what was taken for it; a give-back is bounded by it, so
//! that no one refills a bucket with marks they made up (see [`crate::local::holds`]).

use super::{Check, CheckService, Edge, Outcome};
use crate::local::holds::Holds;
use crate::metrics::seconds;
use crate::rules::{Prepared, RuleSpec};
use parking_lot::Mutex;
use ringlimit_core::check::CheckError;
use ringlimit_core::rule::Mode;
use ringlimit_proto::peer::{LeaseGrant, Mark};

/// A check decided for a client that may hold it: its outcome, and the mark of what it took
/// when it was held.
pub type HeldOutcome = Result<(Outcome, Option<Mark>), CheckError>;

/// One ask for a slice of a bucket.
#[derive(Debug, Clone, Copy)]
pub struct LeaseAsk<'a> {
    pub key: &'a str,
    pub rule: RuleSpec<'a>,
    /// Tokens wanted (at least 1; cut to what the bucket can spare).
    pub want: u64,
}

/// One give-back: `tokens` of what the admission `mark` of (`key`, `rule`) took.
#[derive(Debug, Clone, Copy)]
pub struct GiveBack<'a> {
    pub key: &'a str,
    pub rule: RuleSpec<'a>,
    pub tokens: u64,
    pub mark: Mark,
}

impl CheckService {
    /// Whether a check of `p` asked to be held is decided here and held: an owner-mode rule
    /// whose bucket this node owns, and no block on the key (a block answers without taking).
    fn held_here(&self, p: &Prepared<'_>, now: u64) -> bool {
        p.resolved.mode == Mode::Owner && self.router.owns(p.id) && self.block_of(p, now).is_none()
    }

    /// Decides checks that arrived at `edge`, those flagged `hold` held where this node owns
    /// their bucket: an admitted one answers with the mark of what it took, recorded in
    /// `ledger` (the client's). The others, and a held check of a bucket another member owns,
    /// are decided as [`CheckService::check_many`] decides them, with no mark.
    pub async fn check_many_holding(
        &self,
        edge: Edge,
        checks: &[(Check<'_>, bool)],
        ledger: &Mutex<Holds>,
    ) -> Vec<HeldOutcome> {
        let start = self.local.now();
        let mut here = Vec::new();
        let mut here_at = Vec::new();
        let mut rest = Vec::new();
        let mut rest_at = Vec::new();
        for (i, (c, hold)) in checks.iter().enumerate() {
            if *hold
                && let Ok(p) = self.prepare(c, c.cost)
                && self.held_here(&p, start)
            {
                here.push(p);
                here_at.push(i);
                continue;
            }
            rest.push(*c);
            rest_at.push(i);
        }
        let mut out: Vec<Option<HeldOutcome>> = (0..checks.len()).map(|_| None).collect();
        if !rest.is_empty() {
            let decided = if rest.len() == 1 {
                vec![self.check(edge, &rest[0]).await]
            } else {
                self.check_many(edge, &rest).await
            };
            for (i, r) in rest_at.into_iter().zip(decided) {
                out[i] = Some(r.map(|o| (o, None)));
            }
        }
        if !here.is_empty() {
            let held = self.router.hold_here(&here).await;
            let end = self.local.now();
            let mut ledger = ledger.lock();
            for ((i, p), (answer, mark)) in here_at.into_iter().zip(&here).zip(held) {
                if let Some(m) = mark {
                    ledger.hold(p.id, m, p.cost);
                }
                out[i] = Some(Ok((self.outcome(answer, p, end), mark)));
            }
            drop(ledger);
            self.metrics.count_edge(edge, here.len() as u64);
            self.metrics.check_duration.observe(seconds(start, end));
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(CheckError::Unavailable("no answer was produced"))))
            .collect()
    }

    /// Answers a client's lease asks as the owner (the peer port's path: `Local::lease_ask`),
    /// slices granted to `holder` recorded in `ledger` so that their unspent tokens can be
    /// given back. In order; an invalid ask's error in its place.
    pub async fn lease(
        &self,
        holder: &str,
        asks: &[LeaseAsk<'_>],
        ledger: &Mutex<Holds>,
    ) -> Vec<LeaseGrant> {
        let rules = self.local.rules();
        let prepared: Vec<(Result<Prepared<'_>, CheckError>, u64)> = asks
            .iter()
            .map(|a| (rules.prepare_check(a.key, a.rule, 1), a.want))
            .collect();
        let grants = self.router.lease_here(&prepared, holder).await;
        let mut ledger = ledger.lock();
        for ((p, _), g) in prepared.iter().zip(&grants) {
            if let (Ok(p), LeaseGrant::Granted { tokens, mark, .. }) = (p, g) {
                ledger.hold(p.id, *mark, *tokens);
            }
        }
        grants
    }

    /// Gives back what `items` name, each at most what `ledger` says its admission took for
    /// this client, once: the tokens honoured, in order (0 for an invalid item, a mark the
    /// ledger does not hold, or one given back already: nothing changes then).
    pub fn give_back(&self, items: &[GiveBack<'_>], ledger: &Mutex<Holds>) -> Vec<u64> {
        let rules = self.local.rules();
        items
            .iter()
            .map(|it| {
                // Bounded by the ledger, not by the bucket's capacity: named as by a check of 1.
                let Ok(mut p) = rules.prepare_check(it.key, it.rule, it.tokens.min(1)) else {
                    return 0;
                };
                let taken = ledger.lock().take(p.id, it.mark, it.tokens);
                if taken > 0 {
                    p.cost = taken;
                    self.router.give_back(&p, it.mark);
                }
                taken
            })
            .collect()
    }
}
