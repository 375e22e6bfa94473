//! The peers stage: how this node reaches the others and answers them. The peer pool (one
//! facade per member), the router that sends each check where it is decided, the recall of
//! buckets this node comes to own, the peer server; and the tasks that talk to members: the
//! reach probe, clock samples, hot-key leases, RLQS shares, replicas sent and handed back, and
//! the publishing of global counts.

use super::LOG;
use super::local::LocalState;
use super::membership::Members;
use super::trust::Trust;
use crate::config::NodeConfig;
use crate::global::{self, PublishSettings};
use crate::metrics::PeerRpcMetrics;
use crate::peers::{Cluster, PeerServer, Peers, Recall, ServerSettings};
use crate::replicas::ReplicaStats;
use crate::routing::Router;
use ringlimit_core::lease::asking::LeaseStats;
use ringlimit_core::link::PeerSettings;
use ringlimit_core::link::dial::Dial;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::task::JoinSet;

/// This node's side of the peer link.
pub(super) struct Peering {
    pub(super) pool: Arc<Peers>,
    /// Buckets this node owns but does not hold yet, asked of their last holders.
    pub(super) recall: Arc<Recall>,
    /// The peer server (its checks go to the front door once the edges stage has built it).
    pub(super) server: Arc<PeerServer>,
    /// Sends each check where it is decided: here, its owner, or a fallback share.
    pub(super) router: Arc<Router>,
    /// Buckets handed over to new owners.
    pub(super) handed_over: Arc<AtomicU64>,
    pub(super) replica_stats: Arc<ReplicaStats>,
    pub(super) lease_stats: Arc<LeaseStats>,
}

impl Peering {
    /// The pool, the recall (its task starts now), the peer server (served by the edges
    /// stage) and the router.
    pub(super) fn build(
        config: &NodeConfig,
        trust: &Trust,
        local: &LocalState,
        members: &Members,
        dialer: Arc<dyn Dial>,
        rpc: PeerRpcMetrics,
    ) -> Self {
        let pool = Arc::new(Peers::new(PeerSettings {
            dialer,
            node_id: config.node_id.clone(),
            cluster_id: config.cluster_id.clone(),
            secret: trust.security.secret(),
            client_token: None,
            deadline: config.forward_timeout,
            connect_timeout: Duration::from_millis(500),
            open_for: Duration::from_secs(1),
            queue: 8192,
        }));
        let view = &members.view;
        let recall = Recall::spawn(
            local.local.clone(),
            view.clone(),
            pool.clone(),
            config.replicas,
        );
        let server = Arc::new(
            peer_server(config, trust, local, members, &recall)
                .with_regions(local.regions.clone(), pool.sessions()),
        );
        let router = Arc::new(
            Router::new(local.local.clone(), view.clone(), pool.shared(), rpc)
                .with_replicas(config.replicas)
                .with_recall(recall.clone()),
        );
        Self {
            pool,
            recall,
            server,
            router,
            handed_over: Arc::new(AtomicU64::new(0)),
            replica_stats: Arc::new(ReplicaStats::default()),
            lease_stats: Arc::new(LeaseStats::default()),
        }
    }

