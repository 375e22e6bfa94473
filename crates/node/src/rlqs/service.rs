//! `StreamRateLimitQuotas` on the gRPC port: each Envoy's stream of usage reports in, and the
//! assignments and abandons [`super::Rlqs`] pushes out. A thin edge: the stream is registered,
//! its reports handed over, and it is unregistered when either side ends it.

use super::Rlqs;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures::Stream;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// Largest usage report accepted (Envoy's reports list its buckets; 10,000 buckets of a few
/// short pairs fit).
pub const MAX_REPORT_BYTES: usize = 4 << 20;

/// The service, over this node's [`Rlqs`].
#[derive(Clone)]
pub struct RlqsService(pub Arc<Rlqs>);

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let (tx, mut rx) = mpsc::channel(super::QUEUE);
        let rlqs = self.0.clone();
        let Some(stream) = rlqs.open(tx) else {
            return Err(Status::unavailable(
                "this node is stopping: connect to another",
            ));
        };
        let mut reports = request.into_inner();
        tokio::spawn(async move {
            // Until the Envoy closes its side or the connection breaks.
            while let Ok(Some(report)) = reports.message().await {
                if let Err(e) = rlqs.report(stream, report) {
                    let status = match e {
                        super::ReportError::Stopping => Status::unavailable(e.to_string()),
                        _ => Status::invalid_argument(e.to_string()),
                    };
                    rlqs.fail(stream, status);
                    break;
                }
            }
            rlqs.close(stream);
        });
        // Ends when the sender is gone: the stream closed (by the Envoy, an error, or the node
        // stopping).
        let answers = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Response::new(Box::pin(answers)))
    }
}
