//! The client: route each check to its owner, fall back locally, keep the topology fresh.

use crate::blocks::Blocked;
use crate::builder::{BuildError, ClientBuilder, Settings};
use crate::check::{Check, ClientError};
use crate::fallback::Fallback;
use crate::lease::Leasing;
use crate::topology::{self, Topology};
use arc_swap::ArcSwap;
use ringlimit_core::check::Resolved;
use ringlimit_core::coordinator::{self, Batch, Site};
use ringlimit_core::link::{PeerSettings, PeerStats, SessionPool, Sessions};
use ringlimit_core::tls::PeerTls;
use ringlimit_proto::{CheckAnswer, RuleRef};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often the peer TLS certificate's files are looked at for a new pair.
const CERT_POLL: Duration = Duration::from_secs(1);
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
    /// Leases of hot keys, when enabled ([`crate::ClientBuilder::leases`]).
    pub(crate) leasing: Option<Leasing>,
    /// Connections of their own to owners, kept for reservations.
    pub(crate) reservations: SessionPool,
    /// Buckets an owner answered blocked, until the block's end.
    pub(crate) blocked: Blocked,
    /// The task that reloads the peer TLS certificate when its files change.
    cert_watch: Option<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(l) = &self.leasing {
            l.stop();
        }
        if let Some(w) = &self.cert_watch {
            w.abort();
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) direct: AtomicU64,
    pub(crate) degraded: AtomicU64,
    pub(crate) replica: AtomicU64,
    pub(crate) blocked: AtomicU64,
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
    /// Checks whose owner did not answer, decided by the owner's replica (`replica: true`).
    pub replica: u64,
    /// Checks denied in-process by a block an owner answered their key and rule by (until the
    /// block's end, no round trip), and the blocked buckets kept (at most 10,000).
    pub blocked: u64,
    pub blocked_buckets: usize,
    /// Checks of hot keys decided in-process on a lease's slice (`leased: true`): admitted,
    /// and denied as the owner said the bucket denies (with leases on).
    pub leased: u64,
    pub leased_denied: u64,
    /// Slices asked for and granted, and tokens held in slices now.
    pub lease_asks: u64,
    pub lease_grants: u64,
    pub leased_tokens: u64,
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
        let mut http = reqwest::Client::builder()
            .timeout(settings.discovery_timeout)
            .connect_timeout(settings.discovery_timeout);
        if let Some(ca) = &settings.http_tls_ca {
            let tls =
                ringlimit_core::tls::http::ca_client_config(ca).map_err(BuildError::HttpTls)?;
            http = http.use_preconfigured_tls(tls);
        }
        let http = http.build().map_err(|e| BuildError::Http(e.to_string()))?;
        let peer_tls = settings
            .peer_tls
            .as_ref()
            .map(PeerTls::load)
            .transpose()
            .map_err(BuildError::PeerTls)?;
        let dialer = match &peer_tls {
            Some(tls) => tls.dialer(ringlimit_core::link::dial::tcp()),
            None => ringlimit_core::link::dial::tcp(),
        };
        // The certificate's files are watched while the client lives.
        let cert_watch = peer_tls
            .as_ref()
            .map(|tls| tokio::spawn(tls.cert().clone().watch(CERT_POLL)).abort_handle());
        let link = Arc::new(PeerSettings {
            dialer,
            node_id: format!("sdk:{}", settings.name),
            cluster_id: settings.cluster_id.clone(),
            secret: settings.secret.clone(),
            client_token: settings.client_token.clone(),
            deadline: settings.deadline,
            connect_timeout: settings.connect_timeout,
            // Shorter than a node's 1 s: a client's deadline is tight (a few ms), so a host stall
            // can open a live owner's circuit; probing again soon bounds what that costs.
            open_for: Duration::from_millis(250),
            queue: 8192,
        });
        let leases = settings.leases;
        let reservations = SessionPool::new(
            Sessions::new(link.clone()),
            ringlimit_core::link::reservations::SESSIONS_PER_OWNER,
        );
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
            leasing: leases.then(Leasing::new),
            reservations,
            blocked: Blocked::default(),
            cert_watch,
        });
        if let Some(l) = &inner.leasing {
            let (topo, clock) = (Arc::downgrade(&inner), Arc::downgrade(&inner));
            l.spawn(
                move || {
                    topo.upgrade()
                        .map_or_else(|| Arc::new(Topology::empty()), |i| i.topology.load_full())
                },
                move || clock.upgrade().map_or(0, |i| i.fallback.now()),
                Sessions::new(inner.link.clone()),
            );
        }
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
        coordinator::check(&self.inner.site(&topo), &p).await
    }

    /// Decides many checks, one frame per owner, all owners at once; answers in order.
    pub async fn check_many(&self, checks: &[Check]) -> Vec<Result<CheckAnswer, ClientError>> {
        let mut topo = self.inner.topology.load_full();
        let mut prepared = Vec::with_capacity(checks.len());
        for check in checks {
            match self.prepare(topo.clone(), check).await {
                Ok((t, p)) => {
                    topo = t;
                    prepared.push(Ok(p));
                }
                Err(e) => prepared.push(Err(e)),
            }
        }
        let site = self.inner.site(&topo);
        let mut many = Batch::new(checks.len(), site.now());
        let mut ready = Vec::with_capacity(checks.len());
        for p in prepared {
            match p {
                Ok(p) => {
                    many.add(&site, &p);
                    ready.push(p);
                }
                Err(e) => many.add_error(e),
            }
        }
        many.finish(&site, &ready).await
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
        topo.owner(id).map(|(o, _)| o.to_string())
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
            replica: s.replica.load(Ordering::Relaxed),
            blocked: s.blocked.load(Ordering::Relaxed),
            blocked_buckets: self.inner.blocked.len(),
            leased: self.leasing(|l| l.leased.load(Ordering::Relaxed)),
            leased_denied: self.leasing(|l| l.denied.load(Ordering::Relaxed)),
            lease_asks: self.leasing(|l| {
                let st = &l.stats;
                [&st.granted, &st.denied, &st.refused, &st.unanswered]
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .sum()
            }),
            lease_grants: self.leasing(|l| l.stats.granted.load(Ordering::Relaxed)),
            leased_tokens: self.leasing(|l| l.held.tokens()),
            refreshes: s.refreshes.load(Ordering::Relaxed),
            refresh_failures: s.refresh_failures.load(Ordering::Relaxed),
            frames: self.inner.peer_stats.frames.load(Ordering::Relaxed),
            checks_sent: self.inner.peer_stats.checks.load(Ordering::Relaxed),
            fallback_buckets: self.inner.fallback.len(),
        }
    }

    /// `f` of the leases, 0 without them.
    fn leasing(&self, f: impl FnOnce(&Leasing) -> u64) -> u64 {
        self.inner.leasing.as_ref().map_or(0, f)
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

impl Inner {
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
                    let https = self.settings.http_tls_ca.is_some();
                    let next = topo.next(&cluster, &rules, &self.link, &self.peer_stats, https);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FailMode;
    use crate::testing::unreachable;
    use ringlimit_proto::{Algorithm, InlineRule};

    fn inline(key: &str, limit: u64) -> Check {
        Check::inline(key, limit, Duration::from_secs(3_600))
    }

    #[test]
    fn a_check_is_identified_key_first_then_rule_then_cost() {
        let topo = Topology::empty();
        let check = inline("k", 5).cost(2);
        let (id, known) = identify(&topo, &check).expect("valid");
        let RuleRef::Inline(rule) = &check.rule else {
            unreachable!()
        };
        let resolved = Resolved::inline(rule).expect("valid");
        assert_eq!(known, Some(resolved));
        assert_eq!(Ok(id), resolved.bucket("k", 2));
        // A named rule before any node answered: no identity, no rule, yet no error.
        assert_eq!(identify(&topo, &Check::named("api", "k")), Ok((0, None)));
        // The key is checked first, as a node checks it.
        assert_eq!(
            identify(&topo, &Check::named("api", "")),
            Err(ClientError::InvalidKey(0))
        );
        let long = "k".repeat(513);
        assert_eq!(
            identify(&topo, &inline(&long, 0)),
            Err(ClientError::InvalidKey(513))
        );
        assert!(matches!(
            identify(&topo, &inline("k", 0)),
            Err(ClientError::InvalidRule(_))
        ));
        assert!(matches!(
            identify(&topo, &inline("k", 5).cost(6)),
            Err(ClientError::CostTooLarge {
                cost: 6,
                capacity: 5
            })
        ));
        // A named rule the rules fetched do not have.
        let fetched = Topology {
            rules: Some(std::collections::HashMap::new()),
            ..Topology::empty()
        };
        assert_eq!(
            identify(&fetched, &Check::named("api", "k")),
            Err(ClientError::UnknownRule("api".into()))
        );
    }

    #[tokio::test]
    async fn without_a_member_inline_limits_hold_on_the_fallback() {
        let client = unreachable(Client::builder()).await;
        assert!(client.members().is_empty());
        assert_eq!(client.owner_of(&inline("k", 3)), None);
        let allowed: Vec<bool> = futures::future::join_all((0..4).map(|_| {
            let (client, check) = (client.clone(), inline("k", 3));
            async move {
                let a = client.check(&check).await.expect("answered");
                assert!(a.degraded && !a.replica && !a.leased, "{a:?}");
                assert_eq!(a.limit, 3);
                a.allowed
            }
        }))
        .await;
        assert_eq!(allowed.iter().filter(|a| **a).count(), 3, "{allowed:?}");
        let stats = client.stats();
        assert_eq!((stats.degraded, stats.direct, stats.frames), (4, 0, 0));
        assert_eq!(stats.fallback_buckets, 1);
        assert!(
            stats.refresh_failures >= 1 && stats.refreshes == 0,
            "{stats:?}"
        );
        assert!(!client.refresh().await, "nobody answers");
    }

    #[tokio::test]
    async fn a_named_rule_never_learnt_is_admitted_without_a_limit() {
        let client = unreachable(Client::builder()).await;
        let a = client
            .check(&Check::named("api", "k"))
            .await
            .expect("answered");
        assert!(a.allowed && a.degraded && a.limit == 0, "{a:?}");
        assert_eq!(client.stats().fallback_buckets, 0, "nothing to count it in");
        assert_eq!(client.period_ms(&RuleRef::Named("api".into())), None);
        let check = inline("k", 1);
        assert_eq!(client.period_ms(&check.rule), Some(3_600_000));
    }

    #[tokio::test]
    async fn fail_closed_without_a_member_is_unavailable_and_says_why() {
        let client = unreachable(Client::builder().fail_mode(FailMode::Closed)).await;
        assert_eq!(
            client.check(&Check::named("api", "k")).await,
            Err(ClientError::Unavailable("no cluster member reached yet"))
        );
        assert_eq!(
            client.check(&inline("k", 3)).await,
            Err(ClientError::Unavailable("no cluster member alive"))
        );
        assert_eq!(client.stats().degraded, 0);
    }

    #[tokio::test]
    async fn a_bad_check_is_an_error_that_takes_nothing_and_a_batch_keeps_its_order() {
        let client = unreachable(Client::builder()).await;
        let leaky =
            Check::inline("k", 2, Duration::from_secs(60)).algorithm(Algorithm::LeakyBucket);
        let answers = client
            .check_many(&[
                inline("a", 2),
                inline("", 2),
                Check {
                    key: "b".into(),
                    rule: RuleRef::Inline(InlineRule {
                        limit: 0,
                        period_ms: 1_000,
                        algorithm: Algorithm::TokenBucket,
                        burst: None,
                        calendar: None,
                    }),
                    cost: 1,
                },
                inline("c", 2).cost(3),
                leaky,
            ])
            .await;
        assert_eq!(answers.len(), 5);
        assert!(matches!(&answers[0], Ok(a) if a.allowed && a.degraded));
        assert_eq!(answers[1], Err(ClientError::InvalidKey(0)));
        assert!(matches!(answers[2], Err(ClientError::InvalidRule(_))));
        assert!(matches!(
            answers[3],
            Err(ClientError::CostTooLarge {
                cost: 3,
                capacity: 2
            })
        ));
        assert!(matches!(&answers[4], Ok(a) if a.allowed));
        assert_eq!(
            client.stats().fallback_buckets,
            2,
            "only the valid checks hold"
        );
    }
}
