//! The client: route each check to its owner, fall back locally, keep the topology fresh.

use crate::builder::{BuildError, ClientBuilder, FailMode, Settings};
use crate::check::{Check, ClientError};
use crate::fallback::Fallback;
use crate::topology::{self, Topology};
use arc_swap::ArcSwap;
use ringlimit_core::check::Resolved;
use ringlimit_core::link::fanout::{self, OwnerGroups};
use ringlimit_core::link::{ForwardError, PeerSettings, PeerStats};
use ringlimit_core::rule::OnOwnerUnreachable;
use ringlimit_proto::peer::{PeerAnswer, PeerCheck};
use ringlimit_proto::{CheckAnswer, RuleRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Refreshes asked for by failing checks are at most this frequent.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);
/// A check naming a rule the client does not know refetches the rules at most this often.
const UNKNOWN_RULE_REFETCH: Duration = Duration::from_millis(250);

/// A ringlimit client. Cheap to clone (all clones share connections, topology and fallback);
/// dropping the last clone closes its connections and stops its refresh task.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("seeds", &self.inner.settings.seeds)
            .field("members", &self.members())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) settings: Settings,
    link: Arc<PeerSettings>,
    http: reqwest::Client,
    pub(crate) topology: ArcSwap<Topology>,
    /// Serialises refreshes (the periodic one and those asked for by checks), and holds the
    /// node that answered the last one.
    refreshing: tokio::sync::Mutex<Option<String>>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) fallback: Fallback,
    pub(crate) stats: Counters,
    peer_stats: Arc<PeerStats>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) direct: AtomicU64,
    pub(crate) degraded: AtomicU64,
    refreshes: AtomicU64,
    refresh_failures: AtomicU64,
}

/// What a client has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientStats {
    /// Checks answered by their owner.
    pub direct: u64,
    /// Checks answered by the local fallback (owner slow or unreachable, no members).
    pub degraded: u64,
    /// Successful and failed topology refreshes.
    pub refreshes: u64,
    pub refresh_failures: u64,
    /// Frames and checks sent to owners: checks per frame is the batching factor.
    pub frames: u64,
    pub checks_sent: u64,
    /// Buckets in the local fallback.
    pub fallback_buckets: usize,
}

/// A check made ready to route: its rule resolved, its bucket identified.
pub(crate) struct Prepared<'a> {
    pub(crate) check: &'a Check,
    pub(crate) id: u64,
    /// `None`: a named rule while no node has ever been reached.
    pub(crate) known: Option<Resolved>,
}

