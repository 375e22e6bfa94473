//! Peer authentication: a mutual challenge-response over HMAC-SHA256 of a shared secret.
//!
//! The client sends a nonce in `Hello`, the server answers with its nonce and a proof over both,
//! and the client proves itself over both in turn. Neither side ever sends the secret, and a
//! recorded exchange cannot be replayed because each side chooses a fresh nonce.

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

/// A MAC tag over one datagram (gossip), 16 bytes of HMAC-SHA256.
pub fn datagram_tag(secret: &[u8], payload: &[u8]) -> [u8; 16] {
    let mut mac = keyed(secret);
    mac.update(b"ringlimit-gossip");
    mac.update(payload);
    let full = mac.finalize().into_bytes();
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&full[..16]);
    tag
}

/// Checks a datagram tag in constant time.
pub fn verify_datagram(secret: &[u8], payload: &[u8], tag: &[u8]) -> bool {
    let mut mac = keyed(secret);
    mac.update(b"ringlimit-gossip");
    mac.update(payload);
    mac.verify_truncated_left(tag).is_ok()
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
        let tag = datagram_tag(b"k", b"payload");
        assert!(verify_datagram(b"k", b"payload", &tag));
        assert!(!verify_datagram(b"k", b"payloaD", &tag));
        assert!(!verify_datagram(b"j", b"payload", &tag));
    }
}
