//! The bucket files under `--data-dir`: a snapshot (`buckets.snap`) of the owned buckets, the
//! replica copies and the ring's members, and the logs (`buckets.<generation>.log`) of every
//! commit since, each file stamped with whose buckets they are.
//!
//! Why a format of its own: the measured embedded stores cost too much per changed bucket
//! (redb's B-tree insert of a random id dirties a page of its own, copied and checksummed at
//! every commit; fjall's commits stall behind its compactions: see
//! `bench/notes/durable-store.md`). A commit here is one sequential append of the interval's
//! records and one `fdatasync`; a snapshot is one sequential write; a restore is two
//! sequential reads. What a changed bucket costs is its encoding and its bytes.
//!
//! # Layout
//! Every file is a sequence of frames: `len: u32`, `xxh3(payload): u64` (little endian), then
//! `len` bytes of payload. The first frame is the header: [`MAGIC`], the file's kind
//! (snapshot or log), the format ([`FORMAT`]), its generation, the cluster id and the node id
//! (the stamp: a directory of another node or cluster is refused, never merged). The other
//! frames hold records:
//! - a put: the table (owned or copies), the id, and the value: the time its state stops
//!   mattering (`BucketState::idle_at`, 8 bytes) then the state as it travels between nodes
//!   (`WireState`, bincode), so that a node restores a state exactly as it would take one from
//!   a peer (the rule's tags stay behind; a debt is kept);
//! - a delete: the table and the id (of an id never stored: harmless);
//! - the members: the whole list of the ring's other members (id, peer address), replacing
//!   the last;
//! - the end of a snapshot, with its count of puts.
//!
//! A log's commit is all of an interval's records, in frames of about [`CHUNK`] bytes (each
//! checksummed as soon as it is full), written with one `write` and flushed with one
//! `fdatasync` before the commit returns; a commit cut short keeps its frames that check,
//! each record newer than what it replaces. The write bypasses the page cache (`O_DIRECT`)
//! where the file system allows it, so it is whole blocks from a block boundary: the log's
//! last partial block again (its bytes kept in memory), then the commit, padded with zeros to
//! a whole block. The bytes it rewrites are the ones already there, so a write torn by a power
//! loss loses only (part of) the commit being written. A log may therefore end in zeros, which
//! end it like a cut frame but say nothing was lost. Where `O_DIRECT` is refused, appends go
//! through the page cache. A frame that does not check (a commit the process died in) ends its
//! log: what follows is ignored, never an error, and the log is cut there before anything is
//! appended. A snapshot is written whole to `buckets.snap.tmp` (past the page cache too, where
//! allowed, its last block cut to its length), flushed, and renamed over `buckets.snap`: one
//! that does not check to its end frame is refused at start with one clear line.
//!
//! # Generations
//! A snapshot of generation `g` holds everything the logs before `g` held; restore reads it
//! and replays the logs of generation `g` and later, in order. A compaction first starts the
//! log of the next generation (commits go on there), then writes the snapshot of that
//! generation, then deletes the older logs: a crash at any point leaves a snapshot and every
//! log written since it, so nothing is ever read twice nor missed.

use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::WireState;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

/// The snapshot's name in `--data-dir`.
pub const SNAPSHOT: &str = "buckets.snap";
/// A snapshot being written (removed at start: an unfinished one is never read).
const SNAPSHOT_TMP: &str = "buckets.snap.tmp";
/// The file of the format before this one (redb): refused, see [`DiskError::OldFormat`].
pub const OLD_FILE: &str = "buckets.redb";
/// The first bytes of every header.
const MAGIC: &[u8; 8] = b"rlbucket";
/// The record layout this build writes and reads.
pub(super) const FORMAT: u32 = 2;
/// A frame's length and checksum.
const FRAME_HEAD: usize = 12;
/// A snapshot's records and a commit's are written in frames of about this many bytes.
const CHUNK: usize = 64 << 10;
/// A frame longer than this is not one this build wrote.
const MAX_FRAME: u32 = 1 << 30;

const KIND_SNAPSHOT: u8 = 1;
const KIND_LOG: u8 = 2;
/// The live reservations (see `super::reservations`).
pub(super) const KIND_RESERVATIONS: u8 = 3;

const PUT_OWNED: u8 = 1;
const PUT_COPY: u8 = 2;
const DELETE_OWNED: u8 = 3;
const DELETE_COPY: u8 = 4;
const MEMBERS: u8 = 5;
const END: u8 = 6;

/// Which of the two kinds of bucket a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// This node's own buckets.
    Owned = 0,
    /// Replica copies of other owners' buckets.
    Copies = 1,
}

impl Held {
    fn put(self) -> u8 {
        match self {
            Held::Owned => PUT_OWNED,
            Held::Copies => PUT_COPY,
        }
    }

    fn delete(self) -> u8 {
        match self {
            Held::Owned => DELETE_OWNED,
            Held::Copies => DELETE_COPY,
        }
    }
}

/// Why the bucket files cannot be used.
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
    #[error("{path} was written in bucket format {found}; this build reads {FORMAT}")]
    Format { path: PathBuf, found: u32 },
    #[error(
        "{path} is a bucket file of an earlier format (redb), which this build does not read; \
         move it away to start empty"
    )]
    OldFormat { path: PathBuf },
    #[error("writing {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

/// One table's writes: states to keep and ids to forget.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct Batch {
    pub put: Vec<(u64, BucketState)>,
    pub delete: Vec<u64>,
}

#[cfg(test)]
impl Batch {
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.delete.is_empty()
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.put.clear();
        self.delete.clear();
    }
}

/// Hashes a bucket id by itself: ids are already hashes (xxh3 of rule and key).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64s are hashed here; anything else is folded in, never lost.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

/// Bucket ids to what is stored under them.
type ById<T> = HashMap<u64, T, BuildHasherDefault<IdHasher>>;

/// A stored value: when it stops mattering, and its state (`None`: it did not decode).
#[derive(Debug, Clone)]
struct Stored {
    idle_at: u64,
    state: Option<BucketState>,
}

/// Everything the files hold, as restore replays it.
#[derive(Debug, Default)]
struct Contents {
    owned: ById<Stored>,
    copies: ById<Stored>,
    members: Vec<(String, String)>,
}

impl Contents {
    fn table(&mut self, held: Held) -> &mut ById<Stored> {
        match held {
            Held::Owned => &mut self.owned,
            Held::Copies => &mut self.copies,
        }
    }

    /// Applies one frame's records; `Err` when they do not parse (not a torn write: the
    /// frame checked).
    fn apply(&mut self, mut r: &[u8]) -> Result<Option<u64>, String> {
        let mut end = None;
        while let Some((&tag, rest)) = r.split_first() {
            r = rest;
            match tag {
                PUT_OWNED | PUT_COPY => {
                    let id = take_u64(&mut r)?;
                    let len = take_u32(&mut r)? as usize;
                    let value = take(&mut r, len)?;
                    let held = if tag == PUT_OWNED {
                        Held::Owned
                    } else {
                        Held::Copies
                    };
                    let idle_at = idle_at(value).ok_or("a value shorter than its time")?;
                    let stored = Stored {
                        idle_at,
                        state: decode(value),
                    };
                    self.table(held).insert(id, stored);
                }
                DELETE_OWNED => {
                    self.owned.remove(&take_u64(&mut r)?);
                }
                DELETE_COPY => {
                    self.copies.remove(&take_u64(&mut r)?);
                }
                MEMBERS => {
                    let n = take_u32(&mut r)?;
                    let mut members = Vec::new();
                    for _ in 0..n {
                        members.push((take_str(&mut r)?, take_str(&mut r)?));
                    }
                    self.members = members;
                }
                END => end = Some(take_u64(&mut r)?),
                other => return Err(format!("a record of unknown kind {other}")),
            }
        }
        Ok(end)
    }

