//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: a drop-in for
//! envoyproxy/ratelimit. A request's descriptors are matched against the envoyproxy/ratelimit
//! configuration ([`crate::rules::envoy_config`]) and the limited ones are decided together,
//! all-or-nothing ([`CheckService::check_all`]): through the same ownership, forwarding, global
//! mode and fail-open as HTTP checks. A thin edge: matching here, deciding in the service.

use crate::rules::RuleSpec;
use crate::rules::envoy_config::{EnvoyConfig, EnvoyLimit, Matched};
use crate::service::{Check, CheckService, Edge, Outcome};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ringlimit_core::all_or_nothing::MAX_ALL;
use ringlimit_core::headers::{Policy, RATELIMIT, RATELIMIT_POLICY, ietf_fields};
use ringlimit_proto::InlineRule;
use std::sync::Arc;

/// Most descriptors in one `ShouldRateLimit` request, limited or not (of which at most
/// [`MAX_ALL`] may be limited: they are decided as one all-or-nothing check).
pub const MAX_DESCRIPTORS: usize = 1000;
/// Largest `ShouldRateLimit` request message, bytes: tonic refuses a larger one from its length
/// prefix (OUT_OF_RANGE), before decoding it. Decoding is what an oversized request costs, so the
/// bound on descriptors alone could not keep it cheap (measured: the docs' benchmarks page,
/// "Oversized Envoy requests"). 64 KiB holds [`MAX_DESCRIPTORS`] descriptors of an address each (33
/// bytes) with room to spare; Envoy's requests carry a handful.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

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
    /// A `quota_mode` descriptor decided loosely (see [`RateLimitService::should_rate_limit`]).
    quota: bool,
}

/// A limit override's unit in ms, by its name as in the configuration files.
fn unit_ms(unit: i32) -> Option<u64> {
    crate::rules::envoy_config::unit_ms(Unit::try_from(unit).ok()?.as_str_name())
}

fn unit_of(ms: u64) -> Unit {
    match ms {
        1_000 => Unit::Second,
        60_000 => Unit::Minute,
        3_600_000 => Unit::Hour,
        86_400_000 => Unit::Day,
        604_800_000 => Unit::Week,
        2_592_000_000 => Unit::Month,
        _ => Unit::Year,
    }
}

