//! [`Client::check_all`]: one request against several limits, all-or-nothing, straight to each
//! limit's owner — the same semantics as a node's `POST /v1/check/all`: each owner decides its
//! group all-or-nothing and holds what it admitted; when any limit denies, every cost taken is
//! given back (a refund to each owner that holds one, at once) before the answer returns.

use crate::Check;
use crate::client::{Client, Prepared};
use ringlimit_core::all::{AllError, MAX_ALL, binding, duplicate, shadowed};
use ringlimit_core::coordinator;
use ringlimit_proto::CheckAnswer;

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
        let mut results = coordinator::check_all(&self.inner.site(&topo), &prepared).await;
        // Shadow rules never deny; what they would have done is reported.
        let mut shadow_denied = vec![None; n];
        for (i, p) in prepared.iter().enumerate() {
            if let (Some(known), Ok(a)) = (p.known, &mut results[i])
                && known.shadow
            {
                let (answer, denied) = shadowed(*a);
                *a = answer;
                shadow_denied[i] = Some(denied);
            }
        }
        let admitted = results.iter().all(|r| matches!(r, Ok(a) if a.allowed));
        let mut answers = Vec::with_capacity(n);
        for (index, r) in results.into_iter().enumerate() {
            answers.push(r.map_err(|error| AllError::Item { index, error })?);
        }
        let shadow: Vec<bool> = shadow_denied.iter().map(Option::is_some).collect();
        Ok(AllAnswer {
            allowed: admitted,
            binding: binding(&answers, &shadow),
            results: answers,
            shadow_denied,
        })
    }
}
