//! The cluster: gossip membership and the ring over live members.
//!
//! # Layout
//! - [`member`] — one member and its state, as `/v1/cluster` shows it.
//! - [`clock`] — every peer's clock offset, and the cluster clock global windows are numbered on.
//! - [`membership`] — chitchat wrapper producing immutable [`membership::View`]s.
//! - [`pause`] — this node's own pauses, after which gossip's death verdicts wait.
//! - [`quorum`] — the majority rule: who owns keys on the small side of a partition.
//! - [`transport`] — gossip over the node's UDP socket, with a per-datagram MAC.
//! - [`seeds`] — a bounded wait for seed host names to resolve before gossip starts.
//! - [`metrics`] — the members of the current view by state, as metrics.

pub mod clock;
pub mod member;
pub mod membership;
pub mod metrics;
pub mod pause;
pub mod quorum;
pub mod seeds;
pub mod transport;

pub use member::{Member, MemberState};
pub use membership::{Membership, View};
