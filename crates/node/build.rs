//! Generates the `ringlimit.v1` gRPC service from `crates/proto/proto` (server side; clients in
//! other languages generate theirs from the same file). The .proto is parsed by protox, in
//! Rust, so that a build needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../proto/proto";
    let file = "ringlimit/v1/ratelimiter.proto";
    println!("cargo:rerun-if-changed={root}/{file}");
    let descriptors = protox::compile([file], [root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
