//! `/v1/forward-auth` behind a real gateway we did not write: Debian's nginx with
//! `auth_request` (which passes only 401/403 on, hence `deny_status=403`), on loopback ports.
//! `.ci/run` installs nginx; without it (a developer's machine) the test says so and passes.
//! And the keys of forwarded requests, which the client must not be able to choose, asked
//! directly as a gateway would.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
use ringlimit_node::forwarded::TrustedProxies;
use ringlimit_node::rules::RuleSet;
use ringlimit_tests::{TestNode, WAIT, wait_until};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const RULES: &str = r#"
rules:
  - { name: per-key, limit: 2, period: 1h, request_key: "apikey:{header:x-api-key}" }
  - { name: per-ip, limit: 5, period: 1h, request_key: "ip:{client_ip}" }
"#;

/// nginx in the foreground with its files under `dir`; killed on drop.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Nginx {
    /// nginx on `port` asking `ringlimit`, sending it `forwarded_for` as `X-Forwarded-For`
    /// (`$remote_addr`, or `$proxy_add_x_forwarded_for`: the client's header and then its
    /// address).
    fn start(port: u16, ringlimit: std::net::SocketAddr, forwarded_for: &str) -> Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("ringlimit-nginx-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let d = dir.display();
        let conf = format!(
            r#"worker_processes 1;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location = /_ringlimit {{
      internal;
      proxy_pass http://{ringlimit}/v1/forward-auth?deny_status=403;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Forwarded-For {forwarded_for};
      proxy_set_header X-Forwarded-Method $request_method;
      proxy_set_header X-Forwarded-Uri $request_uri;
    }}
    # A static file: `return` would answer in the rewrite phase, before auth_request runs.
    location / {{
      auth_request /_ringlimit;
      root {d}/www;
    }}
  }}
}}
"#
        );
        std::fs::create_dir_all(dir.join("www"))?;
        std::fs::write(dir.join("www").join("orders"), "hello\n")?;
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf)?;
        let child = Command::new("nginx")
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&path)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting nginx")?;
        Ok(Self { child, dir })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

fn nginx_installed() -> bool {
    Command::new("nginx")
        .arg("-v")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn get(port: u16, key: Option<&str>) -> Result<u16> {
    get_with(port, key, &[]).await
}

/// `GET /orders` through nginx with `x-api-key: key` (if any) and `headers`: the status.
async fn get_with(port: u16, key: Option<&str>, headers: &[(&str, &str)]) -> Result<u16> {
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/orders?id=1"));
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    Ok(req.send().await?.status().as_u16())
}

/// A node with the gateway rules behind nginx's `auth_request`, nginx sending
/// `X-Forwarded-For: <xff>` (an nginx variable); returns them and nginx's port once it listens.
async fn node_behind_nginx(node_id: &str, xff: &str) -> Result<(TestNode, Nginx, u16)> {
    let mut config = NodeConfig::local(node_id);
    config.rules = RuleSet::from_yaml(RULES)?;
    let node = TestNode::start(config).await?;
    let port = free_port()?;
    let nginx = Nginx::start(port, node.http, xff)?;
    wait_until("nginx listens", WAIT, || async {
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok())
    })
    .await
    .with_context(|| nginx.log())?;
    Ok((node, nginx, port))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::test]
async fn nginx_auth_request_limits_per_api_key_and_per_client_ip_all_or_nothing() -> Result<()> {
    if !nginx_installed() {
        eprintln!("nginx is not installed (`apt-get install nginx`): skipping");
        return Ok(());
    }
    let (node, nginx, port) = node_behind_nginx("gateway-node", "$remote_addr").await?;

    // alice's key allows 2; her third is refused by nginx with the 403 it passes on, and the
    // IP's unit it would have taken is given back.
    let mut seen = Vec::new();
    for key in ["alice", "alice", "alice", "bob", "bob", "carol", "carol"] {
        seen.push(get(port, Some(key)).await?);
    }
    ensure!(
        seen == [200, 200, 403, 200, 200, 200, 403],
        "statuses {seen:?}; nginx log: {}",
        nginx.log()
    );
    // The IP (127.0.0.1, from X-Forwarded-For) admitted exactly 5; a request without a key is
    // held to the IP limit alone.
    assert_eq!(get(port, None).await?, 403);
    let ip = node
        .check(&serde_json::json!({"rule": "per-ip", "key": "ip:127.0.0.1", "cost": 0}))
        .await?;
    assert_eq!(ip.json()?["remaining"], 0);
    let carol = node
        .check(&serde_json::json!({"rule": "per-key", "key": "apikey:carol", "cost": 0}))
        .await?;
    assert_eq!(
        carol.json()?["remaining"],
        1,
        "carol's denied request gave hers back"
    );
    drop(nginx);
    node.stop().await
}

/// nginx set up the common way, appending the client's address to whatever `X-Forwarded-For`
/// the client sent (`$proxy_add_x_forwarded_for`): a client that writes a fresh address each
/// time, and an `X-Real-IP` of its choosing, is still held to its own address's limit.
#[tokio::test]
async fn nginx_appending_to_a_spoofed_forwarded_for_keys_the_real_client() -> Result<()> {
    if !nginx_installed() {
        eprintln!("nginx is not installed (`apt-get install nginx`): skipping");
        return Ok(());
    }
    let (node, nginx, port) =
        node_behind_nginx("gateway-append", "$proxy_add_x_forwarded_for").await?;

    let mut seen = Vec::new();
    for i in 1..=7 {
        let spoofed = format!("6.6.6.{i}");
        let headers = [
            ("x-forwarded-for", spoofed.as_str()),
            ("x-real-ip", "7.7.7.7"),
        ];
        seen.push(get_with(port, None, &headers).await?);
    }
    ensure!(
        seen == [200, 200, 200, 200, 200, 403, 403],
        "statuses {seen:?} (the per-ip limit is 5); nginx log: {}",
        nginx.log()
    );
    assert_eq!(remaining(&node, "per-ip", "ip:127.0.0.1").await?, 0);
    for named in ["ip:6.6.6.1", "ip:7.7.7.7"] {
        assert_eq!(remaining(&node, "per-ip", named).await?, 5, "{named}");
    }
    drop(nginx);
    node.stop().await
}

