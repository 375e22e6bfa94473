//! The peer handshake as two small state machines with no I/O: the caller moves frames, these
//! decide. Both nodes and the SDK drive the same code, so they can never disagree on it.
//!
//! ```text
//! member (or anonymous client)           server
//!   Hello{magic, version, cluster, id, nc}  →
//!                                        ←  Challenge{version, ns, proof_s(nc, ns)}
//!   Proof{proof_c(nc, ns)}                →
//!                                        ←  Welcome{id}  |  Refused{reason}
//!
//! client with a credential                server
//!   ClientHello{magic, version, ..., nc}   →
//!                                        ←  Challenge{version, ns, (no proof)}
//!   Proof{proof_c(nc, ns)}                →  (checked against every client key it keeps)
//!                                        ←  ClientWelcome{id, proof_s(nc, ns)}  |  Refused
//! ```
//! The client offers the highest version it speaks; a server that speaks it or an older one no
//! older than its [`OLDEST_PROTOCOL_VERSION`] answers with the lower of the two, which is the
//! connection's version from then on ([`ClientHandshake::version`],
//! [`ServerHandshake::version`]); anything else is refused with a clear reason. A version-2
//! node refuses a version-3 client's `Hello` (it speaks exactly 2): until every node speaks 3,
//! an upgraded node's links to the older ones are refused and its checks for their keys fail
//! over to the fallback share, as for an unreachable owner; older nodes' links to upgraded ones
//! speak 2.
//!
//! # Members and clients
//! A `Hello` proves the cluster secret: what members (and processes that run as members) hold.
//! A `ClientHello` proves a client credential instead — a token with the `check` role — keyed
//! by its SHA-256 ([`auth::client_key`]), the digest the server's tokens file keeps. The client
//! does not name its token: the server finds the key its proof verifies under, and proves that
//! same key back in `ClientWelcome`, so a client talks only to a server that knows its token.
//! What each may send is the server's business ([`Proven`] says what was proved).
//!
//! Without a secret on either side, `Hello`'s proofs are empty and not checked: the port is then
//! unauthenticated, and nodes say so in their startup log.
//!
//! With a secret or a credential, every frame after the handshake carries a MAC under the
//! connection's session key ([`ClientHandshake::session_key`], [`Accepted::session_key`]; see
//! [`crate::auth::FrameMac`]): the link layer turns it on once the handshake is through.

use crate::auth::{self, NONCE_LEN, NamedClientKey, Role};
use crate::peer::{Frame, Hello, MAGIC, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// Why a handshake failed. The text is sent to the other side in `Refused` where possible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("not a ringlimit peer (bad magic)")]
    BadMagic,
    #[error(
        "protocol version {theirs} is not supported (this node speaks \
         {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION})"
    )]
    Version { theirs: u16 },
    #[error("cluster id {theirs:?} does not match {ours:?}")]
    ClusterId { theirs: String, ours: String },
    #[error("peer did not prove it knows the cluster secret")]
    BadProof,
    #[error(
        "region link refused: the other side did not prove RINGLIMIT_REGION_SECRET (it must \
         be the same in every region)"
    )]
    BadRegionProof,
    #[error(
        "client did not prove a client credential this node accepts (a token with the `check` \
         role in --admin-tokens' file, or RINGLIMIT_CLIENT_TOKEN)"
    )]
    BadCredential,
    #[error(
        "this node accepts no client credentials: no token has the `check` role (--admin-tokens' \
         file, or RINGLIMIT_CLIENT_TOKEN)"
    )]
    NoCredentials,
    #[error("server did not prove it knows the client credential")]
    ServerUnproven,
    #[error("peer refused the connection: {0}")]
    Refused(String),
    #[error("unexpected {0} frame during the handshake")]
    Unexpected(&'static str),
}

/// What the dialing side proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proves {
    /// The cluster secret, or nothing when there is none.
    Secret,
    /// A client credential (the key is in `secret`).
    Credential,
    /// The region secret: a node of another region opening a region link.
    Region,
}

/// The dialing side.
#[derive(Debug)]
pub struct ClientHandshake {
    cluster_id: String,
    /// The cluster secret, or the credential's key.
    secret: Option<Vec<u8>>,
    proves: Proves,
    nonce: [u8; NONCE_LEN],
    server_nonce: Option<[u8; NONCE_LEN]>,
    /// Offered in the `Hello`, then what the server chose.
    version: u16,
}

