//! `wanline`: the emulated WAN of the regions' process tests and bench, in one binary.
//!
//! - `line`: a userspace delay line. One TUN device per region, moved into the region's network
//!   namespace; IPv4 packets read from one are written to the region their destination is in,
//!   held for half the pair's round trip and dropped at a seeded random rate. Real packets, so
//!   real TCP retransmissions: the kernel here has no `netem`, and a TCP relay would hide loss.
//!   A control socket cuts a region off and restores it, and reports the counts per pair.
//! - `echo`: a UDP and TCP echo server, and `probe`: round trips and loss measured through it.
//! - `load`: a steady open-loop rate of checks against nodes, counting answers per tick.

mod echo;
mod line;
mod load;

use anyhow::Result;
use clap::Parser;

#[derive(Parser)]
#[command(name = "wanline", about = "An emulated WAN between network namespaces")]
enum Cmd {
    /// The delay line between the regions' namespaces.
    Line(line::Args),
    /// UDP and TCP echo on one address.
    Echo(echo::ServeArgs),
    /// Round trips and loss to an echo server.
    Probe(echo::ProbeArgs),
    /// An open-loop load of checks.
    Load(load::Args),
}

fn main() -> Result<()> {
    let cmd = Cmd::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cmd {
            Cmd::Line(a) => line::run(a).await,
            Cmd::Echo(a) => echo::serve(a).await,
            Cmd::Probe(a) => echo::probe(a).await,
            Cmd::Load(a) => load::run(a).await,
        }
    })
}

/// Ends the process when its standard input closes: the harness that started it holds the
/// other end, so a harness killed without its cleanup does not leave the WAN running.
pub(crate) fn exit_with_stdin() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        loop {
            match std::io::Read::read(&mut std::io::stdin(), &mut sink) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
}
