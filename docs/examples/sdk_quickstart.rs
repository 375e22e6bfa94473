use ringlimit_client::{Check, Client};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::builder()
        // Any node's HTTP address: the client discovers the other members from it.
        .seeds(["http://127.0.0.1:8080"])
        // The nodes' RINGLIMIT_CLIENT_TOKEN (or a `role: check` token), never the cluster secret.
        .client_token(std::env::var("RINGLIMIT_CLIENT_TOKEN")?)
        .build()
        .await?;

    // A named rule (from the rules file or the admin API), checked at the key's owner.
    let a = client.check(&Check::named("silver", "user:1")).await?;
    // degraded: answered in this process without the owner (nodes unreachable, token refused).
    println!(
        "silver user:1: allowed {}, remaining {}, degraded {}",
        a.allowed, a.remaining, a.degraded
    );

    // An inline rule: 5 per 10 s, this check costing 2.
    let ip = Check::inline("ip:10.1.2.3", 5, Duration::from_secs(10)).cost(2);
    let b = client.check(&ip).await?;
    println!(
        "ip:10.1.2.3: allowed {}, remaining {}",
        b.allowed, b.remaining
    );

    // One request held to several limits, all-or-nothing, each asked of its own owner.
    let all = client
        .check_all(&[Check::named("silver", "user:7"), ip])
        .await?;
    if all.allowed {
        println!("both limits admit the request");
    } else {
        let binding = all.binding_answer();
        println!("denied: retry in {} ms", binding.retry_after_ms);
    }
    Ok(())
}
