//! The peer client over the in-memory network, under tokio's paused clock: no sockets, no
//! real waiting. A fake owner runs the server side of the handshake and answers (or not).

use super::client::{ForwardError, PeerClient, PeerSettings, PeerStats, TIMEOUTS_TO_OPEN};
use super::framing::{self, FramedPeer};
use super::memnet::{MemListener, MemNet};
use parking_lot::Mutex;
use ringlimit_proto::handshake::ServerHandshake;
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, Frame, GroupKind, PeerAnswer, PeerCheck};
use ringlimit_proto::{CheckAnswer, RuleRef};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_millis(25);
const OPEN_FOR: Duration = Duration::from_secs(1);

fn settings(net: &MemNet) -> Arc<PeerSettings> {
    Arc::new(PeerSettings {
        dialer: net.dialer("client"),
        node_id: "client".into(),
        cluster_id: "ringlimit".into(),
        secret: None,
        client_token: None,
        deadline: DEADLINE,
        connect_timeout: Duration::from_millis(500),
        open_for: OPEN_FOR,
        queue: 64,
    })
}

fn check(key: &str) -> PeerCheck {
    PeerCheck {
        key: key.into(),
        rule: RuleRef::Named("r".into()),
        cost: 1,
    }
}

/// An owner that answers every check allowed, with `remaining` = the check's key length (so
/// answers can be told apart), unless told to stay silent. Records every `Checks` frame.
#[derive(Clone, Default)]
struct Owner {
    silent: Arc<AtomicBool>,
    /// Speaks protocol version 2 (a group's kind in its id's bits).
    version_2: Arc<AtomicBool>,
    /// Speaks protocol version 9 (before calendar windows): answers leases (each ask with an
    /// error coded `seen`), and records what it is sent.
    version_9: Arc<AtomicBool>,
    frames: Arc<Mutex<Vec<Vec<CheckGroup>>>>,
    /// The lease asks it was sent.
    lease_asks: Arc<Mutex<Vec<ringlimit_proto::peer::LeaseAsk>>>,
    /// Frames of any other kind it was sent (it then closes the connection, as a decoder
    /// failing would).
    others: Arc<Mutex<Vec<&'static str>>>,
}

impl Owner {
    fn spawn(net: &MemNet, addr: &str) -> Self {
        let owner = Self::default();
        let listener = net.listen(addr);
        tokio::spawn(owner.clone().serve(listener));
        owner
    }

    async fn serve(self, mut listener: MemListener) {
        while let Some((io, _from)) = listener.accept().await {
            tokio::spawn(self.clone().connection(framing::framed(io)));
        }
    }

