//! TLS for the tests: a CA made with rcgen at test time, the certificates it issues written to
//! a temporary directory (replaced atomically or piece by piece, as rotations do), and TLS
//! clients that tell which certificate a server presented.

use crate::TempDir;
use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use ringlimit_core::tls::{CertFiles, PeerTlsFiles};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A certificate authority.
pub struct TestCa {
    /// Its certificate (PEM).
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate the CA issued, and its key (PEM both), and its serial number.
#[derive(Clone)]
pub struct Leaf {
    pub cert: String,
    pub key: String,
    pub serial: u64,
}

impl Leaf {
    /// The certificate, DER.
    pub fn der(&self) -> Result<CertificateDer<'static>> {
        Ok(CertificateDer::from_pem_slice(self.cert.as_bytes())?)
    }
}

impl TestCa {
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A certificate for `localhost` and `127.0.0.1` (and `cn`, its common name), for server
    /// and client auth, with serial number `serial`.
    pub fn issue(&self, cn: &str, serial: u64) -> Result<Leaf> {
        self.issue_with(cn, serial, |_| {})
    }

    /// [`TestCa::issue`], valid from `not_before` to `not_after` (Unix seconds, from 1970).
    pub fn issue_dated(
        &self,
        cn: &str,
        serial: u64,
        not_before: u64,
        not_after: u64,
    ) -> Result<Leaf> {
        let at = |s: u64| rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(s);
        let (from, to) = (at(not_before), at(not_after));
        self.issue_with(cn, serial, |p| {
            p.not_before = from;
            p.not_after = to;
        })
    }

    fn issue_with(
        &self,
        cn: &str,
        serial: u64,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Result<Leaf> {
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            cn.to_owned(),
        ])?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        edit(&mut params);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            serial,
        })
    }
}

/// A directory of certificate files, removed on drop.
pub struct CertDir {
    dir: TempDir,
}

impl CertDir {
    pub fn new(what: &str) -> Result<Self> {
        Ok(Self {
            dir: TempDir::new(what)?,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// Writes `text` to `name` (replacing it at once: a new file renamed over the old one).
    pub fn write(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.path(name);
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Writes a CA's certificate as `name`.
    pub fn ca(&self, name: &str, ca: &TestCa) -> Result<PathBuf> {
        self.write(name, &ca.pem)
    }

    /// Writes `leaf` as `{name}.crt` and `{name}.key`.
    pub fn leaf(&self, name: &str, leaf: &Leaf) -> Result<CertFiles> {
        Ok(CertFiles {
            cert: self.write(&format!("{name}.crt"), &leaf.cert)?,
            key: self.write(&format!("{name}.key"), &leaf.key)?,
        })
    }

    /// Writes `leaf` as `{name}.crt`/`.key` beside the CA at `ca`: a peer's TLS files.
    pub fn peer(&self, ca: &Path, name: &str, leaf: &Leaf) -> Result<PeerTlsFiles> {
        let files = self.leaf(name, leaf)?;
        Ok(PeerTlsFiles {
            ca: ca.to_owned(),
            cert: files.cert,
            key: files.key,
        })
    }
}

/// A client configuration that trusts `ca_pem` (names checked as usual) and offers `alpn`.
/// Sessions are never resumed: each connection's handshake shows the certificate the server
/// presents now (a resumed session carries the one it was made with).
pub fn client_config(ca_pem: &str, alpn: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(ringlimit_core::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// A TLS connection to `addr` as `localhost`.
pub async fn connect(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from("localhost")?;
    Ok(tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?)
}

/// The end-entity certificate the server presented on `stream`.
pub fn presented(stream: &TlsStream<TcpStream>) -> Result<CertificateDer<'static>> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .context("no certificate presented")
}

/// The ALPN protocol the server chose on `stream`.
pub fn alpn(stream: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}
