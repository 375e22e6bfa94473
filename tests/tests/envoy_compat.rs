//! Compatibility with envoyproxy/ratelimit: its own configuration files
//! (`tests/fixtures/envoyproxy-ratelimit`, copied unchanged: its examples, its README's
//! examples and its test configurations) load as `--envoy-config DIR` loads them, and a node
//! answers `ShouldRateLimit` as its README says they behave. The node's bucket clock is a
//! manual one that the test moves, so fixed windows turn exactly where the test says.

use anyhow::{Context, Result};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ringlimit_core::clock::ManualClock;
use ringlimit_node::NodeConfig;
use ringlimit_node::config::{EngineClock, load_envoy};
use ringlimit_node::rules::envoy_config::EnvoyConfig;
use ringlimit_tests::{TestNode, envoy_descriptor};
use std::path::PathBuf;
use std::sync::Arc;
use tonic::transport::Channel;

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

fn fixtures(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/envoyproxy-ratelimit")
        .join(dir)
}

/// A node serving `dir` as its envoyproxy/ratelimit configuration, with its bucket clock.
struct Rls {
    node: TestNode,
    client: RateLimitServiceClient<Channel>,
    clock: ManualClock,
}

/// One descriptor status, as the test reads it: code, limit (if any), remaining.
#[derive(Debug, PartialEq, Eq)]
struct Status(Code, Option<u32>, u32);

impl Rls {
    /// A node serving the fixture directory `dir`.
    async fn start(dir: &str) -> Result<Self> {
        Self::serve(&fixtures(dir)).await
    }

    /// A node serving the envoyproxy/ratelimit files at `path`.
    async fn serve(path: &std::path::Path) -> Result<Self> {
        // Midnight UTC: every fixed window (second to day) starts here.
        let clock = ManualClock::new(20_000 * 86_400 * 1_000_000_000);
        let mut config = NodeConfig::local("envoy-compat");
        config.grpc_addr = Some("127.0.0.1:0".parse()?);
        config.envoy_config = load_envoy(path)?;
        config.clock = Some(EngineClock(Arc::new(clock.clone())));
        let node = TestNode::start(config).await?;
        let addr = node.grpc.context("a gRPC address")?;
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
        Ok(Self {
            node,
            client,
            clock,
        })
    }

    /// `ShouldRateLimit` for `descriptors` (each a list of entries) with `hits` (0: 1).
    async fn call(
        &mut self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        hits: u32,
    ) -> Result<(Code, Vec<Status>)> {
        let r = self
            .client
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors: descriptors.iter().map(|d| envoy_descriptor(d)).collect(),
                hits_addend: hits,
            })
            .await?
            .into_inner();
        let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown);
        Ok((
            code(r.overall_code),
            r.statuses
                .iter()
                .map(|s| {
                    Status(
                        code(s.code),
                        s.current_limit.as_ref().map(|l| l.requests_per_unit),
                        s.limit_remaining,
                    )
                })
                .collect(),
        ))
    }

    /// The overall code of one call with one descriptor.
    async fn one(&mut self, domain: &str, entries: &[(&str, &str)], hits: u32) -> Result<Code> {
        Ok(self.call(domain, &[entries], hits).await?.0)
    }

    /// The limit that applies to one descriptor (`None`: not limited), read with a call.
    async fn limit_of(&mut self, domain: &str, entries: &[(&str, &str)]) -> Result<Option<u32>> {
        Ok(self.call(domain, &[entries], 1).await?.1[0].1)
    }
}

