//! Admin tokens: who may call the admin API, under which name, with which role.
//!
//! `--admin-tokens FILE` (`RINGLIMIT_ADMIN_TOKENS`) names a YAML file of named tokens, each with
//! a role — `read` (GETs) or `write` (changes and resets too), or `check`: a client credential
//! for services' SDKs on the peer port, worth nothing on the admin API — and either the token
//! itself or its SHA-256 (hex), so that the file need not hold secrets:
//!
//! ```yaml
//! tokens:
//!   - { name: alice, token_sha256: "9f86d0...", role: write }
//!   - { name: dashboards, token: "s3cret-read-only", role: read }
//!   - { name: checkout-service, token_sha256: "2c26b4...", role: check }
//! ```
//!
//! `RINGLIMIT_CLIENT_TOKEN` adds one client credential named `client` (see [`TokenBook`]).
//!
//! The file is polled like the rules file: a changed file is validated and put in force. An
//! operator who deletes the file, empties it or lists no token revokes every token it held
//! (logged); only a file that cannot be read (other than gone) or does not validate is refused,
//! logged, and the previous tokens stay. `RINGLIMIT_ADMIN_TOKEN` keeps working beside it: a
//! write token named `admin`. Every change through the admin API is logged and listed with the
//! name of the token that made it. A file that group or others may read and that holds raw
//! `token:` entries is warned about when it is loaded: anyone on the host can then read them.
//!
//! Tokens are kept as SHA-256 digests and a presented token is compared with every one of them
//! in constant time, so timing reveals neither a token's bytes, nor its length, nor which entry
//! it matched.

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A client credential (an SDK's, on the peer port): checks, leases, reservations; nothing
    /// on the admin API.
    Check,
    /// Reads: the rules, a key's state, top keys, the cluster.
    Read,
    /// Reads, rule changes and resets.
    Write,
}

/// One admin token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub name: String,
    pub role: Role,
    digest: [u8; 32],
}

impl Role {
    /// The tokens file's word for this role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Check => "check",
            Role::Read => "read",
            Role::Write => "write",
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The name `RINGLIMIT_ADMIN_TOKEN`'s token goes by.
pub const ENV_TOKEN_NAME: &str = "admin";
/// The name `RINGLIMIT_CLIENT_TOKEN`'s client credential goes by.
pub const ENV_CLIENT_TOKEN_NAME: &str = "client";

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Absent or `null`: no token.
    #[serde(default)]
    tokens: Option<Vec<Entry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_sha256: Option<String>,
    role: Role,
}

/// The admin tokens in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminTokens {
    tokens: Vec<Token>,
    /// The names of the file's entries given as raw `token:` (not `token_sha256`).
    raw: Vec<String>,
}

