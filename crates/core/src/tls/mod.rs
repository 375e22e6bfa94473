//! TLS, for nodes and the SDK alike: certificate files read and reloaded when they change, the
//! HTTP and gRPC ports' server side, and mutual TLS on the peer link under a cluster CA.
//!
//! rustls with ring as its only crypto provider, passed explicitly to every configuration (no
//! process-wide default is installed or needed, so an application that installs another one
//! is not disturbed).
//!
//! # Layout
//! - [`files`] — PEM certificates, private keys and CA bundles read from files, every error
//!   naming its file ([`TlsError`]).
//! - [`reload`] — a certificate and key in force, swapped when their files change (polled);
//!   a pair that does not load is refused and the previous one stays.
//! - [`peer`] — mutual TLS on the peer port: the node's (or SDK's) certificate both ways, the
//!   other end's chain checked against the cluster CA; a [`crate::link::dial::Dial`] that
//!   wraps another in TLS, and the server's side of a connection.
//! - [`http`] — the HTTP and gRPC ports' server configuration (ALPN), and the client
//!   configuration the SDK's HTTPS discovery uses.

pub mod files;
pub mod http;
pub mod peer;
pub mod reload;

#[cfg(test)]
mod tests;

pub use files::TlsError;
pub use peer::{PeerTls, PeerTlsFiles};
pub use reload::{CertFiles, ReloadingCert};

use rustls::crypto::CryptoProvider;
use std::sync::{Arc, LazyLock};

/// The crypto provider of every configuration made here: ring's.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: LazyLock<Arc<CryptoProvider>> =
        LazyLock::new(|| Arc::new(rustls::crypto::ring::default_provider()));
    PROVIDER.clone()
}
