//! The gRPC edge on a real node: Envoy's `ShouldRateLimit` over an envoyproxy/ratelimit
//! configuration, and grpc.health.v1. (Here through the client generated from Envoy's protos
//! by envoy-types; a client in another language is the next step.)

use anyhow::{Context, Result};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ringlimit_node::NodeConfig;
use ringlimit_node::envoy_config::EnvoyConfig;
use ringlimit_tests::TestNode;

const ENVOY: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: path
    value: /login
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: internal
    rate_limit: { unlimited: true }
";

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

#[tokio::test]
async fn should_rate_limit_decides_descriptors_all_or_nothing() -> Result<()> {
    let mut config = NodeConfig::local("grpc-node");
    config.grpc_addr = Some("127.0.0.1:0".parse()?);
    config.envoy_config = EnvoyConfig::from_files([("edge.yaml", ENVOY)])?;
    let node = TestNode::start(config).await?;
    let addr = node.grpc.context("a gRPC address")?;
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;

    // /login from one address: the path allows 2; the third is over and takes nothing from
    // the address, which still has its third.
    let login = || {
        request(vec![
            descriptor(&[("remote_address", "10.0.0.1")]),
            descriptor(&[("path", "/login")]),
        ])
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client.should_rate_limit(login()).await?.into_inner();
        codes.push(r.overall_code);
        assert_eq!(r.statuses.len(), 2);
        let limit = r.statuses[1].current_limit.as_ref().context("a limit")?;
        assert_eq!(limit.requests_per_unit, 2);
        assert!(
            r.response_headers_to_add
                .iter()
                .any(|h| h.key == "ratelimit-policy" && h.value.contains(";q=2;w=3600")),
            "{:?}",
            r.response_headers_to_add
        );
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    let alone = client
        .should_rate_limit(request(vec![descriptor(&[("remote_address", "10.0.0.1")])]))
        .await?
        .into_inner();
    assert_eq!(
        alone.overall_code,
        Code::Ok as i32,
        "the address kept its third"
    );
    assert_eq!(alone.statuses[0].limit_remaining, 0);

    // A shadow descriptor never denies; an unlimited one and an unknown one are OK.
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request(vec![
                descriptor(&[("trial", "t")]),
                descriptor(&[("internal", "x")]),
                descriptor(&[("nothing", "configured")]),
            ]))
            .await?
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
        assert!(r.statuses[2].current_limit.is_none());
    }
    // hits_addend is the cost; a descriptor's own limit overrides the configuration.
    let mut heavy = request(vec![descriptor(&[("remote_address", "10.0.0.2")])]);
    heavy.hits_addend = 4;
    let r = client.should_rate_limit(heavy).await?.into_inner();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "4 can never fit in 3"
    );
    let mut raised = descriptor(&[("remote_address", "10.0.0.2")]);
    raised.limit = Some(
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 10,
            unit: 3, // hour
        },
    );
    let mut heavy = request(vec![raised]);
    heavy.hits_addend = 4;
    let r = client.should_rate_limit(heavy).await?.into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 6);
    node.stop().await
}
