//! Building a [`Client`]: seeds, deadlines, fallback policy, authentication, TLS.

use crate::Client;
use ringlimit_core::tls::{PeerTlsFiles, TlsError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a check answers when the cluster cannot (owner timed out, unreachable, no members).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Decide from the local fallback limiter and mark the answer degraded (default): the
    /// service keeps serving, within its share of the limit.
    #[default]
    Open,
    /// Return [`crate::ClientError::Unavailable`] and let the caller decide.
    Closed,
}

/// How much of a rule's limit the local fallback admits (core's, shared with the nodes).
pub use ringlimit_core::coordinator::FallbackShare;

/// Every setting of a client.
#[derive(Debug, Clone)]
pub struct Settings {
    /// HTTP base URLs of nodes to discover the cluster from.
    pub seeds: Vec<String>,
    /// The cluster's id: members of another cluster are ignored.
    pub cluster_id: String,
    /// The cluster secret, for a process that runs as a member (peer port authentication).
    pub secret: Option<Arc<[u8]>>,
    /// A client credential: a token with the `check` role in the nodes' `--admin-tokens` file
    /// (or their `RINGLIMIT_CLIENT_TOKEN`). Proved instead of the secret: a client may check,
    /// lease, reserve and give back its own holds, and nothing a member does.
    pub client_token: Option<Arc<[u8]>>,
    /// Mutual TLS on the peer port (the nodes' `--peer-tls-*`): the cluster CA, and this
    /// client's certificate and key (signed by that CA; reloaded when they change).
    pub peer_tls: Option<PeerTlsFiles>,
    /// The CA of the nodes' HTTPS ports (their `--tls-cert`): discovery then speaks HTTPS to
    /// seeds and members, trusting certificates that chain to it.
    pub http_tls_ca: Option<PathBuf>,
    /// This client's name in the peer handshake (nodes log it).
    pub name: String,
    /// How long a check waits for its owner before the fallback answers.
    pub deadline: Duration,
    /// TCP connect plus handshake with a member.
    pub connect_timeout: Duration,
    /// How often membership and rules are refreshed (also at once after a failed check).
    pub refresh_interval: Duration,
    /// Each discovery request's timeout.
    pub discovery_timeout: Duration,
    pub fail_mode: FailMode,
    pub fallback_share: FallbackShare,
    /// Bound on buckets the local fallback holds (LRU beyond).
    pub fallback_max_keys: u64,
    /// Lease hot keys from their owners and decide their checks in-process (off by default;
    /// rules with `lease: off` never are). See the crate's `lease` module.
    pub leases: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            seeds: Vec::new(),
            cluster_id: "ringlimit".into(),
            secret: None,
            client_token: None,
            peer_tls: None,
            http_tls_ca: None,
            name: "ringlimit-client".into(),
            // A forwarded check takes ~0.1-0.5 ms on a LAN; 5 ms absorbs a busy owner while a
            // dead one costs a caller at most this once (its circuit then opens).
            deadline: Duration::from_millis(5),
            connect_timeout: Duration::from_millis(500),
            refresh_interval: Duration::from_secs(1),
            discovery_timeout: Duration::from_millis(500),
            fail_mode: FailMode::Open,
            fallback_share: FallbackShare::PerMember,
            fallback_max_keys: 100_000,
            leases: false,
        }
    }
}

/// Why a client cannot be built. Unreachable seeds are not an error: the client starts
/// degraded and keeps discovering.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no seeds: give at least one node's HTTP address")]
    NoSeeds,
    #[error("seed {0:?} is not an http://host:port address (https://host:port with .http_tls_ca)")]
    BadSeed(String),
    #[error("seed {0:?} is HTTPS: give the CA of the nodes' certificates with .http_tls_ca(...)")]
    HttpsWithoutCa(String),
    #[error("peer TLS: {0}")]
    PeerTls(TlsError),
    #[error("HTTPS discovery: {0}")]
    HttpTls(TlsError),
    #[error("fallback share {0} must be in (0, 1]")]
    BadShare(f64),
    #[error("deadline must be greater than zero")]
    ZeroDeadline,
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
    #[error("the client must be built inside a tokio runtime")]
    NoRuntime,
    #[error(
        "give either a client token (a service: .client_token) or the cluster secret (a process \
         that runs as a member: .cluster_secret), not both"
    )]
    SecretAndToken,
}

/// Builds a [`Client`]; see [`Client::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ClientBuilder {
    settings: Settings,
}

