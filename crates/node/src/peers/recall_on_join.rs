//! Recall: for a few seconds after it joins (a restart, a scale-up), a member asks the member
//! after it on the ring for each bucket it owns but does not hold, before it decides that
//! bucket's first check.
//!
//! Why: the buckets of a member that comes back are with the member after it on the ring, its
//! interim owner (it promoted its copies when the ring dropped the member, and hands them back when
//! it sees the member in its ring again, keeping each as a copy: see [`crate::lifecycle`]). Other
//! members route to the member as soon as their rings hold it again, which may be before that
//! handover arrives: without a recall, the member decided those checks on full buckets (over the
//! limit in the accuracy contract's kill row: the docs' benchmarks page, "Hardening findings"). The
//! member after it holds the bucket either way (its own, or the copy it kept), so one round trip
//! before the first check finds it.
//!
//! Until it is first ready, such a member holds its owner-mode checks back (see
//! [`Recall::before`]).
//!
//! A recalled state is merged by overlap ([`Local::recall_in`]): it is another reading of the
//! history that a handover may still bring, so the two never add. What the member after it
//! decides between the recall and its handover (other rings still route there) is the view
//! change's own window, as before.
//!
//! The network side runs on one task (the main runtime's): callers on any runtime queue their
//! ids, the task sends what queued as one frame per member (connections of their own, kept
//! across recalls) and answers every caller once the states are merged. A check waits for its
//! bucket's recall at most [`RECALL_WAIT`]; then it decides on what is here.

use super::{Peers, RecallLink};
use crate::cluster::View;
use crate::local::Local;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long after this node first sees another member it recalls, in ns: a member sees the
/// others' handovers well within it (they follow gossip, which converges in about a second).
pub const RECALL_FOR_NS: u64 = 5_000_000_000;
/// Longest a check waits for its bucket's recall.
pub const RECALL_WAIT: Duration = Duration::from_millis(250);
/// Longest a check waits for this node's first readiness (see [`Recall::before`]).
pub const READY_WAIT: Duration = Duration::from_secs(1);
/// How often a waiting check looks at readiness again.
const READY_POLL: Duration = Duration::from_millis(10);
/// Most buckets remembered as recalled while recalling: beyond, buckets are not recalled.
const MOST_RECALLED: usize = 100_000;
/// Requests queued for the recalling task; when full, a check does not wait for one.
const QUEUE: usize = 1024;

/// One caller's buckets to recall, by the member to ask, and where to say they are merged.
struct Request {
    ids: Vec<(u64, String)>,
    done: oneshot::Sender<()>,
}

/// Recall counters.
#[derive(Debug, Default)]
pub struct RecallStats {
    /// Buckets asked for.
    pub asked: AtomicU64,
    /// Buckets that came back and were merged.
    pub recalled: AtomicU64,
}

/// This node's recalls (see the module doc).
pub struct Recall {
    local: Arc<Local>,
    view: Arc<ArcSwap<View>>,
    /// Set once the recall window passed (or from the start, without replicas).
    over: AtomicBool,
    /// Set once this node was first ready (see [`Recall::ready`]).
    ready: AtomicBool,
    /// When the window opened: this node ready, or its ring first holding another member
    /// (ns on this node's clock; 0: not yet).
    since: AtomicU64,
    /// Buckets already recalled (or asked for, with nothing to give); shared with the task.
    asked: Arc<Mutex<HashSet<u64>>>,
    /// Members that sent the end of their handover since this node joined: they hold nothing
    /// more for it (what they handed over they keep as copies), so nothing is recalled from
    /// them. Once every other member of the ring has, the window closes.
    handed: Mutex<HashSet<Arc<str>>>,
    queue: mpsc::Sender<Request>,
    pub stats: Arc<RecallStats>,
}

impl Recall {
    /// Recalls through `peers` into `local`, under the membership in `view`, when the cluster
    /// keeps replicas (`replicas` > 0: only then does the member after this one hold its
    /// buckets); spawns the recalling task on the current runtime.
    pub fn spawn(
        local: Arc<Local>,
        view: Arc<ArcSwap<View>>,
        peers: Arc<Peers>,
        replicas: usize,
    ) -> Arc<Self> {
        let (queue, requests) = mpsc::channel(QUEUE);
        let stats = Arc::new(RecallStats::default());
        let asked = Arc::new(Mutex::new(HashSet::new()));
        let recall = Arc::new(Self {
            local: local.clone(),
            view,
            over: AtomicBool::new(replicas == 0),
            ready: AtomicBool::new(false),
            since: AtomicU64::new(0),
            asked: asked.clone(),
            handed: Mutex::new(HashSet::new()),
            queue,
            stats: stats.clone(),
        });
        if replicas > 0 {
            let task = Task {
                local,
                peers,
                stats,
                asked,
            };
            tokio::spawn(task.run(requests));
        }
        recall
    }

    /// Whether this node may still recall: checked before anything else, so that once the
    /// window has passed a check pays one load.
    #[inline]
    pub fn active(&self) -> bool {
        !self.over.load(Ordering::Relaxed)
    }

