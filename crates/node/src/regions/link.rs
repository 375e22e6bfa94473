//! The exchange task: every interval (and when a bucket runs low) the reports due, grouped by
//! their buckets' home regions, go to the home: ours at once, another over its region link
//! (one `RegionAsks` frame per region an exchange), and the grants come back to the
//! allowances. A link is dialled (its name resolved again) whenever it is down; every
//! exchange is bounded by one interval, and an answer that comes later is skipped on a link
//! kept open (a redial costs three round trips).

use super::{LinkState, Regions};
use crate::local::Local;
use ringlimit_core::link::dial::Dial;
use ringlimit_core::link::framing::{self, FramedPeer, LinkError};
use ringlimit_core::regions::Due;
use ringlimit_proto::auth::Role;
use ringlimit_proto::handshake::ClientHandshake;
use ringlimit_proto::peer::{Frame, REGION_TALLY_SINCE};
use ringlimit_proto::region::{MAX_ASKS_PER_FRAME, RegionAskEntry, TalliedAsk};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Batches waiting for one region's link (a slow link drops what is beyond: those asks are
/// given up as unanswered, which is never more admissions).
const QUEUE: usize = 4;

/// Answers a link may owe: exchanges given up on (no answer within the interval) whose answers
/// may still come, in order, before the next one's. One late answer costs no redial (a redial
/// is three round trips); past this many the link is dialled again, as a connection backing
/// off its retransmissions gets through later than a fresh one.
pub(super) const OWED: u32 = 2;

/// The handshake's wait when dialling, its two round trips together (the connect's is one
/// interval).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(2);

/// Starts the exchange task and one link task per other region in `tasks` (the node's),
/// dialling with `dialer` (the peer links': TCP, inside TLS under `--peer-tls-*`).
pub fn spawn(
    regions: Arc<Regions>,
    local: Arc<Local>,
    node_id: String,
    dialer: Arc<dyn Dial>,
    tasks: &mut JoinSet<()>,
) {
    let mut senders = Vec::new();
    for i in 1..regions.links.len() {
        let (tx, rx) = mpsc::channel::<Vec<Due>>(QUEUE);
        senders.push(tx);
        let link = link(
            regions.clone(),
            local.clone(),
            i,
            (node_id.clone(), dialer.clone()),
            rx,
        );
        tasks.spawn(link);
    }
    tasks.spawn(exchange(regions, local, senders));
}

