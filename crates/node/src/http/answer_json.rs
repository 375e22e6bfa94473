//! A check answer's JSON, written by hand for a measured reason: serde_json serializes a struct
//! through its map path, escaping each field name as it goes, and that was a large share of a
//! `POST /v1/check/batch`'s server CPU time (`perf` under `bench/cpu.sh`'s load; the docs'
//! benchmarks page, "Server CPU per check, by path"). The fields are six fixed names and numbers,
//! so the bytes are known but for the numbers; the tests hold the output to serde's, byte for byte.
//! Every answer body of the check endpoints (single, batch, all-or-nothing) is written here.

use super::error::ErrorBody;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::BlockSource;

/// Bytes of one answer at most (six fields, three 20-digit numbers, a shadow verdict).
const MAX_ANSWER_BYTES: usize = 200;

/// Appends `a`'s fields, `"allowed":…,"degraded":…`, without the braces.
fn write_fields(out: &mut Vec<u8>, a: &CheckAnswer) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(if a.allowed {
        b"\"allowed\":true,\"limit\":"
    } else {
        b"\"allowed\":false,\"limit\":"
    });
    out.extend_from_slice(n.format(a.limit).as_bytes());
    out.extend_from_slice(b",\"remaining\":");
    out.extend_from_slice(n.format(a.remaining).as_bytes());
    out.extend_from_slice(b",\"reset_at_ms\":");
    out.extend_from_slice(n.format(a.reset_at_ms).as_bytes());
    out.extend_from_slice(b",\"retry_after_ms\":");
    out.extend_from_slice(n.format(a.retry_after_ms).as_bytes());
    out.extend_from_slice(if a.degraded {
        b",\"degraded\":true"
    } else {
        b",\"degraded\":false"
    });
    // Only when set: answers made by their owner keep their shape.
    if a.replica {
        out.extend_from_slice(b",\"replica\":true");
    }
    if a.leased {
        out.extend_from_slice(b",\"leased\":true");
    }
}

/// Appends `a` (and, for a shadow rule, `shadow_denied`) as the contract's answer object.
pub fn write_answer(out: &mut Vec<u8>, a: &CheckAnswer, shadow_denied: Option<bool>) {
    write_answer_with(out, a, shadow_denied, None);
}

/// [`write_answer`], and for an answer made by a block, `"blocked":true` and its source as
/// `block_reason`.
pub fn write_answer_with(
    out: &mut Vec<u8>,
    a: &CheckAnswer,
    shadow_denied: Option<bool>,
    blocked: Option<BlockSource>,
) {
    out.push(b'{');
    write_fields(out, a);
    match shadow_denied {
        None => {}
        Some(true) => out.extend_from_slice(b",\"shadow_denied\":true"),
        Some(false) => out.extend_from_slice(b",\"shadow_denied\":false"),
    }
    write_blocked(out, blocked);
    out.push(b'}');
}

/// `,"blocked":true,"block_reason":"…"` for an answer made by a block; nothing otherwise.
fn write_blocked(out: &mut Vec<u8>, blocked: Option<BlockSource>) {
    match blocked {
        None => {}
        Some(BlockSource::Auto) => {
            out.extend_from_slice(b",\"blocked\":true,\"block_reason\":\"auto\"");
        }
        Some(BlockSource::Managed) => {
            out.extend_from_slice(b",\"blocked\":true,\"block_reason\":\"managed\"");
        }
    }
}

/// A reservation taken: its id and estimate, and the check's answer,
/// `{"reservation":…,"cost":…,"allowed":…}`. The id is base64url: nothing in it needs escaping.
pub fn reserved(id: &str, cost: u64, a: &CheckAnswer) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_ANSWER_BYTES + id.len() + 48);
    out.extend_from_slice(b"{\"reservation\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",\"cost\":");
    out.extend_from_slice(itoa::Buffer::new().format(cost).as_bytes());
    out.push(b',');
    write_fields(&mut out, a);
    out.push(b'}');
    out
}

/// One answer as a body.
pub fn answer(a: &CheckAnswer, shadow_denied: Option<bool>) -> Vec<u8> {
    answer_with(a, shadow_denied, None)
}

/// One answer as a body, with its block (see [`write_answer_with`]).
pub fn answer_with(
    a: &CheckAnswer,
    shadow_denied: Option<bool>,
    blocked: Option<BlockSource>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_ANSWER_BYTES);
    write_answer_with(&mut out, a, shadow_denied, blocked);
    out
}

/// The all-or-nothing answer: `top`'s fields (the binding limit's, with the request's verdict)
/// and every check's answer with its shadow verdict, `{...,"results":[...]}`.
#[cfg(test)]
pub fn all<'a>(
    top: &CheckAnswer,
    results: impl ExactSizeIterator<Item = (&'a CheckAnswer, Option<bool>)>,
) -> Vec<u8> {
    all_with(top, None, results.map(|(a, s)| (a, s, None)))
}

