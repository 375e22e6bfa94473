//! What a ringlimit node and the ringlimit SDK both run: the limiting algorithms, the bounded
//! bucket store, rule validation and the peer link.
//!
//! The SDK's local fallback must decide exactly as a node would, and its checks must reach an
//! owner exactly as a forwarding node's do; sharing this crate makes that true by construction.
//!
//! # Layout
//! - [`clock`] — the `Clock` trait; system and manual clocks.
//! - [`calendar`] — calendar windows' boundaries (a day, week or month in a time zone).
//! - [`limiter`] — the algorithms, one module each, pure `decide(state, rule, now, cost)`.
//! - [`store`] — sharded, bounded (CLOCK) bucket store keyed by 64-bit identities.
//! - [`rule`] — rule validation, bucket identities, fallback shares.
//! - [`check`] — a check's rule resolved once ([`check::Resolved`]) and its error ([`check::CheckError`]).
//! - [`all`] — one request against several limits: its errors, shadow answers, the binding limit.
//! - [`answer`] — decisions worded as the contract's answers (owner, fail-closed, given back).
//! - [`headers`] — an answer's `X-RateLimit-*`, `Retry-After` and IETF `RateLimit` fields.
//! - [`hot`] — hot keys: the buckets checked most, with bounded memory, promoted and demoted
//!   with hysteresis (for leases).
//! - [`top`] — top keys: the keys of each rule denied and checked most, with bounded memory
//!   (the admin API's `top`).
//! - [`lease`] — leases of hot buckets: the holder's slices ([`lease::Held`]) and the owner's
//!   sizing ([`lease::grant`]).
//! - [`regions`] — one limit shared by several clusters (regions): a bucket's home region
//!   allocates it ([`regions::Allocator`]), every region decides on its allowance
//!   ([`regions::Allowances`]).
//! - [`reserve`] — reservations (a cost estimated now, settled later) at the bucket's owner:
//!   its table (shared fairly between rules), what a settle does (a debt goes into the
//!   bucket's state: see [`limiter`]).
//! - [`link`] — the peer protocol's client side: framing and a pipelined connection.
//! - [`tls`] — certificate files (reloaded when they change), the HTTP and gRPC ports' TLS,
//!   and mutual TLS on the peer link under a cluster CA.
//! - [`coordinator`] — where a check is decided (here, owner, fallback share), check-many
//!   grouping, all-or-nothing holds and refunds: one code for the node and the SDK.

pub mod all_or_nothing;
pub mod answer;
pub mod calendar;
pub mod check;
pub mod clock;
pub mod coordinator;
pub mod headers;
pub mod hot_keys;
pub mod lease;
pub mod limiter;
pub mod link;
pub mod quota;
pub mod regions;
pub mod reservations;
pub mod rule;
pub mod store;
pub mod tls;
pub mod top_keys;