impl ClientBuilder {
    /// Nodes' HTTP addresses (`http://host:port` or `host:port`) to discover the cluster from.
    pub fn seeds<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.seeds = seeds.into_iter().map(Into::into).collect();
        self
    }

    /// The cluster's id (default `ringlimit`).
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.settings.cluster_id = id.into();
        self
    }

    /// The client credential this service proves to the nodes: a token with the `check` role
    /// in their `--admin-tokens` file (or their `RINGLIMIT_CLIENT_TOKEN`); an empty one means
    /// none. What services should use: it lets them check, lease, reserve and give back their
    /// own holds, and nothing more (rule changes, resets, handovers are a member's). The token
    /// never travels: the handshake proves it, and the node proves it back.
    pub fn client_token(mut self, token: impl AsRef<[u8]>) -> Self {
        let t = token.as_ref();
        self.settings.client_token = (!t.is_empty()).then(|| Arc::from(t));
        self
    }

    /// The cluster secret (`RINGLIMIT_CLUSTER_SECRET` of the nodes), for a process that runs
    /// as a member; a service should prove a [`ClientBuilder::client_token`] instead (whoever
    /// holds the secret can do whatever a member can). An empty one means none.
    pub fn cluster_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        let s = secret.as_ref();
        self.settings.secret = (!s.is_empty()).then(|| Arc::from(s));
        self
    }

    /// Mutual TLS on the peer port, for a cluster whose nodes run with `--peer-tls-ca`,
    /// `--peer-tls-cert`, `--peer-tls-key`: `ca` is the cluster CA (PEM), `cert` and `key` this
    /// client's certificate (signed by it, with client auth among its uses if it lists any) and
    /// key. Checks then travel inside TLS 1.3, and the owner's certificate must chain to `ca`
    /// (names are not checked: members are dialled at their advertised addresses). The files
    /// are read at [`ClientBuilder::build`] (an error names the file) and the certificate and
    /// key are reloaded when they change. Beside [`ClientBuilder::cluster_secret`] or instead
    /// of it, as the nodes have it.
    pub fn peer_tls(
        mut self,
        ca: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.settings.peer_tls = Some(PeerTlsFiles {
            ca: ca.into(),
            cert: cert.into(),
            key: key.into(),
        });
        self
    }

    /// Discovery over HTTPS, for nodes that run with `--tls-cert`: seeds and members are read
    /// at `https://`, and their certificates must chain to the CA in `ca` (PEM; names are not
    /// checked, as members are reached at the addresses they advertise). Seeds may then be
    /// written `https://host:port` or `host:port`.
    pub fn http_tls_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.settings.http_tls_ca = Some(ca.into());
        self
    }

    /// This client's name in the peer handshake.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = name.into();
        self
    }

    /// How long a check may wait for its owner (default 5 ms).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadline = deadline;
        self
    }

    /// Connect plus handshake with a member (default 500 ms; checks never wait on it longer
    /// than their deadline).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// How often to refresh members and rules (default 1 s).
    pub fn refresh_interval(mut self, interval: Duration) -> Self {
        self.settings.refresh_interval = interval;
        self
    }

    /// Each discovery request's timeout (default 500 ms).
    pub fn discovery_timeout(mut self, timeout: Duration) -> Self {
        self.settings.discovery_timeout = timeout;
        self
    }

    /// What to answer when the cluster cannot (default [`FailMode::Open`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.settings.fail_mode = mode;
        self
    }

    /// How much of a limit the local fallback admits (default [`FallbackShare::PerMember`]).
    pub fn fallback_share(mut self, share: FallbackShare) -> Self {
        self.settings.fallback_share = share;
        self
    }

    /// Bound on the local fallback's buckets (default 100,000).
    pub fn fallback_max_keys(mut self, n: u64) -> Self {
        self.settings.fallback_max_keys = n;
        self
    }

    /// Leases hot keys (checked 1,000 times a second and more) from their owners and decides
    /// their checks in-process on the slices (`leased: true`): no round trip, no server work
    /// per check, never more admitted than the limit (slices are taken from the bucket before
    /// they are spent; the cost is false denies while tokens sit unused here). Rules with
    /// `lease: off` are never leased. Off by default.
    pub fn leases(mut self, on: bool) -> Self {
        self.settings.leases = on;
        self
    }

    /// Checks the settings, discovers the cluster (bounded by the discovery timeout; an
    /// unreachable cluster leaves the client degraded, not failed) and starts refreshing.
    pub async fn build(mut self) -> Result<Client, BuildError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BuildError::NoRuntime);
        }
        if self.settings.seeds.is_empty() {
            return Err(BuildError::NoSeeds);
        }
        if self.settings.secret.is_some() && self.settings.client_token.is_some() {
            return Err(BuildError::SecretAndToken);
        }
        let https = self.settings.http_tls_ca.is_some();
        self.settings.seeds = self
            .settings
            .seeds
            .iter()
            .map(|s| match http_base(s, https) {
                Some(base) => Ok(base),
                None if !https && s.trim().starts_with("https://") => {
                    Err(BuildError::HttpsWithoutCa(s.clone()))
                }
                None => Err(BuildError::BadSeed(s.clone())),
            })
            .collect::<Result<_, _>>()?;
        if let FallbackShare::Fraction(f) = self.settings.fallback_share
            && !(f > 0.0 && f <= 1.0)
        {
            return Err(BuildError::BadShare(f));
        }
        if self.settings.deadline.is_zero() {
            return Err(BuildError::ZeroDeadline);
        }
        Client::start(self.settings).await
    }
}