/// [`all`] with blocks: the top level's (the binding limit's) and each result's.
pub fn all_with<'a>(
    top: &CheckAnswer,
    top_blocked: Option<BlockSource>,
    results: impl ExactSizeIterator<Item = (&'a CheckAnswer, Option<bool>, Option<BlockSource>)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity((results.len() + 1) * MAX_ANSWER_BYTES / 2);
    out.push(b'{');
    write_fields(&mut out, top);
    write_blocked(&mut out, top_blocked);
    out.extend_from_slice(b",\"results\":[");
    for (i, (a, shadow, blocked)) in results.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_answer_with(&mut out, a, shadow, blocked);
    }
    out.extend_from_slice(b"]}");
    out
}

/// One item of a batch's `results`.
pub enum Item<'a> {
    Answer(&'a CheckAnswer, Option<bool>),
    /// An answer made by a block.
    Blocked(&'a CheckAnswer, Option<bool>, BlockSource),
    Error(ErrorBody),
}

/// The batch answer, `{"results":[...]}`.
pub fn batch(items: &[Item<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + items.len() * MAX_ANSWER_BYTES / 2);
    out.extend_from_slice(b"{\"results\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match item {
            Item::Answer(a, shadow) => write_answer(&mut out, a, *shadow),
            Item::Blocked(a, shadow, b) => write_answer_with(&mut out, a, *shadow, Some(*b)),
            // Errors are rare and carry free text: serde escapes it. Writing into a Vec
            // cannot fail, nor can serializing two strings.
            Item::Error(e) => {
                if serde_json::to_writer(&mut out, e).is_err() {
                    out.extend_from_slice(b"{\"error\":\"internal\",\"message\":\"\"}");
                }
            }
        }
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Serialize;

    #[derive(Serialize)]
    struct WithShadow<'a> {
        #[serde(flatten)]
        answer: &'a CheckAnswer,
        #[serde(skip_serializing_if = "Option::is_none")]
        shadow_denied: Option<bool>,
    }

    fn answers() -> impl Strategy<Value = (CheckAnswer, Option<bool>)> {
        (
            any::<bool>(),
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
            any::<u64>(),
            any::<u64>(),
            prop_oneof![Just(0u64), any::<u64>()],
            any::<bool>(),
            proptest::option::of(any::<bool>()),
        )
            .prop_map(
                |(allowed, limit, remaining, reset, retry, degraded, shadow)| {
                    (
                        CheckAnswer {
                            allowed,
                            limit,
                            remaining,
                            reset_at_ms: reset,
                            retry_after_ms: retry,
                            degraded,
                            replica: false,
                            leased: false,
                        },
                        shadow,
                    )
                },
            )
    }

    /// `/v1/check/all`'s body as serde wrote it before.
    #[derive(Serialize)]
    struct AllRef<'a> {
        #[serde(flatten)]
        top: &'a CheckAnswer,
        results: Vec<WithShadow<'a>>,
    }

    proptest! {
        #[test]
        fn an_answer_is_serdes_bytes(case in answers()) {
            let (a, shadow) = case;
            let serde = serde_json::to_vec(&WithShadow { answer: &a, shadow_denied: shadow }).unwrap();
            prop_assert_eq!(String::from_utf8(answer(&a, shadow)).unwrap(), String::from_utf8(serde).unwrap());
        }

        #[test]
        fn an_all_or_nothing_answer_is_serdes_bytes(top in answers(), cases in proptest::collection::vec(answers(), 1..6)) {
            let serde = serde_json::to_vec(&AllRef {
                top: &top.0,
                results: cases.iter().map(|(a, s)| WithShadow { answer: a, shadow_denied: *s }).collect(),
            }).unwrap();
            let ours = all(&top.0, cases.iter().map(|(a, s)| (a, *s)));
            prop_assert_eq!(String::from_utf8(ours).unwrap(), String::from_utf8(serde).unwrap());
        }

        #[test]
        fn a_batch_is_valid_json_with_every_item(cases in proptest::collection::vec(answers(), 0..8)) {
            let mut items: Vec<Item<'_>> = cases.iter().map(|(a, s)| Item::Answer(a, *s)).collect();
            items.push(Item::Error(ErrorBody { error: "invalid_request", message: "a \"quoted\"\n text".into() }));
            let v: serde_json::Value = serde_json::from_slice(&batch(&items)).unwrap();
            let results = v["results"].as_array().unwrap();
            prop_assert_eq!(results.len(), cases.len() + 1);
            for (r, (a, s)) in results.iter().zip(&cases) {
                prop_assert_eq!(r, &serde_json::to_value(WithShadow { answer: a, shadow_denied: *s }).unwrap());
            }
            prop_assert_eq!(&results[cases.len()]["message"], "a \"quoted\"\n text");
        }
    }
}
