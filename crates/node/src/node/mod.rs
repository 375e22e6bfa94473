//! Wiring: a node built in stages and run until shutdown, on sockets it bound
//! ([`Listeners`]) or on an in-memory network ([`MemoryNet`], for whole nodes in tests).
//!
//! # Layout
//! [`run`] only sequences the stages, in this order; each is built by short functions of its
//! own module, taking what the stages before it made.
//! - `trust` — whom the node trusts: the peer port's security, the certificates, the tokens.
//! - `local` — what the node holds and decides by itself: opened before it joins (the rules in
//!   force, the rule book under `--data-dir`), completed once membership has named it (global
//!   counters, and [`crate::local::Local`] with its owned buckets, replica copies, leases and
//!   reservations; top keys, RLQS shares).
//! - `listeners` — where the node serves: [`Listeners`] or [`MemoryNet`], turned into the
//!   same endpoints either way.
//! - `membership` — gossip from the seeds, the view, pauses, clocks, the API rules' sync.
//! - `peers` — the peer pool, the router, the recall, the peer server, and the tasks that
//!   talk to members (probe, clocks, leases, replicas, RLQS shares, global counts).
//! - `lifecycle` — readiness following membership; then leaving, draining and stopping.
//! - `edges` — the check service and the admin side; HTTP, gRPC and the peer port served.
//! - `collectors` — every stage's metrics, registered in one list.

mod collectors;
mod edges;
mod lifecycle;
mod listeners;
mod local;
mod membership;
mod peers;
mod trust;

pub use lifecycle::shutdown_signal;
pub use listeners::{Bound, Listeners, MemoryListeners, MemoryNet};

use crate::cluster::membership::GossipError;
use crate::config::NodeConfig;
use crate::http::AppState;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use edges::Edges;
use listeners::{Endpoints, PeerListener};
use local::{LocalState, Opened};
use membership::Members;
use peers::Peering;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinSet;
use trust::Trust;

/// The target of the wiring's log lines, whichever stage logs them: the one they have always
/// had (log filters and parsers name it).
const LOG: &str = "ringlimit_node::node";