    async fn connection(self, mut conn: FramedPeer) {
        let within = Duration::from_secs(5);
        let Ok(hello) = framing::recv(&mut conn, within).await else {
            return;
        };
        let Ok((state, mut challenge)) =
            ServerHandshake::on_hello(hello, "ringlimit", "owner", None, [7; 16])
        else {
            return;
        };
        let version_2 = self.version_2.load(Ordering::Relaxed);
        if let (true, Frame::Challenge { version, .. }) = (version_2, &mut challenge) {
            *version = 2;
        }
        if let (true, Frame::Challenge { version, .. }) =
            (self.version_9.load(Ordering::Relaxed), &mut challenge)
        {
            *version = 9;
        }
        if framing::send(&mut conn, &challenge).await.is_err() {
            return;
        }
        let Ok(proof) = framing::recv(&mut conn, within).await else {
            return;
        };
        let Ok(accepted) = state.on_proof(proof, &[]) else {
            return;
        };
        if framing::send(&mut conn, &accepted.welcome).await.is_err() {
            return;
        }
        while let Ok(frame) = framing::recv(&mut conn, Duration::from_secs(3600)).await {
            let groups: Vec<CheckGroup> = match frame {
                Frame::Checks(groups) if !version_2 => groups,
                Frame::FlaggedChecks(groups) if version_2 => {
                    groups.into_iter().map(CheckGroup::from).collect()
                }
                Frame::Lease { asks } => {
                    let grants = asks
                        .iter()
                        .map(|_| ringlimit_proto::peer::LeaseGrant::Error {
                            code: "seen".into(),
                            message: String::new(),
                        })
                        .collect();
                    self.lease_asks.lock().extend(asks);
                    if framing::send(&mut conn, &Frame::Leased { grants })
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                other => {
                    self.others.lock().push(other.kind());
                    return;
                }
            };
            self.frames.lock().push(groups.clone());
            if self.silent.load(Ordering::Relaxed) {
                continue;
            }
            let answers = groups
                .into_iter()
                .map(|g| AnswerGroup {
                    id: g.id,
                    answers: g.checks.iter().map(answer).collect(),
                })
                .collect();
            if framing::send(&mut conn, &Frame::Answers(answers))
                .await
                .is_err()
            {
                return;
            }
        }
    }

    fn groups_seen(&self) -> usize {
        self.frames.lock().iter().map(Vec::len).sum()
    }
}

fn answer(c: &PeerCheck) -> PeerAnswer {
    PeerAnswer::Answer(CheckAnswer {
        allowed: true,
        limit: 10,
        remaining: c.key.len() as u64,
        reset_at_ms: 0,
        retry_after_ms: 0,
        degraded: false,
        replica: false,
        leased: false,
    })
}

fn remaining(a: &[PeerAnswer]) -> Vec<u64> {
    a.iter()
        .map(|a| a.answer().map_or(u64::MAX, |a| a.remaining))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_group_is_answered_in_order_and_counted() {
    let net = MemNet::new();
    let _owner = Owner::spawn(&net, "owner");
    let stats = Arc::new(PeerStats::default());
    let client = PeerClient::spawn("owner".into(), settings(&net), stats.clone());
    let answers = client
        .send(vec![check("a"), check("bbb"), check("cc")])
        .await
        .expect("answered");
    assert_eq!(remaining(&answers), [1, 3, 2]);
    assert_eq!(stats.frames.load(Ordering::Relaxed), 1);
    assert_eq!(stats.checks.load(Ordering::Relaxed), 3);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_owner_times_out_and_opens_the_circuit_only_once_it_stays_silent() {
    let net = MemNet::new();
    let _owner = Owner::spawn(&net, "owner");
    let client = PeerClient::spawn("owner".into(), settings(&net), Arc::default());
    client.send(vec![check("warm")]).await.expect("answered");
    net.stall("owner");
    for i in 1..=TIMEOUTS_TO_OPEN {
        let started = Instant::now();
        assert_eq!(
            client.send(vec![check("k")]).await,
            Err(ForwardError::Timeout),
            "timeout {i}"
        );
        assert_eq!(
            started.elapsed(),
            DEADLINE,
            "each waits exactly the deadline"
        );
    }
    // Silent for as many deadlines as it timed out: bypassed at once now.
    let started = Instant::now();
    assert_eq!(
        client.send(vec![check("k")]).await,
        Err(ForwardError::CircuitOpen)
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(!client.available());
    // Half-open after `open_for`: the owner answers again, and the circuit closes.
    net.resume("owner");
    tokio::time::sleep(OPEN_FOR).await;
    let answers = client.send(vec![check("back")]).await.expect("answered");
    assert_eq!(remaining(&answers), [4]);
    assert!(client.available());
}

#[tokio::test(start_paused = true)]
async fn concurrent_timeouts_of_one_stall_do_not_open_the_circuit() {
    let net = MemNet::new();
    let _owner = Owner::spawn(&net, "owner");
    let client = PeerClient::spawn("owner".into(), settings(&net), Arc::default());
    client.send(vec![check("warm")]).await.expect("answered");
    net.stall("owner");
    // Ten callers caught by one short stall: ten timeouts, but the owner was silent for one
    // deadline only.
    let sends = (0..10).map(|_| client.send(vec![check("k")]));
    let results = futures::future::join_all(sends).await;
    assert!(results.iter().all(|r| *r == Err(ForwardError::Timeout)));
    net.resume("owner");
    assert!(
        client.send(vec![check("ok")]).await.is_ok(),
        "circuit still closed"
    );
}

/// This process stopped (SIGSTOP) with checks in flight: it resumes with their deadlines long
/// past and the owner's answers not read yet. Before: each timed out, and together they opened
/// the circuit (the owner "silent" for the whole pause), so the checks after the resume fell
/// back too. Now a deadline that fired far too late waits once more, and the answers count.
#[tokio::test(start_paused = true)]
async fn deadlines_that_pass_while_this_process_is_stopped_wait_for_the_answer() {
    let net = MemNet::new();
    let _owner = Owner::spawn(&net, "owner");
    let client = Arc::new(PeerClient::spawn(
        "owner".into(),
        settings(&net),
        Arc::default(),
    ));
    client.send(vec![check("warm")]).await.expect("answered");
    // The answers cannot come back before the jump (held as in the socket of a stopped process).
    net.stall("owner");
    let sends: Vec<_> = (0..TIMEOUTS_TO_OPEN + 2)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.send(vec![check("kk")]).await })
        })
        .collect();
    tokio::task::yield_now().await;
    // Resumed: 4 s went by at once; the timers run before the answers are read (the order a
    // resumed runtime may take), then the bytes move again.
    tokio::time::advance(Duration::from_secs(4)).await;
    net.resume("owner");
    for s in sends {
        let answers = s.await.expect("task").expect("answered after the resume");
        assert_eq!(remaining(&answers), [2]);
    }
    assert!(client.available(), "the circuit stays closed");
    assert!(client.send(vec![check("k")]).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_connection_fails_waiting_callers_at_once_and_reconnects() {
    let net = MemNet::new();
    let owner = Owner::spawn(&net, "owner");
    let client = Arc::new(PeerClient::spawn(
        "owner".into(),
        settings(&net),
        Arc::default(),
    ));
    client.send(vec![check("warm")]).await.expect("answered");
    assert_eq!(net.dials("owner"), 1);
    owner.silent.store(true, Ordering::Relaxed);
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            let started = Instant::now();
            (client.send(vec![check("k")]).await, started.elapsed())
        }
    });
    // Let the check reach the owner, then break the link.
    while owner.groups_seen() < 2 {
        tokio::task::yield_now().await;
    }
    net.drop_connections("owner");
    let (result, waited) = waiting.await.expect("joined");
    assert_eq!(result, Err(ForwardError::Lost));
    assert!(
        waited < DEADLINE,
        "failed at once, not at the deadline: {waited:?}"
    );
    // The circuit is open until a new connection is up.
    assert_eq!(
        client.send(vec![check("k")]).await,
        Err(ForwardError::CircuitOpen)
    );
    owner.silent.store(false, Ordering::Relaxed);
    tokio::time::sleep(OPEN_FOR).await;
    let answers = client.send(vec![check("again")]).await.expect("answered");
    assert_eq!(remaining(&answers), [5]);
    assert_eq!(net.dials("owner"), 2, "reconnected by itself");
}

