//! Reservations at a bucket's owner over the peer protocol (version 7): a reserve or a settle
//! sent on a pooled connection of its own, its answer worded as this side's result. The node
//! (for a request that arrived elsewhere than at the owner) and the SDK both send them so.

use super::session::{Pooled, SessionError, SessionPool};
use crate::reservations::ReserveError;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::RuleRef;
use ringlimit_proto::peer::{
    CALENDAR_SINCE, Frame, PeerAnswer, PeerReserve, PeerSettle, RESERVE_SINCE, SettleAnswer,
};
use std::time::Duration;

/// How long an owner may take to answer a reserve or a settle (a caller waits for it: an LLM
/// call's reservation is not on a millisecond budget).
pub const RESERVE_WITHIN: Duration = Duration::from_millis(500);
/// Idle connections kept per owner for reservations.
pub const SESSIONS_PER_OWNER: usize = 8;

/// Reserves `ask` at the owner at `addr`: the check's answer (denied: nothing kept). Sent
/// again on a new connection only when it failed on an idle one: a reserve taken twice keeps
/// the second estimate until it expires (never an over-admission).
pub async fn reserve(
    pool: &SessionPool,
    addr: &str,
    ask: PeerReserve,
) -> Result<CheckAnswer, ReserveError> {
    let since = since(&ask.rule);
    let frame = Frame::Reserve { asks: vec![ask] };
    match pool
        .request(addr, &frame, RESERVE_WITHIN, since, true)
        .await
    {
        Ok(Pooled::Answer(Frame::Reserved { mut answers })) if answers.len() == 1 => {
            match answers.remove(0) {
                PeerAnswer::Answer(a) => Ok(a),
                PeerAnswer::Error { code, message } => {
                    Err(ReserveError::from_owner(&code, &message))
                }
                _ => Err(out_of_turn()),
            }
        }
        Ok(Pooled::Answer(_)) => Err(out_of_turn()),
        Ok(Pooled::Older(v)) if v >= RESERVE_SINCE => Err(no_calendars(v)),
        Ok(Pooled::Older(v)) => Err(ReserveError::Unavailable(format!(
            "the key's owner runs an older ringlimit (peer protocol {v}, reservations need {RESERVE_SINCE}); upgrade it"
        ))),
        Err(e) => Err(unreachable(&e)),
    }
}

/// The oldest protocol that takes a reserve or settle of `rule`: an inline rule with calendar
/// windows would fail to decode below [`CALENDAR_SINCE`] (it is refused here instead).
fn since(rule: &RuleRef) -> u16 {
    if rule.has_calendar() {
        CALENDAR_SINCE
    } else {
        RESERVE_SINCE
    }
}

/// An owner that keeps reservations but does not know calendar windows.
fn no_calendars(v: u16) -> ReserveError {
    ReserveError::Unavailable(format!(
        "the key's owner runs an older ringlimit (peer protocol {v}, inline rules with calendar windows need {CALENDAR_SINCE}); upgrade it"
    ))
}

/// Settles `settle` at the owner at `addr`: the bucket's answer afterwards. Never sent twice:
/// a settle the owner applied is unknown the second time.
pub async fn settle(
    pool: &SessionPool,
    addr: &str,
    settle: PeerSettle,
) -> Result<CheckAnswer, ReserveError> {
    let since = since(&settle.rule);
    let frame = Frame::Settle {
        settles: vec![settle],
    };
    match pool
        .request(addr, &frame, RESERVE_WITHIN, since, false)
        .await
    {
        Ok(Pooled::Answer(Frame::Settled { mut answers })) if answers.len() == 1 => {
            match answers.remove(0) {
                SettleAnswer::Answer(a) => Ok(a),
                SettleAnswer::Unknown => Err(ReserveError::Unknown),
                SettleAnswer::Error { code, message } => {
                    Err(ReserveError::from_owner(&code, &message))
                }
            }
        }
        Ok(Pooled::Answer(_)) => Err(out_of_turn()),
        Ok(Pooled::Older(v)) if v >= RESERVE_SINCE => Err(no_calendars(v)),
        // An owner older than reservations keeps none: the reservation was taken at another
        // owner, which the ring has since replaced.
        Ok(Pooled::Older(_)) => Err(ReserveError::Unknown),
        Err(e) => Err(unreachable(&e)),
    }
}

fn out_of_turn() -> ReserveError {
    ReserveError::Unavailable("the key's owner answered out of turn".into())
}

fn unreachable(e: &SessionError) -> ReserveError {
    ReserveError::Unavailable(format!("the key's owner did not answer ({e})"))
}