impl Client {
    /// Starts building a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    pub(crate) async fn start(settings: Settings) -> Result<Self, BuildError> {
        let http = reqwest::Client::builder()
            .timeout(settings.discovery_timeout)
            .connect_timeout(settings.discovery_timeout)
            .build()
            .map_err(|e| BuildError::Http(e.to_string()))?;
        let link = Arc::new(PeerSettings {
            dialer: ringlimit_core::link::dial::tcp(),
            node_id: format!("sdk:{}", settings.name),
            cluster_id: settings.cluster_id.clone(),
            secret: settings.secret.clone(),
            deadline: settings.deadline,
            connect_timeout: settings.connect_timeout,
            // Shorter than a node's 1 s: a client's deadline is tight (a few ms), so a host stall
            // can open a live owner's circuit; probing again soon bounds what that costs.
            open_for: Duration::from_millis(250),
            queue: 8192,
        });
        let inner = Arc::new(Inner {
            fallback: Fallback::new(settings.fallback_max_keys, settings.fallback_share),
            settings,
            link,
            http,
            topology: ArcSwap::from_pointee(Topology::empty()),
            refreshing: tokio::sync::Mutex::new(None),
            wake: Arc::new(Notify::new()),
            stats: Counters::default(),
            peer_stats: Arc::new(PeerStats::default()),
        });
        if let Err(e) = inner.refresh().await {
            tracing::warn!(error = %e, "no ringlimit seed answered; checks are degraded until one does");
        }
        tokio::spawn(refresh_loop(Arc::downgrade(&inner), inner.wake.clone()));
        Ok(Self { inner })
    }

    /// Decides one check: at its owner within the deadline, else from the local fallback.
    pub async fn check(&self, check: &Check) -> Result<CheckAnswer, ClientError> {
        let topo = self.inner.topology.load_full();
        let (topo, p) = self.prepare(topo, check).await?;
        if p.known.is_none() {
            return self
                .inner
                .degrade(&p, &topo, "no cluster member reached yet");
        }
        let Some((_, link)) = topo.owner(p.id) else {
            return self.inner.degrade(&p, &topo, "no cluster member alive");
        };
        let sent = link.send(vec![peer_check(check)]).await;
        let reply = sent.and_then(|mut a| a.pop().ok_or(ForwardError::Mismatch));
        self.inner.settle(&p, &topo, reply)
    }

    /// Decides many checks, one frame per owner, all owners at once; answers in order.
    pub async fn check_many(&self, checks: &[Check]) -> Vec<Result<CheckAnswer, ClientError>> {
        let mut topo = self.inner.topology.load_full();
        let mut results: Vec<Option<Result<CheckAnswer, ClientError>>> =
            Vec::with_capacity(checks.len());
        let mut prepared = Vec::with_capacity(checks.len());
        let mut groups = OwnerGroups::new();
        for (i, check) in checks.iter().enumerate() {
            match self.prepare(topo.clone(), check).await {
                Err(e) => {
                    results.push(Some(Err(e)));
                    prepared.push(None);
                }
                Ok((t, p)) => {
                    topo = t;
                    match p.known.and_then(|_| topo.owner(p.id)) {
                        Some((owner, link)) => {
                            groups.add(owner.to_owned(), link, i);
                            results.push(None);
                        }
                        None => results.push(Some(self.inner.degrade(
                            &p,
                            &topo,
                            "no cluster member alive",
                        ))),
                    }
                    prepared.push(Some(p));
                }
            }
        }
        let replies = groups
            .send(
                |i| peer_check(&checks[i]),
                |link, batch| async move { link.send(batch).await },
            )
            .await;
        for (i, reply) in replies {
            if let Some(p) = prepared[i].as_ref() {
                results[i] = Some(self.inner.settle(p, &topo, reply));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(ClientError::Unavailable("no answer"))))
            .collect()
    }

    /// Node ids of the members the client routes to now.
    pub fn members(&self) -> Vec<String> {
        let topo = self.inner.topology.load();
        let mut ids: Vec<String> = topo.peers.keys().map(|k| k.to_string()).collect();
        ids.sort();
        ids
    }

    /// The node that owns `check`'s bucket now, if the client knows its rule and members.
    pub fn owner_of(&self, check: &Check) -> Option<String> {
        let topo = self.inner.topology.load();
        let (id, known) = identify(&topo, check).ok()?;
        known?;
        topo.owner(id).map(|(o, _)| o.to_owned())
    }

    /// Refreshes members and rules now (normally done in the background).
    pub async fn refresh(&self) -> bool {
        self.inner.refresh().await.is_ok()
    }

    /// The period in ms of `rule` as this client knows it (`None`: a named rule not learnt yet).
    pub fn period_ms(&self, rule: &RuleRef) -> Option<u64> {
        match rule {
            RuleRef::Inline(r) => Some(r.period_ms),
            RuleRef::Named(name) => {
                let topo = self.inner.topology.load();
                let known = topo.rules.as_ref()?.get(name)?;
                Some(
                    known
                        .rule
                        .period_ns
                        .div_ceil(ringlimit_core::clock::NANOS_PER_MS),
                )
            }
        }
    }

    /// What this client has done so far.
    pub fn stats(&self) -> ClientStats {
        let s = &self.inner.stats;
        ClientStats {
            direct: s.direct.load(Ordering::Relaxed),
            degraded: s.degraded.load(Ordering::Relaxed),
            refreshes: s.refreshes.load(Ordering::Relaxed),
            refresh_failures: s.refresh_failures.load(Ordering::Relaxed),
            frames: self.inner.peer_stats.frames.load(Ordering::Relaxed),
            checks_sent: self.inner.peer_stats.checks.load(Ordering::Relaxed),
            fallback_buckets: self.inner.fallback.len(),
        }
    }

    /// Validates a check and identifies its bucket; a named rule the client does not know
    /// makes it refetch the rules once (bounded by the deadline) before it is an error.
    pub(crate) async fn prepare<'a>(
        &self,
        topo: Arc<Topology>,
        check: &'a Check,
    ) -> Result<(Arc<Topology>, Prepared<'a>), ClientError> {
        let (id, known) = match identify(&topo, check) {
            Err(ClientError::UnknownRule(name)) => {
                let stale = topo
                    .fetched_at
                    .is_none_or(|t| t.elapsed() >= UNKNOWN_RULE_REFETCH);
                if !stale {
                    return Err(ClientError::UnknownRule(name));
                }
                let _ =
                    tokio::time::timeout(self.inner.settings.deadline, self.inner.refresh()).await;
                let topo = self.inner.topology.load_full();
                let (id, known) = identify(&topo, check)?;
                return Ok((topo, Prepared { check, id, known }));
            }
            other => other?,
        };
        Ok((topo, Prepared { check, id, known }))
    }
}

/// A check's bucket identity and rule, from what the topology knows. `None` rule: a named
/// rule while the client has never reached a node (it cannot know the rule's algorithm).
fn identify(topo: &Topology, check: &Check) -> Result<(u64, Option<Resolved>), ClientError> {
    // The key first, as a node checks it.
    ringlimit_core::rule::validate_key(&check.key).map_err(ClientError::InvalidKey)?;
    let resolved = match &check.rule {
        RuleRef::Inline(inline) => Resolved::inline(inline).map_err(ClientError::InvalidRule)?,
        RuleRef::Named(name) => match &topo.rules {
            None => return Ok((0, None)),
            Some(rules) => *rules
                .get(name)
                .ok_or_else(|| ClientError::UnknownRule(name.clone()))?,
        },
    };
    Ok((resolved.bucket(&check.key, check.cost)?, Some(resolved)))
}

