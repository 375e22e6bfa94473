//! The command line's parsing and validation, and the peer port's security.

use super::*;
use crate::forwarded::TrustedProxies;
use clap::Parser;
use ringlimit_core::tls::PeerTlsFiles;
use std::path::PathBuf;

#[test]
fn trusted_proxies_are_a_list_of_address_blocks() {
    let parse =
        |args: &[&str]| serve_args(args).map(|serve| serve.trusted_proxies.unwrap_or_default());
    let trusted =
        parse(&["--trusted-proxies", "10.0.0.0/8, 2001:db8::/32,192.0.2.7"]).expect("three blocks");
    for ip in ["10.9.8.7", "2001:db8::1", "192.0.2.7"] {
        assert!(trusted.contains(ip.parse().expect("ip")), "{ip}");
    }
    assert!(!trusted.contains("192.0.2.8".parse().expect("ip")));
    // None, and an empty list (an unset variable in a manifest): nothing trusted.
    for args in [&[][..], &["--trusted-proxies", ""]] {
        assert_eq!(parse(args).expect("none"), TrustedProxies::default());
    }
    let e = parse(&["--trusted-proxies", "10.0.0.0/8,nope"]).expect_err("not a block");
    assert!(e.to_string().contains("address block"), "{e}");
}

fn serve_args(args: &[&str]) -> Result<ServeArgs, clap::Error> {
    let cli = Cli::try_parse_from(["ringlimit", "serve"].iter().chain(args))?;
    let Command::Serve(serve) = cli.command else {
        unreachable!("parsed as serve")
    };
    Ok(serve)
}

#[test]
fn tls_flags_come_in_pairs_and_threes() {
    for args in [
        &["--tls-cert", "c.pem"][..],
        &["--tls-key", "k.pem"],
        &["--peer-tls-ca", "ca.pem"],
        &["--peer-tls-ca", "ca.pem", "--peer-tls-cert", "c.pem"],
        &["--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"],
    ] {
        let e = serve_args(args).expect_err("incomplete");
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{args:?}"
        );
    }
    let a = serve_args(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]).expect("a pair");
    assert_eq!(a.tls_cert, Some(PathBuf::from("c.pem")));
}

#[test]
fn a_certificate_that_cannot_be_read_stops_the_node_naming_the_file_and_flags() {
    let missing = std::env::temp_dir().join("ringlimit-no-such-cert.pem");
    let path = missing.display().to_string();
    let args = serve_args(&["--tls-cert", &path, "--tls-key", &path]).expect("flags");
    let e = args.into_config().expect_err("no such file");
    let line = e.to_string();
    assert!(matches!(e, ConfigError::Tls { .. }), "{line}");
    assert!(
        line.starts_with("--tls-cert/--tls-key: cannot read certificate "),
        "{line}"
    );
    assert!(line.contains(&path) && !line.contains('\n'), "{line}");

    let args = serve_args(&[
        "--peer-tls-ca",
        &path,
        "--peer-tls-cert",
        &path,
        "--peer-tls-key",
        &path,
    ])
    .expect("flags");
    let line = args.into_config().expect_err("no such file").to_string();
    assert!(
        line.starts_with("--peer-tls-ca/--peer-tls-cert/--peer-tls-key: cannot read CA "),
        "{line}"
    );
}

#[test]
fn peer_tls_without_the_secret_still_refuses_seeds_because_gossip_needs_it() {
    let mut config = NodeConfig::local("n");
    config.allow_unauthenticated_peers = false;
    config.seeds = vec!["127.0.0.1:7946".into()];
    config.peer_tls = Some(PeerTlsFiles {
        ca: "ca.pem".into(),
        cert: "c.pem".into(),
        key: "k.pem".into(),
    });
    let e = config.peer_security().expect_err("seeds without a secret");
    assert!(matches!(e, ConfigError::NoClusterSecretForGossip), "{e}");
    assert!(e.to_string().contains("gossip"), "{e}");
    // With the secret, or with gossip left open on purpose: a cluster.
    config.cluster_secret = Some("s".into());
    assert!(matches!(
        config.peer_security(),
        Ok(PeerSecurity::Secret(_))
    ));
    config.cluster_secret = None;
    config.allow_unauthenticated_peers = true;
    assert!(matches!(config.peer_security(), Ok(PeerSecurity::Open)));
}

