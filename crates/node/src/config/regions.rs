//! `--region`, `--region-peers`, `--region-interval-ms` and `RINGLIMIT_REGION_SECRET`: the
//! regions this node's cluster shares `scope: regions` limits with.

use super::error::ConfigError;
use std::sync::Arc;
use std::time::Duration;

/// The regions of a node started with `--region`.
#[derive(Clone)]
pub struct RegionsConfig {
    /// This node's region.
    pub name: String,
    /// The other regions: name and the `--peer` address (host:port, re-resolved on every
    /// connection) of a node in each.
    pub peers: Vec<(String, String)>,
    /// How often regions exchange demand and allowances.
    pub interval: Duration,
    /// What region links prove (`RINGLIMIT_REGION_SECRET`); `None` with peer mTLS only.
    pub secret: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for RegionsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionsConfig")
            .field("name", &self.name)
            .field("peers", &self.peers)
            .field("interval", &self.interval)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl RegionsConfig {
    /// Every configured region's name, ours first, then `--region-peers` in their order.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(self.name.clone())
            .chain(self.peers.iter().map(|(n, _)| n.clone()))
            .collect()
    }
}

/// A region's name: 1 to 64 letters, digits, `-`, `_` or `.`.
fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks the region flags (before anything is read): `--region-peers` needs `--region`,
/// names are valid, distinct and not our own, every entry is `NAME=HOST:PORT`, and links
/// between regions are authenticated (the region secret, or peer mTLS).
pub fn parse(
    region: Option<&str>,
    peers: &[String],
    interval_ms: u64,
    secret: Option<String>,
    peer_mtls: bool,
) -> Result<Option<RegionsConfig>, ConfigError> {
    let peers: Vec<&str> = peers
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let Some(name) = region.map(str::trim) else {
        if peers.is_empty() {
            return Ok(None);
        }
        return Err(ConfigError::RegionPeersWithoutRegion);
    };
    if !valid_name(name) {
        return Err(ConfigError::BadRegionName(name.to_owned()));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in peers {
        let Some((n, addr)) = entry.split_once('=') else {
            return Err(ConfigError::BadRegionPeer(entry.to_owned()));
        };
        let (n, addr) = (n.trim(), addr.trim());
        let port_ok = addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid_name(n) || !port_ok {
            return Err(ConfigError::BadRegionPeer(entry.to_owned()));
        }
        if n == name {
            return Err(ConfigError::RegionPeerIsUs(n.to_owned()));
        }
        if out.iter().any(|(m, _)| m == n) {
            return Err(ConfigError::DuplicateRegion(n.to_owned()));
        }
        out.push((n.to_owned(), addr.to_owned()));
    }
    if !out.is_empty() && secret.is_none() && !peer_mtls {
        return Err(ConfigError::NoRegionSecret);
    }
    Ok(Some(RegionsConfig {
        name: name.to_owned(),
        peers: out,
        interval: Duration::from_millis(interval_ms),
        secret: secret.map(|s| Arc::from(s.into_bytes().into_boxed_slice())),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn regions_are_checked_before_start() {
        let s = || Some("secret-secret-secret".to_owned());
        assert!(parse(None, &[], 1000, None, false).expect("ok").is_none());
        let c = parse(
            Some("eu"),
            &peers(&["us=us.example:7946", " ap=10.0.0.1:7946"]),
            1000,
            s(),
            false,
        )
        .expect("ok")
        .expect("regions");
        assert_eq!(c.names(), vec!["eu", "us", "ap"]);
        // One region alone needs no secret.
        assert!(
            parse(Some("eu"), &[], 1000, None, false)
                .expect("ok")
                .is_some()
        );
        let err = |r: Option<&str>, p: &[&str], secret: Option<String>| {
            parse(r, &peers(p), 1000, secret, false)
                .expect_err("refused")
                .to_string()
        };
        assert!(err(None, &["us=h:1"], s()).contains("without --region"));
        assert!(err(Some("eu"), &["eu=h:1"], s()).contains("own region"));
        assert!(err(Some("eu"), &["us=h:1", "us=g:2"], s()).contains("twice"));
        assert!(err(Some("eu"), &["us"], s()).contains("NAME=HOST:PORT"));
        assert!(err(Some("eu"), &["us=h"], s()).contains("NAME=HOST:PORT"));
        assert!(err(Some("e u"), &[], s()).contains("--region"));
        assert!(err(Some("eu"), &["us=h:1"], None).contains("RINGLIMIT_REGION_SECRET"));
        // Peer mTLS authenticates region links too.
        assert!(parse(Some("eu"), &peers(&["us=h:1"]), 1000, None, true).is_ok());
    }
}
