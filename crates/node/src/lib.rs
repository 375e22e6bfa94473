//! ringlimit node: one member of a ringlimit cluster, as a library, and the `ringlimit` binary.
//!
//! A node answers "may key K spend N tokens under rule R now?": here when it owns the key's
//! bucket (or the rule is global), at the owner otherwise, from a local fallback share when
//! the owner cannot answer. Algorithms, the bucket store, rule validation and the peer link are
//! `ringlimit-core`'s, shared with the SDK.
//!
//! # Layout
//! Top to bottom; each layer imports only from layers below it.
//! - [`node`] — wiring in stages (trust, local state, membership, peers, edges, lifecycle):
//!   [`run`] serves on sockets ([`Listeners`]) or on an in-memory network
//!   ([`node::MemoryNet`]).
//! - [`http`], [`grpc`] — the edges (HTTP API and forward auth; Envoy RLS, RLQS streams and
//!   ringlimit.v1): parse → call the service (checks), the admin side or the lifecycle
//!   (readiness) → reply. The peer port's check frames are an edge too: the peer server hands
//!   them to the service.
//! - [`listen`] — serving a port's connections, bounded (timeouts, a cap), over TCP or memnet
//!   streams, inside TLS with `--tls-cert`: the HTTP and gRPC edges' shared server.
//! - [`config`] — flags (and the files they name) into a [`NodeConfig`], for the wiring and
//!   the listeners; it names the defaults of the layers below.
//! - [`service`] — the one front door: every edge's checks (the SDK's, through the peer port,
//!   included), batches, all-or-nothing requests and reservations; counted, timed and put in
//!   the top keys once, by edge.
//! - [`admin`], [`lifecycle`] — beside the service: the admin API (rules, a key's state and its
//!   reset across the cluster), the cluster and rules views and the metrics text; readiness,
//!   peers following membership, promotion of replica copies and handover on ring changes.
//! - [`rlqs`] — Envoy's Rate Limit Quota Service: quota streams (served on the gRPC port),
//!   the task that asks bucket owners for shares, and the owner's side of it.
//! - [`routing`] — the router: the node's side of core's coordinator (here, owner, replica,
//!   fallback share) for checks that arrive at an edge, and the routing of checks that arrive
//!   from peers (decide here, relay once, stand in); the batch gate, hot keys, RPC timing.
//! - [`durable`] — beside the replicas, the second follower of the owned buckets' change feed:
//!   buckets worth keeping written to `--data-dir` and restored before the node is ready.
//! - [`replicas`], [`leases`] — beside the routing, the tasks that talk to other members
//!   about local state: the replica sender (a follower of the owned buckets' change feed) and
//!   handing back what this node decided as a replica; asking owners for slices of hot buckets.
//! - [`peers`] — the peer facade (one typed method per message; clients per member, per
//!   runtime), the peer server (a handler file per frame kind), recall on join, reach, clocks.
//! - [`regions`] — beside the peers: `scope: regions` buckets decided on this region's
//!   allowances, the home's allocation of buckets homed here, and the links between regions.
//! - [`local`] — deciding here, by what it holds: owned buckets (store, change feed, debts),
//!   replica copies, leases, reservations; [`local::Local`] is the coordinator's "here".
//! - [`global`] — `mode: global` rules: gossiped G-counters, decided on every node (through
//!   [`local::Local`]), published and pushed to the other members.
//! - [`cluster`], [`rules`] — membership over chitchat's transport trait (UDP with a MAC, or in
//!   memory), the ring over live members and the quorum; the rule set and its file, the rules
//!   in force and a check made ready under them ([`rules::InForce`]), the admin API's rules,
//!   the book in force (kept under `--data-dir`), their sync through gossip, hot reload,
//!   forward auth's key templates and the envoyproxy/ratelimit configuration.
//! - [`metrics`], [`forwarded`], [`log_gate`] — the ground: the Prometheus registry (hot-path
//!   metrics, and each subsystem's table of families, registered by [`node`] and read at
//!   scrape time);
//!   what a gateway's copy of a request says about its client; log lines a flood could repeat,
//!   at most one per interval.
//! - [`cli`] — apart from the layers: the admin CLI (`ringlimit rules|top|cluster|keys`), an
//!   HTTP client of the admin API that knows nothing of the node's internals (arguments into
//!   one request, its answer as a table or JSON).
//! - `testing` (tests only) — whole nodes through [`run`] on the in-memory network under
//!   tokio's paused clock.

pub(crate) mod admin;
pub mod blocks;
pub(crate) mod blocks_sync;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod durable;
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
pub(crate) mod regions;
pub(crate) mod replicas;
pub mod rlqs;
pub(crate) mod routing;
pub mod rules;
pub(crate) mod service;

#[cfg(test)]
mod testing;

pub use config::NodeConfig;
pub use node::{Listeners, NodeError, run, shutdown_signal};
