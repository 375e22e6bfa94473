//! `/v1/forward-auth` behind a real gateway we did not write: Debian's nginx with
//! `auth_request` (which passes only 401/403 on, hence `deny_status=403`), on loopback ports.
//! `.ci/run` installs nginx; without it (a developer's machine) the test says so and passes.

use anyhow::{Context, Result, ensure};
use ringlimit_node::NodeConfig;
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
    fn start(port: u16, ringlimit: std::net::SocketAddr) -> Result<Self> {
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
      proxy_set_header X-Forwarded-For $remote_addr;
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
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/orders?id=1"));
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    Ok(req.send().await?.status().as_u16())
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
    let mut config = NodeConfig::local("gateway-node");
    config.rules = RuleSet::from_yaml(RULES)?;
    let node = TestNode::start(config).await?;
    let port = free_port()?;
    let nginx = Nginx::start(port, node.http)?;
    wait_until("nginx listens", WAIT, || async {
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok())
    })
    .await
    .with_context(|| nginx.log())?;

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