/// `http://host:port` (`https://host:port` with `https`) from a seed or a member's advertised
/// HTTP address (no path, no slash); the other scheme is not accepted.
pub(crate) fn http_base(s: &str, https: bool) -> Option<String> {
    let scheme = if https { "https://" } else { "http://" };
    let s = s.trim().trim_end_matches('/');
    let rest = s.strip_prefix(scheme).unwrap_or(s);
    let (host, port) = rest.rsplit_once(':')?;
    if host.is_empty() || rest.contains('/') || port.parse::<u16>().is_err() {
        return None;
    }
    Some(format!("{scheme}{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_become_http_bases() {
        let http = |s| http_base(s, false);
        assert_eq!(
            http("http://10.0.0.1:8080/").as_deref(),
            Some("http://10.0.0.1:8080")
        );
        assert_eq!(
            http("ringlimit-0.ringlimit-peers:8080").as_deref(),
            Some("http://ringlimit-0.ringlimit-peers:8080")
        );
        assert_eq!(http("[::1]:80").as_deref(), Some("http://[::1]:80"));
        // With HTTPS discovery: https:// or none, never http://.
        let https = |s| http_base(s, true);
        assert_eq!(https("https://h:1").as_deref(), Some("https://h:1"));
        assert_eq!(
            https("10.0.0.1:8080").as_deref(),
            Some("https://10.0.0.1:8080")
        );
        assert_eq!(https("http://h:1"), None);
        for bad in [
            "",
            "host",
            "host:",
            ":80",
            "https://h:1",
            "h:99999",
            "h:1/x",
        ] {
            assert_eq!(http(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn seeds_are_trimmed_and_lose_a_trailing_slash() {
        assert_eq!(
            http_base("  http://h:80/ ", false).as_deref(),
            Some("http://h:80")
        );
        assert_eq!(http_base("h:80//", false).as_deref(), Some("http://h:80"));
        // A path, a port out of range or none: not a seed.
        for bad in [
            "http://h:80/v1",
            "http://h:0x50",
            "http://h:-1",
            "http://:1",
        ] {
            assert_eq!(http_base(bad, false), None, "{bad:?}");
        }
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let s = Settings::default();
        assert!(s.seeds.is_empty());
        assert_eq!(s.cluster_id, "ringlimit");
        assert_eq!(s.name, "ringlimit-client");
        assert_eq!(s.deadline, Duration::from_millis(5));
        assert_eq!(s.connect_timeout, Duration::from_millis(500));
        assert_eq!(s.refresh_interval, Duration::from_secs(1));
        assert_eq!(s.discovery_timeout, Duration::from_millis(500));
        assert_eq!(s.fail_mode, FailMode::Open);
        assert_eq!(s.fallback_share, FallbackShare::PerMember);
        assert_eq!(s.fallback_max_keys, 100_000);
        assert!(!s.leases && s.secret.is_none() && s.client_token.is_none());
        assert!(s.peer_tls.is_none() && s.http_tls_ca.is_none());
    }

    #[test]
    fn the_builder_keeps_what_it_is_given_and_empty_credentials_are_none() {
        let b = ClientBuilder::default()
            .seeds(["h:1", "http://h:2"])
            .cluster_id("c")
            .client_token("")
            .cluster_secret("s3cret")
            .name("svc")
            .deadline(Duration::from_millis(7))
            .connect_timeout(Duration::from_millis(8))
            .refresh_interval(Duration::from_millis(9))
            .discovery_timeout(Duration::from_millis(10))
            .fail_mode(FailMode::Closed)
            .fallback_share(FallbackShare::Fraction(0.25))
            .fallback_max_keys(11)
            .leases(true)
            .peer_tls("ca.pem", "cert.pem", "key.pem")
            .http_tls_ca("http-ca.pem");
        let s = &b.settings;
        assert_eq!(s.seeds, ["h:1", "http://h:2"]);
        assert_eq!(s.cluster_id, "c");
        assert!(s.client_token.is_none(), "an empty token is none");
        assert_eq!(s.secret.as_deref(), Some(&b"s3cret"[..]));
        assert_eq!(s.name, "svc");
        assert_eq!(
            (
                s.deadline,
                s.connect_timeout,
                s.refresh_interval,
                s.discovery_timeout
            ),
            (
                Duration::from_millis(7),
                Duration::from_millis(8),
                Duration::from_millis(9),
                Duration::from_millis(10)
            )
        );
        assert_eq!(s.fail_mode, FailMode::Closed);
        assert_eq!(s.fallback_share, FallbackShare::Fraction(0.25));
        assert_eq!(s.fallback_max_keys, 11);
        assert!(s.leases);
        let tls = s.peer_tls.as_ref().expect("peer TLS");
        assert_eq!(
            (tls.ca.as_path(), tls.cert.as_path(), tls.key.as_path()),
            (
                std::path::Path::new("ca.pem"),
                std::path::Path::new("cert.pem"),
                std::path::Path::new("key.pem")
            )
        );
        assert_eq!(
            s.http_tls_ca.as_deref(),
            Some(std::path::Path::new("http-ca.pem"))
        );
        let b = b.cluster_secret("").client_token("t");
        assert!(b.settings.secret.is_none(), "an empty secret is none");
        assert_eq!(b.settings.client_token.as_deref(), Some(&b"t"[..]));
    }

    #[test]
    fn a_client_is_built_inside_a_runtime() {
        let built = futures::executor::block_on(ClientBuilder::default().seeds(["h:1"]).build());
        assert!(matches!(built, Err(BuildError::NoRuntime)), "{built:?}");
    }

    /// Whether an error is the one a case expects.
    type Refused = fn(&BuildError) -> bool;

    /// Every setting that cannot work is refused before any request is made (the seeds here
    /// would answer nothing anyway).
    #[tokio::test]
    async fn settings_that_cannot_work_are_refused_before_any_request() {
        let seeded = || ClientBuilder::default().seeds(["127.0.0.1:9"]);
        let cases: Vec<(&str, ClientBuilder, Refused)> = vec![
            ("no seeds", ClientBuilder::default(), |e| {
                matches!(e, BuildError::NoSeeds)
            }),
            (
                "a secret and a token",
                seeded().cluster_secret("s").client_token("t"),
                |e| matches!(e, BuildError::SecretAndToken),
            ),
            (
                "a seed without a port",
                ClientBuilder::default().seeds(["127.0.0.1:9", "host"]),
                |e| matches!(e, BuildError::BadSeed(s) if s == "host"),
            ),
            (
                "an https seed without a CA",
                ClientBuilder::default().seeds(["https://h:1"]),
                |e| matches!(e, BuildError::HttpsWithoutCa(s) if s == "https://h:1"),
            ),
            (
                "an http seed with a CA",
                ClientBuilder::default()
                    .seeds(["http://h:1"])
                    .http_tls_ca("ca.pem"),
                |e| matches!(e, BuildError::BadSeed(_)),
            ),
            (
                "no share",
                seeded().fallback_share(FallbackShare::Fraction(0.0)),
                |e| matches!(e, BuildError::BadShare(f) if *f == 0.0),
            ),
            (
                "more than the limit",
                seeded().fallback_share(FallbackShare::Fraction(1.5)),
                |e| matches!(e, BuildError::BadShare(_)),
            ),
            (
                "not a number",
                seeded().fallback_share(FallbackShare::Fraction(f64::NAN)),
                |e| matches!(e, BuildError::BadShare(_)),
            ),
            ("no deadline", seeded().deadline(Duration::ZERO), |e| {
                matches!(e, BuildError::ZeroDeadline)
            }),
            (
                "a CA file that is not there",
                ClientBuilder::default()
                    .seeds(["https://h:1"])
                    .http_tls_ca("/nonexistent/ringlimit-ca.pem"),
                |e| matches!(e, BuildError::HttpTls(_)),
            ),
            (
                "peer TLS files that are not there",
                seeded().peer_tls(
                    "/nonexistent/ca.pem",
                    "/nonexistent/cert.pem",
                    "/nonexistent/key.pem",
                ),
                |e| matches!(e, BuildError::PeerTls(_)),
            ),
        ];
        for (what, builder, expected) in cases {
            match builder.build().await {
                Err(e) => assert!(expected(&e), "{what}: {e}"),
                Ok(c) => panic!("{what}: built {c:?}"),
            }
        }
    }
}
