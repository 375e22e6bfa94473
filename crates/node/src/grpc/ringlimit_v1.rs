//! `ringlimit.v1.RateLimiter` (`crates/proto/proto/ringlimit/v1/ratelimiter.proto`): the HTTP
//! API's three checks and its reservations (reserve, settle) as gRPC, over the same check
//! service, with the same validation and error codes; and what a client SDK in any language
//! needs to route checks to owners itself: the topology (members, ring, rules; also streamed),
//! held checks, leases and give-backs under a client credential ([`super::credentials`]). A
//! thin edge: messages in and out, deciding in the service, topology from the admin side.

use super::credentials::{self, ClientAuth, Ledgers, StreamCredential};
use super::{all_code, check_code};
use crate::admin::Admin;
use crate::admin::topology::Topology;
use crate::local::holds::Holds;
use crate::rules::{RuleSpec, inline_period};
use crate::service::all_or_nothing::AllOutcome;
use crate::service::clients::{GiveBack, LeaseAsk};
use crate::service::reservations::Reservation;
use crate::service::{Check, CheckService, Edge, MAX_BATCH, Outcome};
use ringlimit_core::all_or_nothing::AllError;
use ringlimit_core::check::CheckError;
use ringlimit_core::reservations::ReserveError;
use ringlimit_core::rule::{FieldError, Mode, OnOwnerUnreachable};
use ringlimit_proto::peer::{LeaseGrant, Mark};
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The code generated from the .proto (build.rs).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("ringlimit.v1");
}

use pb::check_request::RuleSpec as PbRuleSpec;
use pb::rate_limiter_server::RateLimiter;

/// `ringlimit.v1.RateLimiter` over the node's check service and admin side.
pub struct RingLimitV1 {
    pub service: Arc<CheckService>,
    pub admin: Arc<Admin>,
    pub auth: ClientAuth,
    pub ledgers: Ledgers,
    /// One permit per WatchTopology stream open (`--grpc-max-connections` of them: a client
    /// watches from one connection).
    pub watchers: Arc<Semaphore>,
}

/// Most CheckStream requests decided at once on one stream (the .proto says so).
pub const STREAM_IN_FLIGHT: usize = 128;
/// Most asks of one Lease, and give-backs of one GiveBack.
const MOST_ITEMS: usize = 1000;
/// A lease holder's id: 1 to this many bytes.
const MOST_HOLDER_BYTES: usize = 64;
/// WatchTopology's heartbeat: unset, and its bounds (ms).
const HEARTBEAT_MS: u64 = 10_000;
const HEARTBEAT_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=60_000;
/// The ring scheme clients compute owners by (`clients/golden/README.md`).
const RING_SCHEME: &str = "xxh3-64-v1";

impl RingLimitV1 {
    /// The ledger a call's held checks are recorded in, when it asks for holds (`hold`) and
    /// has a credential (or the node needs none); `None`: its checks are decided unheld (a
    /// hold is that credential's to give back, and an anonymous one on a node that needs
    /// credentials could never be).
    fn hold_ledger<T>(
        &self,
        request: &tonic::Request<T>,
        hold: bool,
    ) -> Option<Arc<parking_lot::Mutex<Holds>>> {
        if !hold {
            return None;
        }
        let name = self.credential(request, "a held check").ok()?;
        Some(self.ledgers.of(&name))
    }

    /// The credential name of `request`'s caller, or why it has none (see
    /// [`ClientAuth::credential`]).
    fn credential<T>(
        &self,
        request: &tonic::Request<T>,
        call: &str,
    ) -> Result<String, credentials::Refused> {
        let value = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().map_err(|_| ()));
        self.auth.credential(value, call)
    }
}

/// A gRPC status carrying the HTTP API's error code: `"<code>: <sentence>"`.
fn status(grpc: tonic::Code, code: &str, message: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::new(grpc, format!("{code}: {message}"))
}

fn check_status(e: &CheckError) -> tonic::Status {
    status(check_code(e), e.code(), e)
}

fn reserve_status(e: &ReserveError) -> tonic::Status {
    let grpc = match e {
        ReserveError::Check(c) => check_code(c),
        ReserveError::Ttl { .. } | ReserveError::NotReservable(_) => tonic::Code::InvalidArgument,
        ReserveError::Unknown => tonic::Code::NotFound,
        ReserveError::TooMany(_) | ReserveError::Unavailable(_) => tonic::Code::Unavailable,
    };
    status(grpc, e.code(), e)
}

fn all_status(e: &AllError) -> tonic::Status {
    status(all_code(e), e.code(), e)
}

/// Why a request message cannot be a check (before the service sees it).
struct Invalid {
    code: &'static str,
    message: String,
}

impl Invalid {
    fn status(&self) -> tonic::Status {
        status(tonic::Code::InvalidArgument, self.code, &self.message)
    }
}

