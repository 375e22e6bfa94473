//! Rules hot reload: the rules file is polled, and a changed file is validated and put in force.
//!
//! Polling the content (not inotify, not mtimes) is deliberate: a Kubernetes ConfigMap update is
//! an atomic swap of a `..data` symlink that file watchers often miss and that leaves the mtime
//! seen through `rules.yaml` unreliable, while reading a small file each second costs nothing.
//! A change is a change of the bytes read through the path (symlinks followed). An invalid file
//! is refused with one log line naming the rule and field, and the previous rules stay in force.

use crate::engine::Engine;
use crate::rules::{RuleSet, RulesError};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the rules in force came from and how reloading went: read by the admin API and the
/// metrics, written by [`watch`].
#[derive(Debug)]
pub struct RulesStatus {
    /// The rules file; `None` for the built-in rules.
    pub source: Option<PathBuf>,
    /// Rule sets put in force since start (1: the rules loaded at start).
    pub generation: AtomicU64,
    /// Reloads that put new rules in force.
    pub reloads_ok: AtomicU64,
    /// Reloads refused (invalid or unreadable file).
    pub reloads_failed: AtomicU64,
    /// Unix ms at which the rules in force were loaded.
    pub loaded_at_ms: AtomicU64,
    last: Mutex<Option<ReloadOutcome>>,
}

/// The last reload attempt that changed something (new rules, or a refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// Unix ms.
    pub at_ms: u64,
    /// `None`: the new rules went in force; otherwise why the file was refused.
    pub error: Option<String>,
}

impl RulesStatus {
    /// The status of rules just loaded at start from `source` (`None`: built in).
    pub fn new(source: Option<PathBuf>) -> Self {
        Self {
            source,
            generation: AtomicU64::new(1),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            loaded_at_ms: AtomicU64::new(unix_ms()),
            last: Mutex::new(None),
        }
    }

    /// The last reload attempt that changed something, if any.
    pub fn last(&self) -> Option<ReloadOutcome> {
        self.last.lock().clone()
    }

    /// Records new rules in force; returns their generation.
    fn put_in_force(&self) -> u64 {
        let at_ms = unix_ms();
        self.loaded_at_ms.store(at_ms, Ordering::Relaxed);
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        *self.last.lock() = Some(ReloadOutcome { at_ms, error: None });
        self.generation.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn refused(&self, error: String) {
        self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        *self.last.lock() = Some(ReloadOutcome {
            at_ms: unix_ms(),
            error: Some(error),
        });
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Parses a rules file's bytes (the same validation as at start).
fn parse(bytes: &[u8]) -> Result<RuleSet, RulesError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| RulesError::Syntax(format!("the file is not UTF-8 text: {e}")))?;
    RuleSet::from_yaml(text)
}

/// Watches `status.source` every `every` until the task is dropped (nothing without a source).
pub async fn watch(engine: Arc<Engine>, status: Arc<RulesStatus>, every: Duration) {
    let Some(path) = status.source.clone() else {
        return;
    };
    // Start from nothing read: the first poll compares the file with the rules in force, so a
    // change made between start-up and this task's first read is not missed.
    let mut last: Option<Vec<u8>> = None;
    let mut unreadable = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // One read, parsed as read: the bytes compared next time are the bytes validated now.
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) => {
                if !unreadable {
                    tracing::warn!(path = %path.display(), error = %e, "rules file unreadable; the previous rules stay in force");
                    status.refused(format!("cannot read {}: {e}", path.display()));
                    unreadable = true;
                }
                last = None;
                continue;
            }
        };
        unreadable = false;
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        let parsed = parse(&bytes);
        last = Some(bytes);
        match parsed {
            // Same rules (a comment or layout change, or the file as loaded at start).
            Ok(rules) if *engine.rules() == rules => {}
            Ok(rules) => {
                let count = rules.len();
                engine.set_rules(rules);
                let generation = status.put_in_force();
                tracing::info!(path = %path.display(), rules = count, generation, "rules reloaded");
            }
            Err(e) => {
                match &e {
                    RulesError::Rule { rule, error } => tracing::warn!(
                        path = %path.display(), %rule, field = error.field, error = %e,
                        "rules file refused; the previous rules stay in force"
                    ),
                    _ => tracing::warn!(
                        path = %path.display(), error = %e,
                        "rules file refused; the previous rules stay in force"
                    ),
                }
                status.refused(e.to_string());
            }
        }
    }
}
