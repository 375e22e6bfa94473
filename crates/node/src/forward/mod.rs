//! Forwarding checks to their owners over the peer port (TCP, length-prefixed bincode frames).
//!
//! # Layout
//! - [`framing`], [`client`] — the peer link, shared with the SDK (`ringlimit_core::link`).
//! - [`handover`] — moving live buckets to their new owner when the ring changes.
//! - [`reset`] — dropping a key's buckets on every member (the admin API's reset).
//! - [`server`] — accepts peers, runs the handshake, decides what lands here (never forwards).

pub use ringlimit_core::link::{client, framing};
pub mod handover;
pub mod reset;
pub mod server;

pub use client::{ForwardError, PeerClient, PeerSettings, PeerStats};
pub use server::{PeerServer, ServerSettings};