    /// When the first stored state stops mattering (`u64::MAX`: none stored).
    fn first_idle(&self) -> u64 {
        self.owned
            .values()
            .chain(self.copies.values())
            .map(|s| s.idle_at)
            .min()
            .unwrap_or(u64::MAX)
    }
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if r.len() < n {
        return Err("a record cut short".into());
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

fn take_u64(r: &mut &[u8]) -> Result<u64, String> {
    let b = take(r, 8)?;
    Ok(u64::from_le_bytes(b.try_into().map_err(|_| "cut short")?))
}

fn take_u32(r: &mut &[u8]) -> Result<u32, String> {
    let b = take(r, 4)?;
    Ok(u32::from_le_bytes(b.try_into().map_err(|_| "cut short")?))
}

fn take_str(r: &mut &[u8]) -> Result<String, String> {
    let len = take_u32(r)? as usize;
    String::from_utf8(take(r, len)?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The most a put record of a fixed-size state takes: tag, id, length, `idle_at`, and the
/// state's variant and at most three varints.
const MAX_FIXED_RECORD: usize = 1 + 8 + 4 + 8 + 1 + 3 * 9;

/// A put record of `state` into `out`. A fixed-size state's record is built on the stack and
/// appended in one copy (pushed byte by byte into the commit's buffer, each push checked the
/// buffer's room).
fn encode_put(out: &mut Vec<u8>, held: Held, id: u64, state: &BucketState) {
    let mut rec = [0; MAX_FIXED_RECORD];
    rec[0] = held.put();
    rec[1..9].copy_from_slice(&id.to_le_bytes());
    rec[13..21].copy_from_slice(&state.idle_at().to_le_bytes());
    if let Some(end) = encode_fixed(&mut rec, 21, state) {
        rec[9..13].copy_from_slice(&((end - 13) as u32).to_le_bytes());
        // Copied whole (a fixed size: a few moves, inlined) and cut to the record's length: a
        // copy of its own length is a call to the C library's memmove for each record.
        let start = out.len();
        out.extend_from_slice(&rec);
        out.truncate(start + end);
        return;
    }
    let len_at = out.len() + 9;
    out.extend_from_slice(&rec[..21]);
    encode_state(out, state);
    let len = (out.len() - len_at - 4) as u32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

/// `state.to_wire()` as bincode's standard configuration encodes it (varints, little endian),
/// written by hand for the fixed-size states: through serde it was a large part of the disk
/// follower's and the snapshot's threads under a flood of new keys
/// (`bench/notes/durable-store.md`). The bytes are the same (a test holds them to bincode's),
/// so files written either way read alike. A sliding log's goes through bincode.
fn encode_state(out: &mut Vec<u8>, state: &BucketState) {
    let mut rec = [0; MAX_FIXED_RECORD];
    match encode_fixed(&mut rec, 0, state) {
        Some(end) => out.extend_from_slice(&rec[..end]),
        None => {
            // Encoding a plain enum into a Vec cannot fail; an empty tail would decode as
            // corrupt.
            let _ = bincode::serde::encode_into_std_write(
                state.to_wire(),
                out,
                bincode::config::standard(),
            );
        }
    }
}

/// A fixed-size state's wire form (see [`encode_state`]) into `rec` from `at`: where it ends,
/// or `None` for a sliding log's. `at` leaves room for the state (at most 28 bytes).
#[inline(always)]
fn encode_fixed(rec: &mut [u8; MAX_FIXED_RECORD], at: usize, state: &BucketState) -> Option<usize> {
    // The variants' indexes in `WireState`.
    const GCRA: u64 = 0;
    const FIXED: u64 = 1;
    const SLIDING: u64 = 2;
    Some(match *state {
        BucketState::Gcra { tat, .. } => {
            let at = varint(rec, at, GCRA);
            varint(rec, at, tat)
        }
        BucketState::Fixed { end, count, .. } => {
            let at = varint(rec, at, FIXED);
            let at = varint(rec, at, end);
            varint(rec, at, u64::from(count))
        }
        BucketState::Sliding {
            until,
            current,
            previous,
            ..
        } => {
            let at = varint(rec, at, SLIDING);
            let at = varint(rec, at, until);
            let at = varint(rec, at, u64::from(current));
            varint(rec, at, u64::from(previous))
        }
        BucketState::Log(_) => return None,
    })
}

/// bincode's varint of an unsigned integer into `rec` at `at` (where it ends is returned):
/// below 251 one byte, else a marker (251, 252, 253) and the value in 2, 4 or 8 bytes,
/// little endian.
#[inline(always)]
fn varint(rec: &mut [u8; MAX_FIXED_RECORD], at: usize, v: u64) -> usize {
    if v < 251 {
        rec[at] = v as u8;
        at + 1
    } else if let Ok(v) = u16::try_from(v) {
        rec[at] = 251;
        rec[at + 1..at + 3].copy_from_slice(&v.to_le_bytes());
        at + 3
    } else if let Ok(v) = u32::try_from(v) {
        rec[at] = 252;
        rec[at + 1..at + 5].copy_from_slice(&v.to_le_bytes());
        at + 5
    } else {
        rec[at] = 253;
        rec[at + 1..at + 9].copy_from_slice(&v.to_le_bytes());
        at + 9
    }
}

fn encode_members(out: &mut Vec<u8>, members: &[(String, String)]) {
    out.push(MEMBERS);
    out.extend_from_slice(&(members.len() as u32).to_le_bytes());
    for (id, addr) in members {
        put_str(out, id);
        put_str(out, addr);
    }
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

/// Starts a frame in `out` (cleared): its head is filled in by [`seal`].
pub(super) fn open_frame(out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; FRAME_HEAD]);
}

/// Fills in the head of the frame `out` holds.
pub(super) fn seal(out: &mut [u8]) {
    let (head, payload) = out.split_at_mut(FRAME_HEAD);
    head.copy_from_slice(&frame_head(payload));
}

/// The head of a frame of `payload`: its length and checksum.
fn frame_head(payload: &[u8]) -> [u8; FRAME_HEAD] {
    let mut head = [0; FRAME_HEAD];
    head[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[4..].copy_from_slice(&xxh3_64(payload).to_le_bytes());
    head
}

/// The frame at the start of `bytes`: its payload and its whole length; `None` when it is
/// cut short or does not check.
pub(super) fn frame(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    if len > MAX_FRAME {
        return None;
    }
    let sum = u64::from_le_bytes(bytes.get(4..FRAME_HEAD)?.try_into().ok()?);
    let payload = bytes.get(FRAME_HEAD..FRAME_HEAD + len as usize)?;
    (xxh3_64(payload) == sum).then_some((payload, FRAME_HEAD + len as usize))
}

/// Whose a file is, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) kind: u8,
    pub(super) format: u32,
    pub(super) generation: u64,
    pub(super) cluster: String,
    pub(super) node: String,
}

impl Header {
    pub(super) fn frame(&self) -> Vec<u8> {
        let mut out = Vec::new();
        open_frame(&mut out);
        out.extend_from_slice(MAGIC);
        out.push(self.kind);
        out.extend_from_slice(&self.format.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        put_str(&mut out, &self.cluster);
        put_str(&mut out, &self.node);
        seal(&mut out);
        out
    }

    pub(super) fn parse(mut r: &[u8]) -> Result<Self, String> {
        if take(&mut r, MAGIC.len())? != MAGIC {
            return Err("not a ringlimit bucket file".into());
        }
        let kind = *take(&mut r, 1)?.first().ok_or("cut short")?;
        Ok(Self {
            kind,
            format: take_u32(&mut r)?,
            generation: take_u64(&mut r)?,
            cluster: take_str(&mut r)?,
            node: take_str(&mut r)?,
        })
    }
}

/// The log of generation `generation`'s name.
fn log_name(generation: u64) -> String {
    format!("buckets.{generation:016x}.log")
}

/// The generation a log's name says (`None`: not a log's name).
fn log_generation(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("buckets.")?.strip_suffix(".log")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Flushes a directory's entries (a rename or a new file) to the disk.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The log commits are appended to.
#[derive(Debug)]
struct Log {
    file: File,
    generation: u64,
    /// Where the last complete commit ends: the next one is written there.
    end: u64,
    /// A write failed since the last complete commit: the file may hold part of a frame past
    /// `end`, cut off before the next write.
    torn: bool,
    /// Appends bypass the page cache (`O_DIRECT`); false where the file system refused it.
    direct: bool,
    /// The log's bytes from the last block boundary to `end`: a direct append writes them
    /// again, ahead of the commit.
    tail: Vec<u8>,
}

impl Log {
    /// A log of `generation` whose complete commits end at `end`, `tail` its bytes from the
    /// last block boundary on, opened for appends at `path`.
    fn open(path: &Path, generation: u64, end: u64, tail: &[u8]) -> std::io::Result<Self> {
        let (file, direct) = open_append(path)?;
        Ok(Self {
            file,
            generation,
            end,
            torn: false,
            direct,
            tail: tail.to_vec(),
        })
    }

    /// `written` (the file's bytes from the last block boundary on, the tail then a commit)
    /// is on disk: the log ends after it.
    fn appended(&mut self, written: &[u8]) {
        self.end += (written.len() - self.tail.len()) as u64;
        self.tail.clear();
        self.tail
            .extend_from_slice(&written[written.len() - written.len() % BLOCK..]);
    }
}

/// Opens the log at `path` for appends: bypassing the page cache where the file system allows
/// it (then true), through it where not. A commit is written once and read back only by a
/// restore, so the copy into the page cache (a large part of the follower's kernel time) buys
/// nothing.
fn open_append(path: &Path) -> std::io::Result<(File, bool)> {
    open_for_writes(OpenOptions::new().write(true), path)
}

/// Opens `path` with `options` and `O_DIRECT` where the file system allows it (then true),
/// without where not.
fn open_for_writes(options: &OpenOptions, path: &Path) -> std::io::Result<(File, bool)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(file) = options.clone().custom_flags(libc::O_DIRECT).open(path) {
            return Ok((file, true));
        }
    }
    Ok((options.open(path)?, false))
}

/// Reopens `path` for writes through the page cache, for a file system that let `O_DIRECT`
/// open but refused a direct write (`e`: `EINVAL`, nothing written). Said once a process: each
/// new log and snapshot opens direct again, and would say it again.
fn reopen_buffered(path: &Path, e: &std::io::Error) -> std::io::Result<File> {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            path = %path.display(),
            error = %e,
            "direct writes under --data-dir refused; using the page cache"
        );
    });
    OpenOptions::new().write(true).open(path)
}

/// The unit of a direct write: its address in memory, its place in the file and its length
/// are multiples of it. 4 KiB covers the logical blocks of today's disks (512 B or 4 KiB); a
/// file system that wants more refuses the write, and the log goes through the page cache.
const BLOCK: usize = 4096;

/// Readies `buf[from..]` (bytes to be written from a block boundary of the file) for a direct
/// write: at a block-aligned address (moved there if the buffer grew since [`lay_out`])
/// and padded with zeros to whole blocks. Returns where they start and the padded length;
/// `buf` holds them, padding included, from there on.
fn whole_blocks(buf: &mut Vec<u8>, from: usize) -> (usize, usize) {
    let len = buf.len() - from;
    let padded = len.next_multiple_of(BLOCK);
    // Room for the padding and for a move to the next aligned address, so that neither the
    // resize nor the move below allocates (which would move the bytes again).
    buf.reserve(padded - len + 2 * BLOCK);
    let aligned = buf[from..].as_ptr().align_offset(BLOCK) == 0;
    let at = if aligned {
        from
    } else {
        buf.as_ptr().align_offset(BLOCK)
    };
    buf.resize(buf.len().max(at + padded), 0);
    if !aligned {
        buf.copy_within(from..from + len, at);
    }
    buf[at + len..at + padded].fill(0);
    buf.truncate(at + padded);
    (at, padded)
}

/// What the open files are and hold.
#[derive(Debug)]
struct Files {
    log: Log,
    /// Bytes of the logs before `log` (kept until the snapshot of `log`'s generation is).
    older_logs: u64,
    snapshot_bytes: u64,
    members: Vec<(String, String)>,
    /// What the files held when opened, owned buckets and copies, until restore takes it.
    opened: [Option<ById<Stored>>; 2],
    /// When the first state stored when the files were opened stops mattering.
    first_idle_at_open: u64,
}

/// Starts a commit in `buf` (cleared): `tail` (the log's bytes from its last block boundary)
/// at a block-aligned address, since a direct write starts at the tail's block boundary.
/// Returns where the commit's first frame goes.
fn lay_out(buf: &mut Vec<u8>, tail: &[u8]) -> usize {
    buf.clear();
    buf.reserve(BLOCK + tail.len());
    let pad = buf.as_ptr().align_offset(BLOCK);
    buf.resize(pad, 0);
    buf.extend_from_slice(tail);
    buf.len()
}

/// The next commit, encoded as the disk follower's drains gather its records (between
/// [`Disk::begin`] and [`Disk::commit_pending`]): its records go straight into the buffer the
/// commit is written from, in the order the drains read the changes. Gathered as a list of
/// states first, each was written into the list, read back to be encoded and read again to be
/// counted, a large part of the follower's thread under a flood of new keys
/// (`bench/notes/durable-store.md`).
#[derive(Debug, Default)]
pub struct Pending {
    /// The log's tail, then the sealed frames.
    buf: Vec<u8>,
    /// Where the first frame starts in `buf` (the log's tail precedes it).
    frames: usize,
    /// The records of the frame being filled, copied into `buf` when it is sealed. Encoded
    /// straight into `buf`, a flood's commit of several MiB missed the caches on every line it
    /// wrote, and each record waited for those writes; this one stays in the cache, and a
    /// frame's bulk copy writes whole lines (`bench/notes/durable-store.md`).
    frame: Vec<u8>,
    /// The log's generation and end it was laid out for (`None`: not begun).
    log: Option<(u64, u64)>,
    puts: usize,
    deletes: usize,
}

impl Pending {
    /// Records it holds.
    pub fn len(&self) -> usize {
        self.puts + self.deletes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Puts and deletes it holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.puts, self.deletes)
    }