/// The token of an `authorization: Bearer <token>` value (an HTTP header or gRPC metadata).
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl AdminTokens {
    /// Adds `RINGLIMIT_ADMIN_TOKEN`'s token, when set, as a write token named `admin`.
    pub fn with_env(mut self, token: Option<&str>) -> Self {
        if let Some(t) = token {
            self.tokens.push(Token {
                name: ENV_TOKEN_NAME.into(),
                role: Role::Write,
                digest: digest(t.as_bytes()),
            });
        }
        self
    }

    /// Adds `RINGLIMIT_CLIENT_TOKEN`'s token, when set, as a client credential named `client`
    /// (unless the file already has that token: its entry stays).
    pub fn with_client_env(mut self, token: Option<&str>) -> Self {
        if let Some(t) = token {
            let d = digest(t.as_bytes());
            if !self.tokens.iter().any(|x| x.digest == d) {
                self.tokens.push(Token {
                    name: ENV_CLIENT_TOKEN_NAME.into(),
                    role: Role::Check,
                    digest: d,
                });
            }
        }
        self
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The client credentials among them (role `check`), keyed as the peer handshake proves
    /// them: by their digest.
    pub fn client_keys(&self) -> Vec<ringlimit_proto::auth::NamedClientKey> {
        self.tokens
            .iter()
            .filter(|t| t.role == Role::Check)
            .map(|t| ringlimit_proto::auth::NamedClientKey {
                name: t.name.clone(),
                key: t.digest,
            })
            .collect()
    }

    /// Whether any token is a client credential (role `check`).
    pub fn has_clients(&self) -> bool {
        self.tokens.iter().any(|t| t.role == Role::Check)
    }

    /// The tokens' names.
    pub fn names(&self) -> Vec<String> {
        self.tokens.iter().map(|t| t.name.clone()).collect()
    }

    /// Whether a token is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tokens.iter().any(|t| t.name == name)
    }

    /// Parses a tokens file's text; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, TokensError> {
        let invalid = |reason: String| TokensError::Invalid {
            path: path.to_owned(),
            reason,
        };
        // An empty file (or one of comments only) is a YAML null: no token.
        let file: Option<File> =
            serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let entries = file.and_then(|f| f.tokens).unwrap_or_default();
        let mut tokens = Vec::with_capacity(entries.len());
        let mut raw = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            let at = format!("tokens[{i}] ({:?})", e.name);
            if e.name.trim().is_empty() || e.name.len() > 64 {
                return Err(invalid(format!("{at}: name must be 1 to 64 characters")));
            }
            if tokens.iter().any(|t: &Token| t.name == e.name) {
                return Err(invalid(format!("{at}: the name is used twice")));
            }
            let digest = match (e.token, e.token_sha256) {
                (Some(t), None) if t.len() >= 16 => {
                    raw.push(e.name.clone());
                    digest(t.as_bytes())
                }
                (Some(_), None) => {
                    return Err(invalid(format!(
                        "{at}: token must be at least 16 characters"
                    )));
                }
                (None, Some(hex)) => parse_hex(hex.trim()).ok_or_else(|| {
                    invalid(format!(
                        "{at}: token_sha256 must be 64 hexadecimal digits (sha256sum of the token)"
                    ))
                })?,
                _ => {
                    return Err(invalid(format!(
                        "{at}: give exactly one of token and token_sha256"
                    )));
                }
            };
            if tokens.iter().any(|t: &Token| t.digest == digest) {
                return Err(invalid(format!("{at}: the same token as another entry")));
            }
            tokens.push(Token {
                name: e.name,
                role: e.role,
                digest,
            });
        }
        Ok(Self { tokens, raw })
    }

    /// Reads and parses the tokens file at `path`.
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// The names of the file's entries given as raw tokens.
    pub fn raw(&self) -> &[String] {
        &self.raw
    }

    /// The token `given` is, compared with every token in constant time.
    pub fn find(&self, given: &[u8]) -> Option<&Token> {
        let given = digest(given);
        let mut found = None;
        for t in &self.tokens {
            // No early exit: every entry is compared whatever matched.
            if bool::from(t.digest.ct_eq(&given)) {
                found = Some(t);
            }
        }
        found
    }
}

/// The tokens in force, reloaded from their file (see [`TokenBook::watch`]).
#[derive(Debug)]
pub struct TokenBook {
    current: ArcSwap<AdminTokens>,
    file: Option<PathBuf>,
    env: Option<String>,
    /// `RINGLIMIT_CLIENT_TOKEN`: a client credential named `client`.
    client_env: Option<String>,
    /// The last refusal, so that an invalid file is logged and counted once, not every poll.
    last_error: Mutex<Option<String>>,
    /// Reloads that put new tokens in force, and files refused.
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
}