#[tokio::test(start_paused = true)]
async fn a_cut_link_fails_fast_and_heals() {
    let net = MemNet::new();
    let _owner = Owner::spawn(&net, "owner");
    let client = PeerClient::spawn("owner".into(), settings(&net), Arc::default());
    client.send(vec![check("warm")]).await.expect("answered");
    net.cut("client", "owner");
    let first = client.send(vec![check("k")]).await;
    assert!(
        matches!(first, Err(ForwardError::Lost | ForwardError::CircuitOpen)),
        "{first:?}"
    );
    let started = Instant::now();
    assert_eq!(
        client.send(vec![check("k")]).await,
        Err(ForwardError::CircuitOpen)
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    net.heal("client", "owner");
    // Reconnects with backoff (at most 1 s apart) and answers again.
    let mut answered = false;
    for _ in 0..10 {
        tokio::time::sleep(OPEN_FOR).await;
        if client.send(vec![check("k")]).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered, "the healed link carries checks again");
}

#[tokio::test(start_paused = true)]
async fn checks_queued_while_the_writer_waits_travel_as_one_frame() {
    let net = MemNet::new();
    let owner = Owner::spawn(&net, "owner");
    let stats = Arc::new(PeerStats::default());
    let client = PeerClient::spawn("owner".into(), settings(&net), stats.clone());
    client.send(vec![check("warm")]).await.expect("answered");
    // The first of ten concurrent sends occupies the writer on a stalled link; the nine
    // queued behind it go together as soon as it is free.
    net.stall("owner");
    let keys: Vec<String> = (1..=10).map(|n| "k".repeat(n)).collect();
    let sends = futures::future::join_all(keys.iter().map(|k| client.send(vec![check(k)])));
    let resume = async {
        tokio::task::yield_now().await;
        net.resume("owner");
    };
    let (results, ()) = tokio::join!(sends, resume);
    for (n, r) in results.into_iter().enumerate() {
        assert_eq!(remaining(&r.expect("answered")), [n as u64 + 1]);
    }
    let frames = owner.frames.lock().clone();
    assert_eq!(
        frames.len(),
        2,
        "warm-up, then all ten in one frame: {frames:?}"
    );
    assert_eq!(frames[1].len(), 10);
    assert_eq!(stats.frames.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_relayed_group_says_so() {
    let net = MemNet::new();
    let owner = Owner::spawn(&net, "owner");
    let client = PeerClient::spawn("owner".into(), settings(&net), Arc::default());
    client.send(vec![check("a")]).await.expect("answered");
    client
        .send_relayed(vec![check("b")])
        .await
        .expect("answered");
    let frames = owner.frames.lock().clone();
    assert_eq!(frames[0][0].kind, GroupKind::Owned);
    assert_eq!(frames[1][0].kind, GroupKind::Relayed);
}

/// An owner that chose version 2 gets its groups' kinds in their ids' bits, and answers
/// echoing those ids: every kind of group is answered as before.
#[tokio::test(start_paused = true)]
async fn an_owner_speaking_version_2_reads_kinds_in_group_ids() {
    use ringlimit_proto::peer::{ALL_OR_NOTHING_GROUP, GROUP_FLAGS, RELAYED_GROUP};
    let net = MemNet::new();
    let owner = Owner::default();
    owner.version_2.store(true, Ordering::Relaxed);
    tokio::spawn(owner.clone().serve(net.listen("owner")));
    let client = PeerClient::spawn("owner".into(), settings(&net), Arc::default());
    let a = client.send(vec![check("a")]).await.expect("answered");
    let bb = client
        .send_relayed(vec![check("bb")])
        .await
        .expect("answered");
    let ccc = client.send_all(vec![check("ccc")]).await.expect("answered");
    assert_eq!([a, bb, ccc].map(|r| remaining(&r)), [[1], [2], [3]]);
    let frames = owner.frames.lock().clone();
    let seen: Vec<(GroupKind, u64)> = frames
        .iter()
        .flatten()
        .map(|g| (g.kind, g.id & GROUP_FLAGS))
        .collect();
    assert_eq!(
        seen,
        [
            (GroupKind::Owned, 0),
            (GroupKind::Relayed, RELAYED_GROUP),
            (GroupKind::AllOrNothing, ALL_OR_NOTHING_GROUP)
        ]
    );
}

/// A replica group goes only to a peer that speaks version 4: an older one gets no frame (its
/// decoder would fail the whole frame) and each check is answered `unsupported`; a current one
/// sees the kinds.
#[tokio::test(start_paused = true)]
async fn replica_groups_go_only_to_peers_that_know_them() {
    let net = MemNet::new();
    let old = Owner::default();
    old.version_2.store(true, Ordering::Relaxed);
    tokio::spawn(old.clone().serve(net.listen("old")));
    let client = PeerClient::spawn("old".into(), settings(&net), Arc::default());
    let answers = client
        .send_replica(vec![check("a"), check("b")], false)
        .await
        .expect("answered");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, PeerAnswer::Error { code, .. } if code == "unsupported")),
        "{answers:?}"
    );
    assert!(old.frames.lock().is_empty(), "no frame sent");
    // The connection still carries what the peer knows.
    client.send(vec![check("c")]).await.expect("answered");

    let owner = Owner::spawn(&net, "new");
    let client = PeerClient::spawn("new".into(), settings(&net), Arc::default());
    client
        .send_replica(vec![check("a")], false)
        .await
        .expect("answered");
    client
        .send_replica(vec![check("b")], true)
        .await
        .expect("answered");
    let kinds: Vec<GroupKind> = owner
        .frames
        .lock()
        .iter()
        .flatten()
        .map(|g| g.kind)
        .collect();
    assert_eq!(kinds, [GroupKind::Replica, GroupKind::ReplicaAllOrNothing]);
}

