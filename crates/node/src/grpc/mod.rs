//! The gRPC edge (`--grpc ADDR`): Envoy's rate limit service (`envoy.service.ratelimit.v3`)
//! and ringlimit's own `ringlimit.v1.RateLimiter` over the node's check service, and
//! `grpc.health.v1` (SERVING once the node is ready).
//!
//! # Layout
//! - [`envoy_rls`] — `ShouldRateLimit`: descriptors matched against envoyproxy/ratelimit's
//!   configuration, decided all-or-nothing.
//! - [`ringlimit_v1`] — `ringlimit.v1.RateLimiter`: the HTTP API's checks as gRPC, and what
//!   client SDKs route by and ask owners for (topology, held checks, leases, give-backs).
//! - [`credentials`] — ringlimit.v1's client credentials and each one's ledger.
//! - Envoy's Rate Limit Quota Service lives in [`crate::rlqs`] (served here).

pub mod credentials;
pub mod envoy_rls;
pub mod ringlimit_v1;

use crate::lifecycle::Lifecycle;
use crate::listen::conns::{Conn, ConnTable};
use crate::listen::stream::{Listener, Stream};
use crate::listen::tls::ServerTls;
use crate::listen::{Ended, Handler, OnExpiry};
use crate::rlqs::service::RlqsService;
use crate::rules::envoy_config::EnvoyConfig;
use crate::service::CheckService;
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use ringlimit_core::all_or_nothing::AllError;
use ringlimit_core::check::CheckError;
use ringlimit_v1::RingLimitV1;
use ringlimit_v1::pb::rate_limiter_server::RateLimiterServer;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::watch;
use tonic::service::Routes;
use tower::ServiceExt as _;

/// The gRPC code of a check error, as the HTTP API's status: 404 → NOT_FOUND, 503 →
/// UNAVAILABLE, the rest (400) → INVALID_ARGUMENT.
fn check_code(e: &CheckError) -> tonic::Code {
    match e.code() {
        "unknown_rule" => tonic::Code::NotFound,
        "unavailable" => tonic::Code::Unavailable,
        _ => tonic::Code::InvalidArgument,
    }
}

/// [`check_code`] of an all-or-nothing request's error (its own errors are 400s).
fn all_code(e: &AllError) -> tonic::Code {
    match e {
        AllError::Item { error, .. } => check_code(error),
        _ => tonic::Code::InvalidArgument,
    }
}

/// What Envoy's services answer from: the envoyproxy/ratelimit configuration (RLS) and this
/// node's quota streams (RLQS).
pub struct EnvoyServices {
    pub rls: Arc<ArcSwap<EnvoyConfig>>,
    pub rlqs: Arc<crate::rlqs::Rlqs>,
}

/// What ringlimit.v1 answers from: the check service (Envoy's RLS decides through it too),
/// the admin side (the topology) and the client credentials.
pub struct V1Services {
    pub service: Arc<CheckService>,
    pub admin: Arc<crate::admin::Admin>,
    pub auth: credentials::ClientAuth,
}

/// How the gRPC port serves its connections.
pub struct Port {
    /// Every connection bounded by it (`--grpc-idle-timeout-ms`, `--grpc-request-timeout-ms`,
    /// `--grpc-max-connections`).
    pub table: Arc<ConnTable>,
    /// Inside TLS (`--tls-cert`; ALPN `h2`).
    pub tls: Option<ServerTls>,
    /// On this many threads of their own (`--grpc-threads`; 0: the caller's runtime).
    pub threads: usize,
}