impl TokenBook {
    /// The tokens of `file` (when set; read now: an unreadable or invalid file is an error) and
    /// of `env` (`RINGLIMIT_ADMIN_TOKEN`).
    pub fn open(file: Option<PathBuf>, env: Option<String>) -> Result<Self, TokensError> {
        let from_file = match &file {
            Some(path) => {
                let tokens = AdminTokens::load(path)?;
                warn_if_exposed(path, &tokens);
                tokens
            }
            None => AdminTokens::default(),
        };
        Ok(Self {
            current: ArcSwap::from_pointee(from_file.with_env(env.as_deref())),
            file,
            env,
            client_env: None,
            last_error: Mutex::new(None),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        })
    }

    /// This book with `RINGLIMIT_CLIENT_TOKEN`'s client credential (`None`: not set), kept
    /// across reloads of the file.
    pub fn with_client_token(mut self, token: Option<String>) -> Self {
        let current = (**self.current.load()).clone();
        self.current = ArcSwap::from_pointee(current.with_client_env(token.as_deref()));
        self.client_env = token;
        self
    }

    /// Whether the admin API is on: a tokens file is given, or `RINGLIMIT_ADMIN_TOKEN` is set
    /// (a file that lists no token keeps it on, refusing every request, until tokens are added).
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.env.is_some()
    }

    /// The tokens in force.
    pub fn tokens(&self) -> arc_swap::Guard<std::sync::Arc<AdminTokens>> {
        self.current.load()
    }

    /// Reads the file again; puts its tokens in force if they changed and are valid. A file
    /// gone, empty or listing no token revokes the file's tokens (see the module doc).
    pub fn reload(&self) {
        let Some(path) = &self.file else { return };
        let gone = |e: &TokensError| matches!(e, TokensError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        match AdminTokens::load(path) {
            Ok(t) => self.put_in_force(path, t, false),
            Err(e) if gone(&e) => self.put_in_force(path, AdminTokens::default(), true),
            Err(e) => {
                if self.last_error.lock().as_deref() != Some(&e.to_string()) {
                    tracing::error!(error = %e, "admin tokens file refused; the previous tokens stay in force");
                    self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                }
                *self.last_error.lock() = Some(e.to_string());
            }
        }
    }

    /// Puts the file's `tokens` (and the variable's) in force if they differ from those in
    /// force, saying what was revoked.
    fn put_in_force(&self, path: &Path, tokens: AdminTokens, gone: bool) {
        *self.last_error.lock() = None;
        let from_file = tokens.len();
        let t = tokens
            .with_env(self.env.as_deref())
            .with_client_env(self.client_env.as_deref());
        if **self.current.load() == t {
            return;
        }
        let before: Vec<String> = self.current.load().names();
        let revoked: Vec<&String> = before.iter().filter(|n| !t.has(n)).collect();
        if gone {
            tracing::warn!(file = %path.display(), ?revoked, "admin tokens file is gone: its tokens are revoked (RINGLIMIT_ADMIN_TOKEN's `admin` and RINGLIMIT_CLIENT_TOKEN's `client` stay)");
        } else if from_file == 0 {
            tracing::warn!(file = %path.display(), ?revoked, "admin tokens file lists no token: its tokens are revoked (RINGLIMIT_ADMIN_TOKEN's `admin` and RINGLIMIT_CLIENT_TOKEN's `client` stay)");
        } else {
            warn_if_exposed(path, &t);
            tracing::info!(file = %path.display(), tokens = t.len(), ?revoked, "admin tokens reloaded");
        }
        self.current.store(std::sync::Arc::new(t));
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
    }

    /// Reloads the file every `every` until the task is dropped (polled like the rules file:
    /// a ConfigMap's atomic swap is seen whatever its mtimes say).
    pub async fn watch(self: std::sync::Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.reload();
        }
    }
}

impl crate::peers::server::ClientKeys for TokenBook {
    fn client_keys(&self) -> std::sync::Arc<[ringlimit_proto::auth::NamedClientKey]> {
        std::sync::Arc::from(self.tokens().client_keys())
    }
}

