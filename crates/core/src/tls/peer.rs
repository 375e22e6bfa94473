//! Mutual TLS on the peer port (`--peer-tls-ca`, `--peer-tls-cert`, `--peer-tls-key`; the SDK's
//! `ClientBuilder::peer_tls`): each end presents its certificate, and each checks that the
//! other's chains to the cluster CA. TLS 1.3 only: both ends are ringlimit.
//!
//! What is checked, and why names are not: peers are dialled at the addresses they advertise
//! (pod IPs, or DNS names), which change with every pod and which a certificate seldom names;
//! the CA is the cluster's own, so a certificate it signed is what makes a member. The chain,
//! its validity period and its key usage (server auth for the end that answers, client auth
//! for the end that dials, when the certificate restricts them) are checked; the subject and
//! its names are not. So a CA for this cluster alone, never one that signs anything else.
//!
//! The TLS handshake comes first on a connection, then the peer protocol's own handshake (and
//! its HMAC when the cluster has a secret) inside it.

use super::{CertFiles, ReloadingCert, TlsError, provider};
use crate::link::dial::Dial;
use crate::link::framing::BoxedIo;
use futures::future::BoxFuture;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where the peer port's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The cluster CA (PEM, one or more certificates): what the other end's chain must reach.
    pub ca: PathBuf,
    /// This end's certificate chain and key, presented both ways (reloaded when they change).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Mutual TLS for the peer link, both sides.
#[derive(Clone)]
pub struct PeerTls {
    cert: Arc<ReloadingCert>,
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl PeerTls {
    /// Loads the CA and this end's certificate; an error names the file at fault.
    pub fn load(files: &PeerTlsFiles) -> Result<Self, TlsError> {
        let roots = Arc::new(super::files::roots(&files.ca)?);
        let cert = Arc::new(ReloadingCert::load(CertFiles {
            cert: files.cert.clone(),
            key: files.key.clone(),
        })?);
        let config = |e: rustls::Error| TlsError::Config(e.to_string());
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(CaVerifier::new(roots.clone())))
            .with_client_cert_resolver(cert.clone());
        let clients = WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config)?
            .with_client_cert_verifier(clients)
            .with_cert_resolver(cert.clone());
        Ok(Self {
            cert,
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// This end's certificate, to watch for changes ([`ReloadingCert::watch`]).
    pub fn cert(&self) -> &Arc<ReloadingCert> {
        &self.cert
    }

    /// A dialer that opens `inner`'s streams and runs TLS over them, presenting this end's
    /// certificate and checking the peer's against the CA.
    pub fn dialer(&self, inner: Arc<dyn Dial>) -> Arc<dyn Dial> {
        Arc::new(TlsDial {
            inner,
            connector: self.connector.clone(),
        })
    }

    /// The server's side of an accepted stream: the TLS handshake, which fails unless the
    /// client presents a certificate that chains to the CA. Bound it with a timeout.
    pub async fn accept(&self, io: BoxedIo) -> std::io::Result<BoxedIo> {
        Ok(Box::new(self.acceptor.accept(io).await?))
    }
}

/// A [`Dial`] that runs TLS over another's streams.
struct TlsDial {
    inner: Arc<dyn Dial>,
    connector: TlsConnector,
}

impl Dial for TlsDial {
    fn dial(&self, addr: &str) -> BoxFuture<'static, std::io::Result<BoxedIo>> {
        let opened = self.inner.dial(addr);
        let connector = self.connector.clone();
        let name = server_name(addr);
        Box::pin(async move {
            let io = opened.await?;
            Ok(Box::new(connector.connect(name, io).await?) as BoxedIo)
        })
    }
}

/// The name sent in the handshake for a peer at `addr` (`host:port`): its host, an IP address
/// or a DNS name (only the latter is sent, as SNI; neither is checked).
pub(crate) fn server_name(addr: &str) -> ServerName<'static> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .or_else(|_| ServerName::try_from("ringlimit"))
        .unwrap_or(ServerName::IpAddress(
            std::net::IpAddr::from([0, 0, 0, 0]).into(),
        ))
}

/// Accepts a server's certificate when its chain reaches one of `roots` (validity period and
/// key usage included), whatever names it holds; signatures are checked as usual.
#[derive(Debug)]
pub(crate) struct CaVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl CaVerifier {
    pub(crate) fn new(roots: Arc<RootCertStore>) -> Self {
        Self {
            roots,
            provider: provider(),
        }
    }
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