/// Serves gRPC on `listener` as `port` says until `shutdown` completes.
///
/// Why not tonic's own server: it has no idle timeout and no connection cap, so a client
/// could hold connections until the node ran out of descriptors. Here tonic's routes are
/// served by [`crate::listen`] like the HTTP port, with gRPC's idea of idle (no call in flight;
/// pings do not count) and a GOAWAY before closing. Left out of tonic's stack: honouring a
/// call's `grpc-timeout` header — a client cancels its call at its deadline (RST_STREAM, which
/// drops the call here), and every call is bounded by the request timeout.
pub async fn serve(
    listener: Listener,
    lifecycle: Arc<Lifecycle>,
    envoy: EnvoyServices,
    v1: V1Services,
    Port {
        table,
        tls,
        threads,
    }: Port,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    // SERVING once the node answers checks (its readiness), and from then on.
    tokio::spawn(async move {
        while !lifecycle.is_ready() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        health
            .set_serving::<RateLimitServiceServer<envoy_rls::EnvoyRls>>()
            .await;
        health.set_serving::<RateLimiterServer<RingLimitV1>>().await;
        health
            .set_serving::<RateLimitQuotaServiceServer<RlqsService>>()
            .await;
    });
    let service = v1.service;
    let routes = Routes::new(health_service)
        .add_service(
            RateLimitServiceServer::new(envoy_rls::EnvoyRls {
                service: service.clone(),
                config: envoy.rls,
            })
            .max_decoding_message_size(envoy_rls::MAX_REQUEST_BYTES),
        )
        .add_service(RateLimiterServer::new(RingLimitV1 {
            service,
            admin: v1.admin,
            auth: v1.auth,
            ledgers: credentials::Ledgers::default(),
            // A client watches from one connection: as many watchers as connections.
            watchers: Arc::new(tokio::sync::Semaphore::new(table.limits().max_connections)),
        }))
        .add_service(
            RateLimitQuotaServiceServer::new(RlqsService(envoy.rlqs))
                .max_decoding_message_size(crate::rlqs::service::MAX_REPORT_BYTES),
        )
        .prepare();
    let handler = GrpcConnections { routes };
    crate::listen::serve(
        "gRPC",
        listener,
        move || handler.clone(),
        // As the HTTP port's: on the main runtime a stream's every message woke and switched
        // its worker threads (see `crate::listen`).
        threads,
        table,
        tls,
        shutdown,
    )
    .await
}

/// Serves gRPC connections (HTTP/2 only).
#[derive(Clone)]
struct GrpcConnections {
    routes: Routes,
}

impl Handler for GrpcConnections {
    fn spawn(
        self,
        stream: Stream,
        peer: SocketAddr,
        conn: Arc<Conn>,
        table: Arc<ConnTable>,
        mut stop: watch::Receiver<bool>,
        ended: Ended,
    ) {
        tokio::spawn(async move {
            let limits = table.limits();
            let service = {
                let (table, conn, routes) = (table.clone(), conn.clone(), self.routes);
                hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    // Who calls: RLQS shares its room per client.
                    req.extensions_mut()
                        .insert(crate::rlqs::service::ClientAddr(peer));
                    // In flight from here: the connection is not idle (its clock restarts when
                    // the call ends).
                    let guard = table.start_request(&conn);
                    let call = routes.clone().oneshot(req);
                    let table = table.clone();
                    async move {
                        let answer = match tokio::time::timeout(limits.body_timeout, call).await {
                            // A streaming call (RLQS) is in flight until its answers end: the
                            // guard goes with the body.
                            Ok(Ok(answer)) => {
                                return Ok(answer.map(|body| {
                                    tonic::body::Body::new(body.map_frame(move |f| {
                                        let _in_flight = &guard;
                                        f
                                    }))
                                }));
                            }
                            Ok(answer) => answer,
                            Err(_) => {
                                table.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                                Ok(tonic::Status::deadline_exceeded(format!(
                                    "the call did not complete within --grpc-request-timeout-ms ({} ms)",
                                    limits.body_timeout.as_millis()
                                ))
                                .into_http())
                            }
                        };
                        drop(guard);
                        answer
                    }
                })
            };
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder.timer(TokioTimer::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let expiry = table.expiry(&conn);
            tokio::pin!(expiry);
            // After GOAWAY, calls in flight have the request timeout to finish.
            crate::listen::drive(
                connection,
                &conn,
                expiry,
                &mut stop,
                OnExpiry::GoAway,
                limits.body_timeout,
            )
            .await;
            drop(ended);
        });
    }
}
