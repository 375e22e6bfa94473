//! The peer handshake as two small state machines with no I/O: the caller moves frames, these
//! decide. Both nodes and the SDK drive the same code, so they can never disagree on it.
//!
//! ```text
//! client                               server
//!   Hello{magic, version, cluster, id, nc}  →
//!                                        ←  Challenge{version, ns, proof_s(nc, ns)}
//!   Proof{proof_c(nc, ns)}                →
//!                                        ←  Welcome{id}  |  Refused{reason}
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
//! Without a secret on either side, proofs are empty and not checked: the port is then
//! unauthenticated, and nodes say so in their startup log.
//!
//! With a secret, every frame after the handshake carries a MAC under the connection's session
//! key ([`ClientHandshake::session_key`], [`ServerHandshake::session_key`]; see
//! [`crate::auth::FrameMac`]): the link layer turns it on once the handshake is through.

use crate::auth::{self, NONCE_LEN, Role};
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
    #[error("peer refused the connection: {0}")]
    Refused(String),
    #[error("unexpected {0} frame during the handshake")]
    Unexpected(&'static str),
}

/// The dialing side.
#[derive(Debug)]
pub struct ClientHandshake {
    cluster_id: String,
    secret: Option<Vec<u8>>,
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
        let hello = Frame::Hello(Hello {
            magic: MAGIC,
            version,
            cluster_id: cluster_id.to_owned(),
            node_id: node_id.to_owned(),
            nonce,
        });
        (
            Self {
                cluster_id: cluster_id.to_owned(),
                secret: secret.map(<[u8]>::to_vec),
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
        if let Some(secret) = &self.secret
            && !auth::verify(
                secret,
                Role::Server,
                &self.nonce,
                &server_nonce,
                &self.cluster_id,
                &proof,
            )
        {
            return Err(HandshakeError::BadProof);
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

    /// The connection's session key (after the challenge; `None` without a secret): frames after
    /// the `Welcome` are sealed under it.
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
        match frame {
            Frame::Welcome { node_id } => Ok(node_id),
            Frame::Refused { reason } => Err(HandshakeError::Refused(reason)),
            other => Err(HandshakeError::Unexpected(other.kind())),
        }
    }
}

/// The accepting side.
#[derive(Debug)]
pub struct ServerHandshake {
    cluster_id: String,
    node_id: String,
    secret: Option<Vec<u8>>,
    nonce: [u8; NONCE_LEN],
    client_nonce: [u8; NONCE_LEN],
    peer: String,
    version: u16,
}

impl ServerHandshake {
    /// Takes the client's `Hello`; returns the state and the `Challenge` to send.
    /// `nonce` must be fresh and random.
    pub fn on_hello(
        frame: Frame,
        cluster_id: &str,
        node_id: &str,
        secret: Option<&[u8]>,
        nonce: [u8; NONCE_LEN],
    ) -> Result<(Self, Frame), HandshakeError> {
        let hello = match frame {
            Frame::Hello(h) => h,
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
        let proof = match secret {
            Some(s) => auth::proof(s, Role::Server, &hello.nonce, &nonce, cluster_id).to_vec(),
            None => Vec::new(),
        };
        Ok((
            Self {
                cluster_id: cluster_id.to_owned(),
                node_id: node_id.to_owned(),
                secret: secret.map(<[u8]>::to_vec),
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

    /// The connection's session key (`None` without a secret): frames after the `Welcome` are
    /// sealed under it. Only worth anything once [`ServerHandshake::on_proof`] has accepted.
    pub fn session_key(&self) -> Option<auth::SessionKey> {
        let secret = self.secret.as_ref()?;
        Some(auth::session_key(
            secret,
            &self.client_nonce,
            &self.nonce,
            &self.cluster_id,
        ))
    }

    /// Takes the client's `Proof`; returns the client's node id and the `Welcome` to send.
    pub fn on_proof(self, frame: Frame) -> Result<(String, Frame), HandshakeError> {
        let proof = match frame {
            Frame::Proof { proof } => proof,
            other => return Err(HandshakeError::Unexpected(other.kind())),
        };
        if let Some(secret) = &self.secret
            && !auth::verify(
                secret,
                Role::Client,
                &self.client_nonce,
                &self.nonce,
                &self.cluster_id,
                &proof,
            )
        {
            return Err(HandshakeError::BadProof);
        }
        Ok((
            self.peer,
            Frame::Welcome {
                node_id: self.node_id,
            },
        ))
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
        let (peer, welcome) = server.on_proof(proof)?;
        Ok((peer, client.on_welcome(welcome)?))
    }

    #[test]
    fn both_ends_derive_the_same_session_key_and_none_without_a_secret() {
        let (mut client, hello) = ClientHandshake::start("ringlimit", "a", Some(b"s"), [1; 16]);
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", Some(b"s"), [2; 16]).expect("hello");
        assert_eq!(client.session_key(), None, "no key before the challenge");
        client.on_challenge(challenge).expect("challenge");
        assert!(client.session_key().is_some());
        assert_eq!(client.session_key(), server.session_key());
        let (mut client, hello) = ClientHandshake::start("ringlimit", "a", None, [1; 16]);
        let (server, challenge) =
            ServerHandshake::on_hello(hello, "ringlimit", "b", None, [2; 16]).expect("hello");
        client.on_challenge(challenge).expect("challenge");
        assert_eq!((client.session_key(), server.session_key()), (None, None));
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
            (9, PROTOCOL_VERSION),
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
