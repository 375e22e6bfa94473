//! The integration tests, as one test binary (`it`): each file beside this one is a module of
//! it, so the node is linked once instead of once per file (measured: see `tests/Cargo.toml`).
//! Cargo does not discover test files here by itself (`autotests = false`): a new file needs
//! its `mod` line below. Run one file's tests with `cargo test -p ringlimit-tests --test it
//! <file>::`.

mod api_rules;
mod blocks;
mod calendar;
mod check_all_http;
mod cli;
mod clock_skew;
mod cluster;
mod docs;
mod durable;
mod envoy_compat;
mod fuzz;
mod gateways;
mod global;
mod grpc;
mod grpc_limits;
mod grpc_sdk_calls;
mod grpc_v1;
mod http_api;
mod http_limits;
mod http_wire;
mod ops;
mod prometheus;
mod regions;
mod regions_wan;
mod rlqs;
mod rolling;
mod sdk;
mod sdk_python;
mod sdk_typescript;
mod tls;
mod tls_tools;
