//! `StreamRateLimitQuotas` on the gRPC port: each Envoy's stream of usage reports in, and the
//! assignments and abandons [`super::Rlqs`] keeps for it out. A thin edge: the stream is
//! registered under its client (the connection's source address, which the gRPC edge puts in
//! the request as [`ClientAddr`]), its reports handed over, and it is forgotten when either side
//! ends it.

use super::{OpenError, ReportError, Rlqs};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures::Stream;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::{Request, Response, Status, Streaming};

/// Largest usage report accepted (Envoy's reports list its buckets; 10,000 buckets of a few
/// short pairs fit).
pub const MAX_REPORT_BYTES: usize = 4 << 20;

/// The source address of a call's connection, as the gRPC edge saw it.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// The service, over this node's [`Rlqs`].
#[derive(Clone)]
pub struct RlqsService(pub Arc<Rlqs>);

/// A stream's answers, read from [`Rlqs`] as the Envoy takes them; the stream is forgotten when
/// they are dropped (the call is over).
pub struct Answers {
    rlqs: Arc<Rlqs>,
    stream: u64,
}

impl Stream for Answers {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rlqs.poll_answer(self.stream, cx.waker())
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.rlqs.forget(self.stream);
    }
}

/// The client a call counts for: its connection's source address (IPv4-mapped IPv6 as IPv4);
/// a call without one (not through the gRPC edge) counts as one unnamed client.
pub fn client_of<T>(request: &Request<T>) -> IpAddr {
    request
        .extensions()
        .get::<ClientAddr>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| {
            a.0.ip().to_canonical()
        })
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let rlqs = self.0.clone();
        let stream = match rlqs.open(client_of(&request)) {
            Ok(stream) => stream,
            Err(e @ OpenError::Stopping) => return Err(Status::unavailable(e.to_string())),
            Err(e @ OpenError::Full) => return Err(Status::resource_exhausted(e.to_string())),
        };
        let answers = Answers {
            rlqs: rlqs.clone(),
            stream,
        };
        let mut reports = request.into_inner();
        tokio::spawn(async move {
            // Until the Envoy closes its side or the connection breaks.
            loop {
                match reports.message().await {
                    Ok(Some(report)) => match rlqs.report(stream, report) {
                        Ok(()) => {}
                        Err(ReportError::Ended) => break,
                        Err(e) => {
                            let status = match e {
                                ReportError::Stopping => Status::unavailable(e.to_string()),
                                _ => Status::invalid_argument(e.to_string()),
                            };
                            rlqs.fail(stream, status);
                            break;
                        }
                    },
                    Ok(None) => break,
                    // A report over the size limit, or not a report: said to the Envoy.
                    Err(status) => {
                        rlqs.fail(stream, status);
                        break;
                    }
                }
            }
            rlqs.close(stream);
        });
        Ok(Response::new(answers))
    }
}