    /// Starts the tasks that talk to members.
    pub(super) fn spawn(
        &self,
        config: &NodeConfig,
        local: &LocalState,
        members: &Members,
        tasks: &mut JoinSet<()>,
    ) {
        let (here, pool, view) = (&local.local, &self.pool, &members.view);
        if let Some(regions) = &local.regions {
            // Region links dial as peer links do (TLS under --peer-tls-*).
            crate::regions::link::spawn(
                regions.clone(),
                here.clone(),
                config.node_id.clone(),
                pool.settings().dialer.clone(),
                tasks,
            );
            crate::regions::counts::spawn(
                regions.clone(),
                here.clone(),
                config.node_id.clone(),
                pool.settings().dialer.clone(),
                (config.global_publish, config.global_max_published),
                tasks,
            );
        }
        let pauses = members.membership.pauses().clone();
        tasks.spawn(crate::peers::reach::probe(
            pool.clone(),
            view.clone(),
            pauses,
        ));
        tasks.spawn(crate::peers::clocks::measure(
            crate::peers::clocks::Measure {
                peers: pool.clone(),
                view: view.clone(),
                clocks: members.clocks.clone(),
                clock: here.clock().clone(),
            },
        ));
        let hot_keys = self.router.stats.hot.clone();
        tasks.spawn(hot_keys.run(here.leases().held().clone()));
        tasks.spawn(local.rlqs.clone().run(pool.clone(), view.clone()));
        tasks.spawn(
            crate::leases::Asking {
                local: here.clone(),
                peers: pool.clone(),
                view: view.clone(),
                stats: self.lease_stats.clone(),
            }
            .run(),
        );
        tasks.spawn(
            crate::blocks_sync::Announcer {
                blocks: here.blocks().clone(),
                peers: pool.clone(),
                view: view.clone(),
                clock: here.clock().clone(),
                data_dir: config.data_dir.clone(),
            }
            .run(),
        );
        tasks.spawn(
            crate::replicas::handback::HandBack {
                copies: here.copies().clone(),
                peers: pool.clone(),
                view: view.clone(),
            }
            .run(),
        );
        tasks.spawn(
            crate::replicas::sender::Sender {
                owned: here.owned().clone(),
                peers: pool.clone(),
                view: view.clone(),
                replicas: config.replicas,
                flush: config.replica_flush,
                stats: self.replica_stats.clone(),
            }
            .run(),
        );
    }

    /// Starts publishing this node's global counts to the other members, apart from the other
    /// tasks: once HTTP has drained, it sends peers the last counts.
    pub(super) fn publish(
        &self,
        config: &NodeConfig,
        local: &LocalState,
        members: &Members,
    ) -> Publishing {
        let id = members.membership.chitchat_id();
        let pusher =
            global::push::Pusher::new(self.pool.sessions(), id.generation_id, local.global.clone())
                .with_blocklist(config.gossip_blocklist.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A set of its own, so that it too is aborted if the node's future is dropped.
        let mut task = JoinSet::new();
        task.spawn(global::publish::publish_loop(
            members.membership.view_cell(),
            local.global.clone(),
            local.local.clock().clone(),
            PublishSettings {
                interval: config.global_publish,
                max_published: config.global_max_published,
                gossip_budget: config.global_gossip_budget,
            },
            pusher,
            async move {
                let _ = stopped.await;
            },
        ));
        Publishing { stop, task }
    }
}

/// The peer server: members' frames (when they prove the secret or a certificate of the
/// cluster CA), SDK checks (with a client credential), checks relayed to their owners.
fn peer_server(
    config: &NodeConfig,
    trust: &Trust,
    local: &LocalState,
    members: &Members,
    recall: &Arc<Recall>,
) -> PeerServer {
    PeerServer::new(
        local.local.clone(),
        ServerSettings {
            node_id: config.node_id.clone(),
            cluster_id: config.cluster_id.clone(),
            secret: trust.security.secret(),
            // A certificate of the cluster CA makes a member, as the secret does.
            accept_members: trust.security.accepts_members() || trust.peer_tls.is_some(),
            handshake_timeout: Duration::from_secs(2),
            tls: trust.peer_tls.clone(),
            clients: trust.tokens.clone(),
        },
        Some(Cluster {
            view: members.view.clone(),
            recall: recall.clone(),
        }),
    )
    .with_operators(crate::peers::server::Operators {
        book: local.book.clone(),
        top: local.top.clone(),
        quota: Some(local.rlqs.owner.clone()),
    })
}

/// The publishing of global counts, stopped last.
pub(super) struct Publishing {
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinSet<()>,
}

impl Publishing {
    /// Sends the last counts, waiting a bounded time for them to be sent.
    pub(super) async fn finish(mut self) {
        let _ = self.stop.send(());
        let flush_within = global::publish::FLUSH_WITHIN + Duration::from_millis(100);
        if tokio::time::timeout(flush_within, self.task.join_next())
            .await
            .is_err()
        {
            tracing::warn!(target: LOG, "last global counts not sent in time");
        }
    }
}
