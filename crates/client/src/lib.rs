//! ringlimit client SDK.
//!
//! Will route each check straight to its key's owner over the peer protocol, batch, time out
//! fast and fall back to a local limiter (see the SDK issue). Until then it re-exports the wire
//! types a service needs to speak the HTTP API.

pub use ringlimit_proto::{Algorithm, CheckAnswer, CheckRequest, InlineRule, RuleRef};