mod memnet {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::link::framing::BoxedIo;

    /// A connection from a to b, and b's listener (dropping it refuses later dials).
    async fn connected(net: &MemNet) -> (BoxedIo, BoxedIo, MemListener) {
        let mut listener = net.listen("b");
        let near = net.dialer("a").dial("b").await.expect("dialed");
        let (far, from) = listener.accept().await.expect("accepted");
        assert_eq!(from, "a");
        (near, far, listener)
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_refuses_dials_and_breaks_open_connections() {
        let net = MemNet::new();
        let (mut near, mut far, _listener) = connected(&net).await;
        net.cut("b", "a");
        assert!(near.write_all(b"x").await.is_err());
        assert!(far.read_u8().await.is_err());
        let refused = net.dialer("a").dial("b").await.err().map(|e| e.kind());
        assert_eq!(refused, Some(std::io::ErrorKind::ConnectionRefused));
        net.heal("a", "b");
        assert!(net.dialer("a").dial("b").await.is_ok());
        assert!(net.dialer("x").dial("nobody").await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_holds_bytes_and_a_resume_delivers_them() {
        let net = MemNet::new();
        let (mut near, mut far, _listener) = connected(&net).await;
        net.stall("b");
        let read = tokio::spawn(async move {
            let mut buf = [0u8; 5];
            far.read_exact(&mut buf).await.map(|_| buf)
        });
        let write = tokio::spawn(async move { near.write_all(b"hello").await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !read.is_finished() && !write.is_finished(),
            "nothing moves while stalled"
        );
        net.resume("b");
        write.await.expect("joined").expect("written");
        assert_eq!(&read.await.expect("joined").expect("read"), b"hello");
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_connections_close_and_new_ones_work() {
        let net = MemNet::new();
        let (mut near, _far, _listener) = connected(&net).await;
        net.drop_connections("b");
        assert!(near.write_all(b"x").await.is_err());
        assert!(net.dialer("a").dial("b").await.is_ok());
        assert_eq!(net.dials("b"), 2);
    }
}

/// Reservations go only to an owner that keeps them (protocol 7): an older one is sent
/// nothing (its decoder would fail the frame), a reserve is unavailable saying why, and a
/// settle is unknown (the older owner never took the reservation).
#[tokio::test(start_paused = true)]
async fn reservations_go_only_to_owners_that_keep_them() {
    use super::reservations::{reserve, settle};
    use super::session::{SessionPool, Sessions};
    use crate::reservations::ReserveError;
    use ringlimit_proto::peer::{PeerReserve, PeerSettle};
    let net = MemNet::new();
    let old = Owner::default();
    old.version_2.store(true, Ordering::Relaxed);
    tokio::spawn(old.clone().serve(net.listen("old")));
    let pool = SessionPool::new(Sessions::new(settings(&net)), 2);
    let ask = PeerReserve {
        key: "k".into(),
        rule: RuleRef::Named("r".into()),
        cost: 5,
        ttl_ms: 1_000,
        nonce: 1,
    };
    match reserve(&pool, "old", ask).await {
        Err(ReserveError::Unavailable(why)) => assert!(why.contains("protocol 2"), "{why}"),
        other => panic!("{other:?}"),
    }
    let s = PeerSettle {
        key: "k".into(),
        rule: RuleRef::Named("r".into()),
        nonce: 1,
        cost: 5,
    };
    assert_eq!(settle(&pool, "old", s).await, Err(ReserveError::Unknown));
    // The connection is kept, and checks still go on it.
    let client = PeerClient::spawn("old".into(), settings(&net), Arc::default());
    assert_eq!(
        remaining(&client.send(vec![check("a")]).await.expect("answered")),
        [1]
    );
    assert_eq!(old.groups_seen(), 1, "nothing but the check reached it");
}

/// An inline rule with calendar windows (a month in Berlin).
fn monthly() -> RuleRef {
    RuleRef::Inline(ringlimit_proto::InlineRule {
        limit: 10_000,
        period_ms: 31 * 86_400_000,
        algorithm: ringlimit_proto::Algorithm::FixedWindow,
        burst: None,
        calendar: Some(ringlimit_proto::calendar::Calendar {
            unit: ringlimit_proto::calendar::Unit::Month,
            zone: ringlimit_proto::calendar::Zone::parse("Europe/Berlin").expect("zone"),
        }),
    })
}

/// A reserve or a settle of an inline calendar rule goes only to an owner that knows calendar
/// windows (protocol 10): one of protocol 9 keeps reservations but is sent nothing (its
/// decoder would fail the frame), and each is unavailable saying why.
#[tokio::test(start_paused = true)]
async fn calendar_reservations_go_only_to_owners_that_know_calendars() {
    use super::reservations::{reserve, settle};
    use super::session::{SessionPool, Sessions};
    use crate::reservations::ReserveError;
    use ringlimit_proto::peer::{PeerReserve, PeerSettle};
    let net = MemNet::new();
    let old = Owner::default();
    old.version_9.store(true, Ordering::Relaxed);
    tokio::spawn(old.clone().serve(net.listen("old")));
    let pool = SessionPool::new(Sessions::new(settings(&net)), 2);
    let ask = PeerReserve {
        key: "k".into(),
        rule: monthly(),
        cost: 5,
        ttl_ms: 1_000,
        nonce: 1,
    };
    let why = |r: Result<CheckAnswer, ReserveError>| match r {
        Err(ReserveError::Unavailable(why)) => why,
        other => panic!("{other:?}"),
    };
    let w = why(reserve(&pool, "old", ask).await);
    assert!(
        w.contains("protocol 9") && w.contains("calendar windows need 10"),
        "{w}"
    );
    let s = PeerSettle {
        key: "k".into(),
        rule: monthly(),
        nonce: 1,
        cost: 5,
    };
    let w = why(settle(&pool, "old", s).await);
    assert!(w.contains("calendar windows need 10"), "{w}");
    assert!(old.others.lock().is_empty(), "{:?}", old.others.lock());
    // A named rule's reserve is sent (this owner does not answer it: it closes).
    let named = PeerReserve {
        key: "k".into(),
        rule: RuleRef::Named("r".into()),
        cost: 5,
        ttl_ms: 1_000,
        nonce: 2,
    };
    // (Sent once more on a new connection, as after any idle connection's loss.)
    let _ = reserve(&pool, "old", named).await;
    let others = old.others.lock().clone();
    assert!(
        !others.is_empty() && others.iter().all(|k| *k == "reserve"),
        "{others:?}"
    );
}

/// Lease asks of an inline calendar rule are not sent to an owner below protocol 10: each is
/// answered `unsupported` in its place, and the other asks of the frame go as before.
#[tokio::test(start_paused = true)]
async fn calendar_lease_asks_are_answered_unsupported_for_older_owners() {
    use super::session::Sessions;
    use crate::lease::asking::LeaseLink;
    use ringlimit_proto::peer::{LeaseAsk, LeaseGrant};
    let net = MemNet::new();
    let old = Owner::default();
    old.version_9.store(true, Ordering::Relaxed);
    tokio::spawn(old.clone().serve(net.listen("old")));
    let mut link = LeaseLink::new(Sessions::new(settings(&net)).open("old"));
    let ask = |key: &str, rule: RuleRef| LeaseAsk {
        key: key.into(),
        rule,
        want: 10,
        demand_per_s: 100,
    };
    let grants = link
        .ask(vec![
            ask("a", monthly()),
            ask("b", RuleRef::Named("r".into())),
            ask("c", monthly()),
        ])
        .await
        .expect("answered");
    let codes: Vec<&str> = grants
        .iter()
        .map(|g| match g {
            LeaseGrant::Error { code, .. } => code.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(codes, ["unsupported", "seen", "unsupported"]);
    let sent: Vec<String> = old
        .lease_asks
        .lock()
        .iter()
        .map(|a| a.key.clone())
        .collect();
    assert_eq!(sent, ["b"]);
    // Only calendar asks: nothing sent at all.
    let grants = link.ask(vec![ask("d", monthly())]).await.expect("answered");
    assert!(matches!(&grants[..], [LeaseGrant::Error { code, .. }] if code == "unsupported"));
    assert_eq!(old.lease_asks.lock().len(), 1);
    assert!(old.others.lock().is_empty());
}

/// A member's address that now answers as another node (a pod IP reused after a restart) is
/// not used: the client expecting the member falls back, the one expecting the node there
/// checks.
#[tokio::test(start_paused = true)]
async fn a_client_for_one_member_does_not_use_another_node_at_its_address() {
    let net = MemNet::new();
    let owner = Owner::spawn(&net, "owner");
    let stale = PeerClient::spawn_to(
        "owner".into(),
        Some("node-gone".into()),
        settings(&net),
        Arc::default(),
    );
    let right = PeerClient::spawn_to(
        "owner".into(),
        Some("owner".into()),
        settings(&net),
        Arc::default(),
    );
    right.send(vec![check("a")]).await.expect("answered");
    for _ in 0..3 {
        assert!(stale.send(vec![check("b")]).await.is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!stale.available());
    // Only the right client's check reached the owner.
    assert_eq!(owner.frames.lock().len(), 1);
}
