//! A node incarnation as a G-counter actor (`node_id@generation`): what the counters and the
//! wire frames both name, so it lives below both.

use std::sync::Arc;

/// A node as a G-counter actor: `node_id@generation`.
pub type Actor = Arc<str>;

/// The actor name of a node incarnation.
pub fn actor(node_id: &str, generation: u64) -> Actor {
    Arc::from(format!("{node_id}@{generation}"))
}

/// The node id and generation of an actor made by [`actor`] (node ids may hold `@`).
pub fn parse_actor(a: &str) -> Option<(&str, u64)> {
    let (node_id, generation) = a.rsplit_once('@')?;
    Some((node_id, generation.parse().ok()?))
}