    /// Adds a put of bucket `id` of `held` in `state` (after [`Disk::begin`]).
    #[inline]
    pub fn put(&mut self, held: Held, id: u64, state: &BucketState) {
        debug_assert!(self.log.is_some(), "a commit begun");
        encode_put(&mut self.frame, held, id, state);
        self.puts += 1;
        self.seal_if_long();
    }

    /// Adds a delete of bucket `id` of `held` (after [`Disk::begin`]).
    #[inline]
    pub fn delete(&mut self, held: Held, id: u64) {
        debug_assert!(self.log.is_some(), "a commit begun");
        let mut rec = [0; 9];
        rec[0] = held.delete();
        rec[1..].copy_from_slice(&id.to_le_bytes());
        self.frame.extend_from_slice(&rec);
        self.deletes += 1;
        self.seal_if_long();
    }

    /// Seals the frame being filled once it has grown past [`CHUNK`]: a commit goes in frames
    /// of about that size, each checksummed as soon as it is full, while its bytes are in the
    /// cache. A crash in a commit keeps its first frames, each whole, which is safe: each
    /// record is newer than what it replaces.
    #[inline]
    fn seal_if_long(&mut self) {
        if self.frame.len() > CHUNK {
            self.seal();
        }
    }

    /// Appends the frame being filled to `buf`, sealed (nothing when it is empty).
    fn seal(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        self.buf.extend_from_slice(&frame_head(&self.frame));
        self.buf.extend_from_slice(&self.frame);
        self.frame.clear();
    }

    /// Lays its frames out again behind `tail`, the tail of the log it goes to now.
    fn lay_out_again(&mut self, tail: &[u8]) {
        let sealed = self.buf.split_off(self.frames);
        self.frames = lay_out(&mut self.buf, tail);
        self.buf.extend_from_slice(&sealed);
    }

    /// Empty and not begun, its buffers kept for the next commit.
    fn reset(&mut self) {
        self.log = None;
        self.frame.clear();
        self.puts = 0;
        self.deletes = 0;
    }
}

/// Tells writes to fail (a test's full disk).
#[cfg(test)]
type Refuse = Option<std::sync::Arc<std::sync::atomic::AtomicBool>>;

/// The open bucket files.
pub struct Disk {
    dir: PathBuf,
    cluster: String,
    node: String,
    files: parking_lot::Mutex<Files>,
    /// Set by [`Disk::close`]: nothing is written any more.
    closed: std::sync::atomic::AtomicBool,
    #[cfg(test)]
    refuse: Refuse,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("dir", &self.dir).finish()
    }
}

/// A snapshot to write (see [`Disk::rotate`]): off the follower's thread, then handed back to
/// [`Disk::snapshot_written`].
#[derive(Debug)]
pub struct SnapshotJob {
    dir: PathBuf,
    header: Header,
    members: Vec<(String, String)>,
    #[cfg(test)]
    refuse: Refuse,
}

/// A snapshot written (see [`SnapshotJob::write`]).
#[derive(Debug, Clone, Copy)]
pub struct Snapshotted {
    pub generation: u64,
    /// Buckets and copies it holds.
    pub count: u64,
    pub bytes: u64,
    /// When the first of its states stops mattering (`u64::MAX`: none).
    pub first_idle: u64,
}

/// A snapshot's file, written in whole blocks past the page cache where the file system
/// allows it (a snapshot is read back only by a restore; under a flood of new keys one is
/// written every few seconds, and the kernel's copy of it into the page cache was a third of
/// the snapshot's thread), through the page cache where not.
struct Blocks {
    file: File,
    path: PathBuf,
    direct: bool,
    /// Bytes not yet written, from `base`, a block-aligned address.
    buf: Vec<u8>,
    base: usize,
    /// Where they go in the file.
    at: u64,
}

impl Blocks {
    /// Written at once from this many bytes.
    const FLUSH: usize = 1 << 20;