impl ClientHandshake {
    /// Starts a handshake offering [`PROTOCOL_VERSION`]; send the returned `Hello`. `nonce`
    /// must be fresh and random.
    pub fn start(
        cluster_id: &str,
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Frame) {
        Self::offering(PROTOCOL_VERSION, cluster_id, node_id, secret, nonce)
    }

    /// Like [`ClientHandshake::start`], offering `version` (an older client, in tests).
    pub fn offering(
        version: u16,
        cluster_id: &str,
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Frame) {
        let (hs, hello) = Self::new(version, cluster_id, node_id, secret, nonce);
        (hs, Frame::Hello(hello))
    }

    /// Starts a client's handshake proving client token `token` (see the module doc); send the
    /// returned `ClientHello`.
    pub fn start_client(
        cluster_id: &str,
        node_id: &str,
        token: &[u8],
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Frame) {
        let key = auth::client_key(token);
        let (mut hs, hello) = Self::new(PROTOCOL_VERSION, cluster_id, node_id, Some(&key), nonce);
        hs.proves = Proves::Credential;
        (hs, Frame::ClientHello(hello))
    }

    /// Starts a region link's handshake (a node of another region), proving the region
    /// secret `secret` (none: the link relies on peer mTLS); send the returned `RegionHello`.
    pub fn start_region(
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Frame) {
        let (mut hs, hello) = Self::new(
            PROTOCOL_VERSION,
            crate::region::REGION_CONTEXT,
            node_id,
            secret,
            nonce,
        );
        hs.proves = Proves::Region;
        (hs, Frame::RegionHello(hello))
    }

    fn new(
        version: u16,
        cluster_id: &str,
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> (Self, Hello) {
        let hello = Hello {
            magic: MAGIC,
            version,
            cluster_id: cluster_id.to_owned(),
            node_id: node_id.to_owned(),
            nonce,
        };
        (
            Self {
                cluster_id: cluster_id.to_owned(),
                secret: secret.map(<[u8]>::to_vec),
                proves: Proves::Secret,
                nonce,
                server_nonce: None,
                version,
            },
            hello,
        )
    }

    /// Takes the server's `Challenge`; returns the `Proof` to send.
    pub fn on_challenge(&mut self, frame: Frame) -> Result<Frame, HandshakeError> {
        let (version, server_nonce, proof) = match frame {
            Frame::Challenge {
                version,
                nonce,
                proof,
            } => (version, nonce, proof),
            Frame::Refused { reason } => return Err(HandshakeError::Refused(reason)),
            other => return Err(HandshakeError::Unexpected(other.kind())),
        };
        // The server answers what it chose: no newer than offered, no older than spoken here.
        if !(OLDEST_PROTOCOL_VERSION..=self.version).contains(&version) {
            return Err(HandshakeError::Version { theirs: version });
        }
        // A client's server proves itself in `ClientWelcome`, once it knows which key.
        if self.proves != Proves::Credential
            && let Some(secret) = &self.secret
            && !auth::verify(
                secret,
                Role::Server,
                &self.nonce,
                &server_nonce,
                &self.cluster_id,
                &proof,
            )
        {
            return Err(if self.proves == Proves::Region {
                HandshakeError::BadRegionProof
            } else {
                HandshakeError::BadProof
            });
        }
        self.server_nonce = Some(server_nonce);
        self.version = version;
        let proof = match &self.secret {
            Some(secret) => auth::proof(
                secret,
                Role::Client,
                &self.nonce,
                &server_nonce,
                &self.cluster_id,
            )
            .to_vec(),
            None => Vec::new(),
        };
        Ok(Frame::Proof { proof })
    }

    /// The connection's session key (after the challenge; `None` without a secret or
    /// credential): frames after the welcome are sealed under it.
    pub fn session_key(&self) -> Option<auth::SessionKey> {
        let (secret, server_nonce) = (self.secret.as_ref()?, self.server_nonce.as_ref()?);
        Some(auth::session_key(
            secret,
            &self.nonce,
            server_nonce,
            &self.cluster_id,
        ))
    }

    /// The connection's version: the one offered until the challenge, then the server's choice.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Takes the server's last word; returns its node id when accepted.
    pub fn on_welcome(self, frame: Frame) -> Result<String, HandshakeError> {
        match (frame, self.proves) {
            (Frame::Welcome { node_id }, Proves::Secret | Proves::Region) => Ok(node_id),
            (Frame::ClientWelcome { node_id, proof }, Proves::Credential) => {
                let (Some(key), Some(server_nonce)) = (&self.secret, &self.server_nonce) else {
                    return Err(HandshakeError::ServerUnproven);
                };
                if !auth::verify(
                    key,
                    Role::Server,
                    &self.nonce,
                    server_nonce,
                    &self.cluster_id,
                    &proof,
                ) {
                    return Err(HandshakeError::ServerUnproven);
                }
                Ok(node_id)
            }
            // A server that welcomes a client without proving its credential back.
            (Frame::Welcome { .. }, Proves::Credential) => Err(HandshakeError::ServerUnproven),
            (Frame::Refused { reason }, _) => Err(HandshakeError::Refused(reason)),
            (other, _) => Err(HandshakeError::Unexpected(other.kind())),
        }
    }
}

/// What the dialing side proved, for the server to decide what it may send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proven {
    /// The cluster secret: a member (or a process that runs as one).
    Secret,
    /// A client credential, by the token's name.
    Credential(String),
    /// Nothing: the server has no secret, and the client offered no credential.
    Nothing,
    /// A region link: the region secret (`true`), or nothing when the server has no region
    /// secret (`false`: acceptable only under peer mTLS, the server's call).
    Region(bool),
}

