//! What a node shows of itself: the cluster view, the rules in force, the admin view of the
//! rules and their reloads, and the metrics text.

use super::Admin;
use crate::cluster::Member;
use crate::metrics::load;
use ringlimit_proto::discovery::{RegionScope, RuleInfo};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `GET /v1/cluster`: this node's view of the cluster.
#[derive(Debug, Serialize)]
pub struct ClusterView {
    pub node_id: String,
    pub cluster_id: String,
    pub members: Vec<Member>,
    /// Members in the ring (alive, not leaving).
    pub ring_members: usize,
    /// Whether this node sees a majority of the members it last knew, through gossip and over
    /// their peer links; when false it owns no keys and answers owner-mode checks from its
    /// fallback share (degraded).
    pub quorate: bool,
    /// The members it last knew while it saw a majority (what a majority is counted of).
    pub known_members: usize,
    pub forwarding: Forwarding,
    pub global: GlobalView,
    pub clock: ClockView,
    /// Durable buckets (`--data-dir`): whether they are kept, and whether the disk takes them.
    pub persist: PersistView,
    /// `--region`: this node's region (`null`: one region).
    pub region: Option<String>,
    /// Every configured region (ours first): its link's state, this node's allowances and
    /// demand of `scope: regions` buckets for it, the last measured round trip.
    pub regions: Vec<crate::regions::RegionView>,
}

/// Durable buckets on this node.
#[derive(Debug, Serialize)]
pub struct PersistView {
    /// Whether buckets are kept on disk (`--data-dir`).
    pub enabled: bool,
    /// Whether the last write failed (a full or unwritable disk): the node answers from
    /// memory meanwhile.
    pub failing: bool,
    /// The last write error while writes fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Buckets in the bucket file, and its size.
    pub buckets: u64,
    pub disk_bytes: u64,
}

/// Clocks as this node measures them (see `cluster::clock`).
#[derive(Debug, Serialize)]
pub struct ClockView {
    /// The cluster clock (the median of every member's) minus this node's wall clock, ms:
    /// global windows are numbered on the cluster clock.
    pub correction_ms: f64,
    /// `--max-clock-offset-ms`.
    pub max_offset_ms: u64,
    /// Whether this node's own clock is off the cluster's by more than that.
    pub off: bool,
    /// Each member's clock minus this node's, ms, and the error bound (half a round trip).
    pub peers: Vec<PeerClock>,
}

#[derive(Debug, Serialize)]
pub struct PeerClock {
    pub node_id: String,
    pub offset_ms: f64,
    pub error_ms: f64,
}

/// Global rules' counters on this node.
#[derive(Debug, Serialize)]
pub struct GlobalView {
    /// Window counters held (own and merged, every global bucket).
    pub counters: usize,
    /// Buckets this node publishes to its peers now.
    pub published: u64,
    /// Publish rounds in which a bucket was left unpublished: the per-node cap was reached.
    pub unpublished: u64,
    /// Windows evicted at the cap while they still mattered.
    pub evicted: u64,
    /// Peer updates merged, and own updates not queued for a slow or unreachable peer (it is
    /// sent the full set later).
    pub merged: u64,
    pub dropped_events: u64,
    /// Full sets sent to peers (new connections, and peers that may have missed an update).
    pub resyncs: u64,
    /// Buckets whose other actors' counts were left out of a full set (over the cap).
    pub unrelayed: u64,
    /// Every other member, and every peer heard from: how long ago its counts were last merged
    /// (`null`: never).
    pub peers: Vec<PeerMerge>,
}

