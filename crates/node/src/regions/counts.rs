//! Global counts across regions: the counts of `mode: global`, `scope: regions` buckets go to
//! the other regions, so that every node of every region decides one limit from G-counters
//! that include every region's actors (see `crate::global`).
//!
//! # Sending
//! Each node sends its own counts of such buckets (absolute, per bucket window, as it publishes
//! them to its members) to every other region's entry node (`--region-peers`), on a region
//! link of their own: a `RegionCounts` frame every `--global-publish-ms`, or as soon as the
//! previous one was answered when the round trip is longer (the counts that changed meanwhile
//! go together); an admission that leaves a bucket in the last tenth of its quota sends at
//! once, at most every `interval / 5`, as the publisher does inside the cluster. The global
//! interval rather than `--region-interval-ms`: the counts' age is the main term of the
//! over-admission, and a frame of changed counts is small. A new link
//! starts with the full set (every bucket this node publishes), and so does one that lost a
//! frame; otherwise only changed buckets go. At most `--global-max-published` buckets wait for
//! a link; beyond, it is sent the full set instead. Only `scope: regions` rules' buckets cross:
//! `scope: region` global rules stay inside the cluster.
//!
//! # Clocks
//! Windows are numbered on each region's cluster clock. Each frame carries the sender's
//! cluster time and its answer the receiver's, so the sender measures the receiver's offset
//! as NTP does (the best of the last samples, as `crate::cluster::clock` does between
//! members) and numbers its counts on the receiver's clock before sending them: a count lands
//! in the receiver's window that holds the middle of the sender's
//! ([`crate::global::numbering::Numbering::translate`]). No counts go before the first sample.
//! The receiver refuses, and counts, a count of a window that is neither its current one nor
//! next to it (an offset gone wrong): it changes nothing.
//!
//! # Receiving
//! The entry node merges the counts under actors qualified by the sending region's name
//! (`region/node_id@generation`: node ids may repeat between regions) and relays them to its
//! members at its next publish round ([`GlobalCounters::take_foreign`]); full sets between
//! members carry them too, so a member that restarts learns them. Frames are untrusted input:
//! bounded (at most [`MAX_COUNTS_PER_FRAME`] counts of at most
//! [`crate::global::wire::MAX_ACTORS_PER_FRAME`] actors, qualified node ids of at most
//! [`crate::global::wire::MAX_NODE_ID_BYTES`] bytes) and validated like members' counts; a
//! refused count is counted and changes nothing.
//!
//! # The error bound
//! A region hears another's hits one interval (or one round trip, when longer) plus one
//! one-way WAN delay late, and its members one publish interval after its entry node: at a
//! rate `R` elsewhere, a window over-admits up to about `R × (interval + one-way delay +
//! interval)`, on top of the cluster's own bound. The clock offset adds the hits of a window's
//! edge within the offset's error (half the link's round trip) of its end, counted in the
//! window next to it.

use super::{Regions, link};
use crate::global::publish::{Publisher, early_round_after};
use crate::global::wire::{self, ActorCounts, Update};
use crate::global::{GlobalCounters, numbering::Numbering};
use crate::local::Local;
use parking_lot::Mutex;
use ringlimit_core::link::dial::Dial;
use ringlimit_core::link::framing::{FramedPeer, LinkError};
use ringlimit_proto::peer::{Frame, REGION_COUNTS_SINCE};
pub use ringlimit_proto::region::MAX_COUNTS_PER_FRAME;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

const _: () = assert!(MAX_COUNTS_PER_FRAME <= wire::MAX_PER_FRAME);

/// A link with nothing to send still sends an empty frame this often: a clock sample.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the links send: the counts changed since each link's last frame.
pub struct Outbox {
    publisher: Mutex<Publisher>,
    /// Per other region (index `i - 1`): changed buckets, and whether it needs the full set.
    links: Vec<Pending>,
    max_published: usize,
}

#[derive(Default)]
struct Pending {
    updates: Mutex<HashMap<u64, Update>>,
    needs_full: AtomicBool,
}

impl Outbox {
    /// For `others` other regions, publishing at most `max_published` buckets.
    pub fn new(others: usize, max_published: usize) -> Self {
        Self {
            publisher: Mutex::new(Publisher::new(max_published)),
            links: (0..others)
                .map(|_| Pending {
                    needs_full: AtomicBool::new(true),
                    ..Pending::default()
                })
                .collect(),
            max_published,
        }
    }

