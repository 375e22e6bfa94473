//! Rules hot reload: the rules file is polled, and a changed file is validated and put in force.
//!
//! Polling the content (not inotify) is deliberate: a Kubernetes ConfigMap update is an atomic
//! symlink swap that file watchers often miss, while reading a small file each second costs
//! nothing. An invalid file is refused and logged, and the previous rules stay in force.

use crate::config::load_rules;
use crate::engine::Engine;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Watches `path` every `every` until the task is dropped.
pub async fn watch(engine: Arc<Engine>, path: PathBuf, every: Duration) {
    // Start from nothing read: the first poll compares the file with the rules in force, so a
    // change made between start-up and this task's first read is not missed.
    let mut last: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = match tokio::fs::read(&path).await {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                if last.is_some() {
                    tracing::warn!(path = %path.display(), error = %e, "rules file unreadable; keeping the rules in force");
                }
                last = None;
                continue;
            }
        };
        if now == last {
            continue;
        }
        last = now;
        match load_rules(&path) {
            Ok(rules) if *engine.rules() == rules => {}
            Ok(rules) => {
                tracing::info!(path = %path.display(), rules = rules.len(), "rules reloaded");
                engine.set_rules(rules);
            }
            Err(e) => {
                tracing::error!(error = %e, "rules file refused; the previous rules stay in force")
            }
        }
    }
}
