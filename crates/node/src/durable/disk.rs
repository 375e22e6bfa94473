//! The bucket file under `--data-dir` (`buckets.redb`): one table of bucket states by id, one
//! of replica copies, the members of the ring this node last saw, and a stamp saying whose
//! they are.
//!
//! A value is the time its state stops mattering (`BucketState::idle_at`, 8 bytes, little
//! endian) and then the state as it travels between nodes (`WireState`, bincode): the sweep
//! reads only the first 8 bytes, and a node restores a state exactly as it would take one
//! from a peer (the rule's tags stay behind; a debt is kept).
//!
//! The stamp (cluster id and node id) is written when the file is made and checked on every
//! open: a directory of another node or another cluster is refused, never merged.

use parking_lot::Mutex;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::WireState;
use std::path::{Path, PathBuf};

/// Bucket states by id: this node's own buckets.
const BUCKETS: TableDefinition<u64, &[u8]> = TableDefinition::new("buckets");
/// The replica copies this node keeps of other owners' buckets.
const COPIES: TableDefinition<u64, &[u8]> = TableDefinition::new("copies");

/// Which of the two kinds of bucket a table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// This node's own buckets.
    Owned,
    /// Replica copies of other owners' buckets.
    Copies,
}

impl Held {
    fn table(self) -> TableDefinition<'static, u64, &'static [u8]> {
        match self {
            Held::Owned => BUCKETS,
            Held::Copies => COPIES,
        }
    }
}
/// The other members of the ring this node last saw: node id → peer address. A node that
/// starts waits for them as the owners of their keys (`crate::cluster::membership::Remembered`):
/// their buckets are on their disks, not on this one.
const MEMBERS: TableDefinition<&str, &str> = TableDefinition::new("members");
/// Whose the buckets are: `cluster`, `node`, `format`.
const STAMP: TableDefinition<&str, &str> = TableDefinition::new("stamp");
/// The value layout this build writes and reads.
const FORMAT: &str = "1";
/// The file's name in `--data-dir`.
pub const FILE: &str = "buckets.redb";

/// Why the bucket file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path} is not a readable bucket file ({reason}); move it away to start empty")]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "{path} holds the buckets of node {node:?} of cluster {cluster:?}, not of this node \
         {want_node:?} of cluster {want_cluster:?}; point --data-dir at this node's own directory"
    )]
    Foreign {
        path: PathBuf,
        node: String,
        cluster: String,
        want_node: String,
        want_cluster: String,
    },
    #[error("{path} was written in bucket format {found:?}; this build reads {FORMAT:?}")]
    Format { path: PathBuf, found: String },
    #[error("writing {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

/// One table's writes: states to keep and ids to forget.
#[derive(Debug, Default)]
pub struct Batch {
    pub put: Vec<(u64, BucketState)>,
    pub delete: Vec<u64>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.delete.is_empty()
    }
}

/// Opens the database again (its file, or a test's backend).
type Reopen = Box<dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync>;

/// The open bucket file.
pub struct Disk {
    /// `None` after a failed write: redb refuses every later operation of a database whose
    /// I/O failed, so the next one opens the file again (a disk that takes writes again then
    /// works again).
    db: Mutex<Option<Database>>,
    reopen: Reopen,
    path: PathBuf,
    /// Set by [`Disk::close`]: never opened again.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("path", &self.path).finish()
    }
}

/// A stored value: `idle_at` then the wire state, into `out` (cleared first: one buffer
/// serves a whole commit).
fn encode_into(state: &BucketState, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&state.idle_at().to_le_bytes());
    // Encoding a plain enum into a Vec cannot fail; an empty tail would decode as corrupt.
    let _ =
        bincode::serde::encode_into_std_write(state.to_wire(), out, bincode::config::standard());
}

/// A stored value, in a buffer of its own.
#[cfg(test)]
fn encode(state: &BucketState) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(state, &mut out);
    out
}

