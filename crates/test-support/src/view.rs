//! A node's `GET /v1/cluster` answer, read the way tests ask about it.

use serde_json::Value;

/// A node's `/v1/cluster` answer.
#[derive(Debug, Clone)]
pub struct ClusterView(pub Value);

impl ClusterView {
    /// `(node_id, state)` of every member listed, in the order listed.
    pub fn members(&self) -> Vec<(String, String)> {
        self.0["members"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .map(|m| {
                        (
                            m["node_id"].as_str().unwrap_or("").to_owned(),
                            m["state"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The ids of the members shown `alive`, sorted.
    pub fn alive(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .members()
            .into_iter()
            .filter(|(_, s)| s == "alive")
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    /// The state shown for `node_id` (`alive`, `dead`, `leaving`), `None` when it is not
    /// listed.
    pub fn state_of(&self, node_id: &str) -> Option<String> {
        self.members()
            .into_iter()
            .find(|(id, _)| id == node_id)
            .map(|(_, s)| s)
    }

    /// Whether `node_id` is listed at all, in any state.
    pub fn lists(&self, node_id: &str) -> bool {
        self.state_of(node_id).is_some()
    }

    /// Members in the node's ring.
    pub fn ring_members(&self) -> u64 {
        self.0["ring_members"].as_u64().unwrap_or(0)
    }

    /// A counter of `forwarding` (`forwarded`, `fail_open`, `peer_frames`, ...); 0 when absent.
    pub fn forwarding(&self, counter: &str) -> u64 {
        self.0["forwarding"][counter].as_u64().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_members_states_ring_and_counters() {
        let view = ClusterView(json!({
            "ring_members": 2,
            "members": [
                { "node_id": "n2", "state": "alive" },
                { "node_id": "n0", "state": "alive" },
                { "node_id": "n1", "state": "dead" },
            ],
            "forwarding": { "forwarded": 7 },
        }));
        assert_eq!(view.alive(), ["n0", "n2"], "sorted");
        assert_eq!(view.members()[0], ("n2".into(), "alive".into()));
        assert_eq!(view.state_of("n1").as_deref(), Some("dead"));
        assert!(view.lists("n1") && !view.lists("n3"));
        assert_eq!(view.ring_members(), 2);
        assert_eq!(view.forwarding("forwarded"), 7);
        assert_eq!(view.forwarding("fail_open"), 0);
        // Anything else reads as empty, never a panic.
        let garbage = ClusterView(json!("not a view"));
        assert!(garbage.members().is_empty() && garbage.ring_members() == 0);
    }
}