const KEYED: &str = r#"
rules:
  - { name: per-ip, limit: 3, period: 1h, request_key: "ip:{client_ip}" }
  - { name: per-path, limit: 1, period: 1h, request_key: "path:{path}" }
  - { name: per-pair, limit: 1, period: 1h, request_key: "{header:x-a}:{header:x-b}" }
"#;

/// A gateway's copy of a request with `headers`, checked under `rule`: its status.
async fn forward(node: &TestNode, rule: &str, headers: &[(&str, &[u8])]) -> Result<u16> {
    let mut req = reqwest::Client::new().get(node.url(&format!("/v1/forward-auth?rules={rule}")));
    for (name, value) in headers {
        req = req.header(*name, reqwest::header::HeaderValue::from_bytes(value)?);
    }
    Ok(req.send().await?.status().as_u16())
}

/// What a key has left under `rule`, read with a cost-0 check.
async fn remaining(node: &TestNode, rule: &str, key: &str) -> Result<u64> {
    let r = node
        .check(&serde_json::json!({"rule": rule, "key": key, "cost": 0}))
        .await?;
    r.json()?["remaining"]
        .as_u64()
        .with_context(|| format!("no remaining in {}", r.text))
}

/// The client cannot choose its key: `{client_ip}` is the address the gateway appended to
/// `X-Forwarded-For` (the rightmost), whatever the client wrote before it, and a byte the
/// header may not hold does not switch to the client's `X-Real-IP`; `{path}` is normalised, so
/// one resource spelled five ways is one bucket; and two fields cannot trade characters
/// through the separator between them.
#[tokio::test]
async fn forward_auth_keys_cannot_be_chosen_by_the_client() -> Result<()> {
    let mut config = NodeConfig::local("keyed-node");
    config.rules = RuleSet::from_yaml(KEYED)?;
    config.trusted_proxies = TrustedProxies::new(vec!["10.0.0.0/8".parse()?]);
    let node = TestNode::start(config).await?;

    // A fresh spoofed address each time, before the one the gateway appended: one bucket.
    let mut seen = Vec::new();
    for i in 1..=5 {
        let xff = format!("6.6.6.{i}, 203.0.113.7");
        seen.push(forward(&node, "per-ip", &[("x-forwarded-for", xff.as_bytes())]).await?);
    }
    assert_eq!(seen, [200, 200, 200, 429, 429]);
    // Naming a victim spends nothing of the victim's.
    let victim = [("x-forwarded-for", &b"198.51.100.9, 203.0.113.8"[..])];
    assert_eq!(forward(&node, "per-ip", &victim).await?, 200);
    assert_eq!(remaining(&node, "per-ip", "ip:198.51.100.9").await?, 3);
    assert_eq!(remaining(&node, "per-ip", "ip:203.0.113.8").await?, 2);
    // A byte over 0x7f in the header, and an X-Real-IP of the client's choosing: still the
    // appended address, used up.
    let odd = [
        ("x-forwarded-for", &b"\xff6.6.6.6, 203.0.113.7"[..]),
        ("x-real-ip", &b"7.7.7.7"[..]),
    ];
    assert_eq!(forward(&node, "per-ip", &odd).await?, 429);
    assert_eq!(remaining(&node, "per-ip", "ip:7.7.7.7").await?, 3);
    // Behind a trusted proxy (10.0.0.0/8): the address it appended is the client.
    let proxied = [("x-forwarded-for", &b"6.6.6.6, 203.0.113.30, 10.1.1.1"[..])];
    assert_eq!(forward(&node, "per-ip", &proxied).await?, 200);
    assert_eq!(remaining(&node, "per-ip", "ip:203.0.113.30").await?, 2);
    assert_eq!(remaining(&node, "per-ip", "ip:10.1.1.1").await?, 3);

    // One path, many spellings: the first is admitted, the others are the same bucket.
    let mut seen = Vec::new();
    for uri in [
        "/login",
        "/Login",
        "//login",
        "/login/",
        "/%6cogin",
        "/./login",
        "/a/../login",
        "/login?next=/",
    ] {
        seen.push(forward(&node, "per-path", &[("x-forwarded-uri", uri.as_bytes())]).await?);
    }
    assert_eq!(seen, [200, 429, 429, 429, 429, 429, 429, 429]);

    // `u:1` + `2` and `u` + `1:2`: two clients, two buckets.
    let a = [("x-a", &b"u:1"[..]), ("x-b", &b"2"[..])];
    let b = [("x-a", &b"u"[..]), ("x-b", &b"1:2"[..])];
    assert_eq!(forward(&node, "per-pair", &a).await?, 200);
    assert_eq!(forward(&node, "per-pair", &b).await?, 200);
    assert_eq!(forward(&node, "per-pair", &a).await?, 429);
    node.stop().await
}
