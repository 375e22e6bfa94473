//! Sending one [`ApiRequest`]: the address (`--addr`, with or without a scheme), the token, the
//! TLS roots (the system's, and `--cacert`), the timeout; every failure said in one line.

use super::{ApiRequest, Conn, UsageError};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;
use std::time::Duration;

/// A successful (2xx) answer, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    /// The start of the body, for a message about it.
    pub fn snippet(&self) -> String {
        snippet(&self.body)
    }
}

/// At most 200 characters of `body`, on one line.
fn snippet(body: &str) -> String {
    let one_line: String = body
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    if body.trim().chars().count() > 200 {
        format!("{one_line}...")
    } else {
        one_line
    }
}

/// Why a request gave no successful answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Flags that make no request (exit 2).
    #[error("{0}")]
    Usage(#[from] UsageError),
    /// No HTTP answer: refused, timed out, name not found, TLS refused.
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    /// The server answered an error (4xx, 5xx).
    #[error("{0}")]
    Server(ServerError),
}

impl CallError {
    /// A second line of advice, when the failure has a likely cause.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            CallError::Server(e) => e.hint,
            _ => None,
        }
    }
}

/// An error answer: `{ "error": "<code>", "message": "<sentence>" }` and its status.
#[derive(Debug, PartialEq, Eq)]
pub struct ServerError {
    pub status: u16,
    /// The body's `error`; `None` when the body is not the API's error object (a proxy's page).
    pub code: Option<String>,
    /// The body's `message`, or the start of the body.
    pub message: String,
    pub hint: Option<&'static str>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(code) if self.message.is_empty() => write!(f, "{code} (HTTP {})", self.status),
            Some(code) => write!(f, "{code}: {} (HTTP {})", self.message, self.status),
            None if self.message.is_empty() => write!(f, "HTTP {}", self.status),
            None => write!(f, "HTTP {}: {}", self.status, self.message),
        }
    }
}

impl ServerError {
    /// The error in an answer of `status` with `body`, to a request that carried a token or not.
    pub fn of(status: u16, body: &str, req: &ApiRequest, sent_token: bool) -> Self {
        let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|v| v.get(name))
                .and_then(|v| v.as_str())
                .map(snippet)
        };
        let code = field("error");
        let message = match (&code, field("message")) {
            (Some(_), Some(m)) => m,
            (Some(_), None) => String::new(),
            (None, _) => snippet(body),
        };
        let hint = match (status, code.as_deref()) {
            (401, _) if !sent_token => {
                Some("no admin token given: set RINGLIMIT_ADMIN_TOKEN (or --token)")
            }
            (404, Some("not_found")) if req.auth => Some(
                "a node without admin tokens (RINGLIMIT_ADMIN_TOKEN, --admin-tokens) serves no \
                 admin API",
            ),
            _ => None,
        };
        ServerError {
            status,
            code,
            message,
            hint,
        }
    }
}

/// The node's address from `--addr`: `http(s)://host:port[/prefix]`, or `host:port` for
/// plain HTTP.
pub fn base_url(addr: &str) -> Result<Url, UsageError> {
    let a = addr.trim();
    if a.is_empty() {
        return Err(UsageError("--addr is empty".into()));
    }
    let full = if a.contains("://") {
        a.to_owned()
    } else {
        format!("http://{a}")
    };
    let mut url =
        Url::parse(&full).map_err(|e| UsageError(format!("--addr {a:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UsageError(format!(
            "--addr {a:?}: the scheme must be http:// or https://"
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(UsageError(format!("--addr {a:?} names no host")));
    }
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

/// What [`url_for`] percent-encodes in a path segment: everything but letters, digits, the
/// unreserved `-._~` and `:@` (readable in keys like `user:42`). `+` is encoded too, so that no
/// server or proxy can read it as a space.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

/// `base` with the request's path segments (each percent-encoded: a key may hold `/`, `%`,
/// `?`, spaces, tabs, newlines, anything) and query.
///
/// The segments are encoded here, not by [`Url`]'s `path_segments_mut().push`: that runs the
/// URL parser over each segment, which silently drops tabs and newlines (`a<TAB>b` became `ab`,
/// another key) and turns `\` into `/`.
pub fn url_for(base: &Url, req: &ApiRequest) -> Result<Url, UsageError> {
    if base.cannot_be_a_base() {
        return Err(UsageError(format!("--addr {base} cannot have a path")));
    }
    let mut path = base.path().trim_end_matches('/').to_owned();
    for s in &req.path {
        // URLs drop `.` and `..` segments (also written %2E): no URL can carry them.
        if matches!(s.as_str(), "." | "..") {
            return Err(UsageError(format!(
                "{s:?} cannot be written as a segment of a URL's path"
            )));
        }
        path.push('/');
        path.extend(utf8_percent_encode(s, SEGMENT));
    }
    let mut url = base.clone();
    url.set_path(&path);
    if !req.query.is_empty() {
        url.query_pairs_mut().extend_pairs(&req.query);
    }
    Ok(url)
}

/// The HTTP client for `conn`: its timeout, its TLS roots (the system's are read only for an
/// https:// address), no redirects (a token is for the node named, not wherever it points).
fn client(conn: &Conn, https: bool) -> Result<reqwest::Client, CallError> {
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_millis(conn.timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .tls_built_in_root_certs(https)
        .user_agent(concat!("ringlimit-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &conn.cacert {
        let pem = std::fs::read(path)
            .map_err(|e| UsageError(format!("--cacert {}: {e}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| UsageError(format!("--cacert {}: {}", path.display(), cause(&e))))?;
        if certs.is_empty() {
            return Err(UsageError(format!(
                "--cacert {}: no PEM certificate in it",
                path.display()
            ))
            .into());
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| {
        CallError::Usage(UsageError(format!(
            "cannot set up the HTTP client: {}",
            cause(&e)
        )))
    })
}

/// The innermost cause of an error: what actually went wrong, without the layers around it
/// ("error sending request for url ...", "client error (Connect)").
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// Sends `req` as `conn` says; a 2xx answer read whole, or why there is none.
pub async fn call(conn: &Conn, req: &ApiRequest) -> Result<Reply, CallError> {
    let base = base_url(&conn.addr)?;
    let url = url_for(&base, req)?;
    let client = client(conn, base.scheme() == "https")?;
    let token = conn.token.as_deref().filter(|t| !t.is_empty());
    let mut request = client.request(req.method.clone(), url);
    if let (true, Some(token)) = (req.auth, token) {
        request = request.bearer_auth(token);
    }
    if let Some(version) = &req.if_match {
        request = request.header(reqwest::header::IF_MATCH, version);
    }
    if let Some(body) = &req.body {
        request = request.json(body);
    }
    let unreachable = |e: reqwest::Error| {
        if e.is_builder() {
            // A token or version that is no valid header value.
            return CallError::Usage(UsageError(format!(
                "cannot make the request: {}",
                cause(&e)
            )));
        }
        let reason = if e.is_timeout() {
            format!("no answer within {} ms (--timeout-ms)", conn.timeout_ms)
        } else {
            cause(&e)
        };
        CallError::Unreachable {
            addr: base.to_string(),
            reason,
        }
    };
    let response = request.send().await.map_err(unreachable)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(unreachable)?;
    if (200..300).contains(&status) {
        Ok(Reply { status, body })
    } else {
        Err(CallError::Server(ServerError::of(
            status,
            &body,
            req,
            token.is_some(),
        )))
    }
}