    fn create(path: &Path) -> std::io::Result<Self> {
        let (file, direct) = open_for_writes(
            OpenOptions::new().write(true).create(true).truncate(true),
            path,
        )?;
        let mut buf: Vec<u8> = Vec::with_capacity(Self::FLUSH + 2 * CHUNK + 2 * BLOCK);
        let base = buf.as_ptr().align_offset(BLOCK);
        buf.resize(base, 0);
        Ok(Self {
            file,
            path: path.to_owned(),
            direct,
            buf,
            base,
            at: 0,
        })
    }

    /// The bytes it holds are complete (sealed frames): written once [`Blocks::FLUSH`] of
    /// them gathered.
    fn sealed(&mut self) -> std::io::Result<()> {
        if self.buf.len() - self.base >= Self::FLUSH {
            self.write_out(false)?;
        }
        Ok(())
    }

    /// Writes what it holds: its whole blocks (all of it when `last`, the last block padded
    /// when direct); keeps the rest.
    fn write_out(&mut self, last: bool) -> std::io::Result<()> {
        let len = self.buf.len() - self.base;
        let n = if last || !self.direct {
            len
        } else {
            len - len % BLOCK
        };
        let mut rest = [0; BLOCK];
        let kept = len - n;
        rest[..kept].copy_from_slice(&self.buf[self.base + n..]);
        self.buf.truncate(self.base + n);
        if self.direct {
            let (at, padded) = whole_blocks(&mut self.buf, self.base);
            match self.file.write_all_at(&self.buf[at..at + padded], self.at) {
                Ok(()) => {}
                // Refused for these blocks though O_DIRECT opened (nothing written): the page
                // cache from now on.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    self.file = reopen_buffered(&self.path, &e)?;
                    self.direct = false;
                    self.file.write_all_at(&self.buf[at..at + n], self.at)?;
                }
                Err(e) => return Err(e),
            }
            self.base = at;
        } else {
            self.file
                .write_all_at(&self.buf[self.base..self.base + n], self.at)?;
        }
        self.at += n as u64;
        self.buf.truncate(self.base);
        self.buf.extend_from_slice(&rest[..kept]);
        Ok(())
    }

    /// Writes what is left and flushes the file, of its bytes' length (not padded).
    fn finish(mut self) -> std::io::Result<()> {
        self.write_out(true)?;
        self.file.set_len(self.at)?;
        self.file.sync_all()
    }
}

/// Writes a snapshot's records, in frames of about [`CHUNK`] bytes.
pub struct SnapshotWriter {
    /// The frames are built in its buffer, where they are written from.
    out: Blocks,
    /// Where the frame being filled starts in `out`'s buffer.
    frame: usize,
    count: u64,
    bytes: u64,
    first_idle: u64,
    error: Option<std::io::Error>,
}

impl SnapshotWriter {
    /// Adds bucket `id` of `held` in `state`; a write error is kept for [`SnapshotJob::write`]
    /// to return.
    pub fn put(&mut self, held: Held, id: u64, state: &BucketState) {
        encode_put(&mut self.out.buf, held, id, state);
        self.count += 1;
        self.first_idle = self.first_idle.min(state.idle_at());
        if self.out.buf.len() - self.frame >= CHUNK {
            self.emit();
        }
    }

    /// Seals the frame being filled (written once enough are) and opens the next.
    fn emit(&mut self) {
        let len = self.out.buf.len() - self.frame;
        if self.error.is_some() {
            // Nothing more is written: what was built is dropped.
            self.out.buf.truncate(self.out.base);
        } else if len > FRAME_HEAD {
            seal(&mut self.out.buf[self.frame..]);
            self.bytes += len as u64;
            if let Err(e) = self.out.sealed() {
                self.error = Some(e);
            }
        } else {
            self.out.buf.truncate(self.frame);
        }
        self.frame = self.out.buf.len();
        self.out.buf.extend_from_slice(&[0; FRAME_HEAD]);
    }
}

impl SnapshotJob {
    /// The generation this snapshot is of.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }

    /// Writes the snapshot: `fill` puts every bucket and copy worth keeping, then the
    /// members and the end are added, the file is flushed and renamed over the last one.
    pub fn write(self, fill: impl FnOnce(&mut SnapshotWriter)) -> Result<Snapshotted, DiskError> {
        let tmp = self.dir.join(SNAPSHOT_TMP);
        let failed = |e: std::io::Error| DiskError::Write {
            path: tmp.clone(),
            reason: e.to_string(),
        };
        #[cfg(test)]
        refused(&self.refuse).map_err(failed)?;
        let header = self.header.frame();
        let mut w = SnapshotWriter {
            out: Blocks::create(&tmp).map_err(failed)?,
            frame: 0,
            count: 0,
            bytes: header.len() as u64,
            first_idle: u64::MAX,
            error: None,
        };
        w.out.buf.extend_from_slice(&header);
        w.frame = w.out.buf.len();
        w.out.buf.extend_from_slice(&[0; FRAME_HEAD]);
        fill(&mut w);
        encode_members(&mut w.out.buf, &self.members);
        w.out.buf.push(END);
        w.out.buf.extend_from_slice(&w.count.to_le_bytes());
        w.emit();
        // The frame `emit` opened after the last.
        w.out.buf.truncate(w.frame);
        let done = Snapshotted {
            generation: self.header.generation,
            count: w.count,
            bytes: w.bytes,
            first_idle: w.first_idle,
        };
        let result = match w.error.take() {
            Some(e) => Err(e),
            None => w
                .out
                .finish()
                .and_then(|()| std::fs::rename(&tmp, self.dir.join(SNAPSHOT)))
                .and_then(|()| sync_dir(&self.dir)),
        };
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(failed(e));
        }
        Ok(done)
    }
}

#[cfg(test)]
fn refused(refuse: &Refuse) -> std::io::Result<()> {
    if refuse
        .as_ref()
        .is_some_and(|r| r.load(std::sync::atomic::Ordering::Relaxed))
    {
        return Err(std::io::Error::other("no space left on device (test)"));
    }
    Ok(())
}

/// Reads a whole file.
fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    File::open(path)?.read_to_end(&mut out)?;
    Ok(out)
}

impl Disk {
    /// Opens (or makes) the bucket files in `dir`, stamped for `node` of `cluster`; refuses
    /// files that do not read, that another node or cluster stamped, or of an earlier format.
    /// Reads them whole: [`Disk::load`] then hands out what they hold.
    pub fn open(dir: &Path, cluster: &str, node: &str) -> Result<Self, DiskError> {
        #[cfg(test)]
        return Self::open_inner(dir, cluster, node, None);
        #[cfg(not(test))]
        Self::open_inner(dir, cluster, node)
    }

    fn open_inner(
        dir: &Path,
        cluster: &str,
        node: &str,
        #[cfg(test)] refuse: Refuse,
    ) -> Result<Self, DiskError> {
        let old = dir.join(OLD_FILE);
        if old.exists() {
            return Err(DiskError::OldFormat { path: old });
        }
        let io = |path: &Path, e: std::io::Error| DiskError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let _ = std::fs::remove_file(dir.join(SNAPSHOT_TMP));
        let mut logs: Vec<u64> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|entry| log_generation(entry.ok()?.file_name().to_str()?))
            .collect();
        logs.sort_unstable();
        let stamp = |kind, generation| Header {
            kind,
            format: FORMAT,
            generation,
            cluster: cluster.to_owned(),
            node: node.to_owned(),
        };
        let snap_path = dir.join(SNAPSHOT);
        let mut contents = Contents::default();
        let (generation, snapshot_bytes) = if snap_path.exists() {
            let bytes = read_file(&snap_path).map_err(|e| io(&snap_path, e))?;
            let g = read_snapshot(&snap_path, &bytes, cluster, node, &mut contents)?;
            (g, bytes.len() as u64)
        } else if let Some(first) = logs.first() {
            return Err(DiskError::Unreadable {
                path: snap_path,
                reason: format!("missing, while the log {} is there", log_name(*first)),
            });
        } else {
            let job = SnapshotJob {
                dir: dir.to_owned(),
                header: stamp(KIND_SNAPSHOT, 0),
                members: Vec::new(),
                #[cfg(test)]
                refuse: None,
            };
            let done = job.write(|_| {})?;
            (0, done.bytes)
        };
        let mut older_logs = 0;
        let mut last = None;
        for &g in &logs {
            let path = dir.join(log_name(g));
            if g < generation {
                // Folded into the snapshot already (a compaction ended before its cleanup).
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let bytes = read_file(&path).map_err(|e| io(&path, e))?;
            let end = replay_log(&path, &bytes, g, cluster, node, &mut contents)?;
            let end_at = end as usize;
            let tail = bytes[end_at - end_at % BLOCK..end_at].to_vec();
            if let Some((_, prev_end, _)) = last.replace((g, end, tail)) {
                older_logs += prev_end;
            }
        }
        let log = match last {
            Some((g, end, tail)) if end > 0 => {
                let path = dir.join(log_name(g));
                let log = Log::open(&path, g, end, &tail).map_err(|e| io(&path, e))?;
                // A torn tail (or a direct write's padding) is cut off before anything is
                // appended after it.
                if log.file.metadata().map_err(|e| io(&path, e))?.len() != end {
                    log.file
                        .set_len(end)
                        .and_then(|()| log.file.sync_data())
                        .map_err(|e| io(&path, e))?;
                }
                log
            }
            // No log yet, or one whose header did not make it: started (again).
            other => {
                let g = other.map_or(generation, |(g, _, _)| g);
                new_log(dir, &stamp(KIND_LOG, g)).map_err(|e| io(&dir.join(log_name(g)), e))?
            }
        };
        let first_idle_at_open = contents.first_idle();
        let Contents {
            owned,
            copies,
            members,
        } = contents;
        Ok(Self {
            dir: dir.to_owned(),
            cluster: cluster.to_owned(),
            node: node.to_owned(),
            files: parking_lot::Mutex::new(Files {
                older_logs,
                snapshot_bytes,
                members,
                opened: [Some(owned), Some(copies)],
                first_idle_at_open,
                log,
            }),
            closed: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            refuse,
        })
    }