/// When a stored value stops mattering (`None`: too short to be a value).
fn idle_at(value: &[u8]) -> Option<u64> {
    value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

/// A stored value's state (`None`: not one this build wrote).
fn decode(value: &[u8]) -> Option<BucketState> {
    let tail = value.get(8..)?;
    let (wire, used): (WireState, usize) =
        bincode::serde::decode_from_slice(tail, bincode::config::standard()).ok()?;
    (used == tail.len()).then(|| BucketState::from_wire(wire))
}

impl Disk {
    /// Opens (or makes) the bucket file in `dir`, stamped for `node` of `cluster`; refuses a
    /// file that does not read or that another node or cluster stamped.
    pub fn open(dir: &Path, cluster: &str, node: &str) -> Result<Self, DiskError> {
        let path = dir.join(FILE);
        let file = path.clone();
        Self::open_with(
            path,
            Box::new(move || Database::create(&file)),
            cluster,
            node,
        )
    }

    /// [`Disk::open`] through `reopen` (a file, or a test's storage), named `path`.
    fn open_with(
        path: PathBuf,
        reopen: Reopen,
        cluster: &str,
        node: &str,
    ) -> Result<Self, DiskError> {
        let unreadable = |e: &dyn std::fmt::Display| DiskError::Unreadable {
            path: path.clone(),
            reason: e.to_string(),
        };
        let db = reopen().map_err(|e| unreadable(&e))?;
        let tx = db.begin_write().map_err(|e| unreadable(&e))?;
        {
            let mut stamp = tx.open_table(STAMP).map_err(|e| unreadable(&e))?;
            let get = |t: &redb::Table<&str, &str>, k: &str| -> Result<Option<String>, DiskError> {
                Ok(t.get(k)
                    .map_err(|e| unreadable(&e))?
                    .map(|v| v.value().to_owned()))
            };
            match (get(&stamp, "cluster")?, get(&stamp, "node")?) {
                (None, None) => {
                    for (k, v) in [("cluster", cluster), ("node", node), ("format", FORMAT)] {
                        stamp.insert(k, v).map_err(|e| unreadable(&e))?;
                    }
                }
                (Some(c), Some(n)) if c == cluster && n == node => {
                    let found = get(&stamp, "format")?.unwrap_or_default();
                    if found != FORMAT {
                        return Err(DiskError::Format { path, found });
                    }
                }
                (c, n) => {
                    return Err(DiskError::Foreign {
                        path,
                        node: n.unwrap_or_default(),
                        cluster: c.unwrap_or_default(),
                        want_node: node.to_owned(),
                        want_cluster: cluster.to_owned(),
                    });
                }
            }
            tx.open_table(BUCKETS).map_err(|e| unreadable(&e))?;
            tx.open_table(COPIES).map_err(|e| unreadable(&e))?;
            tx.open_table(MEMBERS).map_err(|e| unreadable(&e))?;
        }
        tx.commit().map_err(|e| unreadable(&e))?;
        Ok(Self {
            db: Mutex::new(Some(db)),
            reopen,
            path,
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether [`Disk::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes the file for good (its lock released): after the last flush at exit, a task of
    /// the stopping node that still runs cannot write after it, nor keep the file from the
    /// node's next life.
    pub fn close(&self) {
        let mut db = self.db.lock();
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        *db = None;
    }

    /// Runs `f` on the database, opened again first if a write failed before; a failure of
    /// `f` drops it (see [`Disk::db`]).
    fn with_db<T>(&self, f: impl FnOnce(&Database) -> Result<T, String>) -> Result<T, String> {
        let mut db = self.db.lock();
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("closed: the node has stopped".into());
        }
        if db.is_none() {
            *db = Some((self.reopen)().map_err(|e| e.to_string())?);
        }
        let Some(open) = db.as_ref() else {
            return Err("not open".into());
        };
        let out = f(open);
        if out.is_err() {
            *db = None;
        }
        out
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every stored bucket still mattering at `now`, and how many values did not decode
    /// (left out).
    pub fn load(&self, held: Held, now: u64) -> Result<(Vec<(u64, BucketState)>, u64), DiskError> {
        self.with_db(|db| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let tx = db.begin_read().map_err(|x| e(&x))?;
            let table = tx.open_table(held.table()).map_err(|x| e(&x))?;
            let n = usize::try_from(table.len().unwrap_or(0)).unwrap_or(0);
            let mut out = Vec::with_capacity(n);
            let mut bad = 0;
            for entry in table.iter().map_err(|x| e(&x))? {
                let (k, v) = entry.map_err(|x| e(&x))?;
                let v = v.value();
                if idle_at(v).is_some_and(|at| at <= now) {
                    continue;
                }
                match decode(v) {
                    Some(state) => out.push((k.value(), state)),
                    None => bad += 1,
                }
            }
            Ok((out, bad))
        })
        .map_err(|reason| DiskError::Unreadable {
            path: self.path.clone(),
            reason,
        })
    }

    /// Writes each table's batch in one transaction, flushed to the disk before it returns.
    pub fn commit(&self, batches: &[(Held, &Batch)]) -> Result<(), DiskError> {
        self.with_db(|db| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let tx = db.begin_write().map_err(|x| e(&x))?;
            let mut value = Vec::with_capacity(64);
            for (held, batch) in batches {
                let mut table = tx.open_table(held.table()).map_err(|x| e(&x))?;
                for (id, state) in &batch.put {
                    encode_into(state, &mut value);
                    table.insert(*id, value.as_slice()).map_err(|x| e(&x))?;
                }
                for id in &batch.delete {
                    table.remove(*id).map_err(|x| e(&x))?;
                }
            }
            tx.commit().map_err(|x| e(&x))
        })
        .map_err(|reason| DiskError::Write {
            path: self.path.clone(),
            reason,
        })
    }

    /// The members kept by [`Disk::remember_members`]: node id and peer address, by id.
    pub fn members(&self) -> Result<Vec<(String, String)>, DiskError> {
        self.with_db(|db| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let tx = db.begin_read().map_err(|x| e(&x))?;
            let table = tx.open_table(MEMBERS).map_err(|x| e(&x))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|x| e(&x))? {
                let (k, v) = entry.map_err(|x| e(&x))?;
                out.push((k.value().to_owned(), v.value().to_owned()));
            }
            Ok(out)
        })
        .map_err(|reason| DiskError::Unreadable {
            path: self.path.clone(),
            reason,
        })
    }

    /// Replaces the members kept with `members` (node id, peer address), in one transaction.
    pub fn remember_members(&self, members: &[(String, String)]) -> Result<(), DiskError> {
        self.with_db(|db| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let tx = db.begin_write().map_err(|x| e(&x))?;
            {
                let mut table = tx.open_table(MEMBERS).map_err(|x| e(&x))?;
                table.retain(|_, _| false).map_err(|x| e(&x))?;
                for (id, addr) in members {
                    table
                        .insert(id.as_str(), addr.as_str())
                        .map_err(|x| e(&x))?;
                }
            }
            tx.commit().map_err(|x| e(&x))
        })
        .map_err(|reason| DiskError::Write {
            path: self.path.clone(),
            reason,
        })
    }

    /// Ids of stored buckets that no longer matter at `now` (the sweep deletes them).
    pub fn idle(&self, held: Held, now: u64) -> Result<Vec<u64>, DiskError> {
        self.with_db(|db| {
            let e = |e: &dyn std::fmt::Display| e.to_string();
            let tx = db.begin_read().map_err(|x| e(&x))?;
            let table = tx.open_table(held.table()).map_err(|x| e(&x))?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(|x| e(&x))? {
                let (k, v) = entry.map_err(|x| e(&x))?;
                if idle_at(v.value()).is_none_or(|at| at <= now) {
                    out.push(k.value());
                }
            }
            Ok(out)
        })
        .map_err(|reason| DiskError::Unreadable {
            path: self.path.clone(),
            reason,
        })
    }

    /// Buckets stored in `held`'s table.
    pub fn len(&self, held: Held) -> u64 {
        let db = self.db.lock();
        db.as_ref()
            .and_then(|db| db.begin_read().ok())
            .and_then(|tx| tx.open_table(held.table()).ok())
            .and_then(|t| t.len().ok())
            .unwrap_or(0)
    }

    /// The file's size in bytes.
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}

/// Storage for tests that fails every write and sync while told to (a full disk).
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub struct FailingStorage {
    inner: std::sync::Arc<redb::backends::InMemoryBackend>,
    pub full: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(test)]
impl FailingStorage {
    fn refuse(&self) -> Result<(), std::io::Error> {
        if self.full.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::other("no space left on device (test)"));
        }
        Ok(())
    }
}

#[cfg(test)]
impl redb::StorageBackend for FailingStorage {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, std::io::Error> {
        self.inner.read(offset, len)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.refuse()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self, eventual: bool) -> Result<(), std::io::Error> {
        self.refuse()?;
        self.inner.sync_data(eventual)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.refuse()?;
        self.inner.write(offset, data)
    }
}

#[cfg(test)]
impl Disk {
    /// A bucket file on `storage` (see [`FailingStorage`]).
    pub fn on_storage(storage: FailingStorage) -> Self {
        let reopen: Reopen =
            Box::new(move || Database::builder().create_with_backend(storage.clone()));
        match Self::open_with(PathBuf::from("test-storage"), reopen, "c", "n1") {
            Ok(disk) => disk,
            Err(e) => panic!("test storage: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000_000;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temp dir")
    }

    #[test]
    fn states_come_back_as_they_went_in_and_idle_ones_stay_out() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let used = BucketState::Fixed {
            end: T0 + 1_000,
            count: 7,
            period_tag: 0,
        };
        let idle = BucketState::Gcra { tat: T0, tag: 0 };
        let batch = Batch {
            put: vec![(1, used.clone()), (2, idle), (3, used.clone())],
            delete: vec![],
        };
        disk.commit(&[(Held::Owned, &batch)]).expect("written");
        let delete = Batch {
            put: vec![],
            delete: vec![3],
        };
        disk.commit(&[(Held::Owned, &delete)]).expect("deleted");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        let (loaded, bad) = disk.load(Held::Owned, T0).expect("reads");
        assert_eq!((loaded, bad), (vec![(1, used)], 0));
        assert_eq!(disk.idle(Held::Owned, T0).expect("reads"), vec![2]);
        assert_eq!(disk.load(Held::Copies, T0).expect("reads").0, vec![]);
        assert!(disk.bytes() > 0);
    }

    #[test]
    fn the_members_kept_are_the_last_written_and_come_back_after_a_reopen() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        assert_eq!(disk.members().expect("reads"), vec![]);
        let pair = |id: &str, addr: &str| (id.to_owned(), addr.to_owned());
        disk.remember_members(&[pair("n2", "10.0.0.2:7946"), pair("n3", "10.0.0.3:7946")])
            .expect("written");
        disk.remember_members(&[pair("n3", "10.0.0.9:7946"), pair("n4", "10.0.0.4:7946")])
            .expect("replaced");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(
            disk.members().expect("reads"),
            vec![pair("n3", "10.0.0.9:7946"), pair("n4", "10.0.0.4:7946")]
        );
    }

    #[test]
    fn another_nodes_or_clusters_directory_is_refused() {
        let d = dir();
        drop(Disk::open(d.path(), "c", "n1").expect("opens"));
        let e = Disk::open(d.path(), "c", "n2").expect_err("another node's");
        assert!(e.to_string().contains("node \"n1\""), "{e}");
        let e = Disk::open(d.path(), "other", "n1").expect_err("another cluster's");
        assert!(matches!(e, DiskError::Foreign { .. }), "{e}");
    }

    #[test]
    fn a_file_that_is_not_a_bucket_file_is_refused() {
        let d = dir();
        std::fs::write(
            d.path().join(FILE),
            b"not a database, just some bytes".repeat(200),
        )
        .expect("written");
        let e = Disk::open(d.path(), "c", "n1").expect_err("corrupt");
        assert!(e.to_string().contains("not a readable bucket file"), "{e}");
    }

    #[test]
    fn a_value_that_does_not_decode_is_counted_and_left_out() {
        assert_eq!(decode(&[1, 2, 3]), None);
        let mut v = encode(&BucketState::Gcra { tat: T0, tag: 3 });
        assert_eq!(decode(&v), Some(BucketState::Gcra { tat: T0, tag: 0 }));
        v.push(0);
        assert_eq!(decode(&v), None, "trailing bytes");
    }
}
