//! The node's side of the peer protocol (TCP, length-prefixed bincode frames; the link itself,
//! shared with the SDK, is `ringlimit_core::link`).
//!
//! # Layout
//! - [`pool`] — one client per alive member, and per-runtime copies ([`pool::bind_current_thread`]).
//! - [`logins`] — places for connections still in their handshake.
//! - [`server`] — accepts peers, runs the handshake, decides what lands here, relays what it
//!   handed over.
//! - [`handover`] — moving live buckets to their new owner when the ring changes.
//! - [`reach`] — pinging every link, and whether this node reaches a majority over them.
//! - [`reset`] — dropping a key's buckets on every member (the admin API's reset).

pub mod handover;
pub mod logins;
pub mod pool;
pub mod reach;
pub mod reset;
pub mod server;

pub use pool::PeerPool;
pub use server::{PeerServer, Relay, ServerSettings};
