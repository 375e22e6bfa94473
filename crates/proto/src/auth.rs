//! Peer authentication: a mutual challenge-response over HMAC-SHA256 of a shared secret, then a
//! MAC on every frame and datagram.
//!
//! The client sends a nonce in `Hello`, the server answers with its nonce and a proof over both,
//! and the client proves itself over both in turn. Neither side ever sends the secret, and a
//! recorded exchange cannot be replayed because each side chooses a fresh nonce.
//!
//! Proving the secret once is not enough on its own: an on-path attacker could let the handshake
//! pass and then inject frames. So both sides derive a [`SessionKey`] from the secret and both
//! nonces, and every frame after the handshake carries a [`FRAME_TAG_LEN`]-byte tag over its
//! direction, its sequence number on the connection and its bytes ([`FrameMac`]): a frame that
//! is injected, changed, dropped, reordered or replayed (within the connection or from another
//! one) does not verify. Gossip datagrams have no session; their tag covers the sender's wall
//! time ([`datagram_tag`]), and the receiver refuses stale times and tags it has already seen.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of a nonce.
pub const NONCE_LEN: usize = 16;
/// Length of a proof (a full HMAC-SHA256).
pub const PROOF_LEN: usize = 32;

/// Who is proving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// The proof a party with `secret` gives for this exchange.
pub fn proof(
    secret: &[u8],
    role: Role,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    cluster_id: &str,
) -> [u8; PROOF_LEN] {
    exchange(secret, role, client_nonce, server_nonce, cluster_id)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a proof in constant time.
pub fn verify(
    secret: &[u8],
    role: Role,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    cluster_id: &str,
    given: &[u8],
) -> bool {
    exchange(secret, role, client_nonce, server_nonce, cluster_id)
        .verify_slice(given)
        .is_ok()
}

/// The MAC over one handshake, before finalising: what `proof` gives and `verify` checks.
fn exchange(
    secret: &[u8],
    role: Role,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    cluster_id: &str,
) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    mac.update(match role {
        Role::Server => b"ringlimit-server",
        Role::Client => b"ringlimit-client",
    });
    mac.update(client_nonce);
    mac.update(server_nonce);
    mac.update(cluster_id.as_bytes());
    mac
}

/// A client credential as both ends key it: the SHA-256 of the token. A node keeps only this
/// digest (its tokens file may hold nothing else), so it is the key a client proves; the
/// token itself never travels.
pub type ClientKey = [u8; 32];

/// The key of client token `token` (see [`ClientKey`]).
pub fn client_key(token: &[u8]) -> ClientKey {
    use sha2::Digest;
    Sha256::digest(token).into()
}

/// A client credential a server accepts: the token's name (for logs and audits) and its key.
#[derive(Clone, PartialEq, Eq)]
pub struct NamedClientKey {
    pub name: String,
    pub key: ClientKey,
}

impl std::fmt::Debug for NamedClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedClientKey")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Length of a datagram's tag and of a frame's tag (truncated HMAC-SHA256).
pub const TAG_LEN: usize = 16;
/// Length of a frame's tag.
pub const FRAME_TAG_LEN: usize = TAG_LEN;

/// A MAC tag over one gossip datagram sent at `sent_ms` (the sender's Unix time in ms, which
/// travels beside the payload so that a receiver can refuse old datagrams).
pub fn datagram_tag(secret: &[u8], sent_ms: u64, payload: &[u8]) -> [u8; TAG_LEN] {
    truncate(datagram_mac(secret, sent_ms, payload))
}

/// Checks a datagram tag in constant time.
pub fn verify_datagram(secret: &[u8], sent_ms: u64, payload: &[u8], tag: &[u8]) -> bool {
    tag.len() == TAG_LEN
        && datagram_mac(secret, sent_ms, payload)
            .verify_truncated_left(tag)
            .is_ok()
}

fn datagram_mac(secret: &[u8], sent_ms: u64, payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    // "-2": datagrams of the first format (no time) must not verify as this one.
    mac.update(b"ringlimit-gossip-2");
    mac.update(&sent_ms.to_be_bytes());
    mac.update(payload);
    mac
}

fn truncate(mac: Hmac<Sha256>) -> [u8; TAG_LEN] {
    let full = mac.finalize().into_bytes();
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&full[..TAG_LEN]);
    tag
}

/// The key both ends of one authenticated connection share: derived from the secret and the
/// handshake's two fresh nonces, so it differs on every connection.
pub type SessionKey = [u8; 32];

/// The session key of one handshake.
pub fn session_key(
    secret: &[u8],
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    cluster_id: &str,
) -> SessionKey {
    let mut mac = keyed(secret);
    mac.update(b"ringlimit-session");
    mac.update(client_nonce);
    mac.update(server_nonce);
    mac.update(cluster_id.as_bytes());
    mac.finalize().into_bytes().into()
}

