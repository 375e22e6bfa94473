//! `--rlqs-config` hot reloaded: polled like the rules file, a refused file named in the
//! logs and metrics (`ringlimit_rlqs_config_*`) while the previous stays in force.

use super::config::RlqsConfig;
use crate::rules::reload::{RulesStatus, Source, poll};
use arc_swap::ArcSwap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The RLQS configuration (`--rlqs-config`), put in force for `StreamRateLimitQuotas`.
struct RlqsFile(Arc<ArcSwap<RlqsConfig>>);

impl Source for RlqsFile {
    type Snapshot = Vec<u8>;
    const WHAT: &'static str = "rlqs config";

    fn read(path: &Path) -> Result<Self::Snapshot, String> {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    fn apply(&self, bytes: &Vec<u8>) -> Result<Option<usize>, String> {
        // Named as the file is at start; the error says where and what.
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        let config = RlqsConfig::parse("--rlqs-config", text).map_err(|e| e.to_string())?;
        if **self.0.load() == config {
            return Ok(None);
        }
        let domains = config.domains();
        self.0.store(Arc::new(config));
        Ok(Some(domains))
    }
}

/// Watches the RLQS configuration (`status.source`) every `every` until the task is dropped.
pub async fn watch_rlqs(
    config: Arc<ArcSwap<RlqsConfig>>,
    status: Arc<RulesStatus>,
    every: Duration,
) {
    poll(RlqsFile(config), status, every).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_is_put_in_force_and_a_refused_one_named() {
        let config = Arc::new(ArcSwap::from_pointee(RlqsConfig::default()));
        let file = RlqsFile(config.clone());
        let good = b"domains:\n  - domain: edge\n    buckets:\n      - { bucket: { name: x }, blanket: deny_all }\n".to_vec();
        assert_eq!(file.apply(&good), Ok(Some(1)));
        assert_eq!(config.load().domains(), 1);
        // The same meaning again: nothing new in force.
        assert_eq!(file.apply(&good), Ok(None));
        // Refused: the reason names the flag and the place; the previous stays.
        let bad =
            b"domains:\n  - domain: edge\n    buckets:\n      - { bucket: { name: x } }\n".to_vec();
        let e = file.apply(&bad).expect_err("refused");
        assert!(e.starts_with("--rlqs-config: domains[0].buckets[0]"), "{e}");
        assert_eq!(config.load().domains(), 1);
        assert!(file.apply(&vec![0xff, 0xfe]).is_err());
    }
}