    /// Takes the shared buckets changed since the last call and queues their counts at `now`
    /// (cluster clock) for every link.
    pub fn collect(&self, counters: &GlobalCounters, now: u64) {
        let dirty = counters.take_shared_dirty();
        if dirty.is_empty() {
            return;
        }
        let round = self
            .publisher
            .lock()
            .round_of(dirty, counters, now, usize::MAX);
        for l in &self.links {
            if l.needs_full.load(Ordering::Relaxed) {
                continue;
            }
            let mut updates = l.updates.lock();
            for u in &round.set {
                updates.insert(u.id, *u);
            }
            if updates.len() > self.max_published {
                updates.clear();
                l.needs_full.store(true, Ordering::Relaxed);
            }
        }
    }

    /// What link `k` (region `k + 1`) sends next at `now`: the full set when it needs it
    /// (then `true`), else the changed buckets.
    pub fn take(&self, k: usize, counters: &GlobalCounters, now: u64) -> (Vec<Update>, bool) {
        let Some(l) = self.links.get(k) else {
            return (Vec::new(), false);
        };
        if l.needs_full.swap(false, Ordering::Relaxed) {
            l.updates.lock().clear();
            return (self.publisher.lock().snapshot(counters, now), true);
        }
        (l.updates.lock().drain().map(|(_, u)| u).collect(), false)
    }

    /// Link `k` lost what it sent (or its connection): it needs the full set.
    pub fn lost(&self, k: usize) {
        if let Some(l) = self.links.get(k) {
            l.needs_full.store(true, Ordering::Relaxed);
        }
    }
}

/// `updates` numbered on a clock `offset_ns` ahead of theirs (see the module doc); those
/// whose window has no translation are left out.
pub fn translate(updates: &[Update], offset_ns: i64) -> Vec<Update> {
    updates
        .iter()
        .filter_map(|u| {
            let window = Numbering::from_code(u.period_ms)?.translate(u.window, offset_ns)?;
            Some(Update { window, ..*u })
        })
        .collect()
}

/// Merges a `RegionCounts` frame's counts from region `region` at `now` (this node's wall
/// time); returns how many were refused, or `None` when `region` is not another region
/// configured here (the link is then closed).
pub fn receive(
    regions: &Regions,
    counters: &GlobalCounters,
    region: &str,
    counts: &[ActorCounts],
    now: u64,
) -> Option<u64> {
    regions.index(region).filter(|&i| i > 0)?;
    // Qualified by region: node ids may repeat between regions. Bounded by `relayed`, which
    // refuses names past its length limit.
    let qualified: Vec<ActorCounts> = counts
        .iter()
        .take(wire::MAX_ACTORS_PER_FRAME + 1)
        .map(|a| ActorCounts {
            node_id: if a.node_id.is_empty() {
                String::new()
            } else {
                format!("{region}/{}", a.node_id)
            },
            generation: a.generation,
            counts: a.counts.clone(),
        })
        .collect();
    let (valid, mut refused) = wire::relayed(&qualified);
    refused += counts
        .iter()
        .skip(qualified.len())
        .map(|a| (a.counts.len() as u64).max(1))
        .sum::<u64>();
    counters
        .stats
        .region_refused
        .fetch_add(refused, Ordering::Relaxed);
    Some(refused + counters.receive_foreign(&valid, now))
}

/// Starts one task per other region sending this node's shared global counts, every
/// `interval`, at most `max_published` buckets (see the module doc).
pub fn spawn(
    regions: Arc<Regions>,
    local: Arc<Local>,
    node_id: String,
    dialer: Arc<dyn Dial>,
    (interval, max_published): (Duration, usize),
    tasks: &mut JoinSet<()>,
) {
    let outbox = Arc::new(Outbox::new(regions.links.len() - 1, max_published));
    for i in 1..regions.links.len() {
        tasks.spawn(run(
            Sender {
                regions: regions.clone(),
                local: local.clone(),
                outbox: outbox.clone(),
                node_id: node_id.clone(),
                dialer: dialer.clone(),
                interval,
            },
            i,
        ));
    }
}

struct Sender {
    regions: Arc<Regions>,
    local: Arc<Local>,
    outbox: Arc<Outbox>,
    node_id: String,
    dialer: Arc<dyn Dial>,
    interval: Duration,
}

impl Sender {
    fn now(&self) -> u64 {
        self.local.global().cluster_now(self.local.now())
    }