    /// This node is ready for the first time (its membership settled: see `node::track_view`):
    /// checks stop waiting for it, and the recall window opens if it had not.
    pub fn ready(&self) {
        self.ready.store(true, Ordering::Release);
        let now = self.local.now().max(1);
        let _ = self
            .since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Member `member` sent the end of its handover to this node.
    pub fn handed_over(&self, member: &str) {
        if self.active() {
            self.handed.lock().insert(Arc::from(member));
        }
    }

    /// Before owner-mode checks of buckets `ids` are decided here: waits (at most
    /// [`READY_WAIT`]) until this node is first ready, then recalls those it owns under its
    /// ring, does not hold and has not recalled yet; returns once they are merged, or after
    /// [`RECALL_WAIT`].
    ///
    /// Why wait for readiness: a node joins `joining` and members route to it only once it is ready
    /// (see `cluster::membership`), but a peer of an older version routes to it as soon as gossip
    /// shows it, which is before the node itself knows them all: its ring then holds itself alone
    /// (or some of the members), and it would decide their checks on buckets it owns under that
    /// ring and does not hold (seen before `joining`: a restarted owner admitting used-up keys just
    /// after its start, before it saw anyone; `bench/notes/accuracy.md`). A sender whose deadline
    /// passes meanwhile has its check decided by the owner's replica.
    pub async fn before(&self, ids: Vec<u64>) {
        if !self.active() || ids.is_empty() {
            return;
        }
        if !self.ready.load(Ordering::Acquire) {
            let until = tokio::time::Instant::now() + READY_WAIT;
            while !self.ready.load(Ordering::Acquire) && tokio::time::Instant::now() < until {
                tokio::time::sleep(READY_POLL).await;
            }
        }
        let view = self.view.load_full();
        if !self.in_window(&view) {
            return;
        }
        let me = &*view.self_id;
        let mut wanted = Vec::new();
        {
            let asked = self.asked.lock();
            let handed = self.handed.lock();
            for id in ids {
                if view.ring.owner(id) != Some(me)
                    || asked.contains(&id)
                    || self.local.owned().holds(id)
                {
                    continue;
                }
                let next = view.ring.replicas(id, 1);
                // A member not seen since this node started holds nothing of this one's.
                let Some(&next) = next
                    .first()
                    .filter(|m| !handed.contains(**m) && !view.awaits(m))
                else {
                    continue;
                };
                let Some(addr) = view.peer_addrs.get(next) else {
                    continue;
                };
                wanted.push((id, addr.clone()));
            }
        }
        if wanted.is_empty() {
            return;
        }
        let (done, merged) = oneshot::channel();
        let request = Request { ids: wanted, done };
        if self.queue.try_send(request).is_err() {
            return;
        }
        // Merged, given up (the task answers every request), or too slow: decide either way.
        let _ = tokio::time::timeout(RECALL_WAIT, merged).await;
    }

    /// Whether the recall window is open under `view`: it opens when this node is first ready
    /// or its ring first holds another member, and lasts [`RECALL_FOR_NS`].
    fn in_window(&self, view: &View) -> bool {
        if !self.active() {
            return false;
        }
        let now = self.local.now();
        let since = self.since.load(Ordering::Relaxed);
        if since == 0 {
            if view.ring.len() > 1 {
                self.since.store(now.max(1), Ordering::Relaxed);
            }
            return view.ring.len() > 1;
        }
        let all_handed = || {
            let handed = self.handed.lock();
            let me = &*view.self_id;
            view.ring
                .members()
                .iter()
                .all(|m| **m == *me || handed.contains(m) || view.awaits(m))
        };
        if now.saturating_sub(since) < RECALL_FOR_NS && !all_handed() {
            return true;
        }
        self.over.store(true, Ordering::Relaxed);
        self.asked.lock().clear();
        self.handed.lock().clear();
        self.local.copies().forget_recalled();
        false
    }
}

/// The recalling task's side.
struct Task {
    local: Arc<Local>,
    peers: Arc<Peers>,
    stats: Arc<RecallStats>,
    asked: Arc<Mutex<HashSet<u64>>>,
}

impl Task {
    /// Takes what queued, asks each member for its ids in one frame (all members at once),
    /// merges what came back, remembers every id as asked (nothing coming back is an answer
    /// too), then answers the callers. Ends when the [`Recall`] is dropped.
    async fn run(self, mut requests: mpsc::Receiver<Request>) {
        let mut links: HashMap<String, RecallLink> = HashMap::new();
        let mut batch = Vec::new();
        while requests.recv_many(&mut batch, QUEUE).await > 0 {
            let mut by_member: HashMap<String, Vec<u64>> = HashMap::new();
            for r in &batch {
                for (id, addr) in &r.ids {
                    by_member.entry(addr.clone()).or_default().push(*id);
                }
            }
            for (addr, ids) in &mut by_member {
                ids.sort_unstable();
                ids.dedup();
                links
                    .entry(addr.clone())
                    .or_insert_with(|| self.peers.recall_link(addr));
            }
            let asks = links
                .iter_mut()
                .filter_map(|(addr, link)| by_member.get(addr).map(|ids| (link, ids)))
                .map(|(link, ids)| async move { (ids, link.recall(ids).await) });
            let answers = futures::future::join_all(asks).await;
            let now = self.local.now();
            for (ids, answer) in answers {
                self.stats
                    .asked
                    .fetch_add(ids.len() as u64, Ordering::Relaxed);
                match answer {
                    Ok(buckets) => {
                        self.stats
                            .recalled
                            .fetch_add(buckets.len() as u64, Ordering::Relaxed);
                        for (id, state) in buckets {
                            self.local.recall_in(id, state, now);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "recall failed; deciding on what is here")
                    }
                }
                let mut asked = self.asked.lock();
                for &id in ids {
                    if asked.len() >= MOST_RECALLED {
                        break;
                    }
                    asked.insert(id);
                }
            }
            for r in batch.drain(..) {
                let _ = r.done.send(());
            }
        }
    }
}
