//! An axum service whose `GET /hello` is limited per `x-api-key` header at 5 requests per 10 s
//! (token bucket), through a ringlimit cluster.
//!
//! ```text
//! cargo run -p ringlimit-client --example guarded_service -- \
//!     --listen 127.0.0.1:3000 --seeds http://127.0.0.1:8080
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/hello
//! ```
//! The client credential, if the nodes ask for one, comes from `RINGLIMIT_CLIENT_TOKEN` (the
//! nodes' own variable of that name): a service proves a client token, never the cluster secret.

use anyhow::Context;
use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use clap::Parser;
use ringlimit_client::layer::key;
use ringlimit_client::{Algorithm, Client, InlineRule, RateLimitLayer};
use std::net::SocketAddr;

#[derive(Parser)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// ringlimit nodes' HTTP addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    seeds: Vec<String>,
    /// The cluster's id.
    #[arg(long, default_value = "ringlimit")]
    cluster_id: String,
}

/// 5 requests per 10 s per API key.
const HELLO_LIMIT: InlineRule = InlineRule {
    limit: 5,
    period_ms: 10_000,
    algorithm: Algorithm::TokenBucket,
    burst: None,
    calendar: None,
};

async fn hello(headers: HeaderMap) -> (StatusCode, String) {
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(k) if !k.is_empty() => (StatusCode::OK, format!("hello, {k}\n")),
        _ => (
            StatusCode::UNAUTHORIZED,
            "an x-api-key header is required\n".into(),
        ),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = Client::builder()
        .seeds(args.seeds)
        .cluster_id(args.cluster_id)
        .client_token(std::env::var("RINGLIMIT_CLIENT_TOKEN").unwrap_or_default())
        .name("guarded_service")
        .build()
        .await
        .context("ringlimit client")?;
    let app = Router::new()
        .route("/hello", get(hello))
        .layer(RateLimitLayer::inline(
            client,
            HELLO_LIMIT,
            key::header("x-api-key"),
        ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "guarded_service serving GET /hello");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