/// Its docker-compose demo: `examples/ratelimit/config/*.yaml` with the descriptors that
/// `examples/envoy/proxy.yaml`'s routes send, answering as its README's `curl` lines say.
#[tokio::test]
async fn the_demo_configuration_answers_as_its_readme_says() -> Result<()> {
    let mut rls = Rls::start("examples").await?;
    // curl localhost:8888/test — (source_cluster, proxy), (destination_cluster, mock): 1/min.
    let test: &[(&str, &str)] = &[("source_cluster", "proxy"), ("destination_cluster", "mock")];
    assert_eq!(rls.one("rl", test, 0).await?, OK);
    assert_eq!(rls.one("rl", test, 0).await?, OVER);
    rls.clock.advance_ms(60_000);
    assert_eq!(rls.one("rl", test, 0).await?, OK, "a new minute");
    // curl /header -H "foo: foo" — 2/min.
    let header: &[(&str, &str)] = &[("foo", "foo")];
    let codes = [
        rls.one("rl", header, 0).await?,
        rls.one("rl", header, 0).await?,
        rls.one("rl", header, 0).await?,
    ];
    assert_eq!(codes, [OK, OK, OVER]);
    // curl /twoheader -H "foo: foo" -H "bar: bar" — (foo),(bar): 3/min.
    let two: &[(&str, &str)] = &[("foo", "f2"), ("bar", "bar")];
    for _ in 0..3 {
        assert_eq!(rls.one("rl", two, 0).await?, OK);
    }
    assert_eq!(rls.one("rl", two, 0).await?, OVER);
    // -H "foo: foo" -H "baz: baz" — "This will be rate limited": 1/s.
    let baz: &[(&str, &str)] = &[("foo", "f3"), ("baz", "baz")];
    assert_eq!(rls.one("rl", baz, 0).await?, OK);
    assert_eq!(rls.one("rl", baz, 0).await?, OVER);
    rls.clock.advance_ms(1_000);
    assert_eq!(rls.one("rl", baz, 0).await?, OK, "a new second");
    // -H "bar: banned" — "Ban a particular header value": 0.
    assert_eq!(
        rls.one("rl", &[("foo", "f4"), ("bar", "banned")], 0)
            .await?,
        OVER
    );
    // -H "baz: shady" — "never be ratelimited since ... shadow_mode"; not-so-shady is.
    for _ in 0..3 {
        assert_eq!(
            rls.one("rl", &[("foo", "f5"), ("baz", "shady")], 0).await?,
            OK
        );
    }
    // (3 a minute in its current example.yaml.)
    let not_so: &[(&str, &str)] = &[("foo", "f5"), ("baz", "not-so-shady")];
    for _ in 0..3 {
        assert_eq!(rls.one("rl", not_so, 0).await?, OK);
    }
    assert_eq!(rls.one("rl", not_so, 0).await?, OVER);
    // replaces: (category, account) replaces the limit named bkthomps (1 a minute).
    let bkthomps: &[(&str, &str)] = &[("foo", "f7"), ("bar", "bkthomps")];
    let account: &[(&str, &str)] = &[("category", "account")];
    assert_eq!(rls.limit_of("rl", bkthomps).await?, Some(1));
    let (code, s) = rls.call("rl", &[bkthomps, account], 0).await?;
    assert_eq!((code, s[0].1, s[1].1), (OK, None, Some(4)));
    // quota_mode: service_1 (1 a minute) and service_2 (2): over only when both are.
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];
    let mut overall = Vec::new();
    for _ in 0..3 {
        overall.push(rls.call("rl", &[s1, s2], 0).await?.0);
    }
    assert_eq!(overall, [OK, OK, OVER]);
    // (foo, x),(bay, y): unlimited; qux: unlimited.
    for d in [&[("foo", "f6"), ("bay", "y")][..], &[("qux", "q")][..]] {
        let (code, s) = rls.call("rl", &[d], 1000).await?;
        assert_eq!((code, s[0].2), (OK, u32::MAX));
    }
    // config.yaml: mongo_cps, 500 a second per database.
    assert_eq!(
        rls.one("mongo_cps", &[("database", "users")], 500).await?,
        OK
    );
    assert_eq!(
        rls.one("mongo_cps", &[("database", "users")], 0).await?,
        OVER
    );
    assert_eq!(
        rls.limit_of("mongo_cps", &[("database", "other")]).await?,
        None
    );
    rls.node.stop().await
}

