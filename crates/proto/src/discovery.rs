//! What a node tells clients about the cluster over HTTP: `GET /v1/cluster` (members) and
//! `GET /v1/rules` (the rules in force), as the SDK reads them to route and to fall back.

use crate::Algorithm;
use serde::{Deserialize, Serialize};

/// Who decides a rule's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleMode {
    /// Exact: the key's owner decides.
    #[default]
    Owner,
    /// Approximate: every node decides from gossiped counters.
    Global,
}

impl RuleMode {
    /// The rules file's word for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleMode::Owner => "owner",
            RuleMode::Global => "global",
        }
    }
}

/// What is answered when a key's owner cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnreachablePolicy {
    /// A local fallback share, marked degraded.
    #[default]
    Open,
    /// A denial.
    Closed,
}

impl UnreachablePolicy {
    /// The rules file's word for this policy.
    pub fn as_str(self) -> &'static str {
        match self {
            UnreachablePolicy::Open => "open",
            UnreachablePolicy::Closed => "closed",
        }
    }
}

/// Whether a rule's hot buckets may be leased: their owner granting slices of a bucket to other
/// nodes and SDKs, which then decide that key's checks themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseMode {
    /// May be leased while hot.
    #[default]
    Auto,
    /// Never leased: every check is decided at the owner.
    Off,
}

impl LeaseMode {
    /// The rules file's word for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Auto => "auto",
            LeaseMode::Off => "off",
        }
    }
}

/// Whether a rule's buckets are kept on disk under `--data-dir` (durable buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PersistMode {
    /// Kept when the rule's period is at least `--persist-min-period`.
    #[default]
    Auto,
    /// Kept whatever the period.
    Always,
    /// Never kept.
    Never,
}

impl PersistMode {
    /// The rules file's word for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            PersistMode::Auto => "auto",
            PersistMode::Always => "always",
            PersistMode::Never => "never",
        }
    }
}

/// Whether a rule's limit is its region's (each region its own, the default) or shared by
/// every region (`--region-peers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionScope {
    /// Each region (each cluster) applies the whole limit.
    #[default]
    Region,
    /// One limit for all regions together.
    Regions,
}

impl RegionScope {
    /// Whether this is the default (`region`).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The rules file's word for this scope.
    pub fn as_str(self) -> &'static str {
        match self {
            RegionScope::Region => "region",
            RegionScope::Regions => "regions",
        }
    }
}

/// What a region does with a `scope: regions` bucket once its allowance from the bucket's
/// home region expired without renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRegionUnreachable {
    /// Decide on the region's share of the limit (the limit divided by the regions): the
    /// regions together never exceed it.
    #[default]
    Share,
    /// Admit every check.
    Open,
}

impl OnRegionUnreachable {
    /// Whether this is the default (`share`).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The rules file's word for this policy.
    pub fn as_str(self) -> &'static str {
        match self {
            OnRegionUnreachable::Share => "share",
            OnRegionUnreachable::Open => "open",
        }
    }
}

/// One configured rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleInfo {
    pub name: String,
    pub limit: u64,
    /// The period in milliseconds (rounded up when the file gave a finer one).
    pub period_ms: u64,
    /// The period as the rules file writes it (`1m`, `250ms`).
    pub period: String,
    pub algorithm: Algorithm,
    /// Capacity of token and leaky buckets (`limit` when the file gave none); `None` otherwise.
    pub burst: Option<u64>,
    pub mode: RuleMode,
    pub on_owner_unreachable: UnreachablePolicy,
    /// Decided and counted, never denies (nodes that predate shadow rules omit it).
    #[serde(default)]
    pub shadow: bool,
    /// Whether hot buckets may be leased (nodes that predate leases omit it: `auto`).
    #[serde(default)]
    pub lease: LeaseMode,
    /// Whether its buckets are kept on disk (nodes that predate durable buckets omit it:
    /// `auto`).
    #[serde(default)]
    pub persist: PersistMode,
    /// The key template gateways' requests are limited by (`/v1/forward-auth`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_key: Option<String>,
    /// Calendar windows (a fixed window's local day, week or month): `period` is then `1d`,
    /// `1w` or `1mo` and `period_ms` that unit's nominal length.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub calendar: bool,
    /// The calendar's IANA time zone (calendar rules only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Repeat offenders' blocks (`block:` in the rules file), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockInfo>,
    /// Whether its limit is shared by every region (omitted when `region`, the default, as
    /// by nodes that predate regions).
    #[serde(default, skip_serializing_if = "RegionScope::is_default")]
    pub scope: RegionScope,
    /// A `scope: regions` rule's fallback when its region cannot renew its allowance (omitted
    /// when `share`, the default).
    #[serde(default, skip_serializing_if = "OnRegionUnreachable::is_default")]
    pub on_region_unreachable: OnRegionUnreachable,
    /// The scope checks are decided under on the node that listed it: `region` for a
    /// `scope: regions` rule on a node started without `--region` (absent when as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_in_effect: Option<RegionScope>,
}

/// A rule's `block` policy as listed: a key denied `after` times within `within` is blocked
/// for `for`, doubled on each repeat up to `max` (durations as the rules file writes them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub after: u64,
    pub within: String,
    #[serde(rename = "for")]
    pub for_: String,
    pub max: String,
}

/// `GET /v1/rules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleList {
    pub rules: Vec<RuleInfo>,
}

/// One member as `GET /v1/cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub node_id: String,
    pub peer_addr: String,
    pub http_addr: String,
    /// Where it serves ringlimit.v1 (`--grpc`, as advertised); empty when it serves no gRPC
    /// (nodes that predate it omit it).
    #[serde(default)]
    pub grpc_addr: String,
    /// `alive`, `leaving` or `dead`; only `alive` members are in the ring.
    pub state: String,
}

/// The part of `GET /v1/cluster` a client needs (the body has more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub node_id: String,
    pub cluster_id: String,
    pub members: Vec<MemberInfo>,
}
