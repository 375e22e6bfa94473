//! A reservation's id: opaque to clients, but enough for any node (or the SDK) to find the
//! bucket's owner, where the reservation lives. It is base64url (no padding) of a small bincode
//! struct: the check's key and rule, and the random nonce the owner keeps the reservation
//! under. Nothing in it is trusted: a forged or altered id names a nonce the owner does not
//! keep, and is answered as unknown.

use crate::RuleRef;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// Longest id accepted, in characters: a 512-byte key, a long rule name and the nonce fit.
pub const MAX_ID_CHARS: usize = 2048;

/// What a reservation's id says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationId {
    pub key: String,
    pub rule: RuleRef,
    pub nonce: u128,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_ID_CHARS>()
}

impl ReservationId {
    /// The id as clients see it.
    pub fn encode(&self) -> String {
        // A key of at most 512 bytes and a rule always encode (nothing here can fail but an
        // encoder's limit, which `MAX_ID_CHARS` leaves room for).
        let bytes =
            bincode::serde::encode_to_vec(self, bincode::config::standard()).unwrap_or_default();
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The id `text` says, or `None` for anything that is not one (untrusted input: bounded,
    /// trailing bytes refused).
    pub fn decode(text: &str) -> Option<Self> {
        if text.is_empty() || text.len() > MAX_ID_CHARS {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let (id, used): (Self, usize) = bincode::serde::decode_from_slice(&bytes, config()).ok()?;
        (used == bytes.len()).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, InlineRule};

    #[test]
    fn an_id_round_trips_and_garbage_is_none() {
        for rule in [
            RuleRef::Named("tokens-per-minute".into()),
            RuleRef::Inline(InlineRule {
                limit: 100_000,
                period_ms: 60_000,
                algorithm: Algorithm::SlidingWindow,
                burst: None,
                calendar: None,
            }),
        ] {
            let id = ReservationId {
                key: "team:42".repeat(70),
                rule,
                nonce: u128::MAX - 7,
            };
            let text = id.encode();
            assert!(text.len() < MAX_ID_CHARS, "{}", text.len());
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{text}"
            );
            assert_eq!(ReservationId::decode(&text), Some(id));
            // One more character, or one less, is not an id.
            assert_eq!(ReservationId::decode(&format!("{text}A")), None);
            assert_eq!(ReservationId::decode(&text[..text.len() - 1]), None);
        }
        for garbage in ["", "!", "AAAA", "////", &"A".repeat(MAX_ID_CHARS + 1), "é"] {
            assert_eq!(ReservationId::decode(garbage), None, "{garbage:?}");
        }
        // A string claiming 2^40 bytes does not allocate them.
        let hostile = URL_SAFE_NO_PAD.encode([0xff, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(ReservationId::decode(&hostile), None);
    }
}
