//! Blocks through the peer link: every member learns every block, so that a blocked key is
//! answered on the node a request reaches. Each round ([`ANNOUNCE_EVERY`]) this node sends the
//! changes waiting in its outbox (blocks it decided as a key's owner, and the admin API's
//! changes made through it) to every other live member, at most [`MAX_PER_ROUND`] a round;
//! a member it has not synced yet (it joined, restarted, or an announcement to it failed) is
//! sent every block this node holds instead, in frames of [`CHUNK`]. Gossip carries none of
//! it: a million blocks would not fit in chitchat's state.
//!
//! It also keeps the managed blocks under `--data-dir` (`blocks.json`), saved in the round
//! after they change (here or announced by a member), and read back at start.

use crate::blocks::{BlockChange, Blocklist};
use crate::cluster::{MemberState, View};
use crate::peers::Peers;
use arc_swap::ArcSwap;
use ringlimit_core::clock::{Clock, NANOS_PER_MS};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often waiting changes are announced: a block is in force on every member within about
/// this (plus a round trip).
pub const ANNOUNCE_EVERY: Duration = Duration::from_millis(250);
/// Most changes announced per round: a storm of new blocks costs each member at most this
/// many entries a round (the rest wait; the outbox is bounded and coalesced).
pub const MAX_PER_ROUND: usize = 10_000;
/// Changes per frame: 2,000 of the largest (512-byte key, 256-byte reason) stay under the
/// peer link's frame limit.
pub const CHUNK: usize = 2_000;
/// How long one member may take to take one frame.
const WITHIN: Duration = Duration::from_secs(2);
/// The file under `--data-dir`.
pub const FILE: &str = "blocks.json";

/// The announcer: this node's blocks, to every member.
pub struct Announcer {
    pub blocks: Arc<Blocklist>,
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
    pub clock: Arc<dyn Clock>,
    pub data_dir: Option<PathBuf>,
}

impl Announcer {
    /// Announces every [`ANNOUNCE_EVERY`], until dropped.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(ANNOUNCE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Members (by id and incarnation) sent every block already.
        let mut synced: HashSet<(String, u64)> = HashSet::new();
        loop {
            tick.tick().await;
            self.round(&mut synced).await;
        }
    }

    /// One round: the waiting changes to synced members, everything to the others.
    pub async fn round(&self, synced: &mut HashSet<(String, u64)>) {
        let changes = self.blocks.outbox.take(MAX_PER_ROUND);
        let now_ms = self.clock.now() / NANOS_PER_MS;
        let view = self.view.load_full();
        let members: Vec<_> = view
            .members
            .iter()
            .filter(|m| m.state == MemberState::Alive && *m.node_id != *view.self_id)
            .map(|m| ((m.node_id.clone(), m.generation), m.peer_addr.clone()))
            .collect();
        synced.retain(|s| members.iter().any(|(m, _)| m == s));
        let mut all: Option<Vec<BlockChange>> = None;
        let mut sends = Vec::new();
        for (member, addr) in members {
            let fresh = !synced.contains(&member);
            let set = if fresh {
                all.get_or_insert_with(|| self.blocks.table.all(now_ms))
                    .clone()
            } else if changes.is_empty() {
                continue;
            } else {
                changes.clone()
            };
            let peers = self.peers.clone();
            sends.push(async move {
                let ok = send(&peers, &addr, set).await;
                (member, ok)
            });
        }
        for (member, ok) in futures::future::join_all(sends).await {
            if ok {
                synced.insert(member);
            } else {
                // Sent everything again once it answers.
                synced.remove(&member);
            }
        }
        if self.blocks.take_dirty() {
            self.save(now_ms);
        }
    }

    /// Saves the managed blocks under `--data-dir`, if any (a failure is logged: the blocks
    /// stay in force, and every member has them).
    fn save(&self, now_ms: u64) {
        let Some(dir) = &self.data_dir else {
            return;
        };
        if let Err(e) = save(dir, &self.blocks.table.managed(now_ms)) {
            tracing::warn!(error = %e, "managed blocks not saved under --data-dir");
        }
    }
}

/// Sends `set` to the member at `addr` in frames of [`CHUNK`]; whether every frame was taken.
async fn send(peers: &Peers, addr: &str, set: Vec<BlockChange>) -> bool {
    if set.is_empty() {
        // A member with nothing to learn is synced once it answers at all.
        return peers.blocks(addr, Vec::new(), WITHIN).await.is_ok();
    }
    for chunk in set.chunks(CHUNK) {
        match peers.blocks(addr, chunk.to_vec(), WITHIN).await {
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(%addr, error = %e, "blocks not announced; sending all later");
                return false;
            }
        }
    }
    true
}

/// Writes `blocks` to `dir/blocks.json` (through a temporary file: a crash leaves the old one).
pub fn save(dir: &Path, blocks: &[BlockChange]) -> std::io::Result<()> {
    let json = serde_json::to_vec(blocks).map_err(std::io::Error::other)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, &json)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(FILE)).map_err(|e| e.error)?;
    Ok(())
}

/// Reads `dir/blocks.json`; nothing when it is absent.
pub fn load(dir: &Path) -> Result<Vec<BlockChange>, String> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a blocks file: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}
