//! What a block names: one key, or a network (`cidr:203.0.113.0/24`, `cidr:2001:db8::/32`)
//! that matches every key built from a client address inside it.

use ipnet::IpNet;
use std::net::IpAddr;

/// How a network is written as a block's target.
pub const CIDR_PREFIX: &str = "cidr:";

/// A block's target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Key(Box<str>),
    /// Host bits cleared.
    Net(IpNet),
}

/// Why a block's target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("a key is 1 to {max} bytes; this one has {0}", max = ringlimit_proto::CheckAnswer::MAX_KEY_BYTES)]
    KeyLength(usize),
    #[error(
        "{0:?} is not a network: write cidr:ADDRESS/LENGTH, e.g. cidr:203.0.113.0/24 or \
         cidr:2001:db8::/32"
    )]
    Cidr(String),
}

impl Target {
    /// Parses a target as the admin API takes it: `cidr:NET/LEN` (host bits cleared), else a
    /// key.
    pub fn parse(s: &str) -> Result<Self, TargetError> {
        if let Some(net) = s.strip_prefix(CIDR_PREFIX) {
            let parsed: IpNet = net.parse().map_err(|_| TargetError::Cidr(s.to_owned()))?;
            return Ok(Target::Net(parsed.trunc()));
        }
        if s.is_empty() || s.len() > ringlimit_proto::CheckAnswer::MAX_KEY_BYTES {
            return Err(TargetError::KeyLength(s.len()));
        }
        Ok(Target::Key(s.into()))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Key(k) => f.write_str(k),
            Target::Net(n) => write!(f, "{CIDR_PREFIX}{n}"),
        }
    }
}

/// The client address a key was built from: the key itself when it is an address, else what
/// follows its first `:` (`ip:{client_ip}` makes `ip:203.0.113.7`, `ip:2001:db8::1`).
pub fn address_of(key: &str) -> Option<IpAddr> {
    if let Ok(ip) = key.parse() {
        return Some(ip);
    }
    let (_, rest) = key.split_once(':')?;
    rest.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print_normalised() {
        assert_eq!(
            Target::parse("cidr:203.0.113.77/24").map(|t| t.to_string()),
            Ok("cidr:203.0.113.0/24".to_owned())
        );
        assert_eq!(
            Target::parse("cidr:2001:db8::1/32").map(|t| t.to_string()),
            Ok("cidr:2001:db8::/32".to_owned())
        );
        assert_eq!(Target::parse("user:42"), Ok(Target::Key("user:42".into())));
        assert!(matches!(
            Target::parse("cidr:203.0.113.0/33"),
            Err(TargetError::Cidr(_))
        ));
        assert!(matches!(
            Target::parse("cidr:nonsense"),
            Err(TargetError::Cidr(_))
        ));
        assert_eq!(Target::parse(""), Err(TargetError::KeyLength(0)));
        assert_eq!(
            Target::parse(&"k".repeat(513)),
            Err(TargetError::KeyLength(513))
        );
    }

    #[test]
    fn addresses_are_found_in_keys_built_from_client_ip() {
        assert_eq!(address_of("203.0.113.7"), "203.0.113.7".parse().ok());
        assert_eq!(address_of("ip:203.0.113.7"), "203.0.113.7".parse().ok());
        assert_eq!(address_of("ip:2001:db8::1"), "2001:db8::1".parse().ok());
        assert_eq!(address_of("2001:db8::1"), "2001:db8::1".parse().ok());
        assert_eq!(address_of("user:42"), None);
        assert_eq!(address_of("apikey:abc"), None);
    }
}
