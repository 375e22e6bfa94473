//! One node as a test reaches it ([`Member`]), and the waits on members both harnesses use.

use crate::view::ClusterView;
use crate::wait::{wait_for, wait_until};
use anyhow::Result;
use std::future::Future;
use std::time::Duration;

/// A node as a test reaches it: a real node's HTTP client in process tests, a node on memnet in
/// the in-memory ones. Two requests are all the waits need.
pub trait Member {
    /// How messages name it (its node id, or its address).
    fn name(&self) -> String;

    /// Whether `GET /readyz` answers 200 now; an error when it does not answer at all.
    fn ready(&self) -> impl Future<Output = Result<bool>> + Send;

    /// `GET /v1/cluster`, read.
    fn cluster_view(&self) -> impl Future<Output = Result<ClusterView>> + Send;
}

impl<M: Member + ?Sized> Member for &M {
    fn name(&self) -> String {
        (**self).name()
    }

    fn ready(&self) -> impl Future<Output = Result<bool>> + Send {
        (**self).ready()
    }

    fn cluster_view(&self) -> impl Future<Output = Result<ClusterView>> + Send {
        (**self).cluster_view()
    }
}

/// Waits (at most `within`) until `member` answers `/readyz` with 200.
pub async fn wait_ready(member: &impl Member, within: Duration) -> Result<()> {
    wait_until(&format!("{} ready", member.name()), within, || {
        member.ready()
    })
    .await
}

/// Waits until every one of `members` shows exactly `ids` alive and as many members in its
/// ring (at most `within` for each).
pub async fn wait_all_alive<M: Member>(
    members: &[M],
    ids: &[&str],
    within: Duration,
) -> Result<()> {
    let mut want: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    for member in members {
        wait_until(
            &format!("{} sees {want:?} alive", member.name()),
            within,
            || async {
                let view = member.cluster_view().await?;
                if view.alive() == want && view.ring_members() == want.len() as u64 {
                    return Ok(true);
                }
                // Not yet: what it shows now becomes the failure's cause if it stays so.
                Err(anyhow::anyhow!(
                    "shows {} in its ring and members {}",
                    view.ring_members(),
                    view.0["members"]
                ))
            },
        )
        .await?;
    }
    Ok(())
}

/// Waits (at most `within`) until `member` shows `node_id` other than alive (dead, leaving or
/// no longer listed) and `ring` members in its ring; returns the state it shows then.
pub async fn wait_out_of_ring(
    member: &impl Member,
    node_id: &str,
    ring: u64,
    within: Duration,
) -> Result<Option<String>> {
    wait_for(
        &format!("{} drops {node_id} from its ring of {ring}", member.name()),
        within,
        || async {
            let view = member.cluster_view().await?;
            let state = view.state_of(node_id);
            let out = state.as_deref() != Some("alive") && view.ring_members() == ring;
            Ok(out.then_some(state))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    /// A member whose answers a test scripts: each poll takes the next view (the last repeats).
    struct Scripted {
        ready_after: Mutex<u32>,
        views: Mutex<Vec<serde_json::Value>>,
    }

    impl Scripted {
        fn new(ready_after: u32, views: Vec<serde_json::Value>) -> Self {
            Self {
                ready_after: Mutex::new(ready_after),
                views: Mutex::new(views),
            }
        }
    }

    impl Member for Scripted {
        fn name(&self) -> String {
            "scripted".into()
        }

        fn ready(&self) -> impl Future<Output = Result<bool>> + Send {
            let mut left = self.ready_after.lock().expect("lock");
            let ready = *left == 0;
            *left = left.saturating_sub(1);
            async move { Ok(ready) }
        }

        fn cluster_view(&self) -> impl Future<Output = Result<ClusterView>> + Send {
            let mut views = self.views.lock().expect("lock");
            let view = if views.len() > 1 {
                views.remove(0)
            } else {
                views[0].clone()
            };
            async move { Ok(ClusterView(view)) }
        }
    }

    fn view(ring: u64, members: &[(&str, &str)]) -> serde_json::Value {
        let members: Vec<_> = members
            .iter()
            .map(|(id, state)| json!({ "node_id": id, "state": state }))
            .collect();
        json!({ "ring_members": ring, "members": members })
    }

    #[tokio::test(start_paused = true)]
    async fn ready_once_readyz_says_so() {
        wait_ready(&Scripted::new(3, vec![json!({})]), Duration::from_secs(1))
            .await
            .expect("ready");
        let e = wait_ready(
            &Scripted::new(1_000, vec![json!({})]),
            Duration::from_secs(1),
        )
        .await
        .expect_err("never ready");
        assert!(format!("{e}").contains("scripted ready"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn all_alive_needs_the_ids_alive_and_in_the_ring() {
        let forming = Scripted::new(
            0,
            vec![
                view(1, &[("b", "alive")]),
                // Alive in the list, not yet in the ring.
                view(1, &[("a", "alive"), ("b", "alive")]),
                view(2, &[("b", "alive"), ("a", "alive")]),
            ],
        );
        wait_all_alive(&[&forming], &["a", "b"], Duration::from_secs(1))
            .await
            .expect("formed");
        let short = Scripted::new(0, vec![view(2, &[("a", "alive"), ("b", "dead")])]);
        assert!(
            wait_all_alive(&[short], &["a", "b"], Duration::from_secs(1))
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_ring_gives_the_state_shown() {
        let dropping = Scripted::new(
            0,
            vec![
                view(3, &[("a", "alive"), ("c", "alive")]),
                view(3, &[("a", "alive"), ("c", "dead")]),
                view(2, &[("a", "alive"), ("c", "dead")]),
            ],
        );
        let state = wait_out_of_ring(&dropping, "c", 2, Duration::from_secs(1))
            .await
            .expect("dropped");
        assert_eq!(state.as_deref(), Some("dead"));
        let gone = Scripted::new(0, vec![view(1, &[("a", "alive")])]);
        let state = wait_out_of_ring(&gone, "c", 1, Duration::from_secs(1))
            .await
            .expect("dropped");
        assert_eq!(state, None);
    }
}
