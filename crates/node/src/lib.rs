//! ringlimit node: a distributed rate limiter's engine, HTTP API and the `ringlimit` binary.
//!
//! A node answers "may key K spend N tokens under rule R now?" from a bounded in-memory store of
//! buckets, deciding with pure algorithms over an injected clock.
//!
//! # Layout
//! - [`clock`], [`limiter`], [`store`] — re-exported from `ringlimit-core` (shared with the SDK):
//!   clocks, the algorithms, the bounded bucket store.
//! - [`rules`] — rule validation, rules file, built-in rules, bucket identities.
//! - [`engine`] — resolve a check, decide it on the store, phrase the answer.
//! - [`cluster`] — gossip membership (chitchat) and the ring over live members.
//! - [`forward`] — the peer protocol: pipelined, coalescing client and the peer server.
//! - [`global`] — `mode: global` rules: gossiped G-counters, decided on every node.
//! - [`router`] — decide here, forward to the owner, or fail open to a local share.
//! - [`http`] — the axum API: checks, batch, health, readiness, cluster and rules views, admin.
//! - [`metrics`] — Prometheus metrics.
//! - [`config`] — flags and environment into a [`NodeConfig`].
//! - [`reload`] — rules file hot reload (content-compared, so ConfigMap symlink swaps count).
//! - [`node`] — wiring: [`run`] is the whole node.

pub mod cluster;
pub mod config;
pub mod decide;
pub mod engine;
pub mod forward;
pub mod global;
pub mod http;
pub mod metrics;
pub mod node;
pub mod reload;
pub mod routing;
pub mod rules;
pub mod service;

pub use ringlimit_core::{clock, limiter, store};

pub use config::NodeConfig;
pub use node::{Listeners, NodeError, run, shutdown_signal};