/// The check a request message asks for.
fn check(r: &pb::CheckRequest) -> Result<Check<'_>, Invalid> {
    let rule = match &r.rule_spec {
        Some(PbRuleSpec::Rule(name)) => RuleSpec::Named(name),
        Some(PbRuleSpec::Inline(i)) => RuleSpec::Inline(inline(i)?),
        None => {
            return Err(Invalid {
                code: "invalid_request",
                message: "a check needs either `rule` or `inline`".into(),
            });
        }
    };
    Ok(Check {
        key: &r.key,
        rule,
        cost: r.cost.unwrap_or(1),
        shadow: false,
    })
}

/// An inline rule message as a rule: `period_ms`, or `period` in the rules file's words and a
/// calendar, refused as the HTTP API and the rules file refuse them.
fn inline(i: &pb::InlineRule) -> Result<InlineRule, Invalid> {
    let algorithm = algorithm(i.algorithm)?;
    let field = |e: FieldError| Invalid {
        code: e.code(),
        message: e.to_string(),
    };
    let timezone = (!i.timezone.is_empty()).then_some(i.timezone.as_str());
    let (period_ms, calendar) = if i.period.is_empty() && !i.calendar && timezone.is_none() {
        (i.period_ms, None)
    } else {
        let period = (!i.period.is_empty()).then_some(i.period.as_str());
        let (period_ms, cal) =
            inline_period(algorithm, i.period_ms, period, i.calendar, timezone).map_err(field)?;
        // proto3 cannot tell an unset `period_ms` from 0: 0 is "not given".
        if !i.period.is_empty() && i.period_ms != 0 && i.period_ms != period_ms {
            return Err(Invalid {
                code: "invalid_request",
                message: format!(
                    "`period_ms` {} and `period` {:?} ({period_ms} ms) disagree: give one of them",
                    i.period_ms, i.period
                ),
            });
        }
        (period_ms, cal)
    };
    Ok(InlineRule {
        limit: i.limit,
        period_ms,
        algorithm,
        burst: i.burst,
        calendar,
    })
}

fn algorithm(value: i32) -> Result<Algorithm, Invalid> {
    use pb::Algorithm as A;
    match A::try_from(value) {
        Ok(A::Unspecified) => Ok(Algorithm::default()),
        Ok(A::TokenBucket) => Ok(Algorithm::TokenBucket),
        Ok(A::FixedWindow) => Ok(Algorithm::FixedWindow),
        Ok(A::SlidingWindow) => Ok(Algorithm::SlidingWindow),
        Ok(A::SlidingLog) => Ok(Algorithm::SlidingLog),
        Ok(A::LeakyBucket) => Ok(Algorithm::LeakyBucket),
        Err(_) => Err(Invalid {
            code: "unknown_algorithm",
            message: format!("unknown algorithm {value}"),
        }),
    }
}

fn answer(o: &Outcome) -> pb::CheckResponse {
    let a = &o.answer;
    pb::CheckResponse {
        allowed: a.allowed,
        limit: a.limit,
        remaining: a.remaining,
        reset_at_ms: a.reset_at_ms,
        retry_after_ms: a.retry_after_ms,
        degraded: a.degraded,
        shadow_denied: o.shadow_denied,
        replica: a.replica,
        leased: a.leased,
        blocked: o.blocked.is_some(),
        block_reason: match o.blocked {
            None => pb::BlockReason::Unspecified,
            Some(crate::blocks::BlockSource::Auto) => pb::BlockReason::Auto,
            Some(crate::blocks::BlockSource::Managed) => pb::BlockReason::Managed,
        } as i32,
        hold: None,
    }
}

/// [`answer`] of a held check: with its mark when it took something.
fn held_answer(o: &Outcome, mark: Option<Mark>) -> pb::CheckResponse {
    pb::CheckResponse {
        hold: mark.map(pb_mark),
        ..answer(o)
    }
}

/// A bucket's answer (a lease's take or refusal) as a check's.
fn bucket_answer(a: &CheckAnswer) -> pb::CheckResponse {
    pb::CheckResponse {
        allowed: a.allowed,
        limit: a.limit,
        remaining: a.remaining,
        reset_at_ms: a.reset_at_ms,
        retry_after_ms: a.retry_after_ms,
        degraded: a.degraded,
        shadow_denied: None,
        replica: a.replica,
        leased: a.leased,
        blocked: false,
        block_reason: pb::BlockReason::Unspecified as i32,
        hold: None,
    }
}

fn pb_mark(m: Mark) -> pb::Mark {
    pb::Mark {
        reset_ns: m.reset_ns,
        at_ns: m.at_ns,
    }
}

fn grant(g: LeaseGrant) -> pb::LeaseGrant {
    use pb::lease_grant::Result as R;
    pb::LeaseGrant {
        result: Some(match g {
            LeaseGrant::Granted {
                tokens,
                mark,
                valid_ns,
                answer,
            } => R::Granted(pb::Granted {
                tokens,
                valid_ns,
                mark: Some(pb_mark(mark)),
                answer: Some(bucket_answer(&answer)),
            }),
            LeaseGrant::Refused { answer } => R::Refused(bucket_answer(&answer)),
            LeaseGrant::Error { code, message } => R::Error(pb::Error {
                error: code,
                message,
            }),
        }),
    }
}

