//! The cluster: gossip membership and the ring over live members.
//!
//! # Layout
//! - [`membership`] — chitchat wrapper producing immutable [`membership::View`]s.
//! - [`quorum`] — the majority rule: who owns keys on the small side of a partition.
//! - [`transport`] — gossip over the node's UDP socket, with a per-datagram MAC.
//! - [`seeds`] — a bounded wait for seed host names to resolve before gossip starts.
//! - [`metrics`] — the members of the current view by state, as metrics.

pub mod membership;
pub mod metrics;
pub mod quorum;
pub mod seeds;
pub mod transport;

pub use membership::{Member, MemberState, Membership, View};
