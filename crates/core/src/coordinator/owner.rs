//! How the coordinator reaches a check's owner: [`OwnerLink`], the few messages it sends
//! (a group of checks, an all-or-nothing group, refunds), implemented by the peer link's
//! [`PeerClient`]; a node wraps it to time its RPCs.

use crate::link::{ForwardError, PeerClient};
use ringlimit_proto::peer::{PeerAnswer, PeerCheck, PeerRefund};
use std::future::Future;
use std::sync::Arc;

/// The link to one owner.
pub trait OwnerLink: Clone + Send + Sync {
    /// The owner's address: refunds are grouped by it.
    fn addr(&self) -> &str;

    /// Sends one group of checks; one answer per check, in order.
    fn send(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send;

    /// Sends one request's checks as an all-or-nothing group: the owner gives back itself
    /// when its group denies, and answers what it holds as [`PeerAnswer::Held`].
    fn send_all(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send;

    /// Sends checks whose owner did not answer to the owner's replica (this link's member),
    /// decided on its copies; `all`: as one all-or-nothing group (admitted checks that took
    /// their cost come back [`PeerAnswer::Held`], refunded through [`OwnerLink::refund`]).
    fn send_replica(
        &self,
        checks: Vec<PeerCheck>,
        all: bool,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send;

    /// Gives back what held checks took; [`PeerAnswer::Refunded`] for each given back.
    fn refund(
        &self,
        refunds: Vec<PeerRefund>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send;
}

impl OwnerLink for Arc<PeerClient> {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn send(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        PeerClient::send(self, checks)
    }

    fn send_all(
        &self,
        checks: Vec<PeerCheck>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        PeerClient::send_all(self, checks)
    }

    fn send_replica(
        &self,
        checks: Vec<PeerCheck>,
        all: bool,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        PeerClient::send_replica(self, checks, all)
    }

    fn refund(
        &self,
        refunds: Vec<PeerRefund>,
    ) -> impl Future<Output = Result<Vec<PeerAnswer>, ForwardError>> + Send {
        PeerClient::refund(self, refunds)
    }
}
