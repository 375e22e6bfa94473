//! Replicas: each owner's buckets copied to the next `--replicas N` members after it on the
//! ring, so that the member that takes a dead owner's keys over starts from their copies, not
//! from full buckets.
//!
//! Primary-backup, asynchronous: a check is answered before its change is copied (the sender
//! follows the store's change feed, off the check path), so what the owner decided in the last
//! flush interval before it died may be missing from the copy (see `crate::local::copies` for
//! what that charges). The copies themselves, standing in and promotion are local state
//! (`crate::local::copies`); this module is what talks to the other members about them.
//!
//! # Layout
//! - [`sender`] — follows the owned buckets' change feed and sends each replica member its buckets'
//!   changes every `--replica-flush-ms` (`Frame::ReplicateOneWay`; acknowledged `Replicate` to
//!   a member older than protocol 5); the whole store again after a lag or a ring change. The
//!   receiving side is `peers/server/replicate.rs`.
//! - [`handback`] — decisions this node made on its copies while their owner did not answer
//!   (failover: the coordinator's `Site::replica`), sent back to the owner once it answers.
//! - [`metrics`] — the sender's lag, frames and bytes as metrics.

pub mod handback;
pub mod metrics;
pub mod sender;

pub use metrics::ReplicaStats;
