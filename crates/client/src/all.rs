//! [`Client::check_all`]: one request against several limits, all-or-nothing, straight to each
//! limit's owner — the same semantics as a node's `POST /v1/check/all`: each owner decides its
//! group all-or-nothing and holds what it admitted; when any limit denies, every cost taken is
//! given back (a refund to each owner that holds one, at once) before the answer returns.

use crate::client::{Client, Prepared, peer_check};
use crate::fallback::Taken;
use crate::{Check, ClientError};
use ringlimit_core::all::{AllError, MAX_ALL, binding, duplicate, shadowed};
use ringlimit_core::link::PeerClient;
use ringlimit_core::link::fanout::{self, OwnerGroups};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{Mark, PeerAnswer, PeerRefund};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A request decided against all its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllAnswer {
    /// Every enforced limit admitted, and each took its cost.
    pub allowed: bool,
    /// The index of the limit that binds (see [`ringlimit_core::all::binding`]).
    pub binding: usize,
    /// One answer per check, in order (a shadow rule's always allowed); after a denial they
    /// read as if the request had never come.
    pub results: Vec<CheckAnswer>,
    /// Per check: for a shadow rule, whether it would have denied; `None` for enforced rules.
    pub shadow_denied: Vec<Option<bool>>,
}

impl AllAnswer {
    /// The binding limit's answer (what a single check's headers would report).
    pub fn binding_answer(&self) -> &CheckAnswer {
        &self.results[self.binding]
    }
}

/// What a check holds until its request is known to be admitted.
enum Hold {
    Owner(Arc<PeerClient>, Mark),
    Share(Taken),
}

impl Client {
    /// Decides one request against all `checks` (1 to 32), all-or-nothing: admitted only when
    /// every enforced limit admits it; when any denies, none keeps its cost. An owner that
    /// cannot answer is replaced by this client's fallback share, as for [`Client::check`].
    /// A global rule's owner counts its check for good (global counters cannot give back).
    pub async fn check_all(&self, checks: &[Check]) -> Result<AllAnswer, AllError> {
        if checks.is_empty() || checks.len() > MAX_ALL {
            return Err(AllError::Count(checks.len()));
        }
        let inner = &self.inner;
        let mut topo = inner.topology.load_full();
        let mut prepared: Vec<Prepared<'_>> = Vec::with_capacity(checks.len());
        for (index, check) in checks.iter().enumerate() {
            let (t, p) = self
                .prepare(topo, check)
                .await
                .map_err(|error| AllError::Item { index, error })?;
            topo = t;
            prepared.push(p);
        }
        let ids: Vec<u64> = prepared.iter().map(|p| p.id).collect();
        if let Some(e) = duplicate(&ids) {
            return Err(e);
        }

        let n = checks.len();
        let mut results: Vec<Option<Result<CheckAnswer, ClientError>>> = vec![None; n];
        let mut holds: Vec<Option<Hold>> = (0..n).map(|_| None).collect();
        let mut groups = OwnerGroups::new();
        for (i, p) in prepared.iter().enumerate() {
            match p.known.and_then(|_| topo.owner(p.id)) {
                Some((owner, link)) => groups.add(owner.to_owned(), link, i),
                None => {
                    let (r, taken) = split(inner.degrade_held(p, &topo, "no cluster member alive"));
                    results[i] = Some(r);
                    holds[i] = taken.map(Hold::Share);
                }
            }
        }
        let clients = groups.clients();
        let replies = groups
            .send(
                |i| peer_check(&checks[i]),
                |link, batch| async move { link.send_all(batch).await },
            )
            .await;
        for (i, reply) in replies {
            let p = &prepared[i];
            if let Ok(PeerAnswer::Held { answer, mark }) = &reply
                && let Some(link) = clients.get(&i)
            {
                inner.stats.direct.fetch_add(1, Ordering::Relaxed);
                results[i] = Some(Ok(*answer));
                holds[i] = Some(Hold::Owner(link.clone(), *mark));
                continue;
            }
            if matches!(reply, Ok(PeerAnswer::Answer(_))) {
                inner.stats.direct.fetch_add(1, Ordering::Relaxed);
            }
            let mut taken = None;
            results[i] = Some(fanout::settle(reply, |_| {
                inner.wake.notify_one();
                let (r, t) = split(inner.degrade_held(p, &topo, "owner unreachable"));
                taken = t;
                r
            }));
            holds[i] = taken.map(Hold::Share);
        }

        // Shadow rules never deny; what they would have done is reported.
        let mut shadow_denied = vec![None; n];
        for (i, p) in prepared.iter().enumerate() {
            if let (Some(known), Some(Ok(a))) = (p.known, &mut results[i])
                && known.shadow
            {
                let (answer, denied) = shadowed(*a);
                *a = answer;
                shadow_denied[i] = Some(denied);
            }
        }
        let admitted = results
            .iter()
            .all(|r| matches!(r, Some(Ok(a)) if a.allowed));
        if !admitted {
            self.give_back(checks, &mut results, holds).await;
        }
        let mut answers = Vec::with_capacity(n);
        for (index, r) in results.into_iter().enumerate() {
            match r {
                Some(Ok(a)) => answers.push(a),
                Some(Err(error)) => return Err(AllError::Item { index, error }),
                None => {
                    return Err(AllError::Item {
                        index,
                        error: ClientError::Unavailable("no answer"),
                    });
                }
            }
        }
        let shadow: Vec<bool> = shadow_denied.iter().map(Option::is_some).collect();
        Ok(AllAnswer {
            allowed: admitted,
            binding: binding(&answers, &shadow),
            results: answers,
            shadow_denied,
        })
    }

    /// Gives back every cost the request holds: the fallback's here, each owner's as one
    /// refund group, all owners at once. A refund that cannot reach its owner leaves the cost
    /// taken (never more admitted; at worst a false deny until the bucket refills).
    async fn give_back(
        &self,
        checks: &[Check],
        results: &mut [Option<Result<CheckAnswer, ClientError>>],
        holds: Vec<Option<Hold>>,
    ) {
        let mut remote: HashMap<String, (Arc<PeerClient>, Vec<PeerRefund>)> = HashMap::new();
        for (i, hold) in holds.into_iter().enumerate() {
            let cost = match hold {
                None => continue,
                Some(Hold::Share(t)) => {
                    self.inner.fallback.refund(&t);
                    t.cost()
                }
                Some(Hold::Owner(link, mark)) => {
                    let c = &checks[i];
                    remote
                        .entry(link.addr.clone())
                        .or_insert_with(|| (link.clone(), Vec::new()))
                        .1
                        .push(PeerRefund {
                            key: c.key.clone(),
                            rule: c.rule.clone(),
                            cost: c.cost,
                            mark,
                        });
                    c.cost
                }
            };
            if let Some(Ok(a)) = &mut results[i] {
                a.remaining = a.remaining.saturating_add(cost);
            }
        }
        let sends = remote
            .into_values()
            .map(|(link, refunds)| async move { link.refund(refunds).await });
        for sent in futures::future::join_all(sends).await {
            if let Err(e) = sent {
                tracing::debug!(error = %e, "a refund did not reach its owner; its cost stays taken");
            }
        }
    }
}

fn split<T>(
    r: Result<(CheckAnswer, Option<T>), ClientError>,
) -> (Result<CheckAnswer, ClientError>, Option<T>) {
    match r {
        Ok((a, t)) => (Ok(a), t),
        Err(e) => (Err(e), None),
    }
}