    /// One `RegionCounts` frame to region `i` and its answer (`None`: none in time, one more
    /// `owed`); records the clock sample.
    async fn exchange(
        &self,
        conn: &mut FramedPeer,
        i: usize,
        owed: &mut u32,
        counts: Vec<Update>,
    ) -> Result<Option<u64>, String> {
        let within = Duration::from_nanos(self.regions.settings().interval_ns);
        let counters = self.local.global();
        let counts = if counts.is_empty() {
            Vec::new()
        } else {
            let (node_id, generation) = crate::global::actor::parse_actor(counters.self_actor())
                .ok_or("this node's actor has no generation")?;
            vec![ActorCounts {
                node_id: node_id.to_owned(),
                generation,
                counts,
            }]
        };
        let sent_ns = self.now();
        let frame = Frame::RegionCounts {
            region: self.regions.name().to_owned(),
            sent_ns,
            counts,
        };
        let answer = match link::round_trip(conn, &frame, owed, Instant::now() + within).await {
            Err(LinkError::Timeout) => return Ok(None),
            answer => answer.map_err(|e| e.to_string())?,
        };
        match answer {
            Frame::RegionCountsAck {
                sent_ns: echoed,
                now_ns,
                refused,
            } if echoed == sent_ns => {
                self.regions.record_clock(
                    i,
                    crate::cluster::clock::Sample {
                        sent_ns,
                        peer_ns: now_ns,
                        received_ns: self.now(),
                    },
                );
                Ok(Some(refused))
            }
            Frame::Refused { reason } => Err(reason),
            other => Err(format!("unexpected {} frame", other.kind())),
        }
    }
}

/// Region `i`'s counts link: dials it when down, sends what changed each interval (the full
/// set after any loss), samples its clock.
async fn run(s: Sender, i: usize) {
    let k = i - 1;
    let me = format!("{}/{}", s.regions.name(), s.node_id);
    let within = Duration::from_nanos(s.regions.settings().interval_ns);
    let mut tick = tokio::time::interval(s.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<(FramedPeer, u16)> = None;
    let mut retry_at = Instant::now();
    let mut sampled: Option<Instant> = None;
    let mut owed = 0u32;
    let mut urgent = s.local.global().urgent_across_regions();
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Ok(()) = urgent.changed() => {
                // A shared bucket nears its limit: send now, as the publisher's early rounds.
                early_round_after(last.elapsed(), s.interval).await;
            }
        }
        last = Instant::now();
        let counters = s.local.global();
        s.outbox.collect(counters, s.now());
        if conn.is_none() {
            if Instant::now() < retry_at {
                continue;
            }
            let addr = &s.regions.links[i].addr;
            match link::dial(&*s.dialer, addr, &me, s.regions.secret(), within).await {
                Ok(c) => {
                    if c.1 < REGION_COUNTS_SINCE {
                        tracing::warn!(region = %s.regions.links[i].name, version = c.1,
                            "the region's node predates mode: global counts across regions: \
                             it hears none of this node's (upgrade it)");
                    }
                    conn = Some(c);
                    owed = 0;
                    s.outbox.lost(k);
                }
                _ => {
                    // The asks' link logs why; this one retries each interval.
                    retry_at = Instant::now() + within;
                    continue;
                }
            }
        }
        let Some((c, version)) = conn.as_mut() else {
            continue;
        };
        if *version < REGION_COUNTS_SINCE {
            // That region's node predates global counts across regions: it hears none.
            continue;
        }
        let offset = s.regions.offset(&s.regions.links[i].name);
        let due = sampled.is_none_or(|t| t.elapsed() >= SAMPLE_EVERY);
        let (updates, full) = match offset {
            Some(_) => s.outbox.take(k, counters, s.now()),
            None => (Vec::new(), false),
        };
        if updates.is_empty() && !full && !due {
            continue;
        }
        let frames: Vec<Vec<Update>> = match offset {
            None => vec![Vec::new()],
            Some(o) => {
                let translated = translate(&updates, o.offset_ns);
                if translated.is_empty() {
                    vec![Vec::new()]
                } else {
                    translated
                        .chunks(MAX_COUNTS_PER_FRAME)
                        .map(<[Update]>::to_vec)
                        .collect()
                }
            }
        };
        for counts in frames {
            let answer = s.exchange(c, i, &mut owed, counts).await;
            match answer {
                Ok(Some(refused)) => {
                    owed = 0;
                    sampled = Some(Instant::now());
                    if refused > 0 {
                        tracing::debug!(region = %s.regions.links[i].name, refused,
                            "global counts refused by the other region");
                    }
                }
                Ok(None) if owed < link::OWED => {
                    // Kept: its answer may still come, and is skipped when it does.
                    owed += 1;
                    s.outbox.lost(k);
                    break;
                }
                Ok(None) | Err(_) => {
                    let reason = answer.err().unwrap_or_else(|| "no answer in time".into());
                    tracing::debug!(region = %s.regions.links[i].name, %reason,
                        "global counts not delivered; resyncing");
                    conn = None;
                    s.outbox.lost(k);
                    // A link that keeps closing (a region that does not list ours) is not
                    // redialled every round.
                    retry_at = Instant::now() + within;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
