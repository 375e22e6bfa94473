//! A node's configuration: the command line (`ringlimit serve` flags, each also read from
//! `RINGLIMIT_<FLAG>`; flags win), checked and turned into a [`NodeConfig`], and the files it
//! names, read at start.
//!
//! # Layout
//! Top to bottom; each imports only from those below it.
//! - [`flags`] — clap's [`Cli`] and [`ServeArgs`]: the flags, their defaults and help.
//! - `validate` — [`ServeArgs::into_config`]: defaults resolved, the environment's secrets,
//!   combinations refused, the named files loaded.
//! - `node_config` — [`NodeConfig`], and [`PeerSecurity`] and [`ConnLimits`] read from it.
//! - [`regions`] — [`RegionsConfig`]: `--region`, `--region-peers` and the region secret.
//! - [`files`] — reading and checking the rules file, the Envoy ratelimit and RLQS
//!   configurations and the TLS certificates.
//! - `error` — [`ConfigError`]: why a node cannot start with what it was given.

mod error;
pub mod files;
pub mod flags;
mod node_config;
pub mod regions;
mod validate;

pub use error::{ConfigError, PEER_TLS_FLAGS, TLS_FLAGS};
pub use files::{load_envoy, load_rules};
pub use flags::{Cli, Command, LogFormat, ServeArgs};
pub use node_config::{ConnLimits, EngineClock, NodeConfig, PeerSecurity};
pub use regions::RegionsConfig;

#[cfg(test)]
mod tests;
