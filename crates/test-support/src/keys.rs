//! Check bodies and key placement: which member owns a key, computed as every node computes it
//! (core's bucket identity, proto's ring).

use anyhow::{Context, Result, anyhow, ensure};
use ringlimit_core::check::Resolved;
use ringlimit_proto::{Algorithm, InlineRule, Ring};
use serde_json::{Value, json};

/// Candidates [`keys_owned_by`] looks through before it gives up (a member that owns nothing).
const MAX_CANDIDATES: usize = 100_000;

/// An inline check body: `limit` per `period_ms` for `key`, token bucket.
pub fn inline(key: &str, limit: u64, period_ms: u64) -> Value {
    json!({ "key": key, "limit": limit, "period_ms": period_ms })
}

/// The member of a ring over `members` that owns `key` under the inline token bucket `limit`
/// per `period_ms`.
pub fn owner_of(members: &[&str], key: &str, limit: u64, period_ms: u64) -> Result<String> {
    let rule = InlineRule {
        limit,
        period_ms,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    };
    owner_under(members, key, &rule)
}

/// The member of a ring over `members` that owns `key` under the inline `rule`.
pub fn owner_under(members: &[&str], key: &str, rule: &InlineRule) -> Result<String> {
    let resolved = Resolved::inline(rule).map_err(|e| anyhow!("invalid rule {rule:?}: {e}"))?;
    let id = resolved
        .bucket(key, 1)
        .map_err(|e| anyhow!("cannot place {key:?}: {e}"))?;
    Ring::new(members)
        .owner(id)
        .map(str::to_owned)
        .context("an empty ring owns nothing")
}

/// `n` keys named `{prefix}:{i}` that `owner` owns on a ring over `members` under the inline
/// token bucket `limit` per `period_ms`.
pub fn keys_owned_by(
    members: &[&str],
    owner: &str,
    prefix: &str,
    n: usize,
    (limit, period_ms): (u64, u64),
) -> Result<Vec<String>> {
    ensure!(members.contains(&owner), "{owner} is not among {members:?}");
    let mut keys = Vec::with_capacity(n);
    for i in 0..MAX_CANDIDATES {
        if keys.len() == n {
            break;
        }
        let key = format!("{prefix}:{i}");
        if owner_of(members, &key, limit, period_ms)? == owner {
            keys.push(key);
        }
    }
    ensure!(
        keys.len() == n,
        "{owner} owns {} of {MAX_CANDIDATES} keys {prefix}:*, not {n}",
        keys.len()
    );
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBERS: [&str; 3] = ["n0", "n1", "n2"];

    #[test]
    fn every_key_has_one_owner_and_each_member_owns_some() {
        for owner in MEMBERS {
            let keys = keys_owned_by(&MEMBERS, owner, "k", 5, (10, 1_000)).expect("keys");
            assert_eq!(keys.len(), 5);
            for k in &keys {
                assert_eq!(owner_of(&MEMBERS, k, 10, 1_000).expect("owner"), owner);
            }
        }
    }

    #[test]
    fn the_owner_follows_the_rule_as_nodes_place_it() {
        // The bucket's identity depends on the rule: some key moves when the limit does.
        let moved = (0..100).map(|i| format!("k:{i}")).any(|k| {
            owner_of(&MEMBERS, &k, 10, 1_000).ok() != owner_of(&MEMBERS, &k, 11, 1_000).ok()
        });
        assert!(moved);
        let rule = InlineRule {
            limit: 10,
            period_ms: 1_000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        };
        assert_eq!(
            owner_under(&MEMBERS, "k:1", &rule).expect("owner"),
            owner_of(&MEMBERS, "k:1", 10, 1_000).expect("owner")
        );
    }

    #[test]
    fn what_cannot_be_placed_is_an_error() {
        assert!(owner_of(&MEMBERS, "", 10, 1_000).is_err(), "empty key");
        assert!(owner_of(&MEMBERS, "k", 0, 1_000).is_err(), "limit 0");
        assert!(owner_of(&[], "k", 10, 1_000).is_err(), "no members");
        assert!(keys_owned_by(&MEMBERS, "n9", "k", 1, (10, 1_000)).is_err());
        assert_eq!(inline("k", 3, 60_000)["period_ms"], 60_000);
    }
}
