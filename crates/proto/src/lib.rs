//! Wire types shared by ringlimit nodes and the client SDK.
//!
//! No I/O and no async runtime here: only the values and pure functions that both sides of a
//! process boundary must agree on, so the node's HTTP layer, the peer protocol and the SDK agree
//! on them by construction.
//!
//! # Layout
//! - [`check`]: a check request (key, rule, cost) and its answer.
//! - [`algorithm`]: the closed set of limiting algorithms and their wire names.
//! - [`calendar`]: calendar windows (a day, week or month in a time zone) and their zones.
//! - [`identity`]: bucket identities (the 64-bit hash of rule and key).
//! - [`ring`]: the consistent-hash ring naming each bucket's owner.
//! - [`peer`]: frames of the peer protocol and their bounded codec.
//! - [`region`]: regions sharing one limit: a bucket's home region, asks and grants.
//! - [`auth`]: the shared-secret challenge-response and datagram MACs.
//! - [`handshake`]: the peer handshake as sans-I/O state machines.
//! - [`reservation`]: the id of a reservation (a cost estimated now, settled later), which
//!   any node decodes to route a settle to the bucket's owner.
//! - [`discovery`]: the cluster's members and rules as nodes tell clients over HTTP.

pub mod algorithm;
pub mod auth;
pub mod calendar;
pub mod check;
pub mod discovery;
pub mod handshake;
pub mod identity;
pub mod mark;
pub mod peer;
pub mod region;
pub mod reservation;
pub mod ring;

pub use algorithm::{Algorithm, UnknownAlgorithm};
pub use check::{CheckAnswer, CheckRequest, InlineRule, RuleRef};
pub use ring::Ring;
