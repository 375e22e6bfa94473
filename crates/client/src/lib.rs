//! ringlimit client SDK: rate-limit a Rust service's own requests with a ringlimit cluster.
//!
//! The client sends each check straight to the node that owns its key, over the nodes' own
//! peer protocol (no hop through an arbitrary node), coalescing concurrent checks per owner
//! into one frame. Every check has a deadline; when the owner is slow or gone, or no member is
//! known, the client answers from a local limiter (the nodes' algorithms over a share of the
//! limit) and marks the answer `degraded`: the service keeps serving.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use ringlimit_client::{Check, Client};
//! use std::time::Duration;
//!
//! let client = Client::builder()
//!     .seeds(["http://10.0.0.1:8080", "http://10.0.0.2:8080"])
//!     .build()
//!     .await?;
//! let answer = client.check(&Check::named("free-tier", "user:42")).await?;
//! let inline = client
//!     .check(&Check::inline("ip:10.1.2.3", 5, Duration::from_secs(10)))
//!     .await?;
//! if !answer.allowed || !inline.allowed { /* 429 */ }
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`check`] — [`Check`] and [`ClientError`] (misuse only; transport trouble degrades).
//! - [`builder`] — [`ClientBuilder`]: seeds, deadline, fail mode, fallback share, secret,
//!   TLS (mutual TLS to owners, HTTPS discovery).
//! - [`client`] — [`Client`]: routing to owners, batches, fallback, background refresh.
//! - `topology` — members, ring and rules as discovered over HTTP.
//! - `fallback` — the local limiter used when the cluster cannot answer.
//! - `lease` — leases of hot keys (opt-in): checks decided in-process on a slice.
//! - `blocks` — blocks owners answered by, kept until their end: a blocked key's checks are
//!   answered in-process.
//! - `site` — the client's side of core's coordinator (routing, fail mode, counters).
//! - [`reserve`] — [`Client::reserve`], [`Reservation::settle`]: costs known afterwards (LLM
//!   tokens), reserved at the bucket's owner and settled later.
//! - [`layer`] — [`RateLimitLayer`], a `tower` middleware for axum/hyper services.

pub mod all_or_nothing;
mod blocks;
pub mod builder;
pub mod check;
pub mod client;
mod fallback;
pub mod layer;
mod lease;
pub mod reservations;
mod site;
mod topology;

pub use all_or_nothing::AllAnswer;
pub use builder::{BuildError, ClientBuilder, FailMode, FallbackShare, Settings};
pub use check::{Check, ClientError};
pub use client::{Client, ClientStats};
pub use layer::{RateLimit, RateLimitLayer};
pub use reservations::{Reservation, Reserve, ReserveError};
pub use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule, RuleRef};

/// What the crate's own tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::{Client, ClientBuilder};
    use std::time::Duration;

    /// A client of a cluster nobody answers for: its one seed is a loopback port just closed,
    /// so that discovery is refused at once and every check is the client's alone (its
    /// fallback, its fail mode, its validation).
    pub(crate) async fn unreachable(builder: ClientBuilder) -> Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a loopback port");
        builder
            .seeds([format!("127.0.0.1:{port}")])
            .discovery_timeout(Duration::from_millis(200))
            .refresh_interval(Duration::from_secs(60))
            .build()
            .await
            .expect("an unreachable cluster is no error")
    }
}
