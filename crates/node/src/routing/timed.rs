//! RPC timing: an owner link that observes each group's size and, when answered, its time.

use crate::metrics::{PeerRpcMetrics, seconds};
use ringlimit_core::clock::Clock;
use ringlimit_core::coordinator::OwnerLink;
use ringlimit_core::link::{ForwardError, PeerClient};
use ringlimit_proto::peer::{PeerAnswer, PeerCheck, PeerRefund};
use std::future::Future;
use std::sync::Arc;

/// The link to one owner, timed on this node's clock.
#[derive(Clone)]
pub(super) struct Timed<'a> {
    pub(super) client: Arc<PeerClient>,
    pub(super) rpc: &'a PeerRpcMetrics,
    pub(super) clock: &'a Arc<dyn Clock>,
}

impl Timed<'_> {
    /// Observes one group sent by `send`.
    async fn observe<F>(&self, checks: usize, send: F) -> Result<Vec<PeerAnswer>, ForwardError>
    where
        F: Future<Output = Result<Vec<PeerAnswer>, ForwardError>>,
    {
        self.rpc.checks.observe(checks as f64);
        let start = self.clock.now();
        let sent = send.await;
        if sent.is_ok() {
            self.rpc.duration.observe(seconds(start, self.clock.now()));
        }
        sent
    }
}

impl OwnerLink for Timed<'_> {
    fn addr(&self) -> &str {
        &self.client.addr
    }

    fn send(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        self.observe(checks.len(), self.client.send(checks))
    }

    fn send_all(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        self.observe(checks.len(), self.client.send_all(checks))
    }

    fn send_replica(
        &self,
        checks: Vec<PeerCheck>,
        all: bool,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        self.observe(checks.len(), self.client.send_replica(checks, all))
    }

    fn refund(
        &self,
        refunds: Vec<PeerRefund>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        self.client.refund(refunds)
    }
}
