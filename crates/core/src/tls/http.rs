//! The HTTP and gRPC ports' TLS (`--tls-cert`, `--tls-key`), and what the SDK's discovery
//! trusts when it reads a node's HTTPS port.

use super::peer::CaVerifier;
use super::{ReloadingCert, TlsError, provider};
use rustls::{ClientConfig, ServerConfig};
use std::path::Path;
use std::sync::Arc;

/// ALPN of the HTTP port: HTTP/2 first, then HTTP/1.1 (a client that offers neither gets
/// HTTP/1.1, or HTTP/2 with prior knowledge).
pub const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// ALPN of the gRPC port: HTTP/2 only (gRPC clients insist on `h2`).
pub const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// A server configuration (TLS 1.2 and 1.3) that presents `cert` as it is at each handshake
/// and offers `alpn`. No client certificates are asked for.
pub fn server_config(
    cert: Arc<ReloadingCert>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// What the SDK's discovery trusts on nodes' HTTPS ports: certificates that chain to the CA in
/// `ca` (a PEM bundle). Host names are not checked, as on the peer port (see
/// [`super::peer`]): members are reached at the addresses they advertise — pod IPs — which a
/// certificate seldom names. Give the CA that signs the nodes' certificates, one for this
/// cluster alone.
pub fn ca_client_config(ca: &Path) -> Result<ClientConfig, TlsError> {
    let roots = super::files::roots(ca)?;
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(CaVerifier::new(Arc::new(roots))))
        .with_no_client_auth())
}
