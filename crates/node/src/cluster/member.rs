//! One member as this node sees it: what membership produces and the quorum counts, so it
//! lives below both.

use serde::Serialize;

/// A member's state as `/v1/cluster` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    Alive,
    Leaving,
    Dead,
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub node_id: String,
    pub peer_addr: String,
    pub http_addr: String,
    pub state: MemberState,
    #[serde(skip)]
    pub generation: u64,
}