#[test]
fn replicas_default_to_one_and_zero_turns_them_off() {
    let parse = |args: &[&str]| serve_args(args).map(|serve| serve.replicas);
    assert_eq!(parse(&[]).expect("default"), 1);
    assert_eq!(parse(&["--replicas", "0"]).expect("off"), 0);
    assert_eq!(parse(&["--replicas", "2"]).expect("two"), 2);
    assert!(parse(&["--replicas", "-1"]).is_err());
}

#[test]
fn a_reservations_life_is_bounded_by_ten_minutes_unless_raised_to_at_most_an_hour() {
    let parse = |args: &[&str]| serve_args(args).map(|serve| serve.max_reservation_ttl_ms);
    assert_eq!(parse(&[]).expect("default"), 600_000);
    assert_eq!(
        parse(&["--max-reservation-ttl-ms", "3600000"]).expect("an hour"),
        3_600_000
    );
    for bad in ["0", "3600001", "-1", "long"] {
        assert!(parse(&["--max-reservation-ttl-ms", bad]).is_err(), "{bad}");
    }
    let config = serve_args(&["--max-reservation-ttl-ms", "120000"])
        .expect("two minutes")
        .into_config()
        .expect("a config");
    assert_eq!(config.max_reservation_ttl_ms, 120_000);
}

#[test]
fn the_replica_flush_interval_defaults_to_8_ms_and_stays_within_a_second() {
    let parse = |args: &[&str]| serve_args(args).map(|serve| serve.replica_flush_ms);
    assert_eq!(parse(&[]).expect("default"), 8);
    assert_eq!(parse(&["--replica-flush-ms", "20"]).expect("20"), 20);
    for bad in ["0", "1001", "-5", "soon"] {
        assert!(parse(&["--replica-flush-ms", bad]).is_err(), "{bad}");
    }
}

#[test]
fn a_node_that_must_not_start_says_why_before_reading_any_file() {
    let missing = std::env::temp_dir().join("ringlimit-no-such-file.yaml");
    let path = missing.display().to_string();
    let files = [
        "--config",
        &path,
        "--envoy-config",
        &path,
        "--rlqs-config",
        &path,
        "--tls-cert",
        &path,
        "--tls-key",
        &path,
    ];
    let refusal = |extra: &[&str]| {
        let args: Vec<&str> = files.iter().chain(extra).copied().collect();
        serve_args(&args)
            .expect("flags")
            .into_config()
            .expect_err("refused")
    };
    // An empty name first, then seeds without the secret (gossip would be open to anyone).
    let e = refusal(&["--node-id", " ", "--seeds", "10.0.0.1:7946"]);
    assert!(matches!(e, ConfigError::EmptyNodeId), "{e}");
    let e = refusal(&["--seeds", "10.0.0.1:7946"]);
    assert!(matches!(e, ConfigError::NoClusterSecret), "{e}");
    let peer_tls = [
        "--peer-tls-ca",
        &path,
        "--peer-tls-cert",
        &path,
        "--peer-tls-key",
        &path,
    ];
    let e = refusal(&[&["--seeds", "10.0.0.1:7946"][..], &peer_tls].concat());
    assert!(matches!(e, ConfigError::NoClusterSecretForGossip), "{e}");
    // Without seeds: the first file read is the rules file.
    let e = refusal(&[]);
    assert!(matches!(e, ConfigError::ReadRules { .. }), "{e}");
}
