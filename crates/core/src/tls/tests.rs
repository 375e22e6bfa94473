//! Certificates made here with rcgen, in a temporary directory: loading, reload, and mutual
//! TLS over the in-memory network.

use super::reload::Polled;
use super::*;
use crate::link::memnet::MemNet;
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA that issues leaf certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        let pem = params.self_signed(&key).expect("CA").pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` usable both ways (server and client auth): its PEM and its
    /// key's.
    fn issue(&self, names: &[&str]) -> (String, String) {
        self.issue_with(names, |_| {})
    }

    /// [`Ca::issue`], valid from the start of year `from` to the start of year `to`.
    fn issue_dated(&self, names: &[&str], from: i32, to: i32) -> (String, String) {
        self.issue_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(from, 1, 1);
            p.not_after = rcgen::date_time_ymd(to, 1, 1);
        })
    }

    fn issue_with(
        &self,
        names: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        edit(&mut params);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

/// A temporary directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ringlimit-core-tls-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("written");
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pair(dir: &Dir, prefix: &str, (cert, key): &(String, String)) -> CertFiles {
    CertFiles {
        cert: dir.write(&format!("{prefix}.crt"), cert),
        key: dir.write(&format!("{prefix}.key"), key),
    }
}

fn peer_files(dir: &Dir, prefix: &str, ca: &Ca, leaf: &(String, String)) -> PeerTlsFiles {
    let files = pair(dir, prefix, leaf);
    PeerTlsFiles {
        ca: dir.write(&format!("{prefix}-ca.crt"), &ca.pem),
        cert: files.cert,
        key: files.key,
    }
}

fn mentions(e: &TlsError, path: &Path) -> bool {
    e.to_string().contains(&path.display().to_string())
}

#[test]
fn a_pair_loads_and_every_bad_file_is_an_error_naming_it() {
    let dir = Dir::new();
    let ca = Ca::new("ca");
    let good = pair(&dir, "good", &ca.issue(&["localhost"]));
    ReloadingCert::load(good.clone()).expect("a good pair");

    let other = pair(&dir, "other", &ca.issue(&["localhost"]));
    let mismatched = CertFiles {
        cert: good.cert.clone(),
        key: other.key.clone(),
    };
    let e = ReloadingCert::load(mismatched).expect_err("another key");
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");
    assert!(mentions(&e, &good.cert) && mentions(&e, &other.key), "{e}");

    let missing = dir.0.join("missing.crt");
    let e = ReloadingCert::load(CertFiles {
        cert: missing.clone(),
        key: good.key.clone(),
    })
    .expect_err("missing");
    assert!(
        matches!(e, TlsError::Read { .. }) && mentions(&e, &missing),
        "{e}"
    );

    let text = dir.write("text.crt", "not a certificate\n");
    let e = ReloadingCert::load(CertFiles {
        cert: text.clone(),
        key: good.key.clone(),
    })
    .expect_err("no PEM");
    assert!(
        matches!(e, TlsError::NoCertificate { .. }) && mentions(&e, &text),
        "{e}"
    );

    // A certificate where the key should be.
    let e = ReloadingCert::load(CertFiles {
        cert: good.cert.clone(),
        key: good.cert.clone(),
    })
    .expect_err("no key");
    assert!(
        matches!(e, TlsError::NoKey { .. }) && mentions(&e, &good.cert),
        "{e}"
    );

    let e = files::roots(&text).expect_err("no CA");
    assert!(mentions(&e, &text) && e.to_string().contains("CA"), "{e}");
}

#[test]
fn a_changed_pair_is_put_in_force_and_a_bad_one_refused_once_keeping_the_previous() {
    let dir = Dir::new();
    let ca = Ca::new("ca");
    let files = pair(&dir, "live", &ca.issue(&["first"]));
    let cert = ReloadingCert::load(files.clone()).expect("loads");
    let first = cert.leaf().expect("a leaf");
    assert!(matches!(cert.poll(), Polled::Unchanged));

    // The certificate rewritten, its key not yet: refused (once), the first stays.
    let (next_cert, next_key) = ca.issue(&["second"]);
    std::fs::write(&files.cert, &next_cert).expect("written");
    assert!(matches!(
        cert.poll(),
        Polled::Refused(TlsError::KeyMismatch { .. })
    ));
    assert!(matches!(cert.poll(), Polled::Unchanged), "refused once");
    assert_eq!(cert.leaf().as_ref(), Some(&first));
    // Then the key: in force.
    std::fs::write(&files.key, &next_key).expect("written");
    assert!(matches!(cert.poll(), Polled::Reloaded));
    let second = cert.leaf().expect("a leaf");
    assert_ne!(second, first);
    assert!(matches!(cert.poll(), Polled::Unchanged));

    // A file gone for a moment: refused once, the second stays; back as it was: in force.
    std::fs::remove_file(&files.key).expect("removed");
    assert!(matches!(
        cert.poll(),
        Polled::Refused(TlsError::Read { .. })
    ));
    assert!(matches!(cert.poll(), Polled::Unchanged));
    std::fs::write(&files.key, &next_key).expect("written");
    assert!(matches!(cert.poll(), Polled::Reloaded));
    assert_eq!(cert.leaf(), Some(second));
    assert_eq!(
        cert.reloads_ok.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(
        cert.reloads_failed
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// 2100-01-01 and 2000-01-01 in Unix seconds.
const Y2100: i64 = 4_102_444_800;
const Y2000: i64 = 946_684_800;

/// A renewed pair that is expired, or not valid yet, is refused on reload (once; the previous
/// stays in force), the early one taken when its start date comes; at start an expired pair is
/// loaded (a node starts) and said to be out of date; the seconds to expiry are the chain's.
#[test]
fn a_pair_out_of_its_dates_is_refused_on_reload_and_an_early_one_taken_when_due() {
    let dir = Dir::new();
    let ca = Ca::new("ca");
    let files = pair(&dir, "live", &ca.issue_dated(&["first"], 2020, 2090));
    let cert = ReloadingCert::load(files.clone()).expect("loads");
    let first = cert.leaf().expect("a leaf");
    let now = Y2000 + 30 * 365 * 86_400;
    assert!(cert.out_of_date(now).is_none());
    let ends = rcgen::date_time_ymd(2090, 1, 1).unix_timestamp();
    assert_eq!(cert.validity().not_after, ends);
    assert_eq!(cert.expires_in(now), ends - now);

    // Expired (2000 to 2001): refused once, naming the file; the first stays.
    let (old_cert, old_key) = ca.issue_dated(&["expired"], 2000, 2001);
    std::fs::write(&files.cert, &old_cert).expect("written");
    std::fs::write(&files.key, &old_key).expect("written");
    let polled = cert.poll_at(now);
    let Polled::Refused(e @ TlsError::Expired { .. }) = polled else {
        panic!("{polled:?}");
    };
    assert!(
        mentions(&e, &files.cert) && e.to_string().contains("2001"),
        "{e}"
    );
    assert!(
        matches!(cert.poll_at(now), Polled::Unchanged),
        "refused once"
    );
    assert_eq!(cert.leaf().as_ref(), Some(&first));
    assert_eq!(cert.validity().not_after, ends);

    // Not valid before 2100: refused, then put in force once 2100 comes.
    let (early_cert, early_key) = ca.issue_dated(&["early"], 2100, 2101);
    std::fs::write(&files.cert, &early_cert).expect("written");
    std::fs::write(&files.key, &early_key).expect("written");
    let polled = cert.poll_at(now);
    assert!(
        matches!(polled, Polled::Refused(TlsError::NotYetValid { .. })),
        "{polled:?}"
    );
    assert!(matches!(cert.poll_at(now), Polled::Unchanged));
    assert_eq!(cert.leaf().as_ref(), Some(&first));
    assert!(matches!(cert.poll_at(Y2100), Polled::Reloaded));
    assert_ne!(cert.leaf().as_ref(), Some(&first));
    assert_eq!(cert.validity().not_before, Y2100);
    assert!(matches!(cert.poll_at(Y2100 + 1), Polled::Unchanged));

    // At start: an expired pair loads, and is said to be out of date.
    let expired = pair(&dir, "expired", &(old_cert, old_key));
    let at_start = ReloadingCert::load(expired.clone()).expect("an expired pair loads");
    assert!(matches!(
        at_start.out_of_date(now),
        Some(TlsError::Expired { .. })
    ));
    assert!(at_start.expires_in(now) < 0);
}

/// Serves one TLS connection at "s:7946" on `net` and echoes one message; what the handshake gave.
async fn echo_once(net: &MemNet, server: &PeerTls) -> tokio::task::JoinHandle<bool> {
    let mut listener = net.listen("s:7946");
    let server = server.clone();
    tokio::spawn(async move {
        let Some((io, _)) = listener.accept().await else {
            return false;
        };
        let mut io = match server.accept(io).await {
            Ok(io) => io,
            Err(e) => {
                eprintln!("accept: {e}");
                return false;
            }
        };
        let mut buf = [0u8; 5];
        if io.read_exact(&mut buf).await.is_err() {
            return false;
        }
        io.write_all(&buf).await.is_ok() && io.flush().await.is_ok()
    })
}

/// Dials "s:7946" through `client` and sends a message; whether it came back.
async fn hello(net: &MemNet, client: &PeerTls) -> bool {
    let dialer = client.dialer(net.dialer("c"));
    let mut io = match tokio::time::timeout(Duration::from_secs(5), dialer.dial("s:7946")).await {
        Ok(Ok(io)) => io,
        other => {
            eprintln!("dial: {:?}", other.map(|r| r.err()));
            return false;
        }
    };
    let mut buf = [0u8; 5];
    io.write_all(b"hello").await.is_ok()
        && io.flush().await.is_ok()
        && io.read_exact(&mut buf).await.is_ok()
        && &buf == b"hello"
}

#[tokio::test]
async fn peers_talk_only_with_certificates_of_their_ca_both_ways() {
    let dir = Dir::new();
    let (ca, stranger) = (Ca::new("cluster"), Ca::new("another"));
    // Names are not checked: this one names nothing the client dials.
    let server = PeerTls::load(&peer_files(
        &dir,
        "s",
        &ca,
        &ca.issue(&["elsewhere.example"]),
    ))
    .expect("server");
    let member = PeerTls::load(&peer_files(&dir, "m", &ca, &ca.issue(&["m"]))).expect("member");

    let net = MemNet::new();
    let served = echo_once(&net, &server).await;
    assert!(hello(&net, &member).await, "a member gets through");
    assert!(served.await.expect("served"));

    // A client whose certificate another CA signed (it trusts the cluster's CA, so only the
    // server can refuse it).
    let mut files = peer_files(&dir, "x", &stranger, &stranger.issue(&["x"]));
    files.ca = dir.write("x-trusts.crt", &ca.pem);
    let outsider = PeerTls::load(&files).expect("outsider");
    let net = MemNet::new();
    let served = echo_once(&net, &server).await;
    assert!(!hello(&net, &outsider).await, "refused by the server");
    assert!(!served.await.expect("served"));

    // A server whose certificate another CA signed: refused by the member.
    let mut files = peer_files(&dir, "y", &stranger, &stranger.issue(&["y"]));
    files.ca = dir.write("y-trusts.crt", &ca.pem);
    let impostor = PeerTls::load(&files).expect("impostor");
    let net = MemNet::new();
    let served = echo_once(&net, &impostor).await;
    assert!(!hello(&net, &member).await, "refused by the client");
    assert!(!served.await.expect("served"));

    // A client without TLS at all.
    let net = MemNet::new();
    let served = echo_once(&net, &server).await;
    let mut plain = net.dialer("c").dial("s:7946").await.expect("dialed");
    let _ = plain.write_all(&[0, 0, 0, 5, 1, 2, 3, 4, 5]).await;
    let _ = plain.flush().await;
    drop(plain);
    assert!(!served.await.expect("served"));
}

#[test]
fn the_handshake_names_dns_hosts_and_addresses() {
    use rustls::pki_types::ServerName;
    let dns = |a: &str| match peer::server_name(a) {
        ServerName::DnsName(d) => d.as_ref().to_owned(),
        other => format!("{other:?}"),
    };
    let ip = |a: &str| match peer::server_name(a) {
        ServerName::IpAddress(ip) => std::net::IpAddr::from(ip).to_string(),
        other => format!("{other:?}"),
    };
    assert_eq!(dns("ringlimit-0.peers:7946"), "ringlimit-0.peers");
    assert_eq!(ip("10.1.2.3:7946"), "10.1.2.3");
    assert_eq!(ip("[::1]:7946"), "::1");
    // Not a name at all: a placeholder, never a failure.
    assert_eq!(dns("bad name:1"), "ringlimit");
}
