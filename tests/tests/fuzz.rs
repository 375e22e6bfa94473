//! Fuzz targets, driven by proptest: cargo-fuzz needs a nightly toolchain these machines cannot
//! install. Each target takes arbitrary bytes and bytes mutated from valid inputs (flips, inserts,
//! deletes, truncations, splices of the seeds below), and asserts what the node relies on: no
//! panic, every rejection a typed error with a message, and no allocation out of proportion to the
//! input (a per-thread allocation counter wraps the global allocator).
//!
//! Bounded in `cargo test` (256 cases a target by default); longer runs by `fuzz/run.sh`
//! (`CASES=200000 fuzz/run.sh`). The HTTP check bodies are fuzzed against a running node.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ringlimit_core::link::framing;
use ringlimit_node::cluster::transport::{payload_len, seal};
use ringlimit_node::rules::RuleSet;
use ringlimit_node::rules::envoy_config::EnvoyConfig;
use ringlimit_proto::handshake::{ClientHandshake, ServerHandshake};
use ringlimit_proto::peer::{
    CheckGroup, FlaggedGroup, Frame, GroupKind, HandedBucket, MAX_FRAME_BYTES, PeerCheck,
    PeerRefund, RELAYED_GROUP, RefundGroup,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Allocation accounting: bytes this thread allocated and not yet freed, and the peak of that.

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: the thread's locals may be gone while it exits.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the most bytes it held allocated at once.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get) - base;
    (out, peak.max(0) as usize)
}

// ---------------------------------------------------------------------------------------------
// Inputs: arbitrary bytes, or a seed mutated a few times.

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// Copies a slice of the input over another place (repeats structure: lengths, tags).
    Splice(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Edit::Delete(i, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), any::<usize>(), 1usize..32).prop_map(|(a, b, n)| Edit::Splice(a, b, n)),
    ]
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = bytes.len();
        match e {
            Edit::Flip(i, b) if len > 0 => bytes[i % len] ^= b | 1,
            Edit::Insert(i, b) => {
                let at = i % (len + 1);
                bytes.splice(at..at, b.iter().copied());
            }
            Edit::Delete(i, n) if len > 0 => {
                let at = i % len;
                bytes.drain(at..(at + n).min(len));
            }
            Edit::Truncate(i) => bytes.truncate(i % (len + 1)),
            Edit::Splice(a, b, n) if len > 0 => {
                let (from, to) = (a % len, b % len);
                let n = (*n).min(len - from).min(len - to);
                let chunk: Vec<u8> = bytes[from..from + n].to_vec();
                bytes[to..to + n].copy_from_slice(&chunk);
            }
            _ => {}
        }
    }
    bytes
}

/// Arbitrary bytes half the time, else one of `seeds` mutated 1 to 8 times.
fn input(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        (0..n, prop::collection::vec(edit(), 1..8))
            .prop_map(move |(i, edits)| apply(seeds[i].clone(), &edits)),
    ]
}

fn runner() -> TestRunner {
    // PROPTEST_CASES (read by `Config::default`) sets the length of a run; the default keeps
    // `cargo test` quick.
    TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    })
}

// ---------------------------------------------------------------------------------------------
// Peer frames.

fn frame_seeds() -> Vec<Vec<u8>> {
    let check = PeerCheck {
        key: "user:42".into(),
        rule: ringlimit_proto::RuleRef::Named("free-tier".into()),
        cost: 1,
    };
    let frames = vec![
        ClientHandshake::start("ringlimit", "n0", None, [7; 16]).1,
        Frame::Challenge {
            version: 1,
            nonce: [1; 16],
            proof: vec![2; 32],
        },
        Frame::Proof { proof: vec![3; 32] },
        Frame::Welcome {
            node_id: "n1".into(),
        },
        Frame::Refused {
            reason: "no".into(),
        },
        Frame::Checks(vec![CheckGroup {
            id: 9,
            kind: GroupKind::AllOrNothing,
            checks: vec![check.clone(), check.clone()],
        }]),
        Frame::FlaggedChecks(vec![FlaggedGroup {
            id: 9 | RELAYED_GROUP,
            checks: vec![check.clone()],
        }]),
        Frame::Handover(vec![HandedBucket {
            id: 5,
            state: ringlimit_core::limiter::BucketState::Fixed {
                end: 10,
                count: 3,
                period_tag: 0,
            }
            .to_wire(),
        }]),
        Frame::Reset { ids: vec![1, 2, 3] },
        Frame::Refunds(vec![RefundGroup {
            id: 4,
            refunds: vec![PeerRefund {
                key: "k".into(),
                rule: check.rule.clone(),
                cost: 1,
                mark: ringlimit_proto::peer::Mark {
                    reset_ns: 1,
                    at_ns: 2,
                },
            }],
        }]),
    ];
    frames
        .iter()
        .map(|f| f.encode().expect("a valid frame encodes"))
        .collect()
}