fn pb_algorithm(a: Algorithm) -> pb::Algorithm {
    match a {
        Algorithm::TokenBucket => pb::Algorithm::TokenBucket,
        Algorithm::FixedWindow => pb::Algorithm::FixedWindow,
        Algorithm::SlidingWindow => pb::Algorithm::SlidingWindow,
        Algorithm::SlidingLog => pb::Algorithm::SlidingLog,
        Algorithm::LeakyBucket => pb::Algorithm::LeakyBucket,
    }
}

fn topology(t: Topology) -> pb::TopologyResponse {
    pb::TopologyResponse {
        node_id: t.node_id,
        cluster_id: t.cluster_id,
        version: t.version,
        members: t
            .members
            .into_iter()
            .map(|m| pb::Member {
                node_id: m.node_id,
                grpc_addr: m.grpc_addr,
                http_addr: m.http_addr,
                peer_addr: m.peer_addr,
            })
            .collect(),
        ring: Some(pb::RingParams {
            scheme: RING_SCHEME.to_owned(),
            vnodes_per_member: ringlimit_proto::ring::VNODES_PER_MEMBER,
        }),
        rules: t
            .rules
            .into_iter()
            .map(|r| {
                let i = r.info;
                pb::RuleInfo {
                    name: i.name,
                    algorithm: pb_algorithm(i.algorithm) as i32,
                    limit: i.limit,
                    period_ms: i.period_ms,
                    period: i.period,
                    burst: i.burst,
                    mode: match i.mode {
                        Mode::Owner => pb::RuleMode::Owner,
                        Mode::Global => pb::RuleMode::Global,
                    } as i32,
                    fail_closed: i.on_owner_unreachable == OnOwnerUnreachable::Closed,
                    shadow: i.shadow,
                    leasable: r.leasable,
                    calendar: i.calendar,
                    timezone: i.timezone.unwrap_or_default(),
                    seed: r.seed,
                }
            })
            .collect(),
    }
}

/// A lease ask message as the service takes it, or why not.
fn lease_ask(a: &pb::LeaseAsk) -> Result<LeaseAsk<'_>, Invalid> {
    let rule = match &a.rule_spec {
        Some(pb::lease_ask::RuleSpec::Rule(n)) => RuleSpec::Named(n),
        Some(pb::lease_ask::RuleSpec::Inline(i)) => RuleSpec::Inline(inline(i)?),
        None => {
            return Err(Invalid {
                code: "invalid_request",
                message: "an ask needs either `rule` or `inline`".into(),
            });
        }
    };
    if a.want == 0 {
        return Err(Invalid {
            code: "invalid_request",
            message: "`want` must be at least 1".into(),
        });
    }
    Ok(LeaseAsk {
        key: &a.key,
        rule,
        want: a.want,
    })
}

/// A give-back message as the service takes it; `None`: it names nothing that could have
/// been taken (no rule, no mark), and is honoured 0.
fn give_back(it: &pb::GiveBackItem) -> Option<GiveBack<'_>> {
    let rule = match it.rule_spec.as_ref()? {
        pb::give_back_item::RuleSpec::Rule(n) => RuleSpec::Named(n),
        pb::give_back_item::RuleSpec::Inline(i) => RuleSpec::Inline(inline(i).ok()?),
    };
    let mark = it.mark?;
    Some(GiveBack {
        key: &it.key,
        rule,
        tokens: it.tokens,
        mark: Mark {
            reset_ns: mark.reset_ns,
            at_ns: mark.at_ns,
        },
    })
}

/// `count` items of a call that takes 1 to [`MOST_ITEMS`], or its INVALID_ARGUMENT.
fn items(count: usize, field: &str) -> Result<(), tonic::Status> {
    if count == 0 || count > MOST_ITEMS {
        return Err(status(
            tonic::Code::InvalidArgument,
            "invalid_request",
            format!("`{field}` must hold 1 to {MOST_ITEMS} items, got {count}"),
        ));
    }
    Ok(())
}

