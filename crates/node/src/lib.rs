//! ringlimit node: one member of a ringlimit cluster, as a library, and the `ringlimit` binary.
//!
//! A node answers "may key K spend N tokens under rule R now?": here when it owns the key's
//! bucket (or the rule is global), at the owner otherwise, from a local fallback share when
//! the owner cannot answer. Algorithms, the bucket store, rule validation and the peer link are
//! `ringlimit-core`'s, shared with the SDK.
//!
//! # Layout
//! Top to bottom; each layer imports only from layers below it.
//! - [`node`] — wiring: [`run`] serves on sockets ([`Listeners`]) or on an in-memory network
//!   ([`node::MemoryNet`]), starts membership, the peers and the edges.
//! - [`http`], [`grpc`] — the edges (HTTP API and forward auth; Envoy RLS and ringlimit.v1):
//!   parse → call the service or the admin side → reply.
//! - [`listen`] — serving a port's connections, bounded (timeouts, a cap), over TCP or memnet
//!   streams, inside TLS with `--tls-cert`: the HTTP and gRPC edges' shared server.
//! - [`service`] — the check service every edge calls for checks: checks, batches,
//!   all-or-nothing; timing and counting.
//! - [`rlqs`] — Envoy's Rate Limit Quota Service: quota streams (an edge served on the gRPC
//!   port), the task that asks bucket owners for shares, and the owner's side of it.
//! - [`admin`], [`lifecycle`] — beside the service: the admin API (rules, a key's state and
//!   reset), the cluster and rules views and the metrics text; readiness, peers following
//!   membership, handover and promotion of replica copies on ring changes.
//! - [`replicas`] — beside the lifecycle: copies of this node's buckets sent to the next
//!   `--replicas` members on the ring (following the engine's change feed), and promotion of
//!   the copies a node comes to own.
//! - [`leases`] — beside the replicas: the slices of hot buckets this node holds, asked of
//!   their owners and given back (the tables are the engine's; checks take in [`routing`]).
//! - [`reservations`] — beside the leases: costs estimated now and settled later, kept at the
//!   bucket's owner (the table is the engine's; a debt is part of its bucket's state); the
//!   task that sweeps expired reservations.
//! - [`routing`] — the node's side of core's coordinator (here, owner, fallback share), the
//!   batch gate and the peer RPC timing.
//! - [`peers`] — the peer facade (one typed method per message; clients per member, per
//!   runtime), the peer server (a handler file per frame kind), handover, reset, reach.
//! - [`decide`] — decide here: owner buckets ([`engine`]) or global counters ([`global`]).
//! - [`engine`] — rules in force, the clock, and the store's one write path (with its change
//!   feed): prepare and decide owned checks.
//! - [`global`] — `mode: global` rules: gossiped G-counters, decided on every node.
//! - [`cluster`] — membership over chitchat's transport trait (UDP with a MAC, or in memory),
//!   the ring over live members and the quorum.
//! - [`rules`] — the rule set and its file, the rule a check names ([`rules::RuleSpec`]), the
//!   admin API's rules, the book in force (kept under `--data-dir`), their sync through gossip,
//!   hot reload, forward auth's key templates and the envoyproxy/ratelimit configuration.
//! - [`cli`] — apart from the layers: the admin CLI (`ringlimit rules|top|cluster|keys`), an
//!   HTTP client of the admin API that knows nothing of the node's internals (arguments into
//!   one request, its answer as a table or JSON).
//! - [`config`] — flags into a [`NodeConfig`]; [`forwarded`] — what a gateway's copy of a
//!   request says about its client; [`log_gate`] — log lines a flood could repeat, at most one
//!   per interval.
//! - [`metrics`] — the Prometheus registry: hot-path metrics, and each subsystem's collector
//!   (registered by [`node`]) read at scrape time.
//! - `testing` (tests only) — whole nodes through [`run`] on the in-memory network under
//!   tokio's paused clock.

pub(crate) mod admin;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod forwarded;
pub(crate) mod global;
pub mod grpc;
pub(crate) mod http;
pub(crate) mod leases;
pub(crate) mod lifecycle;
pub(crate) mod listen;
pub mod local;
pub(crate) mod log_gate;
pub mod metrics;
pub mod node;
pub(crate) mod peers;
pub(crate) mod replicas;
pub mod rlqs;
pub(crate) mod routing;
pub mod rules;
pub(crate) mod service;

#[cfg(test)]
mod testing;

pub use config::NodeConfig;
pub use node::{Listeners, NodeError, run, shutdown_signal};