#[test]
fn fuzz_peer_frame_decoder() {
    runner()
        .run(&input(frame_seeds()), |bytes| {
            let (decoded, peak) = peak_of(|| Frame::decode(&bytes));
            if let Err(e) = &decoded {
                prop_assert!(!e.to_string().is_empty());
            }
            // bincode's limit bounds what a claimed length may allocate.
            prop_assert!(
                peak <= 2 * MAX_FRAME_BYTES,
                "{peak} bytes allocated for {} input bytes",
                bytes.len()
            );
            // What decodes re-encodes to a frame that decodes the same.
            if let Ok(frame) = decoded {
                let again = Frame::decode(&frame.encode().expect("encodes")).expect("decodes");
                prop_assert_eq!(again, frame);
            }
            Ok(())
        })
        .expect("the decoder never panics, errs with a message, stays bounded");
}

/// The length-prefixed stream: arbitrary bytes on a connection end in a frame, an error or a
/// timeout, never a panic, and a claimed length over the limit is refused before it is read.
#[test]
fn fuzz_peer_stream() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seeds: Vec<Vec<u8>> = frame_seeds()
        .into_iter()
        .map(|f| {
            let mut framed = (f.len() as u32).to_be_bytes().to_vec();
            framed.extend(f);
            framed
        })
        .chain([u32::MAX.to_be_bytes().to_vec()])
        .collect();
    runner()
        .run(&input(seeds), |bytes| {
            let (outcome, peak) = peak_of(|| {
                rt.block_on(async {
                    let (mut ours, theirs) = tokio::io::duplex(1 << 16);
                    let mut conn = framing::framed(theirs);
                    tokio::io::AsyncWriteExt::write_all(&mut ours, &bytes)
                        .await
                        .expect("written");
                    drop(ours);
                    let mut frames = 0;
                    loop {
                        match framing::recv(&mut conn, Duration::from_secs(1)).await {
                            Ok(_) => frames += 1,
                            Err(e) => break (frames, e.to_string()),
                        }
                    }
                })
            });
            prop_assert!(!outcome.1.is_empty());
            prop_assert!(peak <= 2 * MAX_FRAME_BYTES + (1 << 20), "{peak} bytes");
            Ok(())
        })
        .expect("the stream reader never panics");
}

