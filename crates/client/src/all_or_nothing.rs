//! [`Client::check_all`]: one request against several limits, all-or-nothing, straight to each
//! limit's owner — the same semantics as a node's `POST /v1/check/all`: each owner decides its
//! group all-or-nothing and holds what it admitted; when any limit denies, every cost taken is
//! given back (a refund to each owner that holds one, at once) before the answer returns.

use crate::Check;
use crate::client::{Client, Prepared};
use ringlimit_core::all_or_nothing::{AllError, MAX_ALL, binding, duplicate, shadowed};
use ringlimit_core::coordinator;
use ringlimit_proto::CheckAnswer;

/// A request decided against all its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllAnswer {
    /// Every enforced limit admitted, and each took its cost.
    pub allowed: bool,
    /// The index of the limit that binds (see [`ringlimit_core::all_or_nothing::binding`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::unreachable;
    use ringlimit_core::check::CheckError;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3_600);

    async fn remaining(client: &Client, check: &Check) -> u64 {
        let peek = check.clone().cost(0);
        client.check(&peek).await.expect("answered").remaining
    }

    #[tokio::test]
    async fn a_request_names_one_to_32_distinct_valid_limits() {
        let client = unreachable(Client::builder()).await;
        assert_eq!(client.check_all(&[]).await, Err(AllError::Count(0)));
        let many: Vec<Check> = (0..=MAX_ALL)
            .map(|i| Check::inline(format!("k{i}"), 5, HOUR))
            .collect();
        assert_eq!(
            client.check_all(&many).await,
            Err(AllError::Count(MAX_ALL + 1))
        );
        let twice = [Check::inline("k", 5, HOUR), Check::inline("k", 5, HOUR)];
        assert_eq!(
            client.check_all(&twice).await,
            Err(AllError::Duplicate {
                first: 0,
                second: 1
            })
        );
        let bad = [Check::inline("k", 5, HOUR), Check::inline("", 5, HOUR)];
        assert_eq!(
            client.check_all(&bad).await,
            Err(AllError::Item {
                index: 1,
                error: CheckError::InvalidKey(0)
            })
        );
        // Refused before anything was decided: no bucket holds a cost.
        assert_eq!(client.stats().fallback_buckets, 0);
    }

    /// On the fallback alone (no member answers), as at the owners: admitted only when every
    /// limit admits, and a denial gives back what the other limits took.
    #[tokio::test]
    async fn a_denial_takes_nothing_from_the_other_limits() {
        let client = unreachable(Client::builder()).await;
        let ip = Check::inline("ip:1", 10, HOUR);
        let user = Check::inline("user:1", 1, HOUR);
        let both = [ip.clone(), user.clone()];

        let first = client.check_all(&both).await.expect("decided");
        assert!(first.allowed, "{first:?}");
        assert!(first.results.iter().all(|a| a.allowed && a.degraded));
        assert_eq!(first.shadow_denied, [None, None]);
        // Admitted: the binding limit is the one with the least left (user: 0 of 1).
        assert_eq!(first.binding, 1);
        assert_eq!(first.binding_answer(), &first.results[1]);
        assert_eq!(remaining(&client, &ip).await, 9);

        let second = client.check_all(&both).await.expect("decided");
        assert!(!second.allowed, "{second:?}");
        assert_eq!(second.binding, 1, "the limit that denied");
        assert!(!second.results[1].allowed);
        // The ip limit admitted, then was given its cost back: it reads as before the request.
        assert!(second.results[0].allowed, "{second:?}");
        assert_eq!(second.results[0].remaining, 9);
        assert_eq!(remaining(&client, &ip).await, 9, "given back");
    }
}