    /// Whether [`Disk::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes the files for good: after the last flush at exit, a task of the stopping node
    /// that still runs cannot write after it, nor append to the log the node's next life
    /// (in the same process, as tests run nodes) writes.
    pub fn close(&self) {
        let _files = self.files.lock();
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn refuse_closed(&self) -> Result<(), DiskError> {
        if self.is_closed() {
            return Err(DiskError::Write {
                path: self.dir.clone(),
                reason: "closed: the node has stopped".into(),
            });
        }
        Ok(())
    }

    /// The cluster and the node whose files these are.
    pub(super) fn owner(&self) -> (&str, &str) {
        (&self.cluster, &self.node)
    }

    /// The directory the files are in.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The stored buckets of `held` still mattering at `now`, and how many values did not
    /// decode (left out). The first call of each kind hands out what [`Disk::open`] read;
    /// later ones read the files again.
    pub fn load(&self, held: Held, now: u64) -> Result<(Vec<(u64, BucketState)>, u64), DiskError> {
        let opened = self.files.lock().opened[held as usize].take();
        let table = match opened {
            Some(table) => table,
            None => std::mem::take(self.read_again()?.table(held)),
        };
        let mut out = Vec::with_capacity(table.len());
        let mut bad = 0;
        for (id, stored) in table {
            if stored.idle_at <= now {
                continue;
            }
            match stored.state {
                Some(state) => out.push((id, state)),
                None => bad += 1,
            }
        }
        Ok((out, bad))
    }

    /// When the first state stored when the files were opened stops mattering (`u64::MAX`:
    /// none).
    pub fn first_idle_at_open(&self) -> u64 {
        self.files.lock().first_idle_at_open
    }

    /// Everything the files hold now, read again.
    fn read_again(&self) -> Result<Contents, DiskError> {
        let mut c = Contents::default();
        let snap = self.dir.join(SNAPSHOT);
        let io = |path: &Path, e: std::io::Error| DiskError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let bytes = read_file(&snap).map_err(|e| io(&snap, e))?;
        let generation = read_snapshot(&snap, &bytes, &self.cluster, &self.node, &mut c)?;
        let current = self.files.lock().log.generation;
        for g in generation..=current {
            let path = self.dir.join(log_name(g));
            match read_file(&path) {
                Ok(bytes) => {
                    replay_log(&path, &bytes, g, &self.cluster, &self.node, &mut c)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path, e)),
            }
        }
        Ok(c)
    }

    /// Appends each table's batch to the log as one commit, flushed to the disk before it
    /// returns.
    #[cfg(test)]
    pub fn commit(&self, batches: &[(Held, &Batch)]) -> Result<(), DiskError> {
        let mut p = Pending::default();
        self.begin(&mut p);
        for (held, batch) in batches {
            for (id, state) in &batch.put {
                p.put(*held, *id, state);
            }
            for id in &batch.delete {
                p.delete(*held, *id);
            }
        }
        self.commit_pending(&mut p)
    }

    /// Begins the next commit in `p` unless begun: laid out behind the log's tail.
    pub fn begin(&self, p: &mut Pending) {
        if p.log.is_some() {
            return;
        }
        let files = self.files.lock();
        p.frames = lay_out(&mut p.buf, &files.log.tail);
        p.log = Some((files.log.generation, files.log.end));
    }

    /// Appends the commit `p` holds to the log, flushed to the disk before it returns (nothing
    /// when it holds nothing). `p` is empty after, written or not: what a failed commit held
    /// is not on disk, and the follower writes the store whole (a snapshot) once writes work.
    pub fn commit_pending(&self, p: &mut Pending) -> Result<(), DiskError> {
        if p.is_empty() {
            return Ok(());
        }
        let mut files = self.files.lock();
        let files = &mut *files;
        files.opened = [None, None];
        if p.log != Some((files.log.generation, files.log.end)) {
            // The log moved since the commit began (members kept, a rotation): its tail is
            // another.
            p.lay_out_again(&files.log.tail);
        }
        p.seal();
        let result = self.append(&mut files.log, &mut p.buf, p.frames);
        p.reset();
        result
    }

