//! Regions on a node (`--region`, `--region-peers`): `scope: regions` buckets decided on this
//! node's allowances, the home's allocation of the buckets whose home is this region, and
//! the links that carry reports and grants between regions.
//!
//! The arithmetic is `ringlimit_core::regions`'; this module holds it for the node:
//! - [`Regions`]: the allowances ([`Allowances`]) and the allocator ([`Allocator`]), each
//!   region's link state, and what `/v1/cluster` and the metrics read.
//! - [`Regions::check`]: the one branch in the owner's decide path for `scope: regions` rules
//!   (`crate::local::Local`).
//! - [`Regions::serve`]: a region link's `RegionAsks`, answered for the buckets this node
//!   owns (the entry node of a region must own the bucket: see the concepts page).
//! - `link`: the exchange task: every interval (and when a bucket runs low), the reports due,
//!   grouped by home region, to the home (ours: at once; another: over its link).

pub mod counts;
pub mod link;

use crate::cluster::clock::{Clocks, Offset, Sample};
use crate::local::Local;
use crate::metrics::{Family, Series, load};
use crate::rules::RuleSpec;
use crate::rules::in_force::Prepared;
use parking_lot::Mutex;
use ringlimit_core::answer::answer;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::limiter::{Decision, Rule};
use ringlimit_core::regions::{Allocator, Allowances, RealBucket, RegionSettings, Verdict};
use ringlimit_core::reservations::Bucket;
use ringlimit_core::rule::{Mode, RegionScope};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use ringlimit_proto::region::{
    MAX_ASKS_PER_FRAME, MAX_BACK_PER_ASK, RegionAsk, RegionAskEntry, RegionGrant, RegionGrantEntry,
};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Most shared buckets this node holds allowances of, and allocates as a home.
pub const MAX_BUCKETS: usize = 100_000;

/// The regions' metrics, one series per other region (registered on a node with regions).
pub const METRICS: &[Family<Regions>] = &[
    Family::gauge_each(
        "region_up",
        "Whether this node's last exchange with the region (its --region-peers entry) was answered: 1, or 0 while its link is connecting or unreachable.",
        &["region"],
        |r| {
            r.others()
                .map(|l| Series::new([l.name.as_str()], u64::from(l.state() == LinkState::Up)))
                .collect()
        },
    ),
    Family::gauge_each(
        "region_clock_offset_seconds",
        "The region's cluster clock minus this node's, measured on its region link (the best of the last 8 samples; half its round trip is the error): what its global counts' windows are translated by.",
        &["region"],
        |r| {
            r.others()
                .filter_map(|l| {
                    let o = r.offset(&l.name)?;
                    Some(Series::new([l.name.as_str()], o.offset_ns as f64 / 1e9))
                })
                .collect()
        },
    ),
    Family::gauge_each(
        "region_rtt_seconds",
        "Round trip of the last answered exchange with the region.",
        &["region"],
        |r| {
            r.others()
                .map(|l| Series::new([l.name.as_str()], l.rtt_ms().unwrap_or(0.0) / 1_000.0))
                .collect()
        },
    ),
    Family::counter_each(
        "region_exchanges",
        "Exchanges (reports and grants, one frame each way) with the region, by outcome: ok, or failed (no answer in an interval, refused, broken link).",
        &["region", "outcome"],
        |r| {
            r.others()
                .flat_map(|l| {
                    [
                        Series::new([l.name.as_str(), "ok"], load(&l.ok)),
                        Series::new([l.name.as_str(), "failed"], load(&l.failed)),
                    ]
                })
                .collect()
        },
    ),
    Family::counter_each(
        "region_allowance_moves",
        "Tokens of scope: regions buckets this node, as their home, granted to the region (ours included) since start.",
        &["region"],
        |r| {
            r.links
                .iter()
                .enumerate()
                .map(|(i, l)| Series::new([l.name.as_str()], r.moved(i)))
                .collect()
        },
    ),
];

/// A region link's state, as `/v1/cluster` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    Connecting,
    Up,
    Unreachable,
}

/// One configured region as this node sees it.
#[derive(Debug)]
pub struct RegionLink {
    pub name: String,
    /// `--region-peers`' address (empty for our own region).
    pub addr: String,
    state: AtomicU8,
    /// Last measured round trip, µs (0: none yet).
    rtt_us: AtomicU64,
    /// Exchanges by outcome: answered, failed (no answer, refused, broken link).
    pub ok: AtomicU64,
    pub failed: AtomicU64,
}

