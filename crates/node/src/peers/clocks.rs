//! Measuring every member's clock (see [`crate::cluster::clock`]): each second, one sample of
//! each alive member's wall clock over a connection of its own, and a warning when a clock is
//! further off than `--max-clock-offset-ms`.

use super::Peers;
use super::facade::ClockLink;
use crate::cluster::View;
use crate::cluster::clock::Clocks;
use arc_swap::ArcSwap;
use futures::future::join_all;
use ringlimit_core::clock::Clock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often each member's clock is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How long a sample may take (a slower one says little of the offset anyway).
const SAMPLE_WITHIN: Duration = Duration::from_millis(500);

/// What [`measure`] needs.
pub struct Measure {
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
    pub clocks: Arc<Clocks>,
    /// This node's wall clock (the one checks are decided on).
    pub clock: Arc<dyn Clock>,
}

/// Samples every alive member's clock each [`SAMPLE_EVERY`] until the task is dropped.
pub async fn measure(m: Measure) {
    let mut links: HashMap<Arc<str>, (String, ClockLink)> = HashMap::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Members (and this node, under its own id) whose clock is logged as off now.
    let mut off: HashMap<Arc<str>, bool> = HashMap::new();
    let max_offset = m.clocks.max_offset();
    let max_ns = i64::try_from(max_offset.as_nanos()).unwrap_or(i64::MAX);
    loop {
        tick.tick().await;
        let view = m.view.load_full();
        let members: Vec<Arc<str>> = view
            .peer_addrs
            .keys()
            .filter(|id| ***id != *view.self_id)
            .cloned()
            .collect();
        links.retain(|id, (addr, _)| view.peer_addrs.get(id) == Some(addr));
        for id in &members {
            if !links.contains_key(id)
                && let Some(addr) = view.peer_addrs.get(id)
            {
                links.insert(id.clone(), (addr.clone(), m.peers.clock_link(addr)));
            }
        }
        m.clocks.retain(&members);
        let clock = &m.clock;
        let samples = links.iter_mut().map(|(id, (_, link))| async move {
            let now = || clock.now();
            (id.clone(), link.sample(now, SAMPLE_WITHIN).await)
        });
        for (id, sample) in join_all(samples).await {
            if let Ok(Some(s)) = sample {
                m.clocks.record(&id, s);
            }
        }
        // A peer is logged off when even the edge of its error bound is past the maximum.
        let offsets = m.clocks.offsets();
        let mut now_off: Vec<(Arc<str>, i64, bool)> = offsets
            .iter()
            .map(|(id, o)| {
                let lower = o.offset_ns.unsigned_abs().saturating_sub(o.error_ns);
                (id.clone(), o.offset_ns, lower > max_ns.unsigned_abs())
            })
            .collect();
        let correction = m.clocks.correction_ns();
        now_off.push((
            view.self_id.clone(),
            -correction,
            correction.unsigned_abs() > max_ns.unsigned_abs(),
        ));
        for (id, offset_ns, is_off) in now_off {
            let was = off.insert(id.clone(), is_off).unwrap_or(false);
            let ms = offset_ns as f64 / 1e6;
            match (was, is_off) {
                (false, true) if *id == *view.self_id => tracing::warn!(
                    offset_ms = ms,
                    max_ms = max_offset.as_millis() as u64,
                    "this node's clock is off the cluster's (the median of its members'): \
                     global windows follow the cluster's; fix NTP on this host"
                ),
                (false, true) => tracing::warn!(
                    peer = %id,
                    offset_ms = ms,
                    max_ms = max_offset.as_millis() as u64,
                    "a member's clock is off this node's by more than --max-clock-offset-ms"
                ),
                (true, false) => {
                    tracing::info!(node = %id, offset_ms = ms, "clock back within --max-clock-offset-ms")
                }
                _ => {}
            }
        }
    }
}
