//! Rules hot reload: the rules file is polled, and a changed file is validated and put in force.
//!
//! Polling the content (not inotify, not mtimes) is deliberate: a Kubernetes ConfigMap update is
//! an atomic swap of a `..data` symlink that file watchers often miss and that leaves the mtime
//! seen through `rules.yaml` unreliable, while reading a small file each second costs nothing.
//! A change is a change of the bytes read through the path (symlinks followed). An invalid file
//! is refused with one log line naming the rule and field, and the previous rules stay in force.

use crate::metrics::{Family, load};
use crate::rules::book::RuleBook;
use crate::rules::envoy_config::EnvoyConfig;
use crate::rules::{RuleSet, RulesError};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use ringlimit_core::clock::unix_ms;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

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
    /// Whether the source as last read was refused (invalid or unreadable): set on a refusal,
    /// cleared once a read is accepted (new rules, or the rules in force already).
    pub failing: AtomicBool,
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
            failing: AtomicBool::new(false),
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
        self.failing.store(false, Ordering::Relaxed);
        *self.last.lock() = Some(ReloadOutcome { at_ms, error: None });
        self.generation.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn refused(&self, error: String) {
        self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        self.failing.store(true, Ordering::Relaxed);
        *self.last.lock() = Some(ReloadOutcome {
            at_ms: unix_ms(),
            error: Some(error),
        });
    }
}

/// Parses a rules file's bytes (the same validation as at start).
fn parse(bytes: &[u8]) -> Result<RuleSet, RulesError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| RulesError::Syntax(format!("the file is not UTF-8 text: {e}")))?;
    RuleSet::from_yaml(text)
}

/// A configuration source polled by [`poll`]: read as a snapshot of its bytes, applied when
/// they change.
pub(crate) trait Source: Send + 'static {
    /// What one read returns (the bytes of its file or files), compared between polls.
    type Snapshot: PartialEq + Send + 'static;
    /// What the logs call it.
    const WHAT: &'static str;
    /// Reads the source (blocking; run off the async threads).
    fn read(path: &Path) -> Result<Self::Snapshot, String>;
    /// Validates a changed snapshot and puts it in force: `Ok(Some(n))` with `n` entries in
    /// force now, `Ok(None)` when it means what is in force already.
    fn apply(&self, snapshot: &Self::Snapshot) -> Result<Option<usize>, String>;
}

/// Polls `status.source` every `every` until the task is dropped (nothing without a source).
pub(crate) async fn poll<S: Source>(source: S, status: Arc<RulesStatus>, every: Duration) {
    let Some(path) = status.source.clone() else {
        return;
    };
    let source = Arc::new(source);
    // Start from nothing read: the first poll compares the source with what is in force, so a
    // change made between start-up and this task's first read is not missed.
    let mut last: Option<S::Snapshot> = None;
    let mut unreadable = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // One read, parsed as read: what is compared next time is what was validated now.
        let read_path = path.clone();
        let read = tokio::task::spawn_blocking(move || S::read(&read_path))
            .await
            .unwrap_or_else(|e| Err(format!("reading failed: {e}")));
        let snapshot = match read {
            Ok(snapshot) => snapshot,
            Err(e) => {
                if !unreadable {
                    tracing::warn!(path = %path.display(), error = %e, "{} unreadable; the previous one stays in force", S::WHAT);
                    status.refused(e);
                    unreadable = true;
                }
                last = None;
                continue;
            }
        };
        unreadable = false;
        if last.as_ref() == Some(&snapshot) {
            continue;
        }
        let applied = source.apply(&snapshot);
        last = Some(snapshot);
        match applied {
            // What is in force already (a refused file put back as it was): nothing fails now.
            Ok(None) => status.failing.store(false, Ordering::Relaxed),
            Ok(Some(count)) => {
                let generation = status.put_in_force();
                tracing::info!(path = %path.display(), entries = count, generation, "{} reloaded", S::WHAT);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "{} refused; the previous one stays in force", S::WHAT);
                status.refused(e);
            }
        }
    }
}

/// The rules file, put in force ([`super::InForce`]).
struct RulesFile(Arc<RuleBook>);

impl Source for RulesFile {
    type Snapshot = Vec<u8>;
    const WHAT: &'static str = "rules file";

    fn read(path: &Path) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    fn apply(&self, bytes: &Vec<u8>) -> Result<Option<usize>, String> {
        // The error names the rule and the field (`RulesError::Rule`).
        let rules = parse(bytes).map_err(|e| e.to_string())?;
        let count = rules.len();
        // Same rules (a comment or layout change, or the file as loaded at start): `false`.
        Ok(self.0.set_file(rules).then_some(count))
    }
}

