//! The live reservations under `--data-dir` (`reservations`): written whole when the table
//! moved (at most every [`super::RESERVATIONS_EVERY`], and at the last flush before exit), read
//! back before the node is ready, so that a reservation taken before a restart is settled
//! after it (its unused estimate given back, its overshoot taken) as if the node had never
//! stopped.
//!
//! The bucket states hold the estimates already (a reservation takes its estimate at once);
//! this file holds only what a settle needs to find them. A reservation missing from it (a
//! SIGKILL after it was taken, a file that does not read) is settled as unknown: its estimate
//! stays taken, never an over-admission. A file is one header frame and one frame of
//! bincode-encoded reservations, each checked by its xxh3; it is replaced by a rename, so a
//! crash leaves the last one whole.

use super::disk::{FORMAT, Header, KIND_RESERVATIONS, frame, open_frame, seal, sync_dir};
use ringlimit_core::reservations::{Reservation, Tenant};
use ringlimit_core::rule::validate_calendar;
use ringlimit_proto::Algorithm;
use ringlimit_proto::calendar::Calendar;
use ringlimit_proto::peer::Mark;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file's name in `--data-dir`.
pub const FILE: &str = "reservations";
/// The file being written (renamed over the last when whole).
const TMP: &str = "reservations.tmp";
/// The most reservations a file is read with (the table's own bound, with room).
const MOST: usize = 4 * ringlimit_core::reservations::MOST_RESERVATIONS;

/// Why the reservations file was not written or read.
#[derive(Debug, thiserror::Error)]
pub enum ReservationsError {
    #[error("writing {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    #[error(
        "{path} is not a readable reservations file of this node ({reason}); its reservations are settled as unknown"
    )]
    Unreadable { path: PathBuf, reason: String },
}

/// One reservation as the file holds it.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    nonce: u128,
    id: u64,
    /// The tenant: a named rule's seed (`named`) or an inline rule's.
    named: bool,
    seed: u64,
    algorithm: Algorithm,
    limit: u64,
    period_ns: u64,
    burst: u64,
    calendar: Option<Calendar>,
    estimate: u64,
    mark: Option<Mark>,
    deadline: u64,
}

impl Kept {
    fn of(nonce: u128, r: &Reservation) -> Self {
        let (named, seed) = match r.tenant {
            Tenant::Named(s) => (true, s),
            Tenant::Inline(s) => (false, s),
        };
        Self {
            nonce,
            id: r.id,
            named,
            seed,
            algorithm: r.rule.algorithm,
            limit: r.rule.limit,
            period_ns: r.rule.period_ns,
            burst: r.rule.burst,
            calendar: r.rule.calendar,
            estimate: r.estimate,
            mark: r.mark,
            deadline: r.deadline,
        }
    }

    /// The reservation again; `None` when its rule does not validate (not one this build
    /// wrote).
    fn reservation(self) -> Option<(u128, Reservation)> {
        let rule = validate_calendar(
            self.algorithm,
            self.limit,
            self.period_ns,
            // The window algorithms take none: their capacity is their limit.
            self.algorithm.has_burst().then_some(self.burst),
            self.calendar,
        )
        .ok()?;
        let tenant = if self.named {
            Tenant::Named(self.seed)
        } else {
            Tenant::Inline(self.seed)
        };
        Some((
            self.nonce,
            Reservation {
                id: self.id,
                tenant,
                rule,
                estimate: self.estimate,
                mark: self.mark,
                deadline: self.deadline,
            },
        ))
    }
}

/// The header every reservations file of node `node` of `cluster` starts with.
fn header(cluster: &str, node: &str) -> Header {
    Header {
        kind: KIND_RESERVATIONS,
        format: FORMAT,
        generation: 0,
        cluster: cluster.to_owned(),
        node: node.to_owned(),
    }
}

/// Writes `live` to `dir`'s reservations file (none: the file goes), replacing the last one
/// whole. Returns the bytes written.
pub fn write(
    dir: &Path,
    (cluster, node): (&str, &str),
    live: &[(u128, Reservation)],
) -> Result<u64, ReservationsError> {
    let path = dir.join(FILE);
    let failed = |e: std::io::Error| ReservationsError::Write {
        path: path.clone(),
        reason: e.to_string(),
    };
    if live.is_empty() {
        return match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(dir).map(|()| 0).map_err(failed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(failed(e)),
        };
    }
    let kept: Vec<Kept> = live.iter().map(|(n, r)| Kept::of(*n, r)).collect();
    let mut out = header(cluster, node).frame();
    let mut body = Vec::new();
    open_frame(&mut body);
    bincode::serde::encode_into_std_write(&kept, &mut body, bincode::config::standard())
        .map_err(|e| failed(std::io::Error::other(e.to_string())))?;
    seal(&mut body);
    out.extend_from_slice(&body);
    let tmp = dir.join(TMP);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(&out)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| sync_dir(dir));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(e));
    }
    Ok(out.len() as u64)
}