    /// Appends the frames `buf` holds from `frames` on (sealed, laid out by [`lay_out`]
    /// behind `log`'s tail) to `log` and flushes them.
    fn append(&self, log: &mut Log, buf: &mut Vec<u8>, frames: usize) -> Result<(), DiskError> {
        self.refuse_closed()?;
        let path = self.dir.join(log_name(log.generation));
        // The file's bytes from the log's last block boundary on: its tail, then the commit.
        let mut from = frames - log.tail.len();
        let result = (|| {
            #[cfg(test)]
            refused(&self.refuse)?;
            if log.torn {
                log.file.set_len(log.end)?;
                log.torn = false;
            }
            if log.direct {
                let len = buf.len() - from;
                let (at, blocks) = whole_blocks(buf, from);
                from = at;
                let start = log.end - log.tail.len() as u64;
                let wrote = log.file.write_all_at(&buf[at..at + blocks], start);
                buf.truncate(at + len);
                match wrote {
                    // Refused for these blocks though O_DIRECT opened (nothing written): the
                    // page cache from now on.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                        log.file = reopen_buffered(&path, &e)?;
                        log.direct = false;
                    }
                    other => other?,
                }
            }
            if !log.direct {
                let commit = from + log.tail.len();
                log.file.write_all_at(&buf[commit..], log.end)?;
            }
            log.file.sync_data()
        })();
        match result {
            Ok(()) => {
                log.appended(&buf[from..]);
                Ok(())
            }
            Err(e) => {
                log.torn = true;
                Err(DiskError::Write {
                    path,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// The members kept by [`Disk::remember_members`]: node id and peer address.
    pub fn members(&self) -> Result<Vec<(String, String)>, DiskError> {
        Ok(self.files.lock().members.clone())
    }

    /// Replaces the members kept with `members` (node id, peer address), in one commit.
    pub fn remember_members(&self, members: &[(String, String)]) -> Result<(), DiskError> {
        let mut files = self.files.lock();
        let files = &mut *files;
        let mut buf = Vec::new();
        let frames = lay_out(&mut buf, &files.log.tail);
        buf.extend_from_slice(&[0; FRAME_HEAD]);
        encode_members(&mut buf, members);
        seal(&mut buf[frames..]);
        self.append(&mut files.log, &mut buf, frames)?;
        files.members = members.to_vec();
        Ok(())
    }

    /// Bytes appended to the log since the last snapshot, and the last snapshot's bytes.
    pub fn log_and_snapshot_bytes(&self) -> (u64, u64) {
        let f = self.files.lock();
        (f.log.end + f.older_logs, f.snapshot_bytes)
    }

    /// Starts the log of the next generation (commits go there from now on) and returns the
    /// snapshot of that generation to write: what the store holds from now on, the buckets
    /// of the logs before it included.
    pub fn rotate(&self) -> Result<SnapshotJob, DiskError> {
        let mut files = self.files.lock();
        self.refuse_closed()?;
        let generation = files.log.generation + 1;
        let header = |kind| Header {
            kind,
            format: FORMAT,
            generation,
            cluster: self.cluster.clone(),
            node: self.node.clone(),
        };
        #[cfg(test)]
        refused(&self.refuse).map_err(|e| DiskError::Write {
            path: self.dir.join(log_name(generation)),
            reason: e.to_string(),
        })?;
        let log = new_log(&self.dir, &header(KIND_LOG)).map_err(|e| DiskError::Write {
            path: self.dir.join(log_name(generation)),
            reason: e.to_string(),
        })?;
        let old = std::mem::replace(&mut files.log, log);
        files.older_logs += old.end;
        Ok(SnapshotJob {
            dir: self.dir.clone(),
            header: header(KIND_SNAPSHOT),
            members: files.members.clone(),
            #[cfg(test)]
            refuse: self.refuse.clone(),
        })
    }

    /// The snapshot `done` is on disk: the logs before its generation go.
    pub fn snapshot_written(&self, done: &Snapshotted) {
        let mut files = self.files.lock();
        for g in (0..done.generation).rev() {
            match std::fs::remove_file(self.dir.join(log_name(g))) {
                Ok(()) => {}
                // The older ones went with earlier snapshots.
                Err(_) => break,
            }
        }
        files.snapshot_bytes = done.bytes;
        files.older_logs = 0;
    }

    /// Buckets stored in `held`'s table (read from the files).
    pub fn len(&self, held: Held) -> u64 {
        self.read_again()
            .map_or(0, |mut c| c.table(held).len() as u64)
    }

    /// The files' size in bytes.
    pub fn bytes(&self) -> u64 {
        let f = self.files.lock();
        f.snapshot_bytes + f.older_logs + f.log.end
    }
}

/// Makes the log of `header`'s generation: its header written and flushed, the directory too.
fn new_log(dir: &Path, header: &Header) -> std::io::Result<Log> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join(log_name(header.generation)))?;
    let head = header.frame();
    file.write_all_at(&head, 0)?;
    file.sync_data()?;
    sync_dir(dir)?;
    drop(file);
    Log::open(
        &dir.join(log_name(header.generation)),
        header.generation,
        head.len() as u64,
        &head[head.len() - head.len() % BLOCK..],
    )
}

/// Checks a file's header against the stamp wanted; returns it and where the records start.
fn check_header(
    path: &Path,
    bytes: &[u8],
    kind: u8,
    cluster: &str,
    node: &str,
) -> Result<Option<(Header, usize)>, DiskError> {
    let unreadable = |reason: String| DiskError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let Some((payload, used)) = frame(bytes) else {
        return Ok(None);
    };
    let header = Header::parse(payload).map_err(unreadable)?;
    if header.cluster != cluster || header.node != node {
        return Err(DiskError::Foreign {
            path: path.to_owned(),
            node: header.node,
            cluster: header.cluster,
            want_node: node.to_owned(),
            want_cluster: cluster.to_owned(),
        });
    }
    if header.format != FORMAT {
        return Err(DiskError::Format {
            path: path.to_owned(),
            found: header.format,
        });
    }
    if header.kind != kind {
        return Err(unreadable(format!("a file of kind {}", header.kind)));
    }
    Ok(Some((header, used)))
}

/// Reads a snapshot whole into `into`; returns its generation. Refused unless every frame
/// checks, up to its end.
fn read_snapshot(
    path: &Path,
    bytes: &[u8],
    cluster: &str,
    node: &str,
    into: &mut Contents,
) -> Result<u64, DiskError> {
    let unreadable = |reason: String| DiskError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let Some((header, mut at)) = check_header(path, bytes, KIND_SNAPSHOT, cluster, node)? else {
        return Err(unreadable("its header does not check".into()));
    };
    into.owned.reserve(bytes.len() / 48);
    loop {
        let Some((payload, used)) = bytes.get(at..).and_then(frame) else {
            return Err(unreadable(format!(
                "the snapshot does not check from byte {at} on"
            )));
        };
        at += used;
        if let Some(count) = into.apply(payload).map_err(unreadable)? {
            let held = (into.owned.len() + into.copies.len()) as u64;
            if count != held || at != bytes.len() {
                return Err(unreadable(format!(
                    "the snapshot says {count} buckets and holds {held} in {at} of {} bytes",
                    bytes.len()
                )));
            }
            return Ok(header.generation);
        }
    }
}

/// Replays a log's complete commits into `into`; returns where the last one ends (0: the
/// header itself did not make it to the disk). A commit that does not check ends the log.
fn replay_log(
    path: &Path,
    bytes: &[u8],
    generation: u64,
    cluster: &str,
    node: &str,
    into: &mut Contents,
) -> Result<u64, DiskError> {
    let Some((header, mut at)) = check_header(path, bytes, KIND_LOG, cluster, node)? else {
        return Ok(0);
    };
    if header.generation != generation {
        return Err(DiskError::Unreadable {
            path: path.to_owned(),
            reason: format!("its header says generation {}", header.generation),
        });
    }
    while let Some((payload, used)) = bytes.get(at..).and_then(frame) {
        into.apply(payload)
            .map_err(|reason| DiskError::Unreadable {
                path: path.to_owned(),
                reason,
            })?;
        at += used;
    }
    // Zeros after the last commit are a direct write's padding, not a commit cut short.
    if bytes[at..].iter().any(|&b| b != 0) {
        tracing::warn!(
            path = %path.display(),
            at,
            len = bytes.len(),
            "the last commit of the bucket log was cut short (the process stopped in it): ignored"
        );
    }
    Ok(at as u64)
}

#[cfg(test)]
impl Disk {
    /// A bucket directory in `dir` whose writes fail while `full` says so (a full disk).
    pub fn failing(
        dir: &Path,
        full: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Self, DiskError> {
        Self::open_inner(dir, "c", "n1", Some(full))
    }
}

/// How many log files `dir` holds (a test's check that folded logs went).
#[cfg(test)]
pub fn log_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("lists")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_700_000_000_000_000_000;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temp dir")
    }

    fn bincode_of(state: &BucketState) -> Vec<u8> {
        bincode::serde::encode_to_vec(state.to_wire(), bincode::config::standard())
            .expect("encodes")
    }

    /// Values on both sides of each varint width.
    const EDGES: [u64; 12] = [
        0,
        1,
        250,
        251,
        252,
        65_535,
        65_536,
        4_294_967_295,
        4_294_967_296,
        T0,
        u64::MAX - 1,
        u64::MAX,
    ];

    #[test]
    fn the_hand_written_encoding_is_bincodes_at_every_width() {
        let log = ringlimit_core::limiter::SlidingLog::from_entries(3, [(T0, 2)]);
        let mut states = vec![BucketState::Log(Box::new(log))];
        for a in EDGES {
            for b in EDGES.map(|v| v as u32) {
                states.push(BucketState::Gcra { tat: a, tag: b });
                states.push(BucketState::Fixed {
                    end: a,
                    count: b,
                    period_tag: 7,
                });
                states.push(BucketState::Sliding {
                    until: a,
                    current: b,
                    previous: b / 3,
                    period_tag: 7,
                });
            }
        }
        for st in &states {
            let mut out = Vec::new();
            encode_state(&mut out, st);
            assert_eq!(out, bincode_of(st), "{st:?}");
        }
    }

    proptest! {
        #[test]
        fn the_hand_written_encoding_is_bincodes(
            a in any::<u64>(), b in any::<u32>(), c in any::<u32>(), which in 0..3u8,
        ) {
            let st = match which {
                0 => BucketState::Gcra { tat: a, tag: b },
                1 => BucketState::Fixed { end: a, count: b, period_tag: c },
                _ => BucketState::Sliding { until: a, current: b, previous: c, period_tag: 1 },
            };
            let mut out = Vec::new();
            encode_state(&mut out, &st);
            prop_assert_eq!(out, bincode_of(&st));
        }
    }

    fn used(count: u32) -> BucketState {
        BucketState::Fixed {
            end: T0 + 1_000_000,
            count,
            period_tag: 0,
        }
    }

    fn puts(ids: impl IntoIterator<Item = u64>, count: u32) -> Batch {
        Batch {
            put: ids.into_iter().map(|id| (id, used(count))).collect(),
            delete: vec![],
        }
    }

    fn sorted(held: Held, disk: &Disk) -> Vec<(u64, BucketState)> {
        let (mut v, bad) = disk.load(held, T0).expect("reads");
        assert_eq!(bad, 0);
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// A snapshot of `state`, as the follower writes one after `rotate`.
    fn compact(disk: &Disk, state: &[(Held, u64, BucketState)]) {
        let job = disk.rotate().expect("rotated");
        let done = job
            .write(|w| {
                for (held, id, st) in state {
                    w.put(*held, *id, st);
                }
            })
            .expect("written");
        disk.snapshot_written(&done);
    }

    fn the_log(d: &Path) -> PathBuf {
        let mut logs: Vec<_> = std::fs::read_dir(d)
            .expect("lists")
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                log_generation(&name).map(|g| (g, d.join(name)))
            })
            .collect();
        logs.sort();
        logs.pop().expect("a log").1
    }