/// Its README's Examples 1 to 11, each checked against what the README says of it.
#[tokio::test]
async fn the_readme_examples_behave_as_described() -> Result<()> {
    let mut rls = Rls::start("readme").await?;
    // 1: 500 a second for database users and default; other databases not limited.
    for db in ["users", "default"] {
        assert_eq!(rls.one("mongo_cps", &[("database", db)], 500).await?, OK);
        assert_eq!(rls.one("mongo_cps", &[("database", db)], 0).await?, OVER);
    }
    assert_eq!(rls.limit_of("mongo_cps", &[("database", "x")]).await?, None);

    // 2: 5 marketing messages a day per number, 100 messages a day per number; both in one
    // call, "a logical OR" of the decisions (and, ringlimit's addition, all-or-nothing).
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: &[(&str, &str)] = &[("to_number", "2061111111")];
    for _ in 0..5 {
        assert_eq!(rls.call("messaging", &[marketing, number], 0).await?.0, OK);
    }
    let (code, s) = rls.call("messaging", &[marketing, number], 0).await?;
    assert_eq!(code, OVER);
    assert_eq!(s[0], Status(OVER, Some(5), 0));
    assert_eq!(s[1].1, Some(100));
    let (_, s) = rls.call("messaging", &[number], 0).await?;
    assert_eq!(
        s[0],
        Status(OK, Some(100), 94),
        "the denied call took nothing"
    );
    let (_, s) = rls
        .call("messaging", &[&[("to_number", "2062222222")]], 0)
        .await?;
    assert_eq!(s[0], Status(OK, Some(100), 99), "each number its own");

    // 3: 10 a second per address; 50.0.0.5 blacklisted (0); key and value before key.
    let ip: &[(&str, &str)] = &[("remote_address", "50.0.0.1")];
    assert_eq!(rls.one("edge_proxy_per_ip", ip, 10).await?, OK);
    assert_eq!(rls.one("edge_proxy_per_ip", ip, 0).await?, OVER);
    let banned: &[(&str, &str)] = &[("remote_address", "50.0.0.5")];
    assert_eq!(rls.one("edge_proxy_per_ip", banned, 0).await?, OVER);

    // 4 (the flat configuration): a two-entry descriptor does not match a one-level limit.
    let deep: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    assert_eq!(rls.limit_of("example4", deep).await?, None);

    // 5: unlimited is OK with LimitRemaining MaxUint32; azure 100 a minute.
    let (code, s) = rls.call("internal", &[&[("ldap", "x")]], 1000).await?;
    assert_eq!((code, s[0].2), (OK, u32::MAX));
    assert_eq!(
        rls.limit_of("internal", &[("azure", "x")]).await?,
        Some(100)
    );

    // 6: user-a in shadow mode is never limited; user-b is, at 20 a second.
    let user_a: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-a")];
    for _ in 0..15 {
        assert_eq!(rls.one("example6", user_a, 0).await?, OK);
    }
    assert_eq!(rls.one("example6", user_a, 11).await?, OK);
    let user_b: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-b")];
    assert_eq!(rls.one("example6", user_b, 20).await?, OK);
    assert_eq!(rls.one("example6", user_b, 0).await?, OVER);

    // 7: replaces — key_1 alone 5, key_2 alone 10, both: only key_2's 10 applies.
    let one: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let two: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    assert_eq!(rls.limit_of("example7", one).await?, Some(5));
    assert_eq!(rls.limit_of("example7", two).await?, Some(10));
    let (_, s) = rls.call("example7", &[one, two], 1).await?;
    assert_eq!((s[0].1, s[1].1), (None, Some(10)));

    // 8: detailed_metric changes metrics only: any value 10, value1 20.
    assert_eq!(rls.limit_of("example8", &[("key1", "x")]).await?, Some(10));
    assert_eq!(
        rls.limit_of("example8", &[("key1", "value1")]).await?,
        Some(20)
    );

    // 9 (trailing wildcard): value1, value2, valueXYZ match; others not.
    for v in ["value1", "value2", "valueXYZ", "value"] {
        assert_eq!(
            rls.limit_of("example9", &[("key1", v)]).await?,
            Some(20),
            "{v}"
        );
    }
    assert_eq!(rls.limit_of("example9", &[("key1", "valu")]).await?, None);
    // Each value its own bucket (no share_threshold).
    assert_eq!(rls.one("example9", &[("key1", "valueA")], 20).await?, OK);
    assert_eq!(rls.one("example9", &[("key1", "valueB")], 20).await?, OK);

    // 10: value_to_metric changes metrics only.
    let req: &[(&str, &str)] = &[
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    assert_eq!(rls.limit_of("example10", req).await?, Some(60));
    let read: &[(&str, &str)] = &[
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    assert_eq!(rls.limit_of("example10_wildcard", read).await?, Some(100));
    let write: &[(&str, &str)] = &[
        ("user", "alice"),
        ("action", "write"),
        ("resource", "documents"),
    ];
    assert_eq!(rls.limit_of("example10_wildcard", write).await?, None);

    // 11: share_threshold — 5 for files/a.pdf and 5 for files/b.csv, then files/c.txt is
    // OVER_LIMIT; without it each value has its own 10.
    assert_eq!(
        rls.one("example11", &[("files", "files/a.pdf")], 5).await?,
        OK
    );
    assert_eq!(
        rls.one("example11", &[("files", "files/b.csv")], 5).await?,
        OK
    );
    assert_eq!(
        rls.one("example11", &[("files", "files/c.txt")], 0).await?,
        OVER
    );
    let a: &[(&str, &str)] = &[("files_no_share", "files_no_share/a.pdf")];
    assert_eq!(rls.one("example11", a, 10).await?, OK);
    assert_eq!(rls.one("example11", a, 0).await?, OVER);
    let b: &[(&str, &str)] = &[("files_no_share", "files_no_share/b.csv")];
    assert_eq!(rls.one("example11", b, 10).await?, OK);
    // ... and with value_to_metric: api/v1 and api/v2 share one 60 a minute.
    let v1: &[(&str, &str)] = &[("route", "api/v1"), ("method", "GET")];
    let v2: &[(&str, &str)] = &[("route", "api/v2"), ("method", "GET")];
    assert_eq!(rls.one("example11_metrics", v1, 60).await?, OK);
    assert_eq!(rls.one("example11_metrics", v2, 0).await?, OVER);
    rls.node.stop().await?;

    // The README's other blocks, whose domains repeat the ones above.
    let mut rls = Rls::start("readme-alt1").await?;
    // 4 (the nested configuration): now the two-entry descriptor matches, 300 a second.
    assert_eq!(rls.limit_of("example4", deep).await?, Some(300));
    // 9 (middle wildcard): /api/123/action and /api/user-id/action; not /api/123/other.
    for v in ["/api/123/action", "/api/user-id/action"] {
        assert_eq!(
            rls.limit_of("example9", &[("path", v)]).await?,
            Some(20),
            "{v}"
        );
    }
    assert_eq!(
        rls.limit_of("example9", &[("path", "/api/123/other")])
            .await?,
        None
    );
    rls.node.stop().await?;
    let mut rls = Rls::start("readme-alt2").await?;
    // 9 (several wildcards, in order).
    for v in ["/api/v1/resource/123/action", "/api/v2/resource/456/action"] {
        assert_eq!(
            rls.limit_of("example9", &[("route", v)]).await?,
            Some(20),
            "{v}"
        );
    }
    for v in ["/api/v1/resource/123/other", "/api/v1/action/resource/x"] {
        assert_eq!(
            rls.limit_of("example9", &[("route", v)]).await?,
            None,
            "{v}"
        );
    }
    rls.node.stop().await
}

fn load_one(dir: &str, file: &str) -> Result<EnvoyConfig, String> {
    let path = fixtures(dir).join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    EnvoyConfig::from_files([(file, text.as_str())]).map_err(|e| e.to_string())
}

fn limit(c: &EnvoyConfig, d: &[(&str, &str)]) -> Option<u64> {
    c.match_request("test-domain", &[d.to_vec()])[0]
        .as_ref()
        .map(|m| m.requests_per_unit)
}

/// Its test configurations: the ones it loads load and match as its tests expect; the ones
/// it refuses are refused, each with an error naming the file.
#[test]
fn its_test_configurations_load_or_are_refused_as_there() -> Result<()> {
    let basic = load_one("tests-good", "basic_config.yaml").map_err(anyhow::Error::msg)?;
    assert_eq!(
        limit(&basic, &[("key1", "value1"), ("subkey1", "x")]),
        Some(5)
    );
    assert_eq!(
        limit(&basic, &[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some(10)
    );
    assert_eq!(limit(&basic, &[("key2", "x")]), Some(20));
    assert_eq!(limit(&basic, &[("key2", "value2")]), Some(30));
    assert_eq!(limit(&basic, &[("key2", "value3")]), None, "whitelisted");
    assert_eq!(limit(&basic, &[("key5", "value5")]), Some(15));
    assert_eq!(
        limit(&basic, &[("key5", "value5"), ("subkey5", "subvalue5")]),
        Some(25)
    );
    assert!(
        basic.match_request("test-domain", &[vec![("key6", "x")]])[0]
            .as_ref()
            .is_some_and(|m| m.unlimited)
    );

    let shadow = load_one("tests-good", "shadowmode_config.yaml").map_err(anyhow::Error::msg)?;
    let m = shadow.match_request(
        "test-domain",
        &[vec![("key2", "x")], vec![("key2", "value2")]],
    );
    assert_eq!(
        m.iter()
            .map(|m| m.as_ref().map(|m| m.shadow))
            .collect::<Vec<_>>(),
        [Some(true), Some(false)]
    );

    let wild = load_one("tests-good", "wildcard.yaml").map_err(anyhow::Error::msg)?;
    for (d, want) in [
        (vec![("wild", "foobar")], Some(20)),
        (vec![("wild", "fo")], None),
        (vec![("noWild", "foobar")], None),
        (vec![("noVal", "anything")], Some(20)),
        (vec![("midWild", "barXXb")], Some(20)),
        (vec![("midWild", "barX")], None),
        (vec![("multiWild", "fooAbarBbaz")], Some(10)),
        (vec![("multiWild", "foobaz")], None),
        (vec![("nestedWild", "val1"), ("wild", "goober")], Some(20)),
    ] {
        assert_eq!(limit(&wild, &d), want, "{d:?}");
    }

    let share = load_one("tests-good", "share_threshold.yaml").map_err(anyhow::Error::msg)?;
    let shared = |d: Vec<(&str, &str)>| {
        share.match_request("test-domain", &[d])[0]
            .as_ref()
            .map(|m| (m.requests_per_unit, m.shared.clone()))
    };
    let s = |p: &str| Some(p.to_owned());
    assert_eq!(
        shared(vec![("files", "files/a")]),
        Some((100, vec![s("files/*")]))
    );
    assert_eq!(
        shared(vec![("file", "test1")]),
        Some((50, vec![None])),
        "exact first"
    );
    assert_eq!(
        shared(vec![("file", "test2")]),
        Some((100, vec![s("test*")]))
    );
    assert_eq!(
        shared(vec![("path", "path/x"), ("file", "file/y"), ("type", "z")]),
        Some((120, vec![s("path/*"), None, None]))
    );
    assert_eq!(
        shared(vec![("midpath", "/api/x/v1")]),
        Some((100, vec![s("/api*v1")]))
    );
    assert_eq!(
        shared(vec![("multiroute", "svcAepBrpc")]),
        Some((50, vec![s("svc*ep*rpc")]))
    );

    let meta = load_one("tests-good", "metadata.yaml").map_err(anyhow::Error::msg)?;
    assert_eq!(limit(&meta, &[("key2", "x")]), Some(20));

    let mut refused = Vec::new();
    for entry in std::fs::read_dir(fixtures("tests-bad"))? {
        let file = entry?.file_name().to_string_lossy().into_owned();
        let error = load_one("tests-bad", &file).err().unwrap_or_default();
        assert!(
            error.starts_with(&file),
            "{file} must be refused, naming it: {error:?}"
        );
        refused.push(file);
    }
    assert_eq!(refused.len(), 12);
    // A domain in two files (its duplicate_domain test).
    let twice = EnvoyConfig::from_files([
        (
            "basic_config.yaml",
            std::fs::read_to_string(fixtures("tests-good/basic_config.yaml"))?.as_str(),
        ),
        (
            "duplicate_domain.yaml",
            "domain: test-domain\ndescriptors:\n",
        ),
    ]);
    assert!(twice.is_err());
    Ok(())
}

/// `quota_mode` (newer envoyproxy/ratelimit): a request is over when every quota descriptor
/// in it is over; one quota descriptor alone is then simply enforced.
#[tokio::test]
async fn quota_mode_descriptors_deny_only_when_all_are_over() -> Result<()> {
    let dir = ringlimit_tests::TempDir::new("envoy-quota")?;
    std::fs::write(
        dir.0.join("quota.yaml"),
        "domain: quota
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 10 }
",
    )?;
    let mut rls = Rls::serve(&dir.0).await?;
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];
    let user: &[(&str, &str)] = &[("user", "u")];
    // Both quotas in one request: OK while either has room; each status says which is over.
    let (code, s) = rls.call("quota", &[s1, s2, user], 0).await?;
    assert_eq!((code, s[0].0, s[1].0), (OK, OK, OK));
    let (code, s) = rls.call("quota", &[s1, s2, user], 0).await?;
    assert_eq!((code, s[0].0, s[1].0), (OK, OVER, OK));
    let (code, s) = rls.call("quota", &[s1, s2, user], 0).await?;
    assert_eq!((code, s[0].0, s[1].0), (OVER, OVER, OVER));
    // One quota alone: enforced, and all-or-nothing with the others.
    rls.clock.advance_ms(60_000);
    assert_eq!(rls.call("quota", &[s1, user], 0).await?.0, OK);
    assert_eq!(rls.call("quota", &[s1, user], 0).await?.0, OVER);
    let (_, s) = rls.call("quota", &[user], 0).await?;
    assert_eq!(
        s[0].2, 8,
        "the user's bucket kept only the admitted request"
    );
    rls.node.stop().await
}
