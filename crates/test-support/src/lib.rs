//! What ringlimit's two test harnesses share, so that a wait or a reading means the same in
//! both: the process tests' (`ringlimit-tests`: real nodes on loopback, in wall time) and the
//! in-memory nodes' (the node crate's `testing`: whole nodes on memnet under tokio's paused
//! clock).
//!
//! A harness implements [`Member`] for its handle on one node (two requests: `/readyz` and
//! `/v1/cluster`); the waits on members are then the same functions in both. Every wait is
//! bounded by a `within` measured on tokio's clock: real time in process tests, virtual time
//! (which costs nothing) under a paused clock.
//!
//! Its own crate, depending on core and proto only: the node crate takes it as a
//! dev-dependency, and anything that depended on the node would build the node twice there.
//!
//! # Layout
//! - [`wait`] — [`wait_until`], [`wait_for`]: poll a condition until it holds, bounded.
//! - [`member`] — [`Member`], and the waits on members: [`wait_ready`], [`wait_all_alive`],
//!   [`wait_out_of_ring`].
//! - [`view`] — [`ClusterView`]: a node's `GET /v1/cluster` answer, read.
//! - [`metrics`] — [`series`]: one series' value in a `/metrics` text.
//! - [`keys`] — [`inline`] check bodies and the owner of a key ([`owner_of`]), as nodes place it.

pub mod keys;
pub mod member;
pub mod metrics;
pub mod view;
pub mod wait;

pub use keys::{inline, keys_owned_by, owner_of, owner_under};
pub use member::{Member, wait_all_alive, wait_out_of_ring, wait_ready};
pub use metrics::{series, series_sum};
pub use view::ClusterView;
pub use wait::{poll_every, wait_for, wait_until};