/// Reads `dir`'s reservations file (none: no reservations), and how many of its entries did
/// not decode (left out). A file of another node, or one that does not check, is an error:
/// its reservations are left out, their estimates stay taken.
pub fn read(
    dir: &Path,
    (cluster, node): (&str, &str),
) -> Result<(Vec<(u128, Reservation)>, u64), ReservationsError> {
    let path = dir.join(FILE);
    let _ = std::fs::remove_file(dir.join(TMP));
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => {
            return Err(ReservationsError::Unreadable {
                path,
                reason: e.to_string(),
            });
        }
    };
    let unreadable = |reason: String| ReservationsError::Unreadable {
        path: path.clone(),
        reason,
    };
    let (head, used) =
        frame(&bytes).ok_or_else(|| unreadable("its header does not check".into()))?;
    let h = Header::parse(head).map_err(unreadable)?;
    if h != header(cluster, node) {
        return Err(unreadable(format!(
            "written by node {:?} of cluster {:?} in format {}, kind {}",
            h.node, h.cluster, h.format, h.kind
        )));
    }
    let body = bytes.get(used..).unwrap_or_default();
    let (payload, _) = frame(body).ok_or_else(|| unreadable("its body does not check".into()))?;
    let config = bincode::config::standard().with_limit::<{ 64 << 20 }>();
    let (kept, _): (Vec<Kept>, usize) = bincode::serde::decode_from_slice(payload, config)
        .map_err(|e| unreadable(e.to_string()))?;
    if kept.len() > MOST {
        return Err(unreadable(format!("{} reservations", kept.len())));
    }
    let total = kept.len() as u64;
    let live: Vec<_> = kept.into_iter().filter_map(Kept::reservation).collect();
    let bad = total - live.len() as u64;
    Ok((live, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::rule::validate;

    fn reservation(id: u64, rule: ringlimit_core::limiter::Rule) -> Reservation {
        Reservation {
            id,
            tenant: Tenant::Named(7),
            rule,
            estimate: 40,
            mark: Some(Mark {
                reset_ns: 9,
                at_ns: 3,
            }),
            deadline: 1_000,
        }
    }

    #[test]
    fn reservations_come_back_as_they_were_written_and_none_remove_the_file() {
        let d = tempfile::tempdir().expect("a temp dir");
        let owner = ("c", "n1");
        let fixed = validate(Algorithm::FixedWindow, 100, 86_400_000_000_000, None).expect("ok");
        let bucket = validate(Algorithm::TokenBucket, 10, 1_000_000_000, Some(50)).expect("ok");
        let cal = validate_calendar(
            Algorithm::FixedWindow,
            1_000,
            0,
            None,
            Some(Calendar {
                unit: ringlimit_proto::calendar::Unit::Month,
                zone: ringlimit_proto::calendar::Zone::parse("Europe/Berlin").expect("a zone"),
            }),
        )
        .expect("ok");
        let mut live = vec![
            (1u128, reservation(11, fixed)),
            (u128::MAX, reservation(12, bucket)),
            (3, reservation(13, cal)),
        ];
        live[1].1.tenant = Tenant::Inline(5);
        live[2].1.mark = None;
        assert!(write(d.path(), owner, &live).expect("written") > 0);
        let (mut back, bad) = read(d.path(), owner).expect("read");
        back.sort_by_key(|(n, _)| *n);
        live.sort_by_key(|(n, _)| *n);
        assert_eq!((back, bad), (live, 0));
        write(d.path(), owner, &[]).expect("written");
        assert!(!d.path().join(FILE).exists());
        assert_eq!(read(d.path(), owner).expect("none").0, vec![]);
    }

    #[test]
    fn another_nodes_or_a_damaged_file_is_refused_with_its_reason() {
        let d = tempfile::tempdir().expect("a temp dir");
        let fixed = validate(Algorithm::FixedWindow, 100, 60_000_000_000, None).expect("ok");
        write(d.path(), ("c", "n1"), &[(1, reservation(1, fixed))]).expect("written");
        let e = read(d.path(), ("c", "n2")).expect_err("another node's");
        assert!(e.to_string().contains("\"n1\""), "{e}");
        let path = d.path().join(FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).expect("written");
        let e = read(d.path(), ("c", "n1")).expect_err("damaged");
        assert!(e.to_string().contains("does not check"), "{e}");
        std::fs::write(&path, b"junk").expect("written");
        assert!(read(d.path(), ("c", "n1")).is_err());
    }
}