/// The MACs of one connection end: tags the frames it sends and checks those it receives, each
/// direction numbered from 0. Sequence numbers are not sent: TCP delivers in order, so both
/// ends count alike, and a frame out of place does not verify.
#[derive(Clone)]
pub struct FrameMac {
    /// HMAC keyed once with the session key (cloned per frame: keying costs two SHA-256 blocks).
    keyed: Hmac<Sha256>,
    sent: u64,
    received: u64,
    /// Labels of this end's outgoing and incoming directions.
    out_label: &'static [u8],
    in_label: &'static [u8],
}

impl std::fmt::Debug for FrameMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameMac")
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl FrameMac {
    /// The MACs of the `role` end of a connection with session key `key`.
    pub fn new(key: &SessionKey, role: Role) -> Self {
        let (c2s, s2c): (&[u8], &[u8]) = (b"ringlimit-frame-c2s", b"ringlimit-frame-s2c");
        let (out_label, in_label) = match role {
            Role::Client => (c2s, s2c),
            Role::Server => (s2c, c2s),
        };
        Self {
            keyed: keyed(key),
            sent: 0,
            received: 0,
            out_label,
            in_label,
        }
    }

    fn mac(&self, label: &[u8], seq: u64, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(label);
        mac.update(&seq.to_be_bytes());
        mac.update(payload);
        mac
    }

    /// The tag of the next frame this end sends.
    pub fn seal(&mut self, payload: &[u8]) -> [u8; FRAME_TAG_LEN] {
        let tag = truncate(self.mac(self.out_label, self.sent, payload));
        self.sent = self.sent.wrapping_add(1);
        tag
    }

    /// Checks the next frame this end receives (constant time).
    pub fn open(&mut self, payload: &[u8], tag: &[u8]) -> bool {
        let ok = tag.len() == FRAME_TAG_LEN
            && self
                .mac(self.in_label, self.received, payload)
                .verify_truncated_left(tag)
                .is_ok();
        self.received = self.received.wrapping_add(1);
        ok
    }
}

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; this cannot fail.
    match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_and_role() {
        let (c, s) = ([1u8; 16], [2u8; 16]);
        let p = proof(b"secret", Role::Client, &c, &s, "ringlimit");
        assert!(verify(b"secret", Role::Client, &c, &s, "ringlimit", &p));
        assert!(!verify(b"other", Role::Client, &c, &s, "ringlimit", &p));
        assert!(!verify(b"secret", Role::Server, &c, &s, "ringlimit", &p));
        assert!(!verify(b"secret", Role::Client, &s, &c, "ringlimit", &p));
        assert!(!verify(b"secret", Role::Client, &c, &s, "other", &p));
        let tag = datagram_tag(b"k", 5, b"payload");
        assert!(verify_datagram(b"k", 5, b"payload", &tag));
        assert!(!verify_datagram(b"k", 5, b"payloaD", &tag));
        assert!(!verify_datagram(b"j", 5, b"payload", &tag));
        // The time is inside the MAC: a replayer cannot make an old datagram look new.
        assert!(!verify_datagram(b"k", 6, b"payload", &tag));
        assert!(!verify_datagram(b"k", 5, b"payload", &tag[..8]));
    }

    #[test]
    fn frames_verify_once_in_order_in_their_own_direction_and_session() {
        let key = session_key(b"secret", &[1; 16], &[2; 16], "ringlimit");
        assert_ne!(key, session_key(b"secret", &[1; 16], &[3; 16], "ringlimit"));
        let (mut client, mut server) = (
            FrameMac::new(&key, Role::Client),
            FrameMac::new(&key, Role::Server),
        );
        let t0 = client.seal(b"first");
        let t1 = client.seal(b"second");
        // Reordered: the second frame in the first frame's place fails, and so the stream dies.
        let mut s2 = server.clone();
        assert!(!s2.open(b"second", &t1));
        assert!(server.open(b"first", &t0));
        assert!(server.open(b"second", &t1));
        // Replayed: the same frame again is not the next one.
        assert!(!server.clone().open(b"second", &t1));
        // Reflected: a client's frame does not verify as the server's.
        let t = client.seal(b"x");
        let mut c2 = client.clone();
        assert!(!c2.open(b"x", &t));
        // Another session's key.
        let other = session_key(b"secret", &[9; 16], &[2; 16], "ringlimit");
        let mut s3 = FrameMac::new(&other, Role::Server);
        assert!(!s3.open(b"first", &t0));
        // And the reply direction works.
        let r = server.seal(b"answer");
        assert!(client.open(b"answer", &r));
    }
}