async fn exchange(regions: Arc<Regions>, local: Arc<Local>, senders: Vec<mpsc::Sender<Vec<Due>>>) {
    let interval = Duration::from_nanos(regions.settings().interval_ns);
    let step = (interval / 10).max(Duration::from_millis(5));
    let mut last_tick = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(step) => {}
            () = regions.held.wake.notified() => {}
        }
        let now = local.now();
        if last_tick.elapsed() >= interval {
            last_tick = Instant::now();
            regions.tick(&local, now);
            // Every link is exercised each interval, reports or not: its state and round
            // trip stay current, and a region learns that it can reach its homes.
            for tx in &senders {
                let _ = tx.try_send(Vec::new());
            }
        }
        let due = regions.held.due(now);
        if due.is_empty() {
            continue;
        }
        let demand: u64 = due
            .iter()
            .filter(|d| !d.ask.early)
            .map(|d| d.ask.demand_milli)
            .sum();
        if due.iter().any(|d| !d.ask.early) {
            regions.told(demand);
        }
        let mut by_home: Vec<Vec<Due>> = (0..regions.links.len()).map(|_| Vec::new()).collect();
        for d in due {
            by_home[regions.home_of(d.id)].push(d);
        }
        for (i, batch) in by_home.into_iter().enumerate() {
            if batch.is_empty() {
                continue;
            }
            if i == 0 {
                for d in batch {
                    // This node decided the bucket's checks: it owns it in this region.
                    let g = regions.grant(&local, 0, d.seq, d.ask, now, &|_| true);
                    // Our own region's home shares our cluster's clock.
                    regions.held.answered(d.id, d.seq, g, local.now(), Some(0));
                }
                continue;
            }
            if let Some(tx) = senders.get(i - 1)
                && tx.try_send(batch).is_err()
            {
                regions.links[i]
                    .failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// Region `i`'s link: dials it when down, sends each batch, hands the grants back.
async fn link(
    regions: Arc<Regions>,
    local: Arc<Local>,
    i: usize,
    (node_id, dialer): (String, Arc<dyn Dial>),
    mut rx: mpsc::Receiver<Vec<Due>>,
) {
    let within = Duration::from_nanos(regions.settings().interval_ns);
    let mut conn: Option<FramedPeer> = None;
    let mut version = 0u16;
    let mut owed = 0u32;
    let me = format!("{}/{node_id}", regions.name());
    // While the link is down: the batches that came meanwhile (sent once it is up, while
    // their asks are current), and when it was last dialled.
    let mut waiting: VecDeque<(Instant, Vec<Due>)> = VecDeque::new();
    let mut dialled: Option<Instant> = None;
    loop {
        let l = &regions.links[i];
        if conn.is_none() {
            // Dialled again every fifth of an interval, not only when a batch comes: a
            // region back from a cut is up again within a few round trips of the network's
            // return, and its reports go out then.
            let redial = (within / 5).saturating_sub(dialled.map_or(within, |t| t.elapsed()));
            tokio::select! {
                b = rx.recv() => match b {
                    Some(b) => waiting.push_back((Instant::now(), b)),
                    None => return,
                },
                () = tokio::time::sleep(redial) => {}
            }
            drop_stale(&regions, i, &mut waiting, within);
            if dialled.is_some_and(|t| t.elapsed() < within / 5) {
                continue;
            }
            dialled = Some(Instant::now());
            match dial(
                &*dialer,
                &l.addr,
                &me,
                regions.secret(),
                connect_within(l, within),
            )
            .await
            {
                Ok((c, v)) => {
                    conn = Some(c);
                    version = v;
                    owed = 0;
                    dialled = None;
                }
                Err(reason) => {
                    unreachable(&regions, i, &reason);
                    continue;
                }
            }
        }
        // What waited for the link, while current, or the next batch.
        drop_stale(&regions, i, &mut waiting, within);
        let batch: Vec<Due> = if waiting.is_empty() {
            match rx.recv().await {
                Some(b) => b,
                None => return,
            }
        } else {
            waiting.drain(..).flat_map(|(_, b)| b).collect()
        };
        let Some(c) = conn.as_mut() else { continue };
        let ids: Vec<(u64, u64)> = batch.iter().map(|d| (d.seq, d.id)).collect();
        let mut asks: Vec<RegionAskEntry> = batch
            .into_iter()
            .map(|d| RegionAskEntry {
                seq: d.seq,
                ask: d.ask,
            })
            .collect();
        asks.truncate(MAX_ASKS_PER_FRAME);
        let frame = asks_frame(regions.name(), asks, version);
        let sent = Instant::now();
        match round_trip(c, &frame, &mut owed, sent + within).await {
            Err(LinkError::Timeout) if owed < OWED => {
                // Its answer may still come: skipped when it does.
                owed += 1;
                down(&regions, i, "no answer in time");
            }
            Ok(Frame::RegionGrants { grants }) => {
                l.set_rtt(sent.elapsed());
                l.set_state(LinkState::Up);
                regions.home.lock().set_down(i, false);
                l.ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let now = local.now();
                let ahead = regions.offset(&l.name).map(|o| o.offset_ns);
                for g in grants {
                    if let Some(&(_, id)) = ids.iter().find(|(seq, _)| *seq == g.seq) {
                        regions.held.answered(id, g.seq, g.grant, now, ahead);
                    }
                }
            }
            Ok(Frame::Refused { reason }) => {
                conn = None;
                down(&regions, i, &reason);
            }
            Ok(other) => {
                conn = None;
                down(&regions, i, &format!("unexpected {} frame", other.kind()));
            }
            Err(e) => {
                conn = None;
                down(&regions, i, &e.to_string());
            }
        }
    }
}

/// Drops the batches that waited for region `i`'s link half an interval or more (their region
/// gives their asks up after one), each an exchange that failed.
fn drop_stale(
    regions: &Regions,
    i: usize,
    waiting: &mut VecDeque<(Instant, Vec<Due>)>,
    within: Duration,
) {
    let before = waiting.len();
    waiting.retain(|(at, _)| at.elapsed() < within / 2);
    for _ in waiting.len()..before {
        down(regions, i, "no link");
    }
}

/// How long a dial's connect may take: an interval, or while the link is down a few of its
/// round trips (a connect whose first packet the network dropped is dialled again sooner than
/// the kernel would send it again).
fn connect_within(l: &super::RegionLink, within: Duration) -> Duration {
    match (l.state(), l.rtt_ms()) {
        (LinkState::Unreachable, Some(ms)) => {
            Duration::from_secs_f64(ms * 3.0 / 1_000.0).clamp(within / 5, within)
        }
        _ => within,
    }
}

/// `asks` of region `region` as a link (or a member) of protocol `version` takes them: with
/// their tallies, or (older) without, what lost asks admitted ahead of their grants told as
/// advances.
pub(crate) fn asks_frame(region: &str, asks: Vec<RegionAskEntry>, version: u16) -> Frame {
    let region = region.to_owned();
    if version >= REGION_TALLY_SINCE {
        return Frame::RegionAsksTallied {
            region,
            asks: asks.into_iter().map(TalliedAsk::from).collect(),
        };
    }
    Frame::RegionAsks {
        region,
        asks: asks.into_iter().map(untallied).collect(),
    }
}

/// [`asks_frame`] for a relay to the bucket's owner in this region.
pub(crate) fn relay_frame(region: &str, asks: Vec<RegionAskEntry>, version: u16) -> Frame {
    match asks_frame(region, asks, version) {
        Frame::RegionAsksTallied { region, asks } => Frame::RegionRelayTallied { region, asks },
        Frame::RegionAsks { region, asks } => Frame::RegionRelay { region, asks },
        other => other,
    }
}

fn untallied(e: RegionAskEntry) -> RegionAskEntry {
    RegionAskEntry {
        seq: e.seq,
        ask: e.ask.untallied(),
    }
}

/// Sends `frame` and returns its answer, both by `deadline`. The `owed` answers of exchanges
/// given up on come first and are skipped (their asks were given up as unanswered). A send
/// given up on leaves its frame whole in the connection's buffer, sent before the next one.
pub(super) async fn round_trip(
    conn: &mut FramedPeer,
    frame: &Frame,
    owed: &mut u32,
    deadline: Instant,
) -> Result<Frame, LinkError> {
    tokio::time::timeout_at(deadline, framing::send(conn, frame))
        .await
        .map_err(|_| LinkError::Timeout)??;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = framing::recv(conn, left).await?;
        if *owed > 0
            && matches!(
                frame,
                Frame::RegionGrants { .. } | Frame::RegionCountsAck { .. }
            )
        {
            *owed -= 1;
            continue;
        }
        return Ok(frame);
    }
}

fn down(regions: &Regions, i: usize, reason: &str) {
    regions.links[i]
        .failed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    unreachable(regions, i, reason);
}

/// [`down`] without an exchange that failed (a dial while the link was down).
fn unreachable(regions: &Regions, i: usize, reason: &str) {
    let l = &regions.links[i];
    let was = l.state();
    l.set_state(LinkState::Unreachable);
    // A region this node cannot reach may be deciding on its fallback share of any bucket
    // homed here, one it never had an allowance of included: reserve it everywhere.
    regions.home.lock().set_down(i, true);
    if was != LinkState::Unreachable || regions.log_gate.pass().is_some() {
        tracing::warn!(region = %l.name, addr = %l.addr, %reason, "region link down");
    }
}

/// Dials a region's entry node and opens a region link (its name resolved again now); returns
/// it and the protocol version it speaks. The connect is bounded by `connect_within`, the
/// handshake by a wait of its own: it is two more round trips, which on a long link take much
/// of an interval.
pub(super) async fn dial(
    dialer: &dyn Dial,
    addr: &str,
    me: &str,
    secret: Option<Arc<[u8]>>,
    connect_within: Duration,
) -> Result<(FramedPeer, u16), String> {
    let io = match tokio::time::timeout(connect_within, dialer.dial(addr)).await {
        Ok(io) => io.map_err(|e| format!("cannot connect: {e}"))?,
        Err(_) => return Err("no answer in time".to_owned()),
    };
    let conn = framing::framed(io);
    tokio::time::timeout(HANDSHAKE_WAIT, handshake(conn, me, secret))
        .await
        .map_err(|_| "no handshake in time".to_owned())?
}

async fn handshake(
    mut conn: FramedPeer,
    me: &str,
    secret: Option<Arc<[u8]>>,
) -> Result<(FramedPeer, u16), String> {
    let (mut hs, hello) = ClientHandshake::start_region(me, secret.as_deref(), rand::random());
    framing::send(&mut conn, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let challenge = framing::recv(&mut conn, HANDSHAKE_WAIT)
        .await
        .map_err(|e| format!("no challenge: {e}"))?;
    let proof = hs.on_challenge(challenge).map_err(|e| e.to_string())?;
    framing::send(&mut conn, &proof)
        .await
        .map_err(|e| e.to_string())?;
    let key = hs.session_key();
    let version = hs.version();
    let welcome = framing::recv(&mut conn, HANDSHAKE_WAIT)
        .await
        .map_err(|e| format!("no welcome: {e}"))?;
    hs.on_welcome(welcome).map_err(|e| e.to_string())?;
    if let Some(key) = key {
        conn.codec_mut().seal(&key, Role::Client);
    }
    Ok((conn, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_proto::RuleRef;
    use ringlimit_proto::region::{AskAgain, AskTally, RegionAsk};

    fn entry() -> RegionAskEntry {
        RegionAskEntry {
            seq: 9,
            ask: RegionAsk {
                key: "k".into(),
                rule: RuleRef::Named("shared".into()),
                demand_milli: 1_000,
                back: vec![],
                advance: 1,
                early: false,
                leaving: false,
                held: 0,
                unanswered: vec![8],
                tally: Some(AskTally {
                    asked_total: 40,
                    fallback_total: 0,
                    asked_at_turn: 0,
                    again: vec![AskAgain {
                        seq: 8,
                        back: vec![],
                        advance: 2,
                    }],
                }),
            },
        }
    }

    /// A link of an older version is sent the asks it knows, a lost ask's advance told as the
    /// next's own (it would otherwise never be charged); a newer one gets the tally whole.
    #[test]
    fn asks_go_tallied_to_a_new_link_and_folded_to_an_old_one() {
        match asks_frame("eu", vec![entry()], REGION_TALLY_SINCE - 1) {
            Frame::RegionAsks { asks, .. } => {
                assert_eq!(asks[0].ask.advance, 3);
                assert_eq!(asks[0].ask.tally, None);
            }
            other => panic!("{other:?}"),
        }
        match relay_frame("eu", vec![entry()], REGION_TALLY_SINCE) {
            Frame::RegionRelayTallied { asks, .. } => {
                assert_eq!(asks[0].ask.advance, 1);
                assert_eq!(asks[0].tally.asked_total, 40);
                assert_eq!(asks[0].tally.again.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            relay_frame("eu", vec![entry()], REGION_TALLY_SINCE - 1),
            Frame::RegionRelay { .. }
        ));
    }
}
