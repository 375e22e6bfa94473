//! The peer link: one authenticated, pipelined TCP connection to a node's peer port.
//!
//! Nodes forward checks to owners through it, and the SDK sends its checks straight to owners
//! through the same code, so both speak the protocol of [`ringlimit_proto::peer`] identically.
//!
//! # Layout
//! - [`framing`] — the length-delimited frame stream with the protocol's hard limits.
//! - [`client`] — one persistent, pipelined, coalescing connection per peer, with a circuit.
//! - [`fanout`] — group checks by owner, send each group, scatter the replies; settle a reply.

pub mod client;
pub mod fanout;
pub mod framing;

pub use client::{ForwardError, PeerClient, PeerSettings, PeerStats};
