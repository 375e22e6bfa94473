//! What a gateway's copy of a request (forward auth) says about the client, read so that the
//! client cannot choose it: its address — `X-Forwarded-For` walked from the right past the
//! proxies the operator trusts (`--trusted-proxies`) — and its path, normalised so that one
//! resource is one key however it is spelled. Pure: header bytes in, no HTTP types.

use ipnet::IpNet;
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// One `--trusted-proxies` entry: an address block (`10.0.0.0/8`, `2001:db8::/32`) or one
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

/// Why a `--trusted-proxies` entry is not an address block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address block such as 10.0.0.0/8, 2001:db8::/32 or 192.0.2.7")]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let t = s.trim();
        let net = match t.parse::<IpNet>() {
            Ok(net) => net,
            // One address: a block of one.
            Err(_) => IpNet::from(IpAddr::from_str(t).map_err(|_| CidrError(s.to_owned()))?),
        };
        // Host bits cleared, so that 10.1.2.3/8 means 10.0.0.0/8.
        Ok(Self(net.trunc()))
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // One address, one spelling: an IPv4-mapped IPv6 address is its IPv4 address.
        self.0.contains(&ip.to_canonical())
    }
}

/// `--trusted-proxies`: the proxies in front of the gateways whose `X-Forwarded-For` entries
/// are believed. The gateway itself (the connection's peer) is always believed: it is what
/// appends the client's address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

