//! A certificate and its key in force, reloaded when their files change, without a restart:
//! every new handshake takes the pair in force at that moment; connections already open keep
//! the one they started with.
//!
//! The files are polled (their bytes, read through the path), as the rules file is: a
//! Kubernetes Secret update is an atomic swap of a `..data` symlink that file watchers often
//! miss, and reading two small files each second costs nothing. A pair that does not load — a
//! file missing, not PEM, a key that is not the certificate's (the certificate rewritten and
//! its key not yet), or a chain expired or not valid yet (every client would refuse it) — is
//! refused, logged once, and the previous pair stays in force; it is tried again as soon as
//! either file changes again, and a pair refused only for being early is taken once its start
//! date comes.
//!
//! At start a pair is taken whatever its dates, with an error in the log (see
//! [`ReloadingCert::watch`]): a node whose certificate expired still serves its peers, its SDK
//! clients and plain ports, keeps its share of the ring, and takes a renewed pair without a
//! restart; refusing to start would turn an expiry, which strikes every node at once, into the
//! whole cluster down. [`ReloadingCert::expires_in`] is exported, so an alert comes first.

use super::TlsError;
use super::files::{self, CERT, Validity};
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
    /// The dates of the chain in force.
    validity: Mutex<Validity>,
    /// The bytes last looked at (`None`: unreadable then), so that a pair is tried, and a
    /// refusal logged, once per change.
    seen: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// The pair last looked at, refused only because it is not valid yet: put in force once it
    /// is (if its files have not changed meanwhile).
    early: Mutex<Option<(Arc<CertifiedKey>, Validity)>>,
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
    ///
    /// A pair out of its dates is loaded (see the module doc); [`ReloadingCert::watch`] says so.
    pub fn load(files: CertFiles) -> Result<Self, TlsError> {
        let cert = files::read_file(CERT, &files.cert)?;
        let key = files::read_file("key", &files.key)?;
        let certified = files::certified_key_of(&files.cert, &cert, &files.key, &key)?;
        let validity = files::validity_of(&files.cert, &certified.cert)?;
        Ok(Self {
            files,
            current: ArcSwap::from_pointee(certified),
            validity: Mutex::new(validity),
            seen: Mutex::new(Some((cert, key))),
            early: Mutex::new(None),
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

    /// The dates of the chain in force.
    pub fn validity(&self) -> Validity {
        *self.validity.lock()
    }

    /// Seconds from `now` (Unix seconds) until the chain in force expires; negative once it has.
    pub fn expires_in(&self, now: i64) -> i64 {
        self.validity().not_after.saturating_sub(now)
    }

    /// Why the chain in force is refused by clients at `now` (Unix seconds), if it is.
    pub fn out_of_date(&self, now: i64) -> Option<TlsError> {
        self.validity().check(&self.files.cert, now).err()
    }

    fn put_in_force(&self, certified: Arc<CertifiedKey>, validity: Validity) -> Polled {
        *self.validity.lock() = validity;
        self.current.store(certified);
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        Polled::Reloaded
    }

    /// Reads the files; a pair that changed since the last look is put in force, or refused.
    pub fn poll(&self) -> Polled {
        self.poll_at(unix_s())
    }

    /// [`ReloadingCert::poll`] at `now` (Unix seconds).
    pub(crate) fn poll_at(&self, now: i64) -> Polled {
        let read = files::read_file(CERT, &self.files.cert)
            .and_then(|cert| files::read_file("key", &self.files.key).map(|key| (cert, key)));
        let mut seen = self.seen.lock();
        let (cert, key) = match read {
            Ok(pair) => pair,
            // Unreadable (a file replaced by remove-then-create, or gone): once per change.
            Err(e) => {
                *self.early.lock() = None;
                if seen.take().is_none() {
                    return Polled::Unchanged;
                }
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                return Polled::Refused(e);
            }
        };
        if seen.as_ref().is_some_and(|(c, k)| *c == cert && *k == key) {
            let mut early = self.early.lock();
            let due = early
                .as_ref()
                .is_some_and(|(_, v)| v.check(&self.files.cert, now).is_ok());
            return match early.take() {
                Some((certified, validity)) if due => self.put_in_force(certified, validity),
                waiting => {
                    *early = waiting;
                    Polled::Unchanged
                }
            };
        }
        let loaded = files::certified_key_of(&self.files.cert, &cert, &self.files.key, &key)
            .and_then(|c| files::validity_of(&self.files.cert, &c.cert).map(|v| (c, v)));
        *seen = Some((cert, key));
        drop(seen);
        *self.early.lock() = None;
        let refused = |e| {
            self.reloads_failed.fetch_add(1, Ordering::Relaxed);
            Polled::Refused(e)
        };
        match loaded {
            Ok((certified, validity)) => match validity.check(&self.files.cert, now) {
                Ok(()) => self.put_in_force(Arc::new(certified), validity),
                Err(e @ TlsError::NotYetValid { .. }) => {
                    *self.early.lock() = Some((Arc::new(certified), validity));
                    refused(e)
                }
                Err(e) => refused(e),
            },
            Err(e) => refused(e),
        }
    }

    /// Polls the files every `every`, for ever (drop or abort the future to stop), logging
    /// what changes: `TLS certificate reloaded` (info) or `TLS certificate files refused`
    /// (warn, with the reason naming the file).
    ///
    /// It first says, at error level, if the pair in force (loaded at start) is expired or not
    /// valid yet, and again whenever the pair in force falls out of its dates.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut out_of_date = false;
        loop {
            match self.out_of_date(unix_s()) {
                Some(e) if !out_of_date => {
                    tracing::error!(
                        error = %e,
                        key = %self.files.key.display(),
                        "TLS certificate in force is out of its dates: clients refuse every \
                         handshake until valid files replace it (taken without a restart)"
                    );
                    out_of_date = true;
                }
                Some(_) => {}
                None => out_of_date = false,
            }
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
                    not_after = %files::date(self.validity().not_after),
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

/// The wall clock in Unix seconds: what clients check a certificate's dates against.
fn unix_s() -> i64 {
    i64::try_from(crate::clock::unix_ms() / 1_000).unwrap_or(i64::MAX)
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