impl RegionLink {
    fn new(name: String, addr: String, up: bool) -> Self {
        Self {
            name,
            addr,
            state: AtomicU8::new(if up { 1 } else { 0 }),
            rtt_us: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> LinkState {
        match self.state.load(Ordering::Relaxed) {
            1 => LinkState::Up,
            2 => LinkState::Unreachable,
            _ => LinkState::Connecting,
        }
    }

    pub fn set_state(&self, s: LinkState) {
        let v = match s {
            LinkState::Connecting => 0,
            LinkState::Up => 1,
            LinkState::Unreachable => 2,
        };
        self.state.store(v, Ordering::Relaxed);
    }

    pub fn rtt_ms(&self) -> Option<f64> {
        let us = self.rtt_us.load(Ordering::Relaxed);
        (us > 0).then(|| us as f64 / 1_000.0)
    }

    pub fn set_rtt(&self, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.rtt_us.store(us, Ordering::Relaxed);
    }
}

/// One region in `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RegionView {
    pub name: String,
    pub state: LinkState,
    /// This node's tokens of `scope: regions` buckets held by that region: for ours, the
    /// slices held here; for another, the live slices this node (their home) granted it.
    pub allowance: u64,
    /// That region's demand on those buckets, per second.
    pub demand: f64,
    pub rtt_ms: Option<f64>,
    /// That region's cluster clock minus this node's, ms (unknown until its link answered a
    /// clock sample; see `counts`).
    pub offset_ms: Option<f64>,
}

/// This node's regions.
pub struct Regions {
    /// Configured regions: ours first, then `--region-peers` in their order.
    pub links: Vec<RegionLink>,
    pub held: Allowances,
    pub home: Mutex<Allocator>,
    secret: Option<Arc<[u8]>>,
    /// Our demand, per second, summed over the last reports (for `/v1/cluster`).
    demand_milli: AtomicU64,
    /// Region links refused or broken, for the log gate.
    pub log_gate: crate::log_gate::LogGate,
    /// Each other region's clock, as this node's region links measure it (by region name).
    clocks: Clocks,
}

impl std::fmt::Debug for Regions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Regions")
            .field("links", &self.links)
            .finish_non_exhaustive()
    }
}

impl Regions {
    /// Region `name` sharing limits with `peers` (name, `--peer` address of a node in it),
    /// exchanging every `interval`; links prove `secret` (`None`: peer mTLS).
    pub fn new(
        name: &str,
        peers: &[(String, String)],
        interval: std::time::Duration,
        secret: Option<Arc<[u8]>>,
    ) -> Self {
        let settings = RegionSettings::new(
            u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            peers.len() + 1,
        );
        let links = std::iter::once(RegionLink::new(name.to_owned(), String::new(), true))
            .chain(
                peers
                    .iter()
                    .map(|(n, a)| RegionLink::new(n.clone(), a.clone(), false)),
            )
            .collect();
        Self {
            links,
            held: Allowances::new(settings, MAX_BUCKETS),
            home: Mutex::new(Allocator::new(settings, MAX_BUCKETS)),
            secret,
            demand_milli: AtomicU64::new(0),
            log_gate: crate::log_gate::LogGate::new(std::time::Duration::from_secs(10)),
            clocks: Clocks::default(),
        }
    }

    /// The other regions' links.
    fn others(&self) -> impl Iterator<Item = &RegionLink> {
        self.links.iter().skip(1)
    }

    /// Records a sample of region `i`'s clock (cluster clocks on both sides).
    pub fn record_clock(&self, i: usize, sample: Sample) {
        if let Some(l) = self.links.get(i).filter(|_| i > 0) {
            self.clocks.record(&Arc::from(l.name.as_str()), sample);
        }
    }

    /// Region `name`'s cluster clock minus this node's, once measured.
    pub fn offset(&self, name: &str) -> Option<Offset> {
        self.clocks.offsets().get(name).copied()
    }

    /// Our region's name.
    pub fn name(&self) -> &str {
        &self.links[0].name
    }

    /// The region secret links prove (`None`: peer mTLS only).
    pub fn secret(&self) -> Option<Arc<[u8]>> {
        self.secret.clone()
    }

    pub fn settings(&self) -> RegionSettings {
        *self.held.settings()
    }