/// The bucket key of a descriptor: its domain and entries, each part length-prefixed so that
/// no two descriptors share a key by the placement of separators; a `share_threshold`
/// entry is named by its wildcard pattern. Past the key limit, the tail is a SHA-256 digest
/// (a gateway may send long values, e.g. a path).
fn bucket_key(domain: &str, entries: &[(&str, &str)], shared: &[Option<String>]) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(64);
    let _ = write!(key, "{}:{domain}", domain.len());
    for (i, (k, v)) in entries.iter().enumerate() {
        let v = shared.get(i).and_then(Option::as_deref).unwrap_or(v);
        let _ = write!(key, "|{}:{k}={}:{v}", k.len(), v.len());
    }
    crate::rules::request_key::bounded_key(key)
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
        // Bounded before any work per descriptor, so that a request's cost is a function of
        // these bounds, not of its size (64,000 descriptors once held a core for seconds).
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(tonic::Status::invalid_argument(format!(
                "a request may hold at most {MAX_DESCRIPTORS} descriptors, got {}",
                req.descriptors.len()
            )));
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
        // A descriptor's own `limit` overrides the configuration (Envoy's dynamic limits).
        let mut limits: Vec<Option<Matched>> = Vec::with_capacity(matched.len());
        for (at, (d, m)) in req.descriptors.iter().zip(matched).enumerate() {
            limits.push(match (&d.limit, m) {
                (Some(o), m) => {
                    let unit_ms = unit_ms(o.unit).ok_or_else(|| {
                        tonic::Status::invalid_argument(format!(
                            "descriptor {at}: unsupported unit {} in its limit override",
                            o.unit
                        ))
                    })?;
                    let (base, shared) = match m {
                        Some(m) => (m.limit, m.shared),
                        None => (
                            EnvoyLimit {
                                requests_per_unit: 0,
                                unit_ms,
                                algorithm: ringlimit_proto::Algorithm::FixedWindow,
                                unlimited: false,
                                shadow: false,
                                quota: false,
                                name: None,
                                replaces: Vec::new(),
                            },
                            Vec::new(),
                        ),
                    };
                    Some(Matched {
                        limit: EnvoyLimit {
                            requests_per_unit: u64::from(o.requests_per_unit),
                            unit_ms,
                            unlimited: false,
                            ..base
                        },
                        shared,
                    })
                }
                (None, m) => m,
            });
        }
        // `quota_mode` as envoyproxy/ratelimit decides it: the request is over when any other
        // descriptor is, or when every quota descriptor is. One quota descriptor is then
        // simply enforced (all-or-nothing as the others); several are decided like shadow
        // descriptors and the request is over only when none has room — and then, as in
        // envoyproxy/ratelimit, the other descriptors keep what they took.
        let loose_quota = limits
            .iter()
            .flatten()
            .filter(|m| m.quota && !m.shadow && !m.unlimited)
            .count()
            > 1;
        let (mut quotas, mut quotas_over) = (0usize, 0usize);
        let mut statuses: Vec<DescriptorStatus> = vec![ok_status(); req.descriptors.len()];
        let mut over = false;
        let mut limited: Vec<Limited> = Vec::new();
        for (at, (d, m)) in req.descriptors.iter().zip(&limits).enumerate() {
            let Some(m) = m else { continue };
            let limit = &m.limit;
            if limit.unlimited {
                statuses[at].limit_remaining = u32::MAX;
                continue;
            }
            let quota = loose_quota && limit.quota && !limit.shadow;
            quotas += usize::from(quota);
            let cost = d.hits_addend.as_ref().map_or(request_hits, |h| h.value);
            let current = RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
                unit: unit_of(limit.unit_ms) as i32,
            };
            statuses[at].current_limit = Some(current);
            // Nothing can pass a limit of 0 or a cost above it: over, without a check.
            if limit.requests_per_unit == 0 || cost > limit.requests_per_unit {
                if quota {
                    statuses[at].code = Code::OverLimit as i32;
                    quotas_over += 1;
                } else if !limit.shadow {
                    statuses[at].code = Code::OverLimit as i32;
                    over = true;
                }
                continue;
            }
            let key = bucket_key(&req.domain, &entries[at], &m.shared);
            // One bucket named twice in a request: its costs add up. (A search through at most
            // MAX_ALL, refused beyond it below, before the checks are even made.)
            if let Some(same) = limited.iter_mut().find(|l| l.key == key) {
                same.cost = same.cost.saturating_add(cost);
                continue;
            }
            if limited.len() == MAX_ALL {
                return Err(tonic::Status::invalid_argument(format!(
                    "at most {MAX_ALL} descriptors of a request may be limited (they are decided all-or-nothing); descriptor {at} is one more"
                )));
            }
            limited.push(Limited {
                at,
                key,
                rule: InlineRule {
                    limit: limit.requests_per_unit,
                    period_ms: limit.unit_ms,
                    algorithm: limit.algorithm,
                    burst: None,
                    calendar: None,
                },
                cost,
                shadow: limit.shadow || quota,
                quota,
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
                .check_all(Edge::Rls, &checks)
                .await
                .map_err(|e| tonic::Status::new(super::all_code(&e), e.to_string()))?;
            over = !outcome.allowed;
            for (l, o) in limited.iter().zip(&outcome.results) {
                let s = &mut statuses[l.at];
                let quota_over = l.quota && o.shadow_denied == Some(true);
                quotas_over += usize::from(quota_over);
                if !o.answer.allowed || quota_over {
                    s.code = Code::OverLimit as i32;
                }
                s.limit_remaining = u32::try_from(o.answer.remaining).unwrap_or(u32::MAX);
                s.duration_until_reset =
                    Some(duration_ms(o.answer.reset_at_ms.saturating_sub(o.now_ms)));
            }
            headers = ietf_headers(&limited, &outcome.results, &config, &req.domain);
        }
        over |= quotas > 0 && quotas_over == quotas;
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

#[cfg(test)]
mod tests {
    use super::bucket_key;

    #[test]
    fn bucket_keys_are_unambiguous_bounded_and_share_by_pattern() {
        // Separators inside keys or values cannot make two descriptors one bucket.
        assert_ne!(
            bucket_key("d", &[("a=b", "c")], &[]),
            bucket_key("d", &[("a", "b=c")], &[])
        );
        assert_ne!(
            bucket_key("d", &[("a", "b|1:c=d")], &[]),
            bucket_key("d", &[("a", "b"), ("c", "d")], &[])
        );
        // A share_threshold entry is named by its pattern: all its values, one bucket.
        let shared = [Some("files/*".to_owned())];
        assert_eq!(
            bucket_key("d", &[("files", "files/a")], &shared),
            bucket_key("d", &[("files", "files/b")], &shared)
        );
        // Long values (a gateway's path) stay within the key limit, and distinct.
        let long_a = "a".repeat(2000);
        let long_b = format!("{}b", "a".repeat(1999));
        let (ka, kb) = (
            bucket_key("d", &[("path", &long_a)], &[]),
            bucket_key("d", &[("path", &long_b)], &[]),
        );
        assert!(ka.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES);
        assert_ne!(ka, kb);
        // Multi-byte characters are cut at a boundary.
        let k = bucket_key("d", &[("p", &"é".repeat(600))], &[]);
        assert!(k.len() <= ringlimit_proto::CheckAnswer::MAX_KEY_BYTES);
    }
}