#[derive(Debug, Serialize)]
pub struct PeerMerge {
    pub node_id: String,
    pub last_merge_ms_ago: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Forwarding {
    pub forwarded: u64,
    pub fail_open: u64,
    pub fail_closed: u64,
    /// Checks whose owner did not answer, decided by its replica.
    pub replica: u64,
    /// Checks answered without an owner because this node saw fewer than a majority.
    pub minority: u64,
    /// Frames and checks sent to peers: checks per frame is the batching factor.
    pub peer_frames: u64,
    pub peer_checks: u64,
    pub batching_factor: f64,
    /// Buckets this node sent to their new owners after ring changes.
    pub handed_over: u64,
}

/// `GET /v1/admin/rules`: the rules in force, their source and reloads.
#[derive(Debug, Serialize)]
pub struct AdminRules {
    /// The rules file, or `built-in`.
    pub source: String,
    /// Rule sets put in force since start (1: those loaded at start).
    pub generation: u64,
    /// Unix ms at which the rules in force were loaded.
    pub loaded_at_ms: u64,
    pub reloads_ok: u64,
    pub reloads_error: u64,
    /// The last reload that changed something (`null`: none since start).
    pub last_reload: Option<LastReload>,
    pub rules: Vec<super::api_rules::AdminRule>,
}

#[derive(Debug, Serialize)]
pub struct LastReload {
    pub at_ms: u64,
    /// `ok` or `error`.
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Admin {
    /// This node's view of the cluster.
    pub fn cluster(&self) -> ClusterView {
        let view = self.router.view();
        let stats = &self.router.stats;
        let (frames, checks) = (
            load(&self.pool.stats().frames),
            load(&self.pool.stats().checks),
        );
        let g = self.local.global();
        let mut ages = g.merge_ages();
        let mut peers: Vec<PeerMerge> = view
            .members
            .iter()
            .filter(|m| *m.node_id != *view.self_id)
            .map(|m| PeerMerge {
                last_merge_ms_ago: ages.remove(&m.node_id).map(millis),
                node_id: m.node_id.clone(),
            })
            .collect();
        peers.extend(ages.into_iter().map(|(node_id, age)| PeerMerge {
            node_id,
            last_merge_ms_ago: Some(millis(age)),
        }));
        ClusterView {
            node_id: view.self_id.to_string(),
            cluster_id: self.cluster_id.to_string(),
            members: view.members.clone(),
            ring_members: view.ring.len(),
            quorate: self.router.owns_keys(&view),
            known_members: view.quorum.known.len(),
            forwarding: Forwarding {
                forwarded: load(&stats.forwarded),
                fail_open: load(&stats.fail_open),
                fail_closed: load(&stats.fail_closed),
                replica: load(&stats.replica),
                minority: load(&stats.minority),
                peer_frames: frames,
                peer_checks: checks,
                handed_over: load(&self.handed_over),
                batching_factor: if frames == 0 {
                    0.0
                } else {
                    checks as f64 / frames as f64
                },
            },
            global: GlobalView {
                counters: g.len(),
                published: load(&g.stats.published),
                unpublished: load(&g.stats.unpublished),
                evicted: load(&g.stats.evicted),
                merged: load(&g.stats.merged),
                dropped_events: load(&g.stats.dropped_events),
                resyncs: load(&g.stats.resyncs),
                unrelayed: load(&g.stats.unrelayed),
                peers,
            },
            clock: self.clock_view(),
            persist: PersistView {
                enabled: self.durable.enabled.load(Ordering::Relaxed),
                failing: self.durable.failing.load(Ordering::Relaxed),
                error: self.durable.error.lock().clone(),
                buckets: load(&self.durable.stored),
                disk_bytes: load(&self.durable.disk_bytes),
            },
            region: self.regions.as_ref().map(|r| r.name().to_owned()),
            regions: self
                .regions
                .as_ref()
                .map(|r| r.view(self.local.now()))
                .unwrap_or_default(),
        }
    }

    fn clock_view(&self) -> ClockView {
        let clocks = self.local.global().clocks();
        let ms = |ns: i64| ns as f64 / 1e6;
        ClockView {
            correction_ms: ms(clocks.correction_ns()),
            max_offset_ms: millis(clocks.max_offset()),
            off: clocks.own_clock_off(),
            peers: clocks
                .offsets()
                .into_iter()
                .map(|(id, o)| PeerClock {
                    node_id: id.to_string(),
                    offset_ms: ms(o.offset_ns),
                    error_ms: o.error_ns as f64 / 1e6,
                })
                .collect(),
        }
    }

    /// Why this node's readiness should say more (its clock is off the cluster's), if so.
    pub fn readiness_note(&self) -> Option<String> {
        let clocks = self.local.global().clocks();
        clocks.own_clock_off().then(|| {
            format!(
                "clock: this node's clock is {:.0} ms off the cluster's (the median of its \
                 members'; --max-clock-offset-ms {}): global windows follow the cluster's; fix \
                 NTP on this host\n",
                -(clocks.correction_ns() as f64) / 1e6,
                millis(clocks.max_offset())
            )
        })
    }

    /// The rules in force here (what the SDK routes and falls back with), sorted by name.
    pub fn rules(&self) -> Vec<RuleInfo> {
        self.local
            .rules()
            .rules()
            .iter()
            .map(|r| {
                let mut info = r.info();
                // Without regions a shared rule is decided as its region's own.
                if self.regions.is_none() && info.scope == RegionScope::Regions {
                    info.scope_in_effect = Some(RegionScope::Region);
                }
                info
            })
            .collect()
    }

    /// The rules in force, where they came from, and how reloading went.
    pub fn admin_rules(&self) -> AdminRules {
        let status = &self.rules;
        AdminRules {
            source: status
                .source
                .as_ref()
                .map_or_else(|| "built-in".to_owned(), |p| p.display().to_string()),
            generation: load(&status.generation),
            loaded_at_ms: load(&status.loaded_at_ms),
            reloads_ok: load(&status.reloads_ok),
            reloads_error: load(&status.reloads_failed),
            last_reload: status.last().map(|o| LastReload {
                at_ms: o.at_ms,
                result: if o.error.is_some() { "error" } else { "ok" },
                error: o.error,
            }),
            rules: self.admin_rule_list(),
        }
    }

    /// Every metric as OpenMetrics text (see [`crate::metrics::CONTENT_TYPE`]).
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }
}