/// WatchTopology's heartbeat, or its INVALID_ARGUMENT.
fn heartbeat(r: &pb::TopologyRequest) -> Result<Duration, tonic::Status> {
    let ms = r.heartbeat_ms.unwrap_or(HEARTBEAT_MS);
    if !HEARTBEAT_MS_RANGE.contains(&ms) {
        return Err(status(
            tonic::Code::InvalidArgument,
            "invalid_request",
            format!(
                "`heartbeat_ms` must be between {} and {}, got {ms}",
                HEARTBEAT_MS_RANGE.start(),
                HEARTBEAT_MS_RANGE.end()
            ),
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// The stream of topologies WatchTopology answers.
type TopologyStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::TopologyResponse, tonic::Status>> + Send>>;

/// The current topology at once, then each changed one, and an unchanged copy whenever
/// `every` passes without one. Holds `permit` (one of the watchers') while it lives.
fn watch(
    admin: Arc<Admin>,
    every: Duration,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> TopologyStream {
    struct Watch {
        admin: Arc<Admin>,
        changes: crate::admin::topology::TopologyChanges,
        every: Duration,
        /// The version last sent; `None` before the first message.
        sent: Option<u64>,
        due: tokio::time::Instant,
        _permit: tokio::sync::OwnedSemaphorePermit,
    }
    let state = Watch {
        changes: admin.topology_changes(),
        admin,
        every,
        sent: None,
        due: tokio::time::Instant::now(),
        _permit: permit,
    };
    Box::pin(futures::stream::unfold(state, |mut w| async move {
        loop {
            if w.sent.is_some() {
                tokio::select! {
                    alive = w.changes.changed() => if !alive { return None },
                    () = tokio::time::sleep_until(w.due) => {}
                }
            }
            let t = w.admin.topology();
            let now = tokio::time::Instant::now();
            if w.sent != Some(t.version) || now >= w.due {
                w.sent = Some(t.version);
                w.due = now + w.every;
                return Some((Ok(topology(t)), w));
            }
        }
    }))
}

fn all_answer(o: &AllOutcome) -> pb::CheckAllResponse {
    pb::CheckAllResponse {
        allowed: o.allowed,
        binding: o.results.get(o.binding).map(answer),
        binding_index: u32::try_from(o.binding).unwrap_or(u32::MAX),
        degraded: o.degraded,
        results: o.results.iter().map(answer).collect(),
    }
}

/// Every check of a request message, or the first invalid one's error naming its index.
fn checks(requests: &[pb::CheckRequest]) -> Result<Vec<Check<'_>>, tonic::Status> {
    requests
        .iter()
        .enumerate()
        .map(|(index, r)| {
            check(r).map_err(|e| {
                status(
                    tonic::Code::InvalidArgument,
                    e.code,
                    format!("check {index}: {}", e.message),
                )
            })
        })
        .collect()
}

/// Whether `count` checks make a batch (CheckBatch, a CheckStream request): 1 to [`MAX_BATCH`].
fn batch_size(count: usize) -> Result<(), Invalid> {
    if count == 0 || count > MAX_BATCH {
        return Err(Invalid {
            code: "invalid_batch",
            message: format!("`checks` must hold 1 to {MAX_BATCH} checks, got {count}"),
        });
    }
    Ok(())
}

/// The answers to a batch of checks, in order: an invalid check's error in its place, the
/// valid ones decided together; held ones (`hold`) recorded in `ledger` when there is one.
async fn decide(
    service: &CheckService,
    ledger: Option<&parking_lot::Mutex<Holds>>,
    requests: &[pb::CheckRequest],
) -> Vec<pb::CheckBatchResult> {
    let error = |code: &str, message: String| pb::CheckBatchResult {
        result: Some(pb::check_batch_result::Result::Error(pb::Error {
            error: code.to_owned(),
            message,
        })),
    };
    let answered = |a: pb::CheckResponse| pb::CheckBatchResult {
        result: Some(pb::check_batch_result::Result::Answer(a)),
    };
    let held = ledger.filter(|_| requests.iter().any(|c| c.hold));
    // One plain check (an SDK's usual stream request) goes the unary Check's way, without a
    // batch's vectors.
    if let ([one], None) = (requests, held) {
        return vec![match check(one) {
            Err(e) => error(e.code, e.message),
            Ok(c) => match service.check(Edge::Grpc, &c).await {
                Ok(o) => answered(answer(&o)),
                Err(e) => error(e.code(), e.to_string()),
            },
        }];
    }
    let parsed: Vec<Result<Check<'_>, Invalid>> = requests.iter().map(check).collect();
    let valid: Vec<(Check<'_>, bool)> = parsed
        .iter()
        .zip(requests)
        .filter_map(|(p, m)| p.as_ref().ok().map(|c| (*c, m.hold)))
        .collect();
    let mut decided = match held {
        Some(ledger) => service
            .check_many_holding(Edge::Grpc, &valid, ledger)
            .await
            .into_iter(),
        None => {
            let plain: Vec<Check<'_>> = valid.iter().map(|(c, _)| *c).collect();
            service
                .check_many(Edge::Grpc, &plain)
                .await
                .into_iter()
                .map(|r| r.map(|o| (o, None)))
                .collect::<Vec<_>>()
                .into_iter()
        }
    };
    parsed
        .into_iter()
        .map(|p| match p {
            Err(e) => error(e.code, e.message),
            Ok(_) => match decided.next() {
                Some(Ok((o, mark))) => answered(held_answer(&o, mark)),
                Some(Err(e)) => error(e.code(), e.to_string()),
                None => error("unavailable", "no answer was produced".into()),
            },
        })
        .collect()
}

/// The stream of answers CheckStream sends.
type CheckStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::CheckStreamResponse, tonic::Status>> + Send>>;

/// CheckStream's answers to `requests`, each decided as a CheckBatch (see [`in_flight`]),
/// while `credential` stays valid.
fn check_stream(
    service: Arc<CheckService>,
    ledger: Arc<parking_lot::Mutex<Holds>>,
    mut credential: StreamCredential,
    requests: tonic::Streaming<pb::CheckStreamRequest>,
) -> CheckStream {
    Box::pin(in_flight(requests, move |r| {
        credential.still_valid().map_err(|r| r.status())?;
        let (service, ledger) = (service.clone(), ledger.clone());
        Ok(async move {
            match batch_size(r.checks.len()) {
                Err(e) => pb::CheckStreamResponse {
                    id: r.id,
                    results: Vec::new(),
                    error: Some(pb::Error {
                        error: e.code.to_owned(),
                        message: e.message,
                    }),
                },
                Ok(()) => pb::CheckStreamResponse {
                    id: r.id,
                    results: decide(&service, Some(&ledger), &r.checks).await,
                    error: None,
                },
            }
        })
    }))
}

/// `answer` of each of `requests`, up to [`STREAM_IN_FLIGHT`] at once, each sent as soon as
/// it is made; an `answer` that refuses (a revoked credential) ends the answers with its status. All on the call's own task (`buffer_unordered` polls the answers in flight
/// itself): no task per request, and no request read while [`STREAM_IN_FLIGHT`] wait, so a
/// client that sends faster than it is answered is held back by HTTP/2's flow control, not
/// buffered here. A broken request stream (the client reset it, a message that does not
/// decode) ends the answers with its status.
fn in_flight<Req, Resp, Fut>(
    requests: impl futures::Stream<Item = Result<Req, tonic::Status>>,
    mut answer: impl FnMut(Req) -> Result<Fut, tonic::Status>,
) -> impl futures::Stream<Item = Result<Resp, tonic::Status>>
where
    Fut: Future<Output = Resp>,
{
    use futures::StreamExt as _;
    requests
        .map(move |request| {
            let answering = request.and_then(&mut answer);
            async move { Ok(answering?.await) }
        })
        .buffer_unordered(STREAM_IN_FLIGHT)
}

#[tonic::async_trait]
impl RateLimiter for RingLimitV1 {
    async fn check(
        &self,
        request: tonic::Request<pb::CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        let ledger = self.hold_ledger(&request, request.get_ref().hold);
        let r = request.into_inner();
        let c = check(&r).map_err(|e| e.status())?;
        let Some(ledger) = ledger else {
            let outcome = self
                .service
                .check(Edge::Grpc, &c)
                .await
                .map_err(|e| check_status(&e))?;
            return Ok(tonic::Response::new(answer(&outcome)));
        };
        let mut held = self
            .service
            .check_many_holding(Edge::Grpc, &[(c, true)], &ledger)
            .await;
        match held.pop() {
            Some(Ok((o, mark))) => Ok(tonic::Response::new(held_answer(&o, mark))),
            Some(Err(e)) => Err(check_status(&e)),
            None => Err(check_status(&CheckError::Unavailable(
                "no answer was produced",
            ))),
        }
    }

    async fn check_batch(
        &self,
        request: tonic::Request<pb::CheckBatchRequest>,
    ) -> Result<tonic::Response<pb::CheckBatchResponse>, tonic::Status> {
        let (metadata, extensions, r) = request.into_parts();
        let request_meta = tonic::Request::from_parts(metadata, extensions, ());
        batch_size(r.checks.len()).map_err(|e| e.status())?;
        let held = r.checks.iter().any(|c| c.hold);
        let ledger = self.hold_ledger(&request_meta, held);
        let results = decide(&self.service, ledger.as_deref(), &r.checks).await;
        Ok(tonic::Response::new(pb::CheckBatchResponse { results }))
    }

    async fn check_all(
        &self,
        request: tonic::Request<pb::CheckAllRequest>,
    ) -> Result<tonic::Response<pb::CheckAllResponse>, tonic::Status> {
        let r = request.into_inner();
        let checks = checks(&r.checks)?;
        let outcome = self
            .service
            .check_all(Edge::Grpc, &checks)
            .await
            .map_err(|e| all_status(&e))?;
        Ok(tonic::Response::new(all_answer(&outcome)))
    }

    async fn reserve(
        &self,
        request: tonic::Request<pb::ReserveRequest>,
    ) -> Result<tonic::Response<pb::ReserveResponse>, tonic::Status> {
        let r = request.into_inner();
        let Some(c) = &r.check else {
            return Err(status(
                tonic::Code::InvalidArgument,
                "invalid_request",
                "a reservation needs `check`",
            ));
        };
        let c = check(c).map_err(|e| e.status())?;
        let reserved = self
            .service
            .reserve(Edge::Grpc, &c, r.ttl_ms)
            .await
            .map_err(|e| reserve_status(&e))?;
        Ok(tonic::Response::new(match reserved {
            Reservation::Denied(o) => pb::ReserveResponse {
                reservation: String::new(),
                cost: 0,
                answer: Some(answer(&o)),
            },
            Reservation::Reserved(r) => pb::ReserveResponse {
                reservation: r.id,
                cost: r.cost,
                answer: Some(answer(&r.outcome)),
            },
        }))
    }

    async fn settle(
        &self,
        request: tonic::Request<pb::SettleRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        let r = request.into_inner();
        let settled = self
            .service
            .settle(&r.reservation, r.cost)
            .await
            .map_err(|e| reserve_status(&e))?;
        Ok(tonic::Response::new(answer(&settled.outcome)))
    }

    async fn topology(
        &self,
        _request: tonic::Request<pb::TopologyRequest>,
    ) -> Result<tonic::Response<pb::TopologyResponse>, tonic::Status> {
        Ok(tonic::Response::new(topology(self.admin.topology())))
    }

    type WatchTopologyStream = TopologyStream;

    async fn watch_topology(
        &self,
        request: tonic::Request<pb::TopologyRequest>,
    ) -> Result<tonic::Response<Self::WatchTopologyStream>, tonic::Status> {
        let every = heartbeat(request.get_ref())?;
        let Ok(permit) = self.watchers.clone().try_acquire_owned() else {
            return Err(status(
                tonic::Code::ResourceExhausted,
                "too_many_watchers",
                "this node streams its topology to --grpc-max-connections watchers at most; \
                 watch another member, or call Topology",
            ));
        };
        Ok(tonic::Response::new(watch(
            self.admin.clone(),
            every,
            permit,
        )))
    }

    async fn lease(
        &self,
        request: tonic::Request<pb::LeaseRequest>,
    ) -> Result<tonic::Response<pb::LeaseResponse>, tonic::Status> {
        let name = self.credential(&request, "Lease").map_err(|r| r.status())?;
        let r = request.into_inner();
        if r.holder.is_empty() || r.holder.len() > MOST_HOLDER_BYTES {
            return Err(status(
                tonic::Code::InvalidArgument,
                "invalid_request",
                format!(
                    "`holder` must be 1 to {MOST_HOLDER_BYTES} bytes, got {}",
                    r.holder.len()
                ),
            ));
        }
        items(r.asks.len(), "asks")?;
        let parsed: Vec<Result<LeaseAsk<'_>, Invalid>> = r.asks.iter().map(lease_ask).collect();
        let valid: Vec<LeaseAsk<'_>> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().copied())
            .collect();
        let ledger = self.ledgers.of(&name);
        let holder = credentials::holder(&name, &r.holder);
        let mut granted = self
            .service
            .lease(&holder, &valid, &ledger)
            .await
            .into_iter();
        let grants = parsed
            .iter()
            .map(|p| match p {
                Err(e) => grant(LeaseGrant::Error {
                    code: e.code.to_owned(),
                    message: e.message.clone(),
                }),
                Ok(_) => grant(granted.next().unwrap_or(LeaseGrant::Error {
                    code: "unavailable".to_owned(),
                    message: "no answer was produced".to_owned(),
                })),
            })
            .collect();
        Ok(tonic::Response::new(pb::LeaseResponse { grants }))
    }

    async fn give_back(
        &self,
        request: tonic::Request<pb::GiveBackRequest>,
    ) -> Result<tonic::Response<pb::GiveBackResponse>, tonic::Status> {
        let name = self
            .credential(&request, "GiveBack")
            .map_err(|r| r.status())?;
        let r = request.into_inner();
        items(r.items.len(), "items")?;
        let parsed: Vec<Option<GiveBack<'_>>> = r.items.iter().map(give_back).collect();
        let valid: Vec<GiveBack<'_>> = parsed.iter().flatten().copied().collect();
        let ledger = self.ledgers.of(&name);
        let mut given = self.service.give_back(&valid, &ledger).into_iter();
        let honoured = parsed
            .iter()
            .map(|p| match p {
                None => 0,
                Some(_) => given.next().unwrap_or(0),
            })
            .collect();
        Ok(tonic::Response::new(pb::GiveBackResponse { honoured }))
    }

    type CheckStreamStream = CheckStream;

    async fn check_stream(
        &self,
        request: tonic::Request<tonic::Streaming<pb::CheckStreamRequest>>,
    ) -> Result<tonic::Response<Self::CheckStreamStream>, tonic::Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().map_err(|_| ()));
        let (name, credential) = StreamCredential::open(&self.auth, authorization, "CheckStream")
            .map_err(|r| r.status())?;
        Ok(tonic::Response::new(check_stream(
            self.service.clone(),
            self.ledgers.of(&name),
            credential,
            request.into_inner(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::calendar::Unit;
    use ringlimit_core::clock::NANOS_PER_MS;

    fn rule(f: impl FnOnce(&mut pb::InlineRule)) -> pb::InlineRule {
        let mut r = pb::InlineRule {
            limit: 5,
            algorithm: pb::Algorithm::FixedWindow as i32,
            ..Default::default()
        };
        f(&mut r);
        r
    }

    fn refused(r: &pb::InlineRule) -> (&'static str, String) {
        match inline(r) {
            Ok(rule) => panic!("{r:?} was taken as {rule:?}"),
            Err(e) => (e.code, e.message),
        }
    }

    #[test]
    fn period_ms_alone_is_the_plain_rule_as_before() {
        let r = inline(&rule(|r| r.period_ms = 60_000)).unwrap_or_else(|_| panic!("refused"));
        assert_eq!((r.period_ms, r.calendar), (60_000, None));
    }

    #[test]
    fn period_and_calendar_make_a_calendar_rule() {
        let month = inline(&rule(|r| {
            r.period = "1mo".into();
            r.calendar = true;
            r.timezone = "Europe/Berlin".into();
        }))
        .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(month.calendar.map(|c| c.unit), Some(Unit::Month));
        assert_eq!(month.period_ms, Unit::Month.nominal_ns() / NANOS_PER_MS);
        // A period_ms that agrees with `period` is taken; a calendar day by `period_ms` too.
        let day = inline(&rule(|r| {
            r.period = "1d".into();
            r.period_ms = 86_400_000;
            r.calendar = true;
        }))
        .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(day.calendar.map(|c| c.unit), Some(Unit::Day));
        let week = inline(&rule(|r| {
            r.period_ms = 7 * 86_400_000;
            r.calendar = true;
        }))
        .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(week.calendar.map(|c| c.unit), Some(Unit::Week));
        // `period` without a calendar is the plain window of that length.
        let plain =
            inline(&rule(|r| r.period = "1h".into())).unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!((plain.period_ms, plain.calendar), (3_600_000, None));
    }

    #[test]
    fn bad_calendar_fields_are_refused_with_the_http_apis_codes() {
        let cases: [(pb::InlineRule, &str); 7] = [
            (
                rule(|r| {
                    r.period = "1d".into();
                    r.calendar = true;
                    r.timezone = "Nowhere/City".into();
                }),
                "invalid_rule",
            ),
            (rule(|r| r.period = "1mo".into()), "invalid_period"),
            (rule(|r| r.period = "soon".into()), "invalid_period"),
            (
                rule(|r| {
                    r.period = "1d".into();
                    r.calendar = true;
                    r.algorithm = pb::Algorithm::SlidingWindow as i32;
                }),
                "invalid_rule",
            ),
            (
                rule(|r| {
                    r.period_ms = 60_000;
                    r.calendar = true;
                }),
                "invalid_rule",
            ),
            (
                rule(|r| {
                    r.period = "1d".into();
                    r.period_ms = 60_000;
                }),
                "invalid_request",
            ),
            (
                rule(|r| {
                    r.period = "1mo".into();
                    r.calendar = true;
                    r.period_ms = 30 * 86_400_000;
                }),
                "invalid_request",
            ),
        ];
        for (r, code) in cases {
            assert_eq!(refused(&r).0, code, "{r:?}");
        }
    }

    /// Every inline rule of the golden file (`clients/golden/owners.json`), sent as a client
    /// sends it, gets the seed the file says: SDKs that agree with the file agree with this
    /// edge.
    #[test]
    fn golden_inline_rules_have_the_golden_seeds_here() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../clients/golden/owners.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let golden: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = 0;
        for case in golden["cases"].as_array().into_iter().flatten() {
            let Some(j) = case["rule"].get("inline") else {
                continue;
            };
            let algorithm = Algorithm::ALL
                .into_iter()
                .find(|a| Some(a.as_str()) == j["algorithm"].as_str())
                .unwrap_or_else(|| panic!("{j}"));
            let msg = pb::InlineRule {
                limit: j["limit"].as_u64().unwrap_or_default(),
                period_ms: j["period_ms"].as_u64().unwrap_or_default(),
                algorithm: pb_algorithm(algorithm) as i32,
                burst: j["burst"].as_u64(),
                period: j["period"].as_str().unwrap_or_default().to_owned(),
                calendar: j["calendar"].as_bool().unwrap_or_default(),
                timezone: j["timezone"].as_str().unwrap_or_default().to_owned(),
            };
            let rule = inline(&msg).unwrap_or_else(|e| panic!("{j}: {}", e.message));
            let valid =
                ringlimit_core::rule::validate_inline(&rule).unwrap_or_else(|e| panic!("{e}"));
            let seed = ringlimit_core::rule::inline_seed(&valid);
            assert_eq!(
                Some(seed.to_string().as_str()),
                case["seed"].as_str(),
                "{j}"
            );
            let key = case["key"].as_str().unwrap_or_default();
            let id = ringlimit_core::rule::bucket_id(seed, key);
            assert_eq!(Some(id.to_string().as_str()), case["bucket_id"].as_str());
            seen += 1;
        }
        assert!(seen >= 100, "{seen} inline cases");
    }

    fn ask(f: impl FnOnce(&mut pb::LeaseAsk)) -> pb::LeaseAsk {
        let mut a = pb::LeaseAsk {
            key: "k".into(),
            rule_spec: Some(pb::lease_ask::RuleSpec::Rule("api".into())),
            want: 10,
            demand_per_s: 0,
        };
        f(&mut a);
        a
    }

    #[test]
    fn lease_asks_need_a_rule_and_a_want() {
        assert!(lease_ask(&ask(|_| {})).is_ok());
        let code = |a: pb::LeaseAsk| lease_ask(&a).err().map(|e| e.code);
        assert_eq!(code(ask(|a| a.want = 0)), Some("invalid_request"));
        assert_eq!(code(ask(|a| a.rule_spec = None)), Some("invalid_request"));
        assert_eq!(
            code(ask(|a| {
                a.rule_spec = Some(pb::lease_ask::RuleSpec::Inline(rule(|r| {
                    r.period = "1mo".into()
                })))
            })),
            Some("invalid_period")
        );
        let inline_ask = ask(|a| {
            a.rule_spec = Some(pb::lease_ask::RuleSpec::Inline(rule(|r| {
                r.period_ms = 1_000
            })))
        });
        assert!(matches!(
            lease_ask(&inline_ask).map(|a| a.rule),
            Ok(RuleSpec::Inline(InlineRule {
                period_ms: 1_000,
                ..
            }))
        ));
    }

    #[test]
    fn a_give_back_without_a_rule_or_a_mark_names_nothing() {
        let item = |rule: bool, mark: bool| pb::GiveBackItem {
            key: "k".into(),
            rule_spec: rule.then(|| pb::give_back_item::RuleSpec::Rule("api".into())),
            tokens: 3,
            mark: mark.then_some(pb::Mark {
                reset_ns: 5,
                at_ns: 6,
            }),
        };
        let taken = give_back(&item(true, true)).map(|g| (g.tokens, g.mark));
        assert_eq!(
            taken,
            Some((
                3,
                Mark {
                    reset_ns: 5,
                    at_ns: 6
                }
            ))
        );
        assert!(give_back(&item(false, true)).is_none());
        assert!(give_back(&item(true, false)).is_none());
    }

    #[test]
    fn counts_and_heartbeats_out_of_bounds_are_invalid_arguments() {
        assert!(items(1, "asks").is_ok() && items(MOST_ITEMS, "asks").is_ok());
        for n in [0, MOST_ITEMS + 1] {
            let e = items(n, "asks").expect_err("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.message().starts_with("invalid_request: `asks`"),
                "{}",
                e.message()
            );
        }
        let hb = |ms: Option<u64>| heartbeat(&pb::TopologyRequest { heartbeat_ms: ms });
        assert_eq!(hb(None).ok(), Some(Duration::from_secs(10)));
        assert_eq!(hb(Some(1_000)).ok(), Some(Duration::from_secs(1)));
        assert_eq!(hb(Some(60_000)).ok(), Some(Duration::from_secs(60)));
        for bad in [0, 999, 60_001, u64::MAX] {
            let e = hb(Some(bad)).expect_err("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }
    /// At most [`STREAM_IN_FLIGHT`] requests are read while their answers wait; one answered
    /// lets one more in; a broken request stream ends the answers with its status.
    #[test]
    fn a_stream_reads_no_further_than_its_requests_in_flight() {
        use futures::{FutureExt as _, StreamExt as _};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<u64, tonic::Status>>();
        for id in 0..STREAM_IN_FLIGHT as u64 + 50 {
            tx.unbounded_send(Ok(id)).unwrap_or_else(|e| panic!("{e}"));
        }
        let read = Arc::new(AtomicUsize::new(0));
        let gates: Arc<parking_lot::Mutex<Vec<futures::channel::oneshot::Sender<()>>>> =
            Arc::default();
        let answers = in_flight(rx, {
            let (read, gates) = (read.clone(), gates.clone());
            move |id: u64| {
                read.fetch_add(1, Ordering::SeqCst);
                let (open, gate) = futures::channel::oneshot::channel();
                gates.lock().push(open);
                Ok(async move {
                    let _ = gate.await;
                    id
                })
            }
        });
        futures::pin_mut!(answers);
        assert!(
            answers.next().now_or_never().is_none(),
            "nothing answered yet"
        );
        assert_eq!(read.load(Ordering::SeqCst), STREAM_IN_FLIGHT);
        let first = gates.lock().remove(0);
        let _ = first.send(());
        let got = answers.next().now_or_never().flatten().map(|r| r.ok());
        assert_eq!(got, Some(Some(0)));
        assert!(answers.next().now_or_never().is_none());
        assert_eq!(read.load(Ordering::SeqCst), STREAM_IN_FLIGHT + 1);
        // The client's stream breaks: the answers end with its status.
        tx.unbounded_send(Err(tonic::Status::cancelled("reset")))
            .unwrap_or_else(|e| panic!("{e}"));
        for open in gates.lock().drain(..) {
            let _ = open.send(());
        }
        let mut codes = Vec::new();
        while let Some(Some(r)) = answers.next().now_or_never() {
            if let Err(e) = r {
                codes.push(e.code());
            }
        }
        assert_eq!(codes, [tonic::Code::Cancelled]);
    }
}
