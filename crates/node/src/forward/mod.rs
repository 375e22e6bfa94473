//! Forwarding checks to their owners over the peer port (TCP, length-prefixed bincode frames).
//!
//! # Layout
//! - [`framing`] — the length-delimited frame stream with the protocol's hard limits.
//! - [`client`] — one persistent, pipelined, coalescing connection per peer, with a circuit.
//! - [`handover`] — moving live buckets to their new owner when the ring changes.
//! - [`server`] — accepts peers, runs the handshake, decides what lands here (never forwards).

pub mod client;
pub mod framing;
pub mod handover;
pub mod server;

pub use client::{ForwardError, PeerClient, PeerSettings, PeerStats};
pub use server::{PeerServer, ServerSettings};
