//! Certificates, keys and CA bundles from PEM files. Every error names the file, so that a node
//! that cannot start says which one in its one line.

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};

/// Why certificate files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {path}: {reason}")]
    Invalid {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "key {path} holds no PEM private key (PKCS#8 `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)"
    )]
    NoKey { path: PathBuf },
    #[error("key {key} is not the private key of certificate {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(String),
    /// A certificate of the chain is past its end date: every client would refuse it.
    #[error("certificate {path} expired on {not_after} (UTC); clients refuse it")]
    Expired { path: PathBuf, not_after: String },
    /// A certificate of the chain is not valid yet: clients would refuse it until then.
    #[error(
        "certificate {path} is not valid before {not_before} (UTC); clients refuse it until then"
    )]
    NotYetValid { path: PathBuf, not_before: String },
}

/// When a certificate chain is valid: from the latest start date of its certificates to the
/// earliest end date, in Unix seconds (inclusive, as RFC 5280 has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// A Unix time as a certificate's dates are written in messages (`Nov 28 02:17:00 2026 +00:00`).
pub(crate) fn date(unix_s: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(unix_s)
        .map_or_else(|_| format!("{unix_s} (Unix seconds)"), |t| t.to_string())
}

impl Validity {
    /// Whether the chain is valid at `now` (Unix seconds); why not, naming `path`.
    pub fn check(&self, path: &Path, now: i64) -> Result<(), TlsError> {
        if now > self.not_after {
            Err(TlsError::Expired {
                path: path.to_owned(),
                not_after: date(self.not_after),
            })
        } else if now < self.not_before {
            Err(TlsError::NotYetValid {
                path: path.to_owned(),
                not_before: date(self.not_before),
            })
        } else {
            Ok(())
        }
    }
}

/// The validity of a chain (from `path`): every certificate's dates, parsed with x509-parser.
pub(crate) fn validity_of(path: &Path, chain: &[CertificateDer<'_>]) -> Result<Validity, TlsError> {
    let mut validity = Validity {
        not_before: i64::MIN,
        not_after: i64::MAX,
    };
    for der in chain {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::Invalid {
                what: CERT,
                path: path.to_owned(),
                reason: format!("not an X.509 certificate: {e}"),
            })?;
        let v = cert.validity();
        validity.not_before = validity.not_before.max(v.not_before.timestamp());
        validity.not_after = validity.not_after.min(v.not_after.timestamp());
    }
    Ok(validity)
}

/// What a file is, in messages.
pub(crate) const CERT: &str = "certificate";
pub(crate) const CA: &str = "CA";

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file's bytes, in order (a chain: the end entity first).
pub(crate) fn certs_of(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file's bytes (the first one).
pub(crate) fn key_of(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_owned(),
        },
        e => TlsError::Invalid {
            what: "key",
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })
}

/// A certificate chain and its key from their files' bytes, checked to belong together.
pub(crate) fn certified_key_of(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<CertifiedKey, TlsError> {
    let chain = certs_of(CERT, cert_path, cert_pem)?;
    let key = key_of(key_path, key_pem)?;
    let signing = super::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Invalid {
            what: "key",
            path: key_path.to_owned(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            })
        }
        // ring can tell every key's public half; anything else is the certificate's fault.
        Err(e) => Err(TlsError::Invalid {
            what: CERT,
            path: cert_path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Reads a certificate chain and its key.
pub fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    certified_key_of(cert, &read(CERT, cert)?, key, &read("key", key)?)
}

/// Reads a CA bundle (one or more PEM certificates) as trust anchors.
pub fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let certs = certs_of(CA, path, &read(CA, path)?)?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::Invalid {
            what: CA,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Reads a file, as the watcher does (an error names it).
pub(crate) fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    read(what, path)
}
