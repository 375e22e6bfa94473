//! The node's side of the peer protocol (TCP, length-prefixed bincode frames; the link itself,
//! shared with the SDK, is `ringlimit_core::link`): [`Peers`], the one facade through which this
//! node sends every member every message, and [`PeerServer`], which answers them.
//!
//! # Layout
//! - [`facade`] — [`Peers`]: one client per alive member (core's `PeerClient`), per-runtime copies
//!   ([`PeersHandle`], one per runtime, passed explicitly), and a typed method per message.
//! - [`server`] — accepts peers, runs the handshake, checks what only members may send, and
//!   dispatches each frame kind to its handler (`server/checks.rs`, which hands checks to the
//!   check service, `refunds.rs`, `handover.rs`, `replicate.rs`, `recall.rs`, `lease.rs`,
//!   `reservations.rs`, `reset.rs`, `rules.rs`, `top_keys.rs`, `quota.rs`,
//!   `global_counts.rs`).
//! - [`logins`] — places for connections still in their handshake.
//! - [`metrics`] — the facade's and the server's counters as metrics.
//! - [`recall_on_join`] — for a few seconds after joining, buckets this node owns but does not
//!   hold asked of the member after it on the ring before their first check.
//! - [`clocks`] — sampling every member's wall clock each second (clock offsets, the cluster
//!   clock of global windows).
//! - [`reach`] — pinging every link, and whether this node reaches a majority over them.
//!
//! # Messages, and how to add one
//! | message | sent by | handled in |
//! |---|---|---|
//! | check group (owned, relayed, all-or-nothing; to a replica) | the member's `PeerClient` (`send`, `send_all`, `send_replica`: the coordinator's owner link, `routing/timed.rs`; `send_relayed`: `routing/arrived.rs`) | `server/checks.rs` (to the check service; routed in `routing/arrived.rs`) |
//! | refunds | the member's `PeerClient::refund` | `server/refunds.rs` |
//! | ping (an empty check group) | [`Peers::ping_all`] | `server/checks.rs` |
//! | handover (on a ring change: `crate::lifecycle`) | [`Peers::hand_over`] | `server/handover.rs` |
//! | replicate (copies of an owner's buckets) | [`Peers::replica_link`], [`ReplicaLink::replicate`] | `server/replicate.rs` |
//! | hand back (a replica's decisions for an owner that did not answer) | [`ReplicaLink::hand_back`] | `server/replicate.rs` |
//! | reset (the admin API's: `crate::admin::keys`) | [`Peers::reset`] | `server/reset.rs` |
//! | recall (a member that joined asks the member after it for buckets it owns) | [`Peers::recall_link`], [`RecallLink::recall`] ([`recall_on_join`]) | `server/recall.rs` |
//! | lease (slices of hot buckets; what they had left comes back as refunds) | core's `lease::asking::LeaseLink` over [`Peers::sessions`] (`crate::leases`) | `server/lease.rs`, `server/refunds.rs` |
//! | reserve, settle (a cost estimated now, settled later at the owner) | [`Peers::reserve`], [`Peers::settle`] (pooled connections of their own) | `server/reservations.rs` |
//! | global counts (delta, full set) | `global::push` over [`Peers::sessions`] | `server/global_counts.rs` |
//! | rule change (an admin API change of a rule, at the member owning its name) | [`Peers::rule_change`] | `server/rules.rs` |
//! | top keys (a member's most denied or checked keys of a rule) | [`Peers::top_keys`] | `server/top_keys.rs` |
//! | quota (RLQS shares of the buckets a member owns) | `crate::rlqs` through [`Peers::quota`] | `server/quota.rs` |
//! | clock (a member's wall time, for offsets) | [`Peers::clock_link`], [`facade::ClockLink::sample`] ([`clocks`]) | `server.rs` (one line) |
//!
//! A new message is three pieces (*lease* is the latest example):
//! 1. a frame variant (and its answer's) appended to `ringlimit_proto::peer::Frame` (appended:
//!    the tags of older variants must not move), with a round-trip test there;
//! 2. a typed method on [`Peers`] (a connection of its own, through
//!    `ringlimit_core::link::Session`) or on the member's `PeerClient` (pipelined with checks);
//! 3. a handler file in `server/` (an `impl PeerServer` block with one `pub(super)` method),
//!    one arm in `PeerServer`'s dispatch, and, when only members may send it, nothing more:
//!    `members_only` refuses every frame it does not name.

pub mod clocks;
pub mod facade;
pub mod logins;
pub mod metrics;
pub mod reach;
pub mod recall_on_join;
pub mod server;

pub use facade::{Peers, PeersHandle, RecallLink, ReplicaLink};
pub use recall_on_join::Recall;
pub use server::{Cluster, PeerServer, ServerSettings};

/// Peer link settings for unit tests' clients: `node_id` of `cluster_id` dialing through
/// `dialer`, no secret, short deadlines.
#[cfg(test)]
pub(crate) fn test_settings(
    dialer: std::sync::Arc<dyn ringlimit_core::link::dial::Dial>,
    node_id: &str,
    cluster_id: &str,
) -> ringlimit_core::link::PeerSettings {
    use std::time::Duration;
    ringlimit_core::link::PeerSettings {
        dialer,
        node_id: node_id.into(),
        cluster_id: cluster_id.into(),
        secret: None,
        client_token: None,
        deadline: Duration::from_millis(25),
        connect_timeout: Duration::from_millis(500),
        open_for: Duration::from_secs(1),
        queue: 16,
    }
}