    #[test]
    fn states_come_back_as_they_went_in_and_idle_ones_stay_out() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let idle = BucketState::Gcra { tat: T0, tag: 0 };
        let batch = Batch {
            put: vec![(1, used(7)), (2, idle), (3, used(7))],
            delete: vec![],
        };
        disk.commit(&[(Held::Owned, &batch)]).expect("written");
        let delete = Batch {
            put: vec![],
            delete: vec![3, 99],
        };
        disk.commit(&[(Held::Owned, &delete), (Held::Copies, &puts([5], 1))])
            .expect("deleted");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(disk.first_idle_at_open(), T0, "the idle one is still there");
        assert_eq!(sorted(Held::Owned, &disk), vec![(1, used(7))]);
        assert_eq!(sorted(Held::Copies, &disk), vec![(5, used(1))]);
        assert_eq!(disk.len(Held::Owned), 2, "1 and the idle 2");
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
        let want = vec![pair("n3", "10.0.0.9:7946"), pair("n4", "10.0.0.4:7946")];
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(disk.members().expect("reads"), want);
        // Folded into a snapshot, they stay.
        compact(&disk, &[]);
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(disk.members().expect("reads"), want);
    }

    #[test]
    fn a_commit_begun_before_the_log_moved_is_written_behind_its_new_tail() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let pair = |id: &str| (id.to_owned(), format!("{id}:7946"));
        let mut p = Pending::default();
        // Begun, then the log grows under it (members kept), then rotates: each time the
        // commit's records go behind the log's tail as it is at the commit.
        for (round, moved) in [(0u64, 0), (1, 1), (2, 2), (3, 1)] {
            disk.begin(&mut p);
            for i in 0..(100 * round + 7) {
                p.put(Held::Owned, 1000 * round + i, &used(round as u32 + 1));
            }
            match moved {
                1 => disk
                    .remember_members(&[pair(&format!("n{round}"))])
                    .expect("written"),
                2 => drop(disk.rotate().expect("rotated")),
                _ => {}
            }
            disk.commit_pending(&mut p).expect("committed");
            assert!(p.is_empty());
        }
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        let got = sorted(Held::Owned, &disk);
        assert_eq!(got.len(), 7 + 107 + 207 + 307);
        assert!(
            got.iter()
                .all(|(id, st)| *st == used((id / 1000) as u32 + 1))
        );
        assert_eq!(disk.members().expect("reads"), vec![pair("n3")]);
    }

    #[test]
    fn every_kind_of_state_comes_back_as_a_peer_would_take_it() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let log = ringlimit_core::limiter::SlidingLog::from_entries(3, [(T0 + 5, 2), (T0 + 9, 1)]);
        let states = [
            BucketState::Log(Box::new(log)),
            BucketState::Gcra {
                tat: T0 + 1,
                tag: 4,
            },
            used(7),
            BucketState::Sliding {
                until: T0 + 3,
                current: 300,
                previous: 70_000,
                period_tag: 2,
            },
        ];
        let batch = Batch {
            put: states
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, st)| (i as u64, st))
                .collect(),
            delete: vec![],
        };
        disk.commit(&[(Held::Owned, &batch)]).expect("commits");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        let want: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(i, st)| (i as u64, BucketState::from_wire(st.to_wire())))
            .collect();
        assert_eq!(sorted(Held::Owned, &disk), want);
    }

    #[test]
    fn a_commit_keeps_its_records_in_the_order_they_were_added() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let mut p = Pending::default();
        disk.begin(&mut p);
        // Deleted, then put again in the same commit (two drains): it stays.
        p.put(Held::Owned, 1, &used(1));
        p.put(Held::Owned, 2, &used(1));
        p.delete(Held::Owned, 1);
        p.delete(Held::Owned, 2);
        p.put(Held::Owned, 1, &used(3));
        assert_eq!(p.counts(), (3, 2));
        disk.commit_pending(&mut p).expect("committed");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(sorted(Held::Owned, &disk), vec![(1, used(3))]);
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
            d.path().join(SNAPSHOT),
            b"not a snapshot, just some bytes".repeat(200),
        )
        .expect("written");
        let e = Disk::open(d.path(), "c", "n1").expect_err("corrupt");
        assert!(e.to_string().contains("not a readable bucket file"), "{e}");
    }

    #[test]
    fn the_redb_file_of_the_earlier_format_is_refused() {
        let d = dir();
        std::fs::write(d.path().join(OLD_FILE), b"redb").expect("written");
        let e = Disk::open(d.path(), "c", "n1").expect_err("old format");
        assert!(e.to_string().contains("earlier format (redb)"), "{e}");
        assert!(e.to_string().contains("move it away"), "{e}");
    }

    #[test]
    fn a_corrupt_snapshot_is_refused_with_one_clear_line() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        let all: Vec<_> = (1..500)
            .map(|id| (Held::Owned, id, used(id as u32)))
            .collect();
        compact(&disk, &all);
        drop(disk);
        let path = d.path().join(SNAPSHOT);
        let mut bytes = std::fs::read(&path).expect("reads");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&path, &bytes).expect("written");
        let e = Disk::open(d.path(), "c", "n1").expect_err("corrupt");
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains("buckets.snap is not a readable bucket file"),
            "{line}"
        );
        assert!(line.contains("does not check from byte"), "{line}");
        // Cut short: refused too (its end frame is missing).
        bytes[middle] ^= 0x40;
        std::fs::write(&path, &bytes[..bytes.len() - 5]).expect("written");
        let e = Disk::open(d.path(), "c", "n1").expect_err("cut short");
        assert!(e.to_string().contains("not a readable bucket file"), "{e}");
    }

    #[test]
    fn whole_blocks_are_aligned_padded_with_zeros_and_hold_the_bytes() {
        for from in [0, 1, 100, BLOCK - 1, BLOCK, BLOCK + 7] {
            for len in [1, 40, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5] {
                // Garbage ahead and a buffer at whatever address the allocator gave.
                let mut buf = vec![0xAA; from];
                let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
                buf.extend_from_slice(&bytes);
                let (at, padded) = whole_blocks(&mut buf, from);
                assert_eq!(buf[at..].as_ptr().align_offset(BLOCK), 0, "{from}/{len}");
                assert_eq!(padded % BLOCK, 0);
                assert!(padded >= len && padded < len + BLOCK);
                assert_eq!(buf.len(), at + padded);
                assert_eq!(&buf[at..at + len], &bytes[..]);
                assert!(buf[at + len..].iter().all(|&b| b == 0), "{from}/{len}");
            }
        }
    }

    #[test]
    fn a_file_written_in_blocks_holds_its_bytes_exactly() {
        for direct in [true, false] {
            let d = dir();
            let path = d.path().join("blocks");
            let mut b = Blocks::create(&path).expect("creates");
            if !direct {
                // As on a file system that refuses O_DIRECT.
                b.file = OpenOptions::new().write(true).open(&path).expect("opens");
                b.direct = false;
            }
            let mut want = Vec::new();
            for i in 0..200u64 {
                let len = (i * 7919) as usize % (CHUNK + BLOCK + 3);
                let bytes: Vec<u8> = (0..len as u64).map(|j| (j * 31 + i) as u8).collect();
                b.buf.extend_from_slice(&bytes);
                b.sealed().expect("written");
                want.extend_from_slice(&bytes);
            }
            b.finish().expect("finished");
            let got = std::fs::read(&path).expect("reads");
            assert_eq!(got.len(), want.len(), "direct: {direct}");
            assert!(got == want, "direct: {direct}");
        }
    }

    /// A commit larger than a frame goes in several; a crash in it keeps the frames before.
    #[test]
    fn a_large_commit_goes_in_frames_and_a_cut_one_keeps_its_first_frames() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        disk.commit(&[(Held::Owned, &puts(0..10_000, 1))])
            .expect("commits");
        let (end, _) = disk.log_and_snapshot_bytes();
        assert!(end > 4 * CHUNK as u64, "{end}");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        assert_eq!(sorted(Held::Owned, &disk).len(), 10_000);
        drop(disk);
        // Cut in its third frame, as a SIGKILL during the write leaves it.
        let log = the_log(d.path());
        let bytes = std::fs::read(&log).expect("reads");
        let (_, mut at) = check_header(&log, &bytes, KIND_LOG, "c", "n1")
            .expect("checks")
            .expect("a header");
        for _ in 0..2 {
            at += frame(&bytes[at..]).expect("a frame").1;
        }
        std::fs::write(&log, &bytes[..at + 100]).expect("cut");
        let disk = Disk::open(d.path(), "c", "n1").expect("a cut commit is no error");
        let kept = sorted(Held::Owned, &disk);
        assert!(
            kept.len() > 2_000 && kept.len() < 10_000,
            "the first two frames' records: {}",
            kept.len()
        );
        assert_eq!(kept.first().map(|(id, _)| *id), Some(0));
    }

    /// Many commits of sizes that end anywhere in a block, then reopened as a SIGKILL leaves
    /// the log (padded to whole blocks when written directly), then appended to again.
    #[test]
    fn direct_appends_read_back_whole_and_a_reopened_log_goes_on_after_its_last_commit() {
        for direct in [true, false] {
            let d = dir();
            let disk = Disk::open(d.path(), "c", "n1").expect("opens");
            if !direct {
                // As on a file system that refuses O_DIRECT.
                let mut files = disk.files.lock();
                let path = d.path().join(log_name(files.log.generation));
                files.log.file = OpenOptions::new().write(true).open(path).expect("opens");
                files.log.direct = false;
            }
            let mut want = std::collections::BTreeMap::new();
            for round in 0..40u64 {
                let ids = (round * 37)..(round * 37 + 1 + round * round % 300);
                for id in ids.clone() {
                    want.insert(id, used(round as u32));
                }
                disk.commit(&[(Held::Owned, &puts(ids, round as u32))])
                    .expect("commits");
                let (end, _) = disk.log_and_snapshot_bytes();
                let len = std::fs::metadata(the_log(d.path())).expect("there").len();
                if disk.files.lock().log.direct {
                    assert_eq!(len, end.next_multiple_of(BLOCK as u64), "round {round}");
                } else {
                    assert_eq!(len, end, "round {round}");
                }
            }
            drop(disk);
            let want: Vec<_> = want.into_iter().collect();
            let disk = Disk::open(d.path(), "c", "n1").expect("padding is no error");
            assert_eq!(sorted(Held::Owned, &disk), want, "direct: {direct}");
            let (end, _) = disk.log_and_snapshot_bytes();
            let len = std::fs::metadata(the_log(d.path())).expect("there").len();
            assert_eq!(len, end, "the padding is cut off at open");
            disk.commit(&[(Held::Owned, &puts([1_000_000], 99))])
                .expect("appends");
            drop(disk);
            let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
            let mut want = want;
            want.push((1_000_000, used(99)));
            assert_eq!(sorted(Held::Owned, &disk), want, "direct: {direct}");
        }
    }

    #[test]
    fn a_torn_tail_is_ignored_the_complete_commits_restored_and_the_log_goes_on_after_them() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        disk.commit(&[(Held::Owned, &puts(1..=3, 1))]).expect("1");
        disk.commit(&[(Held::Owned, &puts(4..=6, 2))]).expect("2");
        let complete = disk.log_and_snapshot_bytes().0;
        disk.commit(&[(Held::Owned, &puts(1..=9, 3))]).expect("3");
        let third = disk.log_and_snapshot_bytes().0 - complete;
        drop(disk);
        // The process died in the third commit: half its frame is on disk.
        let log = the_log(d.path());
        let f = OpenOptions::new().write(true).open(&log).expect("opens");
        f.set_len(complete + third / 2).expect("cut");
        drop(f);
        let disk = Disk::open(d.path(), "c", "n1").expect("a torn tail is no error");
        let want: Vec<_> = (1..=3)
            .map(|id| (id, used(1)))
            .chain((4..=6).map(|id| (id, used(2))))
            .collect();
        assert_eq!(sorted(Held::Owned, &disk), want);
        // Appended after the complete commits, not after the torn one.
        disk.commit(&[(Held::Owned, &puts([7], 4))]).expect("4");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens again");
        let mut want = want;
        want.push((7, used(4)));
        assert_eq!(sorted(Held::Owned, &disk), want);
    }

    #[test]
    fn a_compaction_cut_short_leaves_the_last_snapshot_and_every_log_since() {
        let d = dir();
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        disk.commit(&[(Held::Owned, &puts(1..=3, 1))]).expect("1");
        // The next log started, its snapshot never written (the process died).
        let job = disk.rotate().expect("rotated");
        disk.commit(&[(Held::Owned, &puts([2], 5))]).expect("2");
        drop((job, disk));
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        assert_eq!(
            sorted(Held::Owned, &disk),
            vec![(1, used(1)), (2, used(5)), (3, used(1))]
        );
        // Finished this time: the old logs go.
        let all = sorted(Held::Owned, &disk);
        let all: Vec<_> = all
            .into_iter()
            .map(|(id, st)| (Held::Owned, id, st))
            .collect();
        compact(&disk, &all);
        assert_eq!(log_files(d.path()), 1, "only the new log");
        drop(disk);
        let disk = Disk::open(d.path(), "c", "n1").expect("opens");
        assert_eq!(sorted(Held::Owned, &disk).len(), 3);
    }

    #[test]
    fn a_value_that_does_not_decode_is_counted_and_left_out() {
        assert_eq!(decode(&[1, 2, 3]), None);
        let mut v = Vec::new();
        encode_put(
            &mut v,
            Held::Owned,
            1,
            &BucketState::Gcra { tat: T0, tag: 3 },
        );
        let mut v = v[13..].to_vec();
        assert_eq!(decode(&v), Some(BucketState::Gcra { tat: T0, tag: 0 }));
        v.push(0);
        assert_eq!(decode(&v), None, "trailing bytes");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(bool, u8, u16),
        Delete(bool, u8),
        Commit,
        Compact,
        /// A compaction whose snapshot is never written (the process died in it).
        Rotate,
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (any::<bool>(), 0..40u8, any::<u16>()).prop_map(|(c, id, n)| Op::Put(c, id, n)),
            4 => (any::<bool>(), 0..40u8).prop_map(|(c, id)| Op::Delete(c, id)),
            4 => Just(Op::Commit),
            1 => Just(Op::Compact),
            1 => Just(Op::Rotate),
            1 => Just(Op::Reopen),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever puts, deletes, compactions and restarts, a restore reads what was
        /// committed last.
        #[test]
        fn restore_equals_what_was_committed(ops in prop::collection::vec(op(), 1..80)) {
            let d = dir();
            let mut disk = Disk::open(d.path(), "c", "n1").expect("opens");
            let mut model: std::collections::BTreeMap<(bool, u64), BucketState> = Default::default();
            let mut pending: Vec<(bool, u64, Option<BucketState>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Put(c, id, n) => pending.push((c, u64::from(id), Some(used(u32::from(n))))),
                    Op::Delete(c, id) => pending.push((c, u64::from(id), None)),
                    Op::Commit => {
                        // Coalesced, as the follower's drain is: each id once, its last.
                        let mut last = std::collections::BTreeMap::new();
                        for (c, id, st) in pending.drain(..) {
                            last.insert((c, id), st);
                        }
                        let (mut owned, mut copies) = (Batch::default(), Batch::default());
                        for ((c, id), st) in last {
                            let b = if c { &mut copies } else { &mut owned };
                            match st.clone() {
                                Some(st) => b.put.push((id, st)),
                                None => b.delete.push(id),
                            }
                            match st {
                                Some(st) => model.insert((c, id), st),
                                None => model.remove(&(c, id)),
                            };
                        }
                        disk.commit(&[(Held::Owned, &owned), (Held::Copies, &copies)]).expect("commits");
                    }
                    Op::Compact => {
                        let all: Vec<_> = model
                            .iter()
                            .map(|((c, id), st)| {
                                (if *c { Held::Copies } else { Held::Owned }, *id, st.clone())
                            })
                            .collect();
                        compact(&disk, &all);
                    }
                    Op::Rotate => drop(disk.rotate().expect("rotates")),
                    Op::Reopen => {
                        drop(disk);
                        disk = Disk::open(d.path(), "c", "n1").expect("opens again");
                    }
                }
            }
            drop(disk);
            let disk = Disk::open(d.path(), "c", "n1").expect("opens at the end");
            for (held, c) in [(Held::Owned, false), (Held::Copies, true)] {
                let want: Vec<_> = model
                    .iter()
                    .filter(|((cc, _), _)| *cc == c)
                    .map(|((_, id), st)| (*id, st.clone()))
                    .collect();
                prop_assert_eq!(sorted(held, &disk), want);
            }
        }
    }
}