    /// The index (into [`Regions::links`]) of bucket `id`'s home region.
    pub fn home_of(&self, id: u64) -> usize {
        let names: Vec<&str> = self.links.iter().map(|l| l.name.as_str()).collect();
        ringlimit_proto::region::home(id, &names).unwrap_or(0)
    }

    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.links.iter().position(|l| l.name == name)
    }

    /// A check of a `scope: regions` bucket this node owns in its region, decided on its
    /// allowance (never waiting on the WAN).
    pub fn check(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        let r = &p.resolved;
        let v = self
            .held
            .check(p.id, &r.rule, r.on_region_unreachable, p.cost, now, || {
                (p.key.to_owned(), p.spec.to_ref())
            });
        verdict_answer(v, &r.rule)
    }

    /// `/v1/cluster`'s regions.
    pub fn view(&self, now: u64) -> Vec<RegionView> {
        let totals = self.home.lock().totals(now);
        let held = self.held.totals(now);
        self.links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let (allowance, demand) = if i == 0 {
                    (
                        held.tokens,
                        self.demand_milli.load(Ordering::Relaxed) as f64 / 1_000.0,
                    )
                } else {
                    let t = totals.get(i).copied().unwrap_or_default();
                    (t.allowance, t.demand_per_s)
                };
                RegionView {
                    name: l.name.clone(),
                    state: l.state(),
                    allowance,
                    demand,
                    rtt_ms: l.rtt_ms(),
                    offset_ms: (i > 0)
                        .then(|| self.offset(&l.name))
                        .flatten()
                        .map(|o| o.offset_ns as f64 / 1e6),
                }
            })
            .collect()
    }

    /// Tokens moved to region `i` by this node as a home, since start.
    pub fn moved(&self, i: usize) -> u64 {
        self.home.lock().moved(i)
    }

    /// Region `region`'s asks on a region link, answered for the buckets this node owns
    /// (`owns`: its ring says so); a bad ask, or one of a bucket another member of this region
    /// owns, is answered with an error and changes no bucket.
    pub fn serve(
        &self,
        local: &Local,
        region: &str,
        asks: Vec<RegionAskEntry>,
        owns: impl Fn(u64) -> bool,
    ) -> Vec<RegionGrantEntry> {
        let Some(idx) = self.index(region).filter(|&i| i > 0) else {
            return asks
                .into_iter()
                .map(|a| RegionGrantEntry {
                    seq: a.seq,
                    grant: error(
                        "unknown_region",
                        format!("region {region:?} is not configured here"),
                    ),
                })
                .collect();
        };
        let now = local.now();
        asks.into_iter()
            .take(MAX_ASKS_PER_FRAME)
            .map(|a| RegionGrantEntry {
                seq: a.seq,
                grant: self.grant(local, idx, a.seq, a.ask, now, &owns),
            })
            .collect()
    }

    /// One ask of region `idx` (ours: 0) at `now`.
    pub fn grant(
        &self,
        local: &Local,
        idx: usize,
        seq: u64,
        mut ask: RegionAsk,
        now: u64,
        owns: &dyn Fn(u64) -> bool,
    ) -> RegionGrant {
        ask.back.truncate(MAX_BACK_PER_ASK);
        ask.unanswered.truncate(MAX_BACK_PER_ASK);
        let spec = RuleSpec::of(&ask.rule);
        let rules = local.rules().rules();
        let Some(named) = spec.name().and_then(|n| rules.get(n)) else {
            return error(
                "unknown_rule",
                "no such rule here (scope: regions rules are named)".to_owned(),
            );
        };
        let resolved = named.resolved();
        // A global rule across regions is counted, never allocated (see `crate::global`).
        if resolved.scope != RegionScope::Regions || resolved.mode == Mode::Global {
            return error(
                "not_shared",
                format!(
                    "rule {:?} is not a mode: owner, scope: regions rule here",
                    named.name
                ),
            );
        }
        let id = match resolved.bucket(&ask.key, 1) {
            Ok(id) => id,
            Err(e) => return error("invalid_key", e.to_string()),
        };
        if self.home_of(id) != 0 {
            return error(
                "not_home",
                "this region is not the bucket's home".to_owned(),
            );
        }
        if !owns(id) {
            // Allocated only by the bucket's owner in its home region: one allocator per
            // bucket (the entry node relays other owners' asks to them).
            return error(
                "not_owner",
                "another member of this region owns the bucket (its ring moved)".to_owned(),
            );
        }
        let rule = resolved.rule;
        let bucket = local.bucket_of(id, (&rule, resolved.persist), now);
        let mut real = Real {
            bucket,
            local,
            id,
            rule: &rule,
            now,
        };
        self.home
            .lock()
            .ask(id, &rule, idx, seq, &ask, now, &mut real)
    }

    /// The bucket an ask names, when its rule is a `scope: regions` rule here and its key
    /// valid (to send it to its owner in this region).
    pub fn bucket_of(&self, local: &Local, ask: &RegionAsk) -> Option<u64> {
        let name = RuleSpec::of(&ask.rule).name()?;
        let rules = local.rules().rules();
        let resolved = rules.get(name)?.resolved();
        if resolved.scope != RegionScope::Regions || resolved.mode == Mode::Global {
            return None;
        }
        resolved.bucket(&ask.key, 1).ok()
    }

    /// Reservations due at every bucket this node allocates (each interval).
    pub fn tick(&self, local: &Local, now: u64) {
        {
            let mut home = self.home.lock();
            for (i, l) in self.links.iter().enumerate().skip(1) {
                if let Some(ms) = l.rtt_ms() {
                    home.set_lag(i, (ms * 1e6 / 2.0) as u64);
                }
            }
        }
        let ids = self.home.lock().ids();
        for id in ids {
            let Some(rule) = self.home.lock().rule(id) else {
                continue;
            };
            let bucket = local.bucket(id, &rule, now);
            let mut real = Real {
                bucket,
                local,
                id,
                rule: &rule,
                now,
            };
            self.home.lock().tick(id, now, &mut real);
        }
    }

    /// Records our demand (the reports just sent), for `/v1/cluster`.
    fn told(&self, demand_milli: u64) {
        self.demand_milli.store(demand_milli, Ordering::Relaxed);
    }
}