/// envoyproxy/ratelimit's configuration (`--envoy-config`, a file or a directory), put in
/// force for `ShouldRateLimit`.
struct EnvoyFiles(Arc<ArcSwap<EnvoyConfig>>);

impl Source for EnvoyFiles {
    type Snapshot = Vec<(String, String)>;
    const WHAT: &'static str = "envoy config";

    fn read(path: &Path) -> Result<Self::Snapshot, String> {
        super::envoy_config::read_files(path).map_err(|e| e.to_string())
    }

    fn apply(&self, files: &Self::Snapshot) -> Result<Option<usize>, String> {
        let config = EnvoyConfig::from_files(files.iter().map(|(n, t)| (n.as_str(), t.as_str())))
            .map_err(|e| e.to_string())?;
        if **self.0.load() == config {
            return Ok(None);
        }
        let domains = config.domains();
        self.0.store(Arc::new(config));
        Ok(Some(domains))
    }
}

/// Watches the rules file (`status.source`) every `every` until the task is dropped.
pub async fn watch(book: Arc<RuleBook>, status: Arc<RulesStatus>, every: Duration) {
    poll(RulesFile(book), status, every).await;
}

/// Watches the envoyproxy/ratelimit configuration (`status.source`, a file or a directory:
/// files added, changed or removed) every `every` until the task is dropped.
pub async fn watch_envoy(
    config: Arc<ArcSwap<EnvoyConfig>>,
    status: Arc<RulesStatus>,
    every: Duration,
) {
    poll(EnvoyFiles(config), status, every).await;
}

/// Whether the configuration as last read is in force: 1, or 0 while it is refused.
fn successful(s: &RulesStatus) -> u64 {
    u64::from(!s.failing.load(Ordering::Relaxed))
}

/// The rules file's reloads as metrics, read at scrape time.
pub const RULES_RELOADS: &[Family<RulesStatus>] = &[
    Family::counter_by(
        "rules_reload",
        "Rules file reloads: ok (new rules in force) or error (refused; the previous rules stay).",
        "result",
        &[
            ("ok", |s| load(&s.reloads_ok)),
            ("error", |s| load(&s.reloads_failed)),
        ],
    ),
    Family::gauge(
        "rules_generation",
        "Rule sets put in force since start (1: the rules loaded at start).",
        |s| load(&s.generation),
    ),
    Family::gauge(
        "rules_last_reload_timestamp_seconds",
        "Unix time at which the rules in force were loaded.",
        |s| load(&s.loaded_at_ms) / 1000,
    ),
    Family::gauge(
        "rules_last_reload_successful",
        "0 while the rules file as last read is refused (the previous rules stay in force), else 1.",
        successful,
    ),
];

/// The envoyproxy/ratelimit configuration's reloads (`--envoy-config`) as metrics.
pub const ENVOY_CONFIG_RELOADS: &[Family<RulesStatus>] = &[
    Family::counter_by(
        "envoy_config_reload",
        "envoyproxy/ratelimit configuration reloads (--envoy-config): ok or error (refused; the previous stays).",
        "result",
        &[
            ("ok", |s| load(&s.reloads_ok)),
            ("error", |s| load(&s.reloads_failed)),
        ],
    ),
    Family::gauge(
        "envoy_config_generation",
        "envoyproxy/ratelimit configurations put in force since start (1: loaded at start; 0: none).",
        |s| load(&s.generation),
    ),
    Family::gauge(
        "envoy_config_last_reload_successful",
        "0 while the envoyproxy/ratelimit configuration as last read is refused (the previous stays in force), else 1.",
        successful,
    ),
];

/// The RLQS configuration's reloads (`--rlqs-config`) as metrics.
pub const RLQS_CONFIG_RELOADS: &[Family<RulesStatus>] = &[
    Family::counter_by(
        "rlqs_config_reload",
        "RLQS configuration reloads (--rlqs-config): ok or error (refused; the previous stays).",
        "result",
        &[
            ("ok", |s| load(&s.reloads_ok)),
            ("error", |s| load(&s.reloads_failed)),
        ],
    ),
    Family::gauge(
        "rlqs_config_generation",
        "RLQS configurations put in force since start (1: loaded at start; 0: none).",
        |s| load(&s.generation),
    ),
    Family::gauge(
        "rlqs_config_last_reload_successful",
        "0 while the RLQS configuration as last read is refused (the previous stays in force), else 1.",
        successful,
    ),
];
