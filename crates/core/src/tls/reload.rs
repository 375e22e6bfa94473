//! A certificate and its key in force, reloaded when their files change, without a restart:
//! every new handshake takes the pair in force at that moment; connections already open keep
//! the one they started with.
//!
//! The files are polled (their bytes, read through the path), as the rules file is: a
//! Kubernetes Secret update is an atomic swap of a `..data` symlink that file watchers often
//! miss, and reading two small files each second costs nothing. A pair that does not load — a
//! file missing, not PEM, or a key that is not the certificate's (the certificate rewritten and
//! its key not yet) — is refused, logged once, and the previous pair stays in force; it is
//! tried again as soon as either file changes again.

use super::TlsError;
use super::files::{self, CERT};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{SignatureScheme, pki_types::CertificateDer};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where a certificate chain (PEM, the end entity first) and its private key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What one look at the files found.
#[derive(Debug)]
pub enum Polled {
    /// The same bytes as last time.
    Unchanged,
    /// A new pair is in force.
    Reloaded,
    /// The files changed but do not load: the previous pair stays.
    Refused(TlsError),
}

/// A certificate and key in force, for servers ([`ResolvesServerCert`]) and for clients that
/// present one ([`ResolvesClientCert`]).
pub struct ReloadingCert {
    files: CertFiles,
    current: ArcSwap<CertifiedKey>,
    /// The bytes last looked at (`None`: unreadable then), so that a pair is tried, and a
    /// refusal logged, once per change.
    seen: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// Pairs put in force since start, and pairs refused.
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair now; an error names the file at fault.
    pub fn load(files: CertFiles) -> Result<Self, TlsError> {
        let cert = files::read_file(CERT, &files.cert)?;
        let key = files::read_file("key", &files.key)?;
        let certified = files::certified_key_of(&files.cert, &cert, &files.key, &key)?;
        Ok(Self {
            files,
            current: ArcSwap::from_pointee(certified),
            seen: Mutex::new(Some((cert, key))),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        })
    }

    /// The files watched.
    pub fn files(&self) -> &CertFiles {
        &self.files
    }

    /// The pair in force.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// The end-entity certificate in force (DER).
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// Reads the files; a pair that changed since the last look is put in force, or refused.
    pub fn poll(&self) -> Polled {
        let read = files::read_file(CERT, &self.files.cert)
            .and_then(|cert| files::read_file("key", &self.files.key).map(|key| (cert, key)));
        let mut seen = self.seen.lock();
        let (cert, key) = match read {
            Ok(pair) => pair,
            // Unreadable (a file replaced by remove-then-create, or gone): once per change.
            Err(e) => {
                if seen.take().is_none() {
                    return Polled::Unchanged;
                }
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                return Polled::Refused(e);
            }
        };
        if seen.as_ref().is_some_and(|(c, k)| *c == cert && *k == key) {
            return Polled::Unchanged;
        }
        let loaded = files::certified_key_of(&self.files.cert, &cert, &self.files.key, &key);
        *seen = Some((cert, key));
        drop(seen);
        match loaded {
            Ok(certified) => {
                self.current.store(Arc::new(certified));
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                Polled::Reloaded
            }
            Err(e) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                Polled::Refused(e)
            }
        }
    }

    /// Polls the files every `every`, for ever (drop or abort the future to stop), logging
    /// what changes: `TLS certificate reloaded` (info) or `TLS certificate files refused`
    /// (warn, with the reason naming the file).
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            // Two small reads and, on a change, a key parse: off the runtime's worker anyway,
            // since a slow disk must not hold connections' tasks.
            let this = self.clone();
            let polled = match tokio::task::spawn_blocking(move || this.poll()).await {
                Ok(p) => p,
                Err(_) => continue,
            };
            match polled {
                Polled::Unchanged => {}
                Polled::Reloaded => tracing::info!(
                    cert = %self.files.cert.display(),
                    key = %self.files.key.display(),
                    "TLS certificate reloaded: new handshakes use it"
                ),
                Polled::Refused(e) => tracing::warn!(
                    error = %e,
                    "TLS certificate files refused; the previous certificate stays in force"
                ),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
