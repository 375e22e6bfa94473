//! ringlimit node: one member of a ringlimit cluster, as a library, and the `ringlimit` binary.
//!
//! A node answers "may key K spend N tokens under rule R now?": here when it owns the key's
//! bucket (or the rule is global), at the owner otherwise, from a local fallback share when
//! the owner cannot answer. Algorithms, the bucket store, rule validation and the peer link are
//! `ringlimit-core`'s, shared with the SDK.
//!
//! # Layout
//! Top to bottom; each layer imports only from layers below it.
//! - [`node`] — wiring: [`run`] binds listeners, starts gossip, the peer server and the edges.
//! - [`http`] — the HTTP edge (axum): parse → call the service → reply.
//! - [`listen`] — serving a port's connections, bounded (timeouts, a cap): the HTTP and gRPC
//!   edges' shared server.
//! - [`service`] — the check service every edge calls: checks, batches, key state and reset,
//!   cluster and rules views, metrics text; timing and counting.
//! - [`routing`] — decide here, forward to the owner (one group per owner), or fail open.
//! - [`peers`] — the peer facade (one typed method per message; clients per member, per
//!   runtime), the peer server (a handler per frame kind), handover, reset on every member.
//! - [`decide`] — decide here: owner buckets ([`engine`]) or global counters ([`global`]).
//! - [`engine`] — rules in force, the store and the clock: prepare and decide owned checks.
//! - [`global`] — `mode: global` rules: gossiped G-counters, decided on every node.
//! - [`cluster`] — gossip membership (chitchat) and the ring over live members.
//! - [`rule_sync`] — the admin API's rules through gossip (publish, merge).
//! - [`rulebook`] — the rules in force: the file's and the admin API's, kept under `--data-dir`.
//! - [`rules`], [`reload`], [`config`] — the rules file and its hot reload; flags into a
//!   [`NodeConfig`].
//! - [`request_key`], [`forwarded`] — forward auth: rules' key templates, and what a gateway's
//!   copy of a request says about its client (address, path) that the client cannot choose.
//! - [`log_gate`] — log lines a flood could repeat, at most one per interval.
//! - [`metrics`] — the Prometheus registry: hot-path metrics, and a table of those read from a
//!   snapshot at scrape time.

pub mod cluster;
pub mod config;
pub mod decide;
pub mod engine;
pub mod envoy_config;
pub mod forwarded;
pub mod global;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod log_gate;
pub mod metrics;
pub mod node;
pub mod peers;
pub mod reload;
pub mod request_key;
pub mod routing;
pub mod rule_sync;
pub mod rulebook;
pub mod rules;
pub mod service;

#[cfg(test)]
mod testing;

pub use config::NodeConfig;
pub use node::{Listeners, NodeError, run, shutdown_signal};