/// Warns when the file at `path` holds raw tokens and group or others may read it.
fn warn_if_exposed(path: &Path, tokens: &AdminTokens) {
    if tokens.raw().is_empty() {
        return;
    }
    if let Some(mode) = readable_by_others(path) {
        tracing::warn!(
            file = %path.display(),
            mode = %format!("{mode:o}"),
            raw = ?tokens.raw(),
            "admin tokens file holds raw tokens and group or others may read it: give \
             token_sha256 (sha256sum of the token) instead, or make the file readable by the node \
             alone (chmod 600; a Kubernetes Secret's defaultMode 0400)"
        );
    }
}

/// The file's permission bits when group or others may read it (following links, as a
/// Kubernetes Secret's are).
#[cfg(unix)]
fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn readable_by_others(_path: &Path) -> Option<u32> {
    None
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bearer_tokens_are_parsed() {
        use super::bearer;
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    use super::*;

    const FILE: &str = r#"
tokens:
  - { name: alice, token_sha256: "4a3ba0c4a1ba4d50ee2aa6b1a6e4f8e2a6a43e0b3d0f7e3ad7e6ee9be4b1a801", role: write }
  - { name: dashboards, token: "read-only-token-0001", role: read }
"#;

    #[test]
    fn named_tokens_are_found_with_their_role() {
        let t = AdminTokens::parse(FILE, "tokens.yaml")
            .expect("valid")
            .with_env(Some("env-token"));
        assert_eq!(t.len(), 3);
        let read = t.find(b"read-only-token-0001").expect("found");
        assert_eq!((read.name.as_str(), read.role), ("dashboards", Role::Read));
        let env = t.find(b"env-token").expect("found");
        assert_eq!((env.name.as_str(), env.role), (ENV_TOKEN_NAME, Role::Write));
        assert!(t.find(b"read-only-token-000").is_none());
        assert!(t.find(b"").is_none());
        assert!(!format!("{read:?}").contains("digest"));
    }

    #[test]
    fn a_digest_names_the_token_it_was_made_of() {
        let hex: String = digest(b"alice's long token")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text =
            format!("tokens:\n  - {{ name: alice, token_sha256: \"{hex}\", role: write }}\n");
        let t = AdminTokens::parse(&text, "f").expect("valid");
        assert_eq!(
            t.find(b"alice's long token").map(|t| t.role),
            Some(Role::Write)
        );
    }

    #[test]
    fn a_changed_file_is_put_in_force_and_a_bad_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens.yaml");
        let write = |text: &str| std::fs::write(&path, text).expect("written");
        write("tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: read }]\n");
        let book = TokenBook::open(Some(path.clone()), Some("env-token".into())).expect("open");
        assert!(book.enabled());
        assert_eq!(
            book.tokens().find(b"aaaaaaaaaaaaaaaa").map(|t| t.role),
            Some(Role::Read)
        );
        write("tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: write }]\n");
        book.reload();
        assert_eq!(
            book.tokens().find(b"aaaaaaaaaaaaaaaa").map(|t| t.role),
            Some(Role::Write)
        );
        write("tokens: [{ name: a, role: write }]\n");
        book.reload();
        book.reload();
        assert_eq!(
            book.reloads_failed.load(Ordering::Relaxed),
            1,
            "logged and counted once"
        );
        assert_eq!(
            book.tokens().find(b"aaaaaaaaaaaaaaaa").map(|t| t.role),
            Some(Role::Write)
        );
        assert!(
            book.tokens().find(b"env-token").is_some(),
            "the variable's token stays"
        );
        assert!(TokenBook::open(Some(dir.path().join("absent")), None).is_err());
        assert!(!TokenBook::open(None, None).expect("open").enabled());
    }

    /// An operator removing tokens sees them stop working: a file deleted, emptied, of
    /// comments only or listing no token revokes the file's tokens (the variable's stays); a
    /// file that cannot be read (here: a directory in its place) or does not validate keeps
    /// the previous ones.
    #[test]
    fn deleting_or_emptying_the_file_revokes_its_tokens() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens.yaml");
        let good = "tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: write }]\n";
        std::fs::write(&path, good).expect("written");
        let book = TokenBook::open(Some(path.clone()), Some("env-token".into())).expect("open");
        let a = |book: &TokenBook| book.tokens().find(b"aaaaaaaaaaaaaaaa").is_some();
        assert!(a(&book));
        for emptied in [
            None,
            Some(""),
            Some("# none\n"),
            Some("tokens: []\n"),
            Some("tokens:\n"),
        ] {
            match emptied {
                None => std::fs::remove_file(&path).expect("removed"),
                Some(text) => std::fs::write(&path, text).expect("written"),
            }
            book.reload();
            assert!(!a(&book), "{emptied:?}: the file's token still works");
            assert!(book.tokens().find(b"env-token").is_some(), "{emptied:?}");
            assert!(book.enabled());
            std::fs::write(&path, good).expect("written");
            book.reload();
            assert!(a(&book), "{emptied:?}: back");
        }
        assert_eq!(book.reloads_failed.load(Ordering::Relaxed), 0);
        // Unreadable (a directory where the file was), then invalid: the token stays.
        std::fs::remove_file(&path).expect("removed");
        std::fs::create_dir(&path).expect("a directory");
        book.reload();
        assert!(a(&book));
        std::fs::remove_dir(&path).expect("removed");
        std::fs::write(&path, "tokens: [{ name: a, role: write }]\n").expect("written");
        book.reload();
        assert!(a(&book));
        assert_eq!(book.reloads_failed.load(Ordering::Relaxed), 2);
        // An empty file at start: the admin API stays on, with the variable's token only.
        std::fs::write(&path, "").expect("written");
        let empty = TokenBook::open(Some(path.clone()), None).expect("open");
        assert!(empty.enabled() && empty.tokens().len() == 0);
    }

    /// Raw tokens are noticed, and a file group or others may read is told apart.
    #[cfg(unix)]
    #[test]
    fn raw_tokens_in_a_file_others_can_read_are_noticed() {
        use std::os::unix::fs::PermissionsExt;
        let t = AdminTokens::parse(FILE, "tokens.yaml").expect("valid");
        assert_eq!(t.raw(), ["dashboards".to_owned()]);
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens.yaml");
        std::fs::write(&path, FILE).expect("written");
        let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
        mode(0o644).expect("chmod");
        assert_eq!(readable_by_others(&path), Some(0o644));
        mode(0o640).expect("chmod");
        assert_eq!(readable_by_others(&path), Some(0o640));
        mode(0o600).expect("chmod");
        assert_eq!(readable_by_others(&path), None);
    }

    #[test]
    fn bad_files_are_refused_naming_the_entry() {
        for (text, says) in [
            ("tokens: [{ name: a, role: read }]", "exactly one"),
            (
                "tokens: [{ name: a, token: x, token_sha256: ab, role: read }]",
                "exactly one",
            ),
            (
                "tokens: [{ name: a, token: short, role: read }]",
                "16 characters",
            ),
            (
                "tokens: [{ name: a, token_sha256: zz, role: read }]",
                "64 hexadecimal",
            ),
            (
                "tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: admin }]",
                "unknown variant",
            ),
            (
                "tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: read }, { name: a, token: bbbbbbbbbbbbbbbb, role: read }]",
                "used twice",
            ),
            (
                "tokens: [{ name: a, token: aaaaaaaaaaaaaaaa, role: read }, { name: b, token: aaaaaaaaaaaaaaaa, role: write }]",
                "same token",
            ),
            (
                "tokens: [{ name: '', token: aaaaaaaaaaaaaaaa, role: read }]",
                "1 to 64",
            ),
            ("nope: 1", "unknown field"),
        ] {
            let e = AdminTokens::parse(text, "tokens.yaml").expect_err(text);
            let e = e.to_string();
            assert!(e.starts_with("tokens.yaml: "), "{e}");
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
