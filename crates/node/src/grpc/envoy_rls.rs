//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: a drop-in for
//! envoyproxy/ratelimit. A request's descriptors are matched against the envoyproxy/ratelimit
//! configuration ([`crate::envoy_config`]) and the limited ones are decided together,
//! all-or-nothing ([`CheckService::check_all`]): through the same ownership, forwarding, global
//! mode and fail-open as HTTP checks. A thin edge: matching here, deciding in the service.

use crate::engine::RuleSpec;
use crate::envoy_config::{EnvoyConfig, EnvoyLimit};
use crate::service::{Check, CheckService, Outcome};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ringlimit_core::headers::{Policy, RATELIMIT, RATELIMIT_POLICY, ietf_fields};
use ringlimit_proto::InlineRule;
use std::sync::Arc;

/// The Envoy rate limit service over the node's check service.
pub struct EnvoyRls {
    pub service: Arc<CheckService>,
    pub config: Arc<ArcSwap<EnvoyConfig>>,
}

/// One limited descriptor of a request, as checked.
struct Limited {
    /// Index of the descriptor in the request.
    at: usize,
    key: String,
    rule: InlineRule,
    cost: u64,
    shadow: bool,
}

fn unit_ms(unit: i32) -> Option<u64> {
    match Unit::try_from(unit).ok()? {
        Unit::Second => Some(1_000),
        Unit::Minute => Some(60_000),
        Unit::Hour => Some(3_600_000),
        Unit::Day => Some(86_400_000),
        Unit::Week => Some(7 * 86_400_000),
        _ => None,
    }
}

fn unit_of(ms: u64) -> Unit {
    match ms {
        1_000 => Unit::Second,
        60_000 => Unit::Minute,
        3_600_000 => Unit::Hour,
        86_400_000 => Unit::Day,
        _ => Unit::Week,
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

fn duration_ms(ms: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let req = request.into_inner();
        if req.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "`domain` must not be empty",
            ));
        }
        let config = self.config.load();
        let entries: Vec<Vec<(&str, &str)>> = req
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect()
            })
            .collect();
        let matched = config.match_request(&req.domain, &entries);
        let request_hits = u64::from(req.hits_addend.max(1));
        let mut statuses: Vec<DescriptorStatus> = vec![ok_status(); req.descriptors.len()];
        let mut over = false;
        let mut limited: Vec<Limited> = Vec::new();
        for (at, (d, m)) in req.descriptors.iter().zip(&matched).enumerate() {
            // A descriptor's own `limit` overrides the configuration (Envoy's dynamic limits).
            let limit = match (&d.limit, m) {
                (Some(o), m) => match unit_ms(o.unit) {
                    Some(unit_ms) => Some(EnvoyLimit {
                        requests_per_unit: u64::from(o.requests_per_unit),
                        unit_ms,
                        unlimited: false,
                        ..m.clone().unwrap_or(EnvoyLimit {
                            requests_per_unit: 0,
                            unit_ms,
                            algorithm: ringlimit_proto::Algorithm::FixedWindow,
                            unlimited: false,
                            shadow: false,
                            name: None,
                            replaces: Vec::new(),
                        })
                    }),
                    None => {
                        return Err(tonic::Status::invalid_argument(format!(
                            "descriptor {at}: unsupported unit {} in its limit override",
                            o.unit
                        )));
                    }
                },
                (None, m) => m.clone(),
            };
            let Some(limit) = limit else { continue };
            if limit.unlimited {
                statuses[at].limit_remaining = u32::MAX;
                continue;
            }
            let cost = d.hits_addend.as_ref().map_or(request_hits, |h| h.value);
            let current = RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
                unit: unit_of(limit.unit_ms) as i32,
            };
            statuses[at].current_limit = Some(current);
            // Nothing can pass a limit of 0 or a cost above it: over, without a check.
            if limit.requests_per_unit == 0 || cost > limit.requests_per_unit {
                if !limit.shadow {
                    statuses[at].code = Code::OverLimit as i32;
                    over = true;
                }
                continue;
            }
            let key = std::iter::once(req.domain.as_str())
                .chain(d.entries.iter().flat_map(|e| ["|", &e.key, "=", &e.value]))
                .collect::<String>();
            // One bucket named twice in a request: its costs add up.
            if let Some(same) = limited.iter_mut().find(|l| l.key == key) {
                same.cost = same.cost.saturating_add(cost);
                continue;
            }
            limited.push(Limited {
                at,
                key,
                rule: InlineRule {
                    limit: limit.requests_per_unit,
                    period_ms: limit.unit_ms,
                    algorithm: limit.algorithm,
                    burst: None,
                },
                cost,
                shadow: limit.shadow,
            });
        }
        let mut headers = Vec::new();
        if !limited.is_empty() && !over {
            let checks: Vec<Check<'_>> = limited
                .iter()
                .map(|l| Check {
                    key: &l.key,
                    rule: RuleSpec::Inline(l.rule),
                    cost: l.cost,
                    shadow: l.shadow,
                })
                .collect();
            let outcome = self
                .service
                .check_all(&checks)
                .await
                .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
            over = !outcome.allowed;
            for (l, o) in limited.iter().zip(&outcome.results) {
                let s = &mut statuses[l.at];
                if !o.answer.allowed {
                    s.code = Code::OverLimit as i32;
                }
                s.limit_remaining = u32::try_from(o.answer.remaining).unwrap_or(u32::MAX);
                s.duration_until_reset =
                    Some(duration_ms(o.answer.reset_at_ms.saturating_sub(o.now_ms)));
            }
            headers = ietf_headers(&limited, &outcome.results, &config, &req.domain);
        }
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        }))
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields of the checked descriptors, named after
/// their configured `name`, else their key.
fn ietf_headers(
    limited: &[Limited],
    outcomes: &[Outcome],
    _config: &EnvoyConfig,
    _domain: &str,
) -> Vec<HeaderValue> {
    let mut map = http::HeaderMap::new();
    ietf_fields(
        &mut map,
        limited.iter().zip(outcomes).map(|(l, o)| Policy {
            name: &l.key,
            period_ms: l.rule.period_ms,
            answer: &o.answer,
            now_ms: o.now_ms,
        }),
    );
    [RATELIMIT_POLICY, RATELIMIT]
        .iter()
        .filter_map(|name| {
            let v = map.get(name)?.to_str().ok()?;
            Some(HeaderValue {
                key: name.as_str().to_owned(),
                value: v.to_owned(),
                ..Default::default()
            })
        })
        .collect()
}
