//! `ringlimit.v1.RateLimiter` (`crates/proto/proto/ringlimit/v1/ratelimiter.proto`): the HTTP
//! API's three checks and its reservations (reserve, settle) as gRPC, over the same check service, with the same validation and error
//! codes. A thin edge: messages in and out, deciding in the service.

use super::{all_code, check_code};
use crate::rules::{RuleSpec, inline_period};
use crate::service::all_or_nothing::AllOutcome;
use crate::service::reservations::Reservation;
use crate::service::{Check, CheckService, Edge, MAX_BATCH, Outcome};
use ringlimit_core::all_or_nothing::AllError;
use ringlimit_core::check::CheckError;
use ringlimit_core::reservations::ReserveError;
use ringlimit_core::rule::FieldError;
use ringlimit_proto::{Algorithm, InlineRule};
use std::sync::Arc;

/// The code generated from the .proto (build.rs).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("ringlimit.v1");
}

use pb::check_request::RuleSpec as PbRuleSpec;
use pb::rate_limiter_server::RateLimiter;

/// `ringlimit.v1.RateLimiter` over the node's check service.
pub struct RingLimitV1 {
    pub service: Arc<CheckService>,
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
    }
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

#[tonic::async_trait]
impl RateLimiter for RingLimitV1 {
    async fn check(
        &self,
        request: tonic::Request<pb::CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        let r = request.into_inner();
        let c = check(&r).map_err(|e| e.status())?;
        let outcome = self
            .service
            .check(Edge::Grpc, &c)
            .await
            .map_err(|e| check_status(&e))?;
        Ok(tonic::Response::new(answer(&outcome)))
    }

    async fn check_batch(
        &self,
        request: tonic::Request<pb::CheckBatchRequest>,
    ) -> Result<tonic::Response<pb::CheckBatchResponse>, tonic::Status> {
        let r = request.into_inner();
        if r.checks.is_empty() || r.checks.len() > MAX_BATCH {
            return Err(status(
                tonic::Code::InvalidArgument,
                "invalid_batch",
                format!(
                    "`checks` must hold 1 to {MAX_BATCH} checks, got {}",
                    r.checks.len()
                ),
            ));
        }
        // An invalid item gets its error in its place; the valid ones are decided together.
        let parsed: Vec<Result<Check<'_>, Invalid>> = r.checks.iter().map(check).collect();
        let valid: Vec<Check<'_>> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().copied())
            .collect();
        let mut decided = self
            .service
            .check_many(Edge::Grpc, &valid)
            .await
            .into_iter();
        let error = |code: &str, message: String| {
            pb::check_batch_result::Result::Error(pb::Error {
                error: code.to_owned(),
                message,
            })
        };
        let results = parsed
            .iter()
            .map(|p| pb::CheckBatchResult {
                result: Some(match p {
                    Err(e) => error(e.code, e.message.clone()),
                    Ok(_) => match decided.next() {
                        Some(Ok(o)) => pb::check_batch_result::Result::Answer(answer(&o)),
                        Some(Err(e)) => error(e.code(), e.to_string()),
                        None => error("unavailable", "no answer was produced".into()),
                    },
                }),
            })
            .collect();
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
}