/// `10.0.0.0/8,2001:db8::/32,192.0.2.7` (empty entries skipped, so an empty list is none).
impl FromStr for TrustedProxies {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        s.split(',')
            .filter(|b| !b.trim().is_empty())
            .map(Cidr::from_str)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl TrustedProxies {
    pub fn new(blocks: Vec<Cidr>) -> Self {
        Self(blocks)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }
}

/// The client's address of a forwarded request:
/// - with `X-Forwarded-For` (every line of it, in order): walked from the right, each trusted
///   proxy's entry skipped; the first entry that is not a trusted proxy is the client. Entries
///   to its left were written by the client (or hops nobody vouches for) and are never read.
///   Every entry trusted: the leftmost, the farthest a trusted hop saw. An entry that is not an
///   address where the client's should be (`unknown`, garbage): the hop that wrote it — the
///   trusted entry to its right, else the gateway — is the key, so a broken hop shows as its
///   clients sharing one bucket, never as a client picking its own;
/// - without it: `X-Real-IP`, as a gateway that sets it in place of `X-Forwarded-For` (nginx
///   `proxy_set_header X-Real-IP $remote_addr`) wrote it;
/// - else the gateway (`peer`) itself.
pub fn client_ip(
    forwarded_for: &[&[u8]],
    real_ip: Option<&[u8]>,
    peer: Option<IpAddr>,
    trusted: &TrustedProxies,
) -> Option<IpAddr> {
    let mut entries = forwarded_for
        .iter()
        .rev()
        .flat_map(|line| line.rsplit(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
        .peekable();
    if entries.peek().is_none() {
        return real_ip.and_then(address).or(peer.map(|p| p.to_canonical()));
    }
    let mut hop = peer.map(|p| p.to_canonical());
    for entry in entries {
        match address(entry) {
            Some(ip) if trusted.contains(ip) => hop = Some(ip),
            Some(ip) => return Some(ip),
            None => return hop,
        }
    }
    hop
}

/// An `X-Forwarded-For` entry's address: `192.0.2.7`, `2001:db8::1`, with a port
/// (`192.0.2.7:443`, `[2001:db8::1]:443`) or brackets (`[2001:db8::1]`), as proxies write them.
fn address(entry: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(entry.trim_ascii()).ok()?;
    let ip = IpAddr::from_str(s)
        .ok()
        .or_else(|| SocketAddr::from_str(s).ok().map(|a| a.ip()))
        .or_else(|| {
            let inner = s.strip_prefix('[')?.strip_suffix(']')?;
            std::net::Ipv6Addr::from_str(inner).ok().map(IpAddr::V6)
        })?;
    Some(ip.to_canonical())
}

/// The path of `X-Forwarded-Uri`, one spelling per resource, so that a client cannot get a
/// fresh bucket by respelling it: the query and fragment dropped (an absolute-form target's
/// scheme and host too); percent-encoded unreserved characters (letters, digits, `-._~`)
/// decoded and any other byte outside them and `!$&'()*+,;=:@` encoded (`%c3%a9`, whether the
/// request had `é` or `%C3%A9`); empty segments (`//`), `.` and `..` resolved (never above
/// `/`); no trailing `/` (but `/` itself); and all of it in lower case, as most limiters do for
/// this purpose — servers are often case-insensitive (`/Login` reaching `/login`) and a limit
/// that errs counts more, not less.
pub fn path(uri: &[u8]) -> String {
    let end = uri
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(uri.len());
    let mut p = &uri[..end];
    if !p.starts_with(b"/")
        && let Some(i) = p.windows(3).position(|w| w == b"://")
    {
        let after = &p[i + 3..];
        p = &after[after.iter().position(|&b| b == b'/').unwrap_or(after.len())..];
    }
    let mut out = String::with_capacity(p.len() + 1);
    // Where each kept segment starts in `out` (at its `/`), for `..`.
    let mut starts: Vec<usize> = Vec::new();
    for raw in p.split(|&b| b == b'/') {
        let start = out.len();
        out.push('/');
        segment(raw, &mut out);
        match &out[start + 1..] {
            "" | "." => out.truncate(start),
            ".." => {
                out.truncate(starts.pop().unwrap_or(start));
            }
            _ => starts.push(start),
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// One path segment, normalised into `out` (see [`path`]).
fn segment(raw: &[u8], out: &mut String) {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let escaped = match (b, raw.get(i + 1..i + 3)) {
            (b'%', Some(&[h, l])) => hex(h).zip(hex(l)).map(|(h, l)| (h << 4) | l),
            _ => None,
        };
        let (byte, width) = match escaped {
            Some(v) => (v, 3),
            None => (b, 1),
        };
        let keep = byte.is_ascii_alphanumeric()
            || b"-._~".contains(&byte)
            || (escaped.is_none() && b"!$&'()*+,;=:@".contains(&byte));
        if keep {
            out.push(char::from(byte.to_ascii_lowercase()));
        } else {
            push_escaped(out, byte);
        }
        i += width;
    }
}

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// `%xx`, lower case (the whole path is).
fn push_escaped(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0xf)]));
}

/// A header's value as key text: itself when it is printable ASCII (the usual case, borrowed),
/// else with each byte outside it written `%XX` — so a byte that makes the value invalid text
/// changes the key instead of leaving the request without one (and outside the rule).
pub fn header_text(value: &[u8]) -> Cow<'_, str> {
    let plain = |b: &u8| (b' '..=b'~').contains(b);
    match std::str::from_utf8(value) {
        Ok(s) if value.iter().all(plain) => Cow::Borrowed(s),
        _ => {
            let mut out = String::with_capacity(value.len() + 8);
            for &b in value {
                if plain(&b) {
                    out.push(char::from(b));
                } else {
                    out.push('%');
                    out.push_str(&format!("{b:02X}"));
                }
            }
            Cow::Owned(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn trusted(blocks: &[&str]) -> TrustedProxies {
        TrustedProxies::new(blocks.iter().map(|b| b.parse().expect("a block")).collect())
    }

    /// The client of a request whose gateway is 192.0.2.1.
    fn client(xff: &[&str], real_ip: Option<&str>, t: &TrustedProxies) -> Option<String> {
        let lines: Vec<&[u8]> = xff.iter().map(|l| l.as_bytes()).collect();
        client_ip(&lines, real_ip.map(str::as_bytes), Some(ip("192.0.2.1")), t)
            .map(|a| a.to_string())
    }

    #[test]
    fn the_client_is_the_rightmost_address_no_trusted_proxy_wrote() {
        let none = TrustedProxies::default();
        let c = |xff: &[&str], real_ip| client(xff, real_ip, &none);
        // What the gateway appended, whatever the client wrote before it.
        assert_eq!(
            c(&["6.6.6.6, 203.0.113.7"], None).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(c(&["203.0.113.7"], None).as_deref(), Some("203.0.113.7"));
        // Several lines are one list, in order.
        assert_eq!(
            c(&["6.6.6.6", "203.0.113.7"], None).as_deref(),
            Some("203.0.113.7")
        );
        // X-Real-IP only without X-Forwarded-For; then the gateway itself.
        assert_eq!(
            c(&["203.0.113.7"], Some("7.7.7.7")).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            c(&[], Some(" 198.51.100.2 ")).as_deref(),
            Some("198.51.100.2")
        );
        assert_eq!(
            c(&[" , "], Some("198.51.100.2")).as_deref(),
            Some("198.51.100.2")
        );
        assert_eq!(c(&[], Some("nonsense")).as_deref(), Some("192.0.2.1"));
        assert_eq!(c(&[], None).as_deref(), Some("192.0.2.1"));
        // Ports, brackets, one spelling per address.
        assert_eq!(
            c(&["203.0.113.7:5123"], None).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            c(&["[2001:DB8::1]:443"], None).as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(c(&["[2001:db8::1]"], None).as_deref(), Some("2001:db8::1"));
        assert_eq!(
            c(&["::ffff:203.0.113.7"], None).as_deref(),
            Some("203.0.113.7")
        );
        // Not an address where the client's should be: the gateway's own, not the client's.
        assert_eq!(
            c(&["203.0.113.7, unknown"], Some("7.7.7.7")).as_deref(),
            Some("192.0.2.1")
        );
        // A byte the header may not hold in the client's part changes nothing.
        let lines: [&[u8]; 1] = [b"\xff6.6.6.6, 203.0.113.7"];
        assert_eq!(
            client_ip(&lines, Some(b"7.7.7.7"), None, &none),
            Some(ip("203.0.113.7"))
        );
    }

    #[test]
    fn trusted_proxies_are_walked_past_from_the_right() {
        let t = trusted(&["10.0.0.0/8", "2001:db8:ff::/48", "198.51.100.9"]);
        let c = |xff: &[&str]| client(xff, None, &t);
        assert_eq!(
            c(&["6.6.6.6, 203.0.113.7, 10.2.3.4, 198.51.100.9"]).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            c(&["203.0.113.7, 2001:db8:ff::5"]).as_deref(),
            Some("203.0.113.7")
        );
        // All trusted: the farthest hop, the leftmost entry.
        assert_eq!(c(&["10.9.9.9, 10.2.3.4"]).as_deref(), Some("10.9.9.9"));
        // Garbage where the client's address should be: the trusted hop that wrote it.
        assert_eq!(
            c(&["6.6.6.6, bogus, 10.2.3.4"]).as_deref(),
            Some("10.2.3.4")
        );
        // Trust is of whole blocks only: 198.51.100.10 is a client.
        assert_eq!(
            c(&["203.0.113.7, 198.51.100.10"]).as_deref(),
            Some("198.51.100.10")
        );
    }

    #[test]
    fn address_blocks_parse_and_contain() {
        let b: Cidr = "10.1.2.3/8".parse().expect("host bits are cleared");
        assert!(b.contains(ip("10.255.0.1")) && !b.contains(ip("11.0.0.1")));
        assert!(b.contains(ip("::ffff:10.0.0.1")), "IPv4-mapped is IPv4");
        let one: Cidr = "192.0.2.7".parse().expect("one address");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let all: Cidr = "0.0.0.0/0".parse().expect("everything");
        assert!(all.contains(ip("203.0.113.7")) && !all.contains(ip("2001:db8::1")));
        let v6: Cidr = "2001:db8::/32".parse().expect("v6");
        assert!(v6.contains(ip("2001:db8:1::1")) && !v6.contains(ip("2001:db9::1")));
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0/8",
            "::/129",
            "example.com",
            "10.0.0.0/",
        ] {
            let e = bad.parse::<Cidr>().expect_err(bad);
            assert!(e.to_string().contains("address block"), "{e}");
        }
    }

    #[test]
    fn one_path_is_one_key_however_it_is_spelled() {
        let p = |s: &str| path(s.as_bytes());
        for spelling in [
            "/login",
            "/Login",
            "//login",
            "/login/",
            "/%6cogin",
            "/%6Cogin",
            "/./login",
            "/a/../login",
            "/../login",
            "/login?next=/x",
            "/login#top",
            "/login/.",
            "https://shop.example/login",
            "login",
        ] {
            assert_eq!(p(spelling), "/login", "{spelling}");
        }
        for root in [
            "",
            "/",
            "//",
            "/.",
            "/..",
            "/?x",
            "https://shop.example",
            "/a/..",
        ] {
            assert_eq!(p(root), "/", "{root}");
        }
        assert_eq!(p("/a//b/./c/../d/"), "/a/b/d");
        // Only unreserved characters are decoded: an escaped `/` stays a byte of a segment.
        assert_eq!(p("/a%2Fb"), "/a%2fb");
        assert_eq!(p("/a%2fb"), "/a%2fb");
        // Other bytes are escaped alike however they came.
        assert_eq!(p("/caf\u{e9}"), "/caf%c3%a9");
        assert_eq!(p("/caf%C3%A9"), "/caf%c3%a9");
        assert_eq!(p("/a b"), "/a%20b");
        assert_eq!(p("/100%"), "/100%25");
        assert_eq!(p("/%zz"), "/%25zz");
        assert_eq!(path(b"/x\xff"), "/x%ff");
        assert_eq!(p("/u:1;v=2@x"), "/u:1;v=2@x");
    }

    #[test]
    fn header_values_become_text_whatever_their_bytes() {
        assert!(matches!(header_text(b"k42"), Cow::Borrowed("k42")));
        assert_eq!(header_text(b"k\xff42"), "k%FF42");
        assert_eq!(header_text(b"caf\xc3\xa9"), "caf%C3%A9");
    }
}