/// Why a node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot bind the {what} address {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot resolve the advertise address {addr:?}: {reason}")]
    Advertise { addr: String, reason: String },
    #[error(transparent)]
    Gossip(#[from] GossipError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("--data-dir: {0}")]
    DataDir(String),
    #[error("--admin-tokens: {0}")]
    AdminTokens(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Runs a node until `shutdown` completes: then announces `leaving`, keeps serving for the
/// leave delay, drains in-flight requests and returns. Dropping the returned future instead
/// stops every task it started except HTTP connections already accepted.
pub async fn run(
    config: NodeConfig,
    listeners: impl Into<Bound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    Node::build(config, listeners.into())
        .await?
        .serve(shutdown)
        .await
}

/// A node built stage by stage, before it serves (gossip and the recall have started).
struct Node {
    config: NodeConfig,
    trust: Trust,
    local: LocalState,
    members: Members,
    peers: Peering,
    lifecycle: Arc<Lifecycle>,
    edges: Edges,
    peer_listener: PeerListener,
    /// The front door every HTTP request goes through.
    state: AppState,
}

impl Node {
    /// Builds the stages in order; each takes what the ones before it made.
    async fn build(config: NodeConfig, bound: Bound) -> Result<Self, NodeError> {
        // Every file is read, and the rules put in force, before anything is served.
        let trust = Trust::load(&config)?;
        edges::raise_open_files(&config);
        let opened = Opened::open(&config)?.open_disk(&config).await?;
        let endpoints = Endpoints::new(bound, &config, trust.peer_tls.as_ref())?;
        // From here on other nodes learn of this one.
        let members = Members::join(&config, &endpoints, &opened.remembered).await?;
        let local = opened.decide_here(&config, &members);
        local.restore().await?;
        let mut metrics = Metrics::new();
        let (dialer, rpc) = (endpoints.dialer.clone(), metrics.peer_rpc());
        let peers = Peering::build(&config, &trust, &local, &members, dialer, rpc);
        let lifecycle = lifecycle::new(&config, &local, &peers);
        let (edges, peer_listener) = Edges::new(&config, &trust, endpoints);
        collectors::register(
            &mut metrics,
            &trust,
            &local,
            &members,
            &peers,
            &edges,
            &lifecycle,
        );
        let metrics = Arc::new(metrics);
        let state = edges::front_door(
            &config, &trust, &local, &members, &peers, &lifecycle, metrics,
        );
        Ok(Self {
            config,
            trust,
            local,
            members,
            peers,
            lifecycle,
            edges,
            peer_listener,
            state,
        })
    }

    /// Starts every stage's tasks, then serves until `shutdown` and stops them.
    async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let Self {
            config,
            trust,
            local,
            members,
            peers,
            lifecycle,
            mut edges,
            peer_listener,
            state,
        } = self;
        let mut tasks = JoinSet::new();
        local.sweep(&mut tasks);
        local.persist(&config, &members, &mut tasks);
        peers.spawn(&config, &local, &members, &mut tasks);
        // Before readiness announces this node to the others.
        edges::serve_peer_port(&peers.server, peer_listener, &mut tasks);
        let publishing = peers.publish(&config, &local, &members);
        members.sync_rules(&config, &local.book, &mut tasks);
        lifecycle::follow_membership(&config, &members, &local, &peers, &lifecycle, &mut tasks);
        trust.watch(&config, &mut tasks);
        local.watch(&config, &mut tasks);
        edges.watch(&config, &local, &mut tasks);

        edges.say_serving(&config, &trust, &members);
        edges.serve_grpc(&config, &trust, &state, &local, &lifecycle, &mut tasks);
        let membership = members.membership.clone();
        let leave = lifecycle::leave(
            shutdown,
            local.rlqs.clone(),
            local.durable.clone(),
            lifecycle,
            membership,
            config.leave_delay,
        );
        let result = edges.serve_http(&config, state, leave).await;
        lifecycle::stop(
            publishing,
            tasks,
            &members.membership,
            local.durable.clone(),
        )
        .await;
        result
    }
}

/// The `/metrics` contract as a test: every family's `# HELP` and `# TYPE` line and every
/// series' name and labels, from a node that has done some work, must be those listed in
/// `metrics/names.txt` (a metric added is a line added there; none may change or go).
#[cfg(test)]
mod tests {
    use crate::testing::Cluster;
    use serde_json::json;
    use std::collections::BTreeSet;

    /// What the contract fixes of a `/metrics` text: descriptor lines whole, sample lines without
    /// their value.
    fn shape(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| *l != "# EOF")
            .map(|l| match l.strip_prefix('#') {
                Some(_) => l.to_owned(),
                None => l
                    .rsplit_once(' ')
                    .map_or(l, |(series, _)| series)
                    .to_owned(),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_names_types_and_help_stay_those_of_the_contract() {
        let c = Cluster::start(2, |_| {}).await;
        c.wait("n0 sees two", || async { c.alive("n0").await.len() == 2 })
            .await;
        c.wait("n0 measured n1's clock", || async {
            c.view("n0").await["clock"]["peers"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
        })
        .await;
        // Checks decided here and forwarded, single and batched, and one all-or-nothing request.
        for i in 0..8 {
            let key = format!("m:{i}");
            let r = c
                .check(
                    "n0",
                    &json!({ "key": key, "limit": 1, "period_ms": 60_000 }),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
        let batch = json!({ "checks": [
            { "key": "m:0", "limit": 1, "period_ms": 60_000 },
            { "key": "m:1", "limit": 1, "period_ms": 60_000 },
        ] });
        let r = c
            .http("n0", "POST", "/v1/check/batch", &batch.to_string())
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let r = c
            .http("n0", "POST", "/v1/check/all", &batch.to_string())
            .await;
        assert!(r.status == 200 || r.status == 429, "{}", r.body);

        let r = c.http("n0", "GET", "/metrics", "").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let got = shape(&r.body);
        let want: BTreeSet<String> = include_str!("../metrics/names.txt")
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "missing from /metrics: {missing:#?}\nnot in names.txt: {extra:#?}"
        );
    }
}