/// A handshake the server accepted.
#[derive(Debug)]
pub struct Accepted {
    /// The client's node id (as it says: only its proof is checked, not its name).
    pub peer: String,
    pub proven: Proven,
    /// Frames after the welcome are sealed under it (`None` when nothing was proved).
    pub session_key: Option<auth::SessionKey>,
    /// The last frame to send: `Welcome` or `ClientWelcome`.
    pub welcome: Frame,
}

/// The accepting side.
#[derive(Debug)]
pub struct ServerHandshake {
    cluster_id: String,
    node_id: String,
    secret: Option<Vec<u8>>,
    proves: Proves,
    nonce: [u8; NONCE_LEN],
    client_nonce: [u8; NONCE_LEN],
    peer: String,
    version: u16,
}

impl ServerHandshake {
    /// Takes the client's `Hello` (or `ClientHello`); returns the state and the `Challenge` to
    /// send. `nonce` must be fresh and random.
    pub fn on_hello(
        frame: Frame,
        cluster_id: &str,
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> Result<(Self, Frame), HandshakeError> {
        let (hello, proves) = match frame {
            Frame::Hello(h) => (h, Proves::Secret),
            Frame::ClientHello(h) => (h, Proves::Credential),
            Frame::RegionHello(h) => (h, Proves::Region),
            other => return Err(HandshakeError::Unexpected(other.kind())),
        };
        if hello.magic != MAGIC {
            return Err(HandshakeError::BadMagic);
        }
        if hello.version < OLDEST_PROTOCOL_VERSION {
            return Err(HandshakeError::Version {
                theirs: hello.version,
            });
        }
        // A newer client speaks this side's version too (it offers its highest).
        let version = hello.version.min(PROTOCOL_VERSION);
        if hello.cluster_id != cluster_id {
            return Err(HandshakeError::ClusterId {
                theirs: hello.cluster_id,
                ours: cluster_id.to_owned(),
            });
        }
        let proof = match (secret, proves) {
            (Some(s), Proves::Secret | Proves::Region) => {
                auth::proof(s, Role::Server, &hello.nonce, &nonce, cluster_id).to_vec()
            }
            _ => Vec::new(),
        };
        Ok((
            Self {
                cluster_id: cluster_id.to_owned(),
                node_id: node_id.to_owned(),
                secret: secret.map(<[u8]>::to_vec),
                proves,
                nonce,
                client_nonce: hello.nonce,
                peer: hello.node_id,
                version,
            },
            Frame::Challenge {
                version,
                nonce,
                proof,
            },
        ))
    }

    /// The connection's version (the lower of the client's and this side's).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Whether the client offered a client credential (`ClientHello`) rather than the secret.
    pub fn is_client(&self) -> bool {
        self.proves == Proves::Credential
    }

    /// Whether the client opens a region link (`RegionHello`).
    pub fn is_region(&self) -> bool {
        self.proves == Proves::Region
    }

    /// Takes the client's `Proof`, checked against the cluster secret (a `Hello`) or against
    /// every key of `clients` (a `ClientHello`: each is tried, whichever matched, so timing
    /// does not tell which).
    pub fn on_proof(
        self,
        frame: Frame,
        clients: &[NamedClientKey],
    ) -> Result<Accepted, HandshakeError> {
        let proof = match frame {
            Frame::Proof { proof } => proof,
            other => return Err(HandshakeError::Unexpected(other.kind())),
        };
        let verify = |key: &[u8]| {
            auth::verify(
                key,
                Role::Client,
                &self.client_nonce,
                &self.nonce,
                &self.cluster_id,
                &proof,
            )
        };
        let session =
            |key: &[u8]| auth::session_key(key, &self.client_nonce, &self.nonce, &self.cluster_id);
        if self.proves == Proves::Credential {
            if clients.is_empty() {
                return Err(HandshakeError::NoCredentials);
            }
            let mut found = None;
            for c in clients {
                // No early exit: every key is tried whatever matched.
                if verify(&c.key) {
                    found = Some(c);
                }
            }
            let c = found.ok_or(HandshakeError::BadCredential)?;
            let proof = auth::proof(
                &c.key,
                Role::Server,
                &self.client_nonce,
                &self.nonce,
                &self.cluster_id,
            )
            .to_vec();
            return Ok(Accepted {
                peer: self.peer,
                proven: Proven::Credential(c.name.clone()),
                session_key: Some(session(&c.key)),
                welcome: Frame::ClientWelcome {
                    node_id: self.node_id,
                    proof,
                },
            });
        }
        let region = self.proves == Proves::Region;
        let (proven, session_key) = match &self.secret {
            Some(secret) if !verify(secret) && region => {
                return Err(HandshakeError::BadRegionProof);
            }
            Some(secret) if !verify(secret) => return Err(HandshakeError::BadProof),
            Some(secret) if region => (Proven::Region(true), Some(session(secret))),
            Some(secret) => (Proven::Secret, Some(session(secret))),
            None if region => (Proven::Region(false), None),
            None => (Proven::Nothing, None),
        };
        Ok(Accepted {
            peer: self.peer,
            proven,
            session_key,
            welcome: Frame::Welcome {
                node_id: self.node_id,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        client_secret: Option<&[u8]>,
        server_secret: Option<&[u8]>,
        client_cluster: &str,
    ) -> Result<(String, String), HandshakeError> {
        let (mut client, hello) =
            ClientHandshake::start(client_cluster, "a", client_secret, [1; 16]);
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", server_secret, [2; 16])?;
        let proof = client.on_challenge(challenge)?;
        let accepted = server.on_proof(proof, &[])?;
        Ok((accepted.peer, client.on_welcome(accepted.welcome)?))
    }

    fn run_region(
        client_secret: Option<&[u8]>,
        server_secret: Option<&[u8]>,
    ) -> Result<Proven, HandshakeError> {
        let (mut client, hello) = ClientHandshake::start_region("eu/n1", client_secret, [1; 16]);
        let (server, challenge) = ServerHandshake::on_hello(
            hello,
            crate::region::REGION_CONTEXT,
            "b",
            server_secret,
            [2; 16],
        )?;
        assert!(server.is_region() && !server.is_client());
        let proof = client.on_challenge(challenge)?;
        let accepted = server.on_proof(proof, &[])?;
        assert_eq!(client.on_welcome(accepted.welcome)?, "b");
        assert_eq!(accepted.peer, "eu/n1");
        Ok(accepted.proven)
    }

    #[test]
    fn a_region_link_proves_the_region_secret() {
        assert_eq!(run_region(Some(b"r"), Some(b"r")), Ok(Proven::Region(true)));
        assert_eq!(run_region(None, None), Ok(Proven::Region(false)));
        // The server proves it first: a client with another secret refuses it.
        assert_eq!(
            run_region(Some(b"x"), Some(b"r")),
            Err(HandshakeError::BadRegionProof)
        );
        assert_eq!(
            run_region(None, Some(b"r")),
            Err(HandshakeError::BadRegionProof)
        );
        // A region hello is bound to the regions' context, not a cluster's id.
        let (_, hello) = ClientHandshake::start_region("eu/n1", Some(b"r"), [1; 16]);
        assert!(ServerHandshake::on_hello(hello, "ringlimit", "b", Some(b"r"), [2; 16]).is_err());
    }

    fn keys(tokens: &[(&str, &[u8])]) -> Vec<NamedClientKey> {
        tokens
            .iter()
            .map(|(name, token)| NamedClientKey {
                name: (*name).into(),
                key: auth::client_key(token),
            })
            .collect()
    }

    /// A client's handshake against a server with `secret` and client keys `clients`: what the
    /// server says was proved, and both ends' session keys.
    fn run_client(
        token: &[u8],
        secret: Option<&[u8]>,
        clients: &[NamedClientKey],
    ) -> Result<(Proven, Option<auth::SessionKey>, Option<auth::SessionKey>), HandshakeError> {
        let (mut client, hello) = ClientHandshake::start_client("ringlimit", "sdk", token, [1; 16]);
        assert!(matches!(hello, Frame::ClientHello(_)));
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", secret, [2; 16])?;
        assert!(server.is_client());
        let proof = client.on_challenge(challenge)?;
        let client_key = client.session_key();
        let accepted = server.on_proof(proof, clients)?;
        assert_eq!(client.on_welcome(accepted.welcome)?, "b");
        Ok((accepted.proven, client_key, accepted.session_key))
    }

    /// A client proves a token the server keeps (by its digest alone), learns that the server
    /// knows it too, and both derive one session key, whichever of the keys matched and
    /// whether or not the cluster has a secret.
    #[test]
    fn a_client_proves_its_credential_and_the_server_proves_it_back() {
        let clients = keys(&[
            ("svc-a", b"token-of-service-a"),
            ("svc-b", b"token-of-service-b"),
        ]);
        for secret in [None, Some(&b"cluster secret"[..])] {
            let (proven, c, s) =
                run_client(b"token-of-service-b", secret, &clients).expect("accepted");
            assert_eq!(proven, Proven::Credential("svc-b".into()));
            assert!(c.is_some());
            assert_eq!(c, s);
        }
        assert_eq!(
            run_client(b"some other token", None, &clients).err(),
            Some(HandshakeError::BadCredential)
        );
        assert_eq!(
            run_client(b"token-of-service-a", None, &[]).err(),
            Some(HandshakeError::NoCredentials)
        );
    }

    /// A client does not take a welcome that does not prove its credential: a plain `Welcome`,
    /// or a `ClientWelcome` under another key (a server that does not know the token).
    #[test]
    fn a_client_refuses_a_server_that_does_not_prove_its_credential() {
        for welcome in [
            Frame::Welcome {
                node_id: "b".into(),
            },
            Frame::ClientWelcome {
                node_id: "b".into(),
                proof: auth::proof(
                    &auth::client_key(b"not the token"),
                    Role::Server,
                    &[1; 16],
                    &[2; 16],
                    "ringlimit",
                )
                .to_vec(),
            },
        ] {
            let (mut client, _) =
                ClientHandshake::start_client("ringlimit", "sdk", b"tok", [1; 16]);
            client
                .on_challenge(Frame::Challenge {
                    version: PROTOCOL_VERSION,
                    nonce: [2; 16],
                    proof: Vec::new(),
                })
                .expect("challenge");
            assert_eq!(
                client.on_welcome(welcome).err(),
                Some(HandshakeError::ServerUnproven)
            );
        }
        // And a member never takes a client's welcome.
        let (mut member, _) = ClientHandshake::start("ringlimit", "a", None, [1; 16]);
        member
            .on_challenge(Frame::Challenge {
                version: PROTOCOL_VERSION,
                nonce: [2; 16],
                proof: Vec::new(),
            })
            .expect("challenge");
        assert!(matches!(
            member.on_welcome(Frame::ClientWelcome {
                node_id: "b".into(),
                proof: Vec::new()
            }),
            Err(HandshakeError::Unexpected(_))
        ));
    }

    /// What the server says a `Hello` proved: the secret, or nothing on a server without one.
    #[test]
    fn a_hello_proves_the_secret_or_nothing() {
        for (secret, want) in [(None, Proven::Nothing), (Some(&b"s"[..]), Proven::Secret)] {
            let (mut client, hello) = ClientHandshake::start("ringlimit", "a", secret, [1; 16]);
            let (server, challenge) =
                ServerHandshake::on_hello(hello, "ringlimit", "b", secret, [2; 16]).expect("hello");
            assert!(!server.is_client());
            let proof = client.on_challenge(challenge).expect("challenge");
            let accepted = server
                .on_proof(proof, &keys(&[("x", b"y")]))
                .expect("proof");
            assert_eq!(accepted.proven, want);
            assert_eq!(accepted.session_key, client.session_key());
        }
    }

    #[test]
    fn both_ends_derive_the_same_session_key_and_none_without_a_secret() {
        let (mut client, hello) = ClientHandshake::start("ringlimit", "a", Some(b"s"), [1; 16]);
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", Some(b"s"), [2; 16]).expect("hello");
        assert_eq!(client.session_key(), None, "no key before the challenge");
        let proof = client.on_challenge(challenge).expect("challenge");
        assert!(client.session_key().is_some());
        let accepted = server.on_proof(proof, &[]).expect("proof");
        assert_eq!(client.session_key(), accepted.session_key);
        let (mut client, hello) = ClientHandshake::start("ringlimit", "a", None, [1; 16]);
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", None, [2; 16]).expect("hello");
        let proof = client.on_challenge(challenge).expect("challenge");
        let accepted = server.on_proof(proof, &[]).expect("proof");
        assert_eq!((client.session_key(), accepted.session_key), (None, None));
    }

    #[test]
    fn matching_secrets_or_none_are_accepted() {
        assert_eq!(run(None, None, "ringlimit"), Ok(("a".into(), "b".into())));
        assert_eq!(
            run(Some(b"s"), Some(b"s"), "ringlimit"),
            Ok(("a".into(), "b".into()))
        );
    }

    #[test]
    fn wrong_or_missing_secret_and_other_cluster_are_refused() {
        assert_eq!(
            run(None, Some(b"s"), "ringlimit"),
            Err(HandshakeError::BadProof)
        );
        assert_eq!(
            run(Some(b"x"), Some(b"s"), "ringlimit"),
            Err(HandshakeError::BadProof)
        );
        // A client with a secret will not talk to a server that cannot prove it.
        assert_eq!(
            run(Some(b"s"), None, "ringlimit"),
            Err(HandshakeError::BadProof)
        );
        assert!(matches!(
            run(None, None, "other"),
            Err(HandshakeError::ClusterId { .. })
        ));
    }

    /// Both sides agree on the lower version: a version-2 client gets 2, a newer one this
    /// side's; a client refuses a server that answers a version it did not offer.
    #[test]
    fn the_connection_speaks_the_lower_version() {
        for (offered, agreed) in [
            (2, 2),
            (PROTOCOL_VERSION, PROTOCOL_VERSION),
            (9, 9),
            (PROTOCOL_VERSION + 1, PROTOCOL_VERSION),
            (99, PROTOCOL_VERSION),
        ] {
            let (mut client, hello) =
                ClientHandshake::offering(offered, "ringlimit", "a", None, [1; 16]);
            let (server, challenge) =
                ServerHandshake::on_hello(hello, "ringlimit", "b", None, [2; 16]).expect("hello");
            assert_eq!(server.version(), agreed);
            client.on_challenge(challenge).expect("challenge");
            assert_eq!(client.version(), agreed);
        }
        let (mut client, _) = ClientHandshake::offering(2, "ringlimit", "a", None, [1; 16]);
        let newer = Frame::Challenge {
            version: 3,
            nonce: [2; 16],
            proof: Vec::new(),
        };
        assert_eq!(
            client.on_challenge(newer).err(),
            Some(HandshakeError::Version { theirs: 3 })
        );
    }

    #[test]
    fn bad_magic_version_and_order_are_refused() {
        let bad = Frame::Hello(Hello {
            magic: 1,
            version: PROTOCOL_VERSION,
            cluster_id: "ringlimit".into(),
            node_id: "x".into(),
            nonce: [0; 16],
        });
        assert_eq!(
            ServerHandshake::on_hello(bad, "ringlimit", "b", None, [0; 16]).err(),
            Some(HandshakeError::BadMagic)
        );
        let old = Frame::Hello(Hello {
            magic: MAGIC,
            version: 0,
            cluster_id: "ringlimit".into(),
            node_id: "x".into(),
            nonce: [0; 16],
        });
        assert_eq!(
            ServerHandshake::on_hello(old, "ringlimit", "b", None, [0; 16]).err(),
            Some(HandshakeError::Version { theirs: 0 })
        );
        assert_eq!(
            ServerHandshake::on_hello(Frame::Checks(vec![]), "ringlimit", "b", None, [0; 16]).err(),
            Some(HandshakeError::Unexpected("checks"))
        );
    }
}
