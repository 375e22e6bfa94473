//! Waiting, briefly, for seed host names to resolve before gossip starts.
//!
//! chitchat resolves seed names once when it starts and then only every 60 s. In a StatefulSet
//! with `podManagementPolicy: Parallel` every pod starts at once, before the headless Service
//! publishes its peers' DNS records; a node that found no seed would form a cluster alone and
//! merge only a minute later, enforcing per-node limits meanwhile. So a node first waits (bounded)
//! until every seed name resolves.

use std::time::{Duration, Instant};

/// How often an unresolved seed name is looked up again.
const RETRY: Duration = Duration::from_millis(250);

/// Waits until every seed that is a host name (not an IP literal) resolves, or `within` has
/// passed; returns the names still unresolved.
pub async fn wait_for_names(seeds: &[String], within: Duration) -> Vec<String> {
    let started = Instant::now();
    let mut pending: Vec<&String> = seeds
        .iter()
        .filter(|s| s.parse::<std::net::SocketAddr>().is_err())
        .collect();
    let mut logged = false;
    loop {
        let mut still = Vec::new();
        for seed in pending {
            let resolved = tokio::time::timeout(RETRY * 4, tokio::net::lookup_host(seed.as_str()))
                .await
                .is_ok_and(|r| r.is_ok_and(|mut addrs| addrs.next().is_some()));
            if !resolved {
                still.push(seed);
            }
        }
        pending = still;
        if pending.is_empty() || started.elapsed() >= within {
            if !pending.is_empty() {
                tracing::warn!(unresolved = ?pending, waited = ?started.elapsed(), "seed names do not resolve; starting with the others (chitchat retries every 60 s)");
            }
            return pending.into_iter().cloned().collect();
        }
        if !logged {
            tracing::info!(unresolved = ?pending, "waiting for seed names to resolve");
            logged = true;
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_resolvable_names_do_not_wait() {
        // Nothing left unresolved means no wait for the bound; how long the resolver itself
        // takes is not this code's (a wall-clock assertion here failed on a loaded CI machine).
        let seeds = ["127.0.0.1:7946".to_owned(), "localhost:7946".to_owned()];
        assert!(
            wait_for_names(&seeds, Duration::from_secs(5))
                .await
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_seed_without_a_port_never_resolves_and_the_wait_is_bounded() {
        // No port: refused locally by the resolver call, no network involved.
        let seeds = ["localhost".to_owned()];
        let started = Instant::now();
        let unresolved = wait_for_names(&seeds, Duration::from_millis(600)).await;
        assert_eq!(unresolved, seeds);
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
