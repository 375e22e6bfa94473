//! One member as this node sees it: what membership produces and the quorum counts, so it
//! lives below both.

use serde::Serialize;

/// A member's state as `/v1/cluster` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Started, not ready yet (its membership not settled, its rules or global counts not
    /// heard): gossiped, but in no other member's ring, so no key is routed to it before it
    /// knows the cluster (see `node::lifecycle::track_view`).
    Joining,
    Alive,
    Leaving,
    Dead,
    /// In the ring this node last saw before it stopped (kept under `--data-dir`), not seen
    /// since it started: still the owner of its keys, whose buckets are on its disk, and
    /// asked for them as an owner that does not answer is, until it is seen alive or
    /// `--members-wait-ms` has passed (see `membership::Remembered`).
    Unseen,
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub node_id: String,
    pub peer_addr: String,
    pub http_addr: String,
    /// Where it serves ringlimit.v1 (`--grpc`, as advertised); empty when it serves no gRPC,
    /// or predates gossiping it.
    pub grpc_addr: String,
    pub state: MemberState,
    #[serde(skip)]
    pub generation: u64,
}