pub(crate) fn peer_check(check: &Check) -> PeerCheck {
    PeerCheck {
        key: check.key.clone(),
        rule: check.rule.clone(),
        cost: check.cost,
    }
}

impl Inner {
    /// Turns the owner's reply — or its absence — into the caller's result.
    fn settle(
        &self,
        p: &Prepared<'_>,
        topo: &Topology,
        reply: Result<PeerAnswer, ForwardError>,
    ) -> Result<CheckAnswer, ClientError> {
        match &reply {
            Ok(PeerAnswer::Answer(_)) => {
                self.stats.direct.fetch_add(1, Ordering::Relaxed);
            }
            // The owner knows rules we do not (or no longer): look again soon.
            Ok(PeerAnswer::Error { code, .. }) if code == "unknown_rule" => self.wake.notify_one(),
            _ => {}
        }
        fanout::settle(reply, |e| {
            // A dead or slow owner: the topology may be stale.
            self.wake.notify_one();
            let reason = match e {
                ForwardError::CircuitOpen | ForwardError::Lost => "owner unreachable",
                ForwardError::Timeout => "owner did not answer within the deadline",
                ForwardError::Shed => "queue to the owner is full",
                ForwardError::Mismatch => "owner answered too few checks",
                ForwardError::RuleUnknownAtOwner => "owner does not know the rule yet",
            };
            self.degrade(p, topo, reason)
        })
    }

    /// The answer without the cluster: per the fail mode, the rule's policy and the fallback.
    pub(crate) fn degrade(
        &self,
        p: &Prepared<'_>,
        topo: &Topology,
        reason: &'static str,
    ) -> Result<CheckAnswer, ClientError> {
        self.degrade_held(p, topo, reason).map(|(a, _)| a)
    }

    /// [`Inner::degrade`] for an all-or-nothing check: also what the fallback share took.
    pub(crate) fn degrade_held(
        &self,
        p: &Prepared<'_>,
        topo: &Topology,
        reason: &'static str,
    ) -> Result<(CheckAnswer, Option<crate::fallback::Taken>), ClientError> {
        if topo.peers.is_empty() {
            self.wake.notify_one();
        }
        if self.settings.fail_mode == FailMode::Closed {
            return Err(ClientError::Unavailable(reason));
        }
        self.stats.degraded.fetch_add(1, Ordering::Relaxed);
        let Some(known) = p.known else {
            return Ok((self.fallback.unknown(), None));
        };
        if known.on_unreachable == OnOwnerUnreachable::Closed {
            return Ok((self.fallback.deny(&known.rule), None));
        }
        Ok(self
            .fallback
            .hold(p.id, &known.rule, p.check.cost, topo.alive()))
    }

    /// Asks the node that answered last, then the other alive members, then the seeds, for
    /// members and rules; the first that answers replaces the topology. Sticking to one node
    /// keeps the view monotonic while a failure is being detected: nodes declare a dead member
    /// at slightly different times, and alternating between them would bring it back.
    async fn refresh(&self) -> Result<(), String> {
        let mut last_good = self.refreshing.lock().await;
        let topo = self.topology.load_full();
        let mut candidates: Vec<String> = last_good.iter().cloned().collect();
        candidates.extend(topo.http_addrs().map(str::to_owned));
        candidates.extend(self.settings.seeds.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|c| seen.insert(c.clone()));
        let mut last = String::from("no candidates");
        for base in &candidates {
            match topology::fetch(&self.http, base, &self.settings).await {
                Ok((cluster, rules)) => {
                    let next = topo.next(&cluster, &rules, &self.link, &self.peer_stats);
                    if next.ring.members() != topo.ring.members() {
                        tracing::info!(members = ?next.ring.members(), from = %base, "ringlimit members changed");
                    }
                    self.topology.store(Arc::new(next));
                    self.stats.refreshes.fetch_add(1, Ordering::Relaxed);
                    *last_good = Some(base.clone());
                    return Ok(());
                }
                Err(e) => {
                    tracing::debug!(node = %base, error = %e, "discovery failed");
                    last = format!("{base}: {e}");
                }
            }
        }
        self.stats.refresh_failures.fetch_add(1, Ordering::Relaxed);
        Err(last)
    }
}

/// Refreshes every interval, and soon after a check asked for it (at most every
/// [`MIN_REFRESH_GAP`]); ends when the client is dropped.
async fn refresh_loop(inner: Weak<Inner>, wake: Arc<Notify>) {
    let Some(interval) = inner.upgrade().map(|i| i.settings.refresh_interval) else {
        return;
    };
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval.saturating_sub(last.elapsed())) => {}
            _ = wake.notified() => {
                tokio::time::sleep(MIN_REFRESH_GAP.saturating_sub(last.elapsed())).await;
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = inner.refresh().await {
            tracing::debug!(error = %e, "ringlimit refresh failed");
        }
        last = Instant::now();
    }
}