#[test]
fn fuzz_handshake() {
    let seeds = frame_seeds();
    let secret: &[u8] = b"fuzz-secret";
    let clients = [ringlimit_proto::auth::NamedClientKey {
        name: "svc".into(),
        key: ringlimit_proto::auth::client_key(b"fuzz-client-token"),
    }];
    runner()
        .run(&(input(seeds.clone()), input(seeds)), |(first, second)| {
            // A server meeting arbitrary bytes as the client's Hello and then its Proof.
            for secret in [None, Some(secret)] {
                let Ok(hello) = Frame::decode(&first) else {
                    continue;
                };
                match ServerHandshake::on_hello(hello, "ringlimit", "n1", secret, [9; 16]) {
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                    Ok((server, _challenge)) => {
                        if let Ok(proof) = Frame::decode(&second) {
                            match server.on_proof(proof, &clients) {
                                // Without the secret a well-formed member's exchange is
                                // accepted; with it, or as a client, nothing made up here can
                                // prove it.
                                Ok(a) => prop_assert!(
                                    secret.is_none()
                                        && a.proven == ringlimit_proto::handshake::Proven::Nothing
                                ),
                                Err(e) => prop_assert!(!e.to_string().is_empty()),
                            }
                        }
                    }
                }
                // A client meeting arbitrary bytes as the server's Challenge and Welcome, as a
                // member and with a client credential (whose welcome nothing made up proves).
                let (member, _) = ClientHandshake::start("ringlimit", "n0", secret, [7; 16]);
                let (with_token, _) = ClientHandshake::start_client(
                    "ringlimit",
                    "sdk",
                    b"fuzz-client-token",
                    [7; 16],
                );
                for (mut client, is_client) in [(member, false), (with_token, true)] {
                    if let Ok(challenge) = Frame::decode(&first) {
                        match client.on_challenge(challenge) {
                            Err(e) => prop_assert!(!e.to_string().is_empty()),
                            Ok(_) => {
                                if let Ok(welcome) = Frame::decode(&second) {
                                    match client.on_welcome(welcome) {
                                        Ok(_) => prop_assert!(!is_client),
                                        Err(e) => prop_assert!(!e.to_string().is_empty()),
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Ok(())
        })
        .expect("the handshake never panics and refuses with a reason");
}

// ---------------------------------------------------------------------------------------------
// Gossip datagrams: the tag check in front of chitchat, then chitchat's own decoder (what a
// node without a secret hands it as is).

#[test]
fn fuzz_gossip_datagram() {
    use chitchat::transport::{Socket, UdpSocket as ChitchatUdp};
    use chitchat::{ChitchatEnvelope, ChitchatMessage, ProtocolVersion};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    // chitchat's own socket (its decoder is crate-private): what a node hands it.
    let (target, sentinel, raw) = rt.block_on(async {
        (
            ChitchatUdp::open(loopback).await.expect("bind"),
            ChitchatUdp::open(loopback).await.expect("bind"),
            std::net::UdpSocket::bind(loopback).expect("bind"),
        )
    });
    let to = target.local_addr().expect("addr");
    let sentinel_addr = sentinel.local_addr().expect("addr");
    // `run` takes an `Fn`: the sockets are borrowed mutably one case at a time.
    let sockets = tokio::sync::Mutex::new((target, sentinel));
    let secret: &[u8] = b"fuzz-secret";
    let tagged = |payload: &[u8]| {
        let mut d = payload.to_vec();
        d.resize(payload.len() + 24, 0);
        let n = seal(secret, &mut d, payload.len(), 1_700_000_000_000);
        d.truncate(n);
        d
    };
    let seeds = vec![
        vec![0u8; 8],
        tagged(b"\x00\x00ringlimit"),
        tagged(&[0u8; 64]),
        // chitchat's header: magic (LE), version, message type, then a cluster id.
        b"\x53\xb0\x00\x00\x09ringlimit\x00\x00\x00\x00".to_vec(),
    ];
    runner()
        .run(&input(seeds), |bytes| {
            // The tag check in front of chitchat: only an untouched tag passes.
            if let Some((len, sent_ms)) = payload_len(secret, &bytes) {
                prop_assert!(ringlimit_proto::auth::verify_datagram(
                    secret,
                    sent_ms,
                    &bytes[..len],
                    &bytes[len + 8..]
                ));
            }
            // Then chitchat's decoder, on the wire: the datagram, then a valid message after it;
            // the socket must survive the first and deliver the second.
            raw.send_to(&bytes, to).expect("sent");
            let delivered = rt.block_on(async {
                let mut guard = sockets.lock().await;
                let (target, sentinel) = &mut *guard;
                let envelope = ChitchatEnvelope {
                    version: ProtocolVersion::V0,
                    message: ChitchatMessage::BadCluster,
                };
                sentinel.send(to, envelope).await.expect("sent");
                tokio::time::timeout(Duration::from_secs(5), async {
                    loop {
                        let got = target.recv().await.expect("the socket lives on");
                        if got.from_addr == sentinel_addr {
                            return;
                        }
                    }
                })
                .await
            });
            prop_assert!(delivered.is_ok(), "the valid message after it never came");
            Ok(())
        })
        .expect("the datagram path never panics");
}

// ---------------------------------------------------------------------------------------------
// Configuration files: the rules file and envoyproxy/ratelimit's files.

const RULES_SEED: &str = "rules:
  - name: free-tier
    limit: 100
    period: 1m
    algorithm: token_bucket
    burst: 100
    mode: owner
    on_owner_unreachable: open
  - { name: per-ip, limit: 10, period: 1h, algorithm: sliding_window, shadow: true }
  - { name: g, limit: 5, period: 250ms, mode: global }
";

const ENVOY_SEED: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: path
    value: /api/*
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 5, name: u, replaces: [{ name: x }] }
  - key: plan
    value: free
    share_threshold: true
    quota_mode: true
    rate_limit: { unlimited: true }
";

/// YAML aliases that expand exponentially ("billion laughs").
const ALIAS_BOMB: &str = "a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
rules: [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
";

fn yaml_seeds() -> Vec<Vec<u8>> {
    [
        RULES_SEED,
        ENVOY_SEED,
        ALIAS_BOMB,
        "rules: []\n",
        "domain: d\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// The most a configuration file of `n` bytes may take in memory while it is read. Aliases make a
/// small file expand: found by this fuzzer, an alias bomb of a few hundred bytes held megabytes
/// before the YAML library refused it ("repetition limit exceeded", a fixed count of expanded
/// events). That limit is the bound: 32 MiB whatever the file, plus what its own size takes.
fn yaml_bound(n: usize) -> usize {
    (32 << 20) + 512 * n
}

#[test]
fn fuzz_rules_file() {
    runner()
        .run(&input(yaml_seeds()), |bytes| {
            let text = String::from_utf8_lossy(&bytes);
            let (parsed, peak) = peak_of(|| RuleSet::from_yaml(&text).map(|r| r.len()));
            if let Err(e) = parsed {
                prop_assert!(!e.to_string().is_empty());
            }
            prop_assert!(
                peak <= yaml_bound(bytes.len()),
                "{peak} bytes for {}",
                bytes.len()
            );
            Ok(())
        })
        .expect("the rules file parser never panics, refuses with a message, stays bounded");
}

#[test]
fn fuzz_envoy_files() {
    runner()
        .run(&input(yaml_seeds()), |bytes| {
            let text = String::from_utf8_lossy(&bytes);
            let (parsed, peak) = peak_of(|| {
                EnvoyConfig::from_files([("fuzz.yaml", text.as_ref())]).map(|c| c.domains())
            });
            if let Err(e) = parsed {
                prop_assert!(e.to_string().contains("fuzz.yaml"), "{e}");
            }
            prop_assert!(
                peak <= yaml_bound(bytes.len()),
                "{peak} bytes for {}",
                bytes.len()
            );
            Ok(())
        })
        .expect("the Envoy configuration reader never panics, refuses naming the file");
}

#[test]
fn an_alias_bomb_is_refused_quickly_and_bounded() {
    for read in [
        |t: &str| RuleSet::from_yaml(t).map(drop).map_err(|e| e.to_string()),
        |t: &str| {
            EnvoyConfig::from_files([("bomb.yaml", t)])
                .map(drop)
                .map_err(|e| e.to_string())
        },
    ] {
        let started = std::time::Instant::now();
        let (result, peak) = peak_of(|| read(ALIAS_BOMB));
        let err = result.expect_err("refused");
        assert!(err.contains("repetition limit exceeded"), "{err}");
        assert!(peak <= yaml_bound(ALIAS_BOMB.len()), "{peak} bytes");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP check bodies, against a running node: never a 5xx, every refusal the contract's error
// body, and the node answers a real check afterwards.

#[test]
fn fuzz_http_check_bodies() {
    use ringlimit_tests::{TestNode, inline};
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let node = rt.block_on(TestNode::single()).expect("a node");
    let check = serde_json::json!({ "key": "fuzz:1", "limit": 1000000, "period_ms": 1000,
        "algorithm": "sliding_log", "burst": 5, "cost": 1 });
    let named = serde_json::json!({ "key": "fuzz:2", "rule": "default", "cost": 0 });
    let bodies = [
        check.clone(),
        named.clone(),
        serde_json::json!({ "checks": [check.clone(), named.clone(), {"key": ""}] }),
        serde_json::json!({ "checks": [check, named] }),
    ];
    let seeds: Vec<Vec<u8>> = bodies
        .iter()
        .map(|b| serde_json::to_vec(b).expect("json"))
        .chain([b"{\"key\":\"\\ud800\",\"limit\":1e400,\"period_ms\":-1}".to_vec()])
        .collect();
    let paths = ["/v1/check", "/v1/check/batch", "/v1/check/all"];
    runner()
        .run(&(input(seeds), 0..paths.len()), |(body, path)| {
            let reply = rt
                .block_on(node.api().post_raw(paths[path], body.clone()))
                .map_err(|e| TestCaseError::fail(format!("no answer: {e:#}")))?;
            prop_assert!(
                reply.status < 500,
                "{} for {:?}",
                reply.status,
                String::from_utf8_lossy(&body)
            );
            if reply.status >= 400 && reply.status != 429 {
                let v = reply
                    .json()
                    .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
                prop_assert!(
                    v["error"].is_string() && v["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "{}",
                    reply.text
                );
            }
            Ok(())
        })
        .expect("no body gets a 5xx or an error without a message");
    let after = rt
        .block_on(node.api().check(&inline("fuzz:after", 1, 60_000)))
        .expect("the node still answers");
    assert_eq!(after.status, 200);
    rt.block_on(node.stop()).expect("stopped");
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1 on the wire, against a running node: the check loop's head parser (`http/h1.rs`)
// and its hand-over to hyper see any bytes a client may send. The connection is half-closed
// after the bytes, so every case ends: no panic, every answer a whole HTTP/1.1 response below
// 500 (but 505, HTTP's own answer to a version it does not speak), and the node answers a real
// check afterwards.

fn wire_seeds() -> Vec<Vec<u8>> {
    let body = r#"{"key":"wire","limit":1000000,"period_ms":1000}"#;
    let check = format!(
        "POST /v1/check HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    [
        check.clone(),
        format!("{check}{check}"),
        format!("{check}GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n{check}"),
        check
            .replace("/v1/check", "/v1/check/all")
            .replace(body, &format!("{{\"checks\":[{body}]}}"))
            .replace(
                &format!("Length: {}", body.len()),
                &format!("Length: {}", body.len() + 13),
            ),
        check
            .replace("/v1/check", "/v1/check/batch")
            .replace(body, &format!("{{\"checks\":[{body}]}}"))
            .replace(
                &format!("Length: {}", body.len()),
                &format!("Length: {}", body.len() + 13),
            ),
        check.replace("Host: n", "Transfer-Encoding: chunked"),
        check.replace("Host: n", "Expect: 100-continue"),
        check.replace("Host: n", "Connection: close"),
        check.replace("HTTP/1.1", "HTTP/1.0"),
        "GET /v1/cluster HTTP/1.1\r\nHost: n\r\n\r\n".to_owned(),
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

/// The status codes of the responses in `bytes`, in order: every `HTTP/1.x NNN ` in them (a
/// looser reading than parsing each response, which would have to know which have no body:
/// 1xx, answers to HEAD; an HTTP/1.0 request is answered in HTTP/1.0); an error for bytes that
/// do not start as a response.
fn statuses(bytes: &[u8]) -> Result<Vec<u16>, String> {
    let status_line = |w: &[u8]| {
        (w.starts_with(b"HTTP/1.1 ") || w.starts_with(b"HTTP/1.0 "))
            && w[9..12].iter().all(u8::is_ascii_digit)
            && w[12] == b' '
    };
    let starts_as_response = bytes.get(..13).is_some_and(status_line);
    if !bytes.is_empty() && !starts_as_response {
        return Err(format!(
            "not a response: {:?}",
            String::from_utf8_lossy(bytes)
        ));
    }
    let mut out = Vec::new();
    for (i, w) in bytes.windows(13).enumerate() {
        if status_line(w) {
            let code = std::str::from_utf8(&w[9..12])
                .ok()
                .and_then(|c| c.parse().ok());
            out.push(code.ok_or_else(|| format!("bad status at {i}"))?);
        }
    }
    Ok(out)
}

#[test]
fn fuzz_http_wire() {
    use ringlimit_tests::{TestNode, inline};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let node = rt.block_on(TestNode::single()).expect("a node");
    let addr = node.http;
    runner()
        .run(&input(wire_seeds()), |bytes| {
            let got = rt.block_on(async {
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                s.write_all(&bytes).await?;
                s.shutdown().await?;
                let mut got = Vec::new();
                tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
                    .await
                    .map_err(|_| std::io::Error::other("the node kept the connection open"))??;
                Ok::<_, std::io::Error>(got)
            });
            let got = match got {
                Ok(got) => got,
                // A reset once the node closed on bad bytes: what it sent before is lost.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            };
            if bytes.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") {
                // HTTP/2 prior knowledge: frames back, hyper's and h2's to judge.
                return Ok(());
            }
            let codes = statuses(&got).map_err(TestCaseError::fail)?;
            prop_assert!(
                codes.iter().all(|&c| c < 500 || c == 505),
                "{codes:?} for {:?}",
                String::from_utf8_lossy(&bytes)
            );
            Ok(())
        })
        .expect("every answer a response below 500");
    let after = rt
        .block_on(node.api().check(&inline("wire:after", 1, 60_000)))
        .expect("the node still answers");
    assert_eq!(after.status, 200);
    rt.block_on(node.stop()).expect("stopped");
}
