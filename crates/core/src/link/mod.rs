//! The peer link: one authenticated, pipelined connection to a node's peer port (TCP; any byte
//! stream in tests).
//!
//! Nodes forward checks to owners through it, and the SDK sends its checks straight to owners
//! through the same code, so both speak the protocol of [`ringlimit_proto::peer`] identically.
//!
//! # Layout
//! - [`framing`] — the length-delimited frame stream with the protocol's hard limits, over any
//!   byte stream.
//! - [`dial`] — how a link is opened: TCP, or whatever a test hands in.
//! - [`memnet`] — an in-memory network for tests, whose links can be cut, stalled and dropped.
//! - [`client`] — one persistent, pipelined, coalescing connection per peer, with a circuit.
//! - [`session`] — a connection of its own for one request and its answer (handover, reset),
//!   or for frames written one way (global counts); a pool of them for requests made one at
//!   a time by many callers (reservations).
//! - [`reserve`] — reserve and settle at a bucket's owner on pooled sessions.
//! - [`fanout`] — group checks by owner, send each group, scatter the replies; settle a reply.

pub mod client;
pub mod dial;
pub mod fanout;
pub mod framing;
pub mod memnet;
pub mod reservations;
pub mod session;

#[cfg(test)]
mod tests;

pub use client::{ForwardError, PeerClient, PeerSettings, PeerStats};
pub use session::{Pooled, Session, SessionError, SessionPool, Sessions};