impl crate::local::AcrossRegions for Regions {
    fn check(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        Regions::check(self, p, now)
    }
}

fn error(code: &str, message: String) -> RegionGrant {
    RegionGrant::Error {
        code: code.to_owned(),
        message,
    }
}

/// A check's answer from what the allowances decided.
fn verdict_answer(v: Verdict, rule: &Rule) -> CheckAnswer {
    let base = CheckAnswer {
        allowed: false,
        limit: rule.limit,
        remaining: 0,
        reset_at_ms: 0,
        retry_after_ms: 0,
        degraded: false,
        replica: false,
        leased: false,
    };
    match v {
        Verdict::Allowed {
            remaining,
            limit,
            reset_at_ms,
        } => CheckAnswer {
            allowed: true,
            limit,
            remaining,
            reset_at_ms,
            ..base
        },
        Verdict::Denied {
            limit,
            reset_at_ms,
            retry_after_ns,
        } => CheckAnswer {
            limit,
            reset_at_ms,
            retry_after_ms: retry_after_ns.div_ceil(NANOS_PER_MS).max(1),
            ..base
        },
        Verdict::Fallback(d, fb) => CheckAnswer {
            degraded: true,
            ..answer(&d, &fb)
        },
        Verdict::Open => CheckAnswer {
            allowed: true,
            remaining: rule.limit,
            degraded: true,
            ..base
        },
        Verdict::Full => CheckAnswer {
            retry_after_ms: 1_000,
            ..base
        },
    }
}

/// The real bucket of a shared bucket homed here: this node's bucket, decided in place.
struct Real<'a> {
    bucket: crate::local::OwnedBucket<'a>,
    local: &'a Local,
    id: u64,
    rule: &'a Rule,
    now: u64,
}

impl RealBucket for Real<'_> {
    fn decide(&mut self, _now: u64, cost: u64) -> Decision {
        Bucket::decide(&mut self.bucket, cost)
    }
    fn refund(&mut self, cost: u64, mark: Mark, _now: u64) {
        Bucket::refund(&mut self.bucket, cost, mark);
    }
    fn charge(&mut self, _now: u64, cost: u64) {
        Bucket::charge(&mut self.bucket, cost);
    }
    fn owed(&mut self, _now: u64) -> u64 {
        self.local
            .owned()
            .peek(self.id)
            .map_or(0, |s| s.owed(self.rule, self.now))
    }
}
