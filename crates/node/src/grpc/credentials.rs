//! ringlimit.v1's client credentials (Lease, GiveBack, held checks) and each credential's
//! ledger of what it may give back.
//!
//! A credential is metadata `authorization: Bearer <token>`, a named token of role `check`
//! (the admin tokens' file, `RINGLIMIT_CLIENT_TOKEN`), as on the peer port. A node with neither
//! a cluster secret nor client credentials takes calls without one (as its peer port takes
//! anonymous clients): they share one ledger. gRPC calls come on any connection, so a client
//! is its credential's name, not its connection: each name has one ledger, bounded.

use crate::admin::tokens::{AdminTokens, Role, TokenBook, bearer};
use crate::local::holds::Holds;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Most holds one credential's ledger remembers (about 60 bytes each): an SDK's all-or-nothing
/// groups and lease slices in flight, with room for many processes sharing a credential.
pub const MOST_HOLDS_PER_CREDENTIAL: usize = 65_536;

/// Who may make the calls that need a client credential.
#[derive(Clone)]
pub struct ClientAuth {
    pub tokens: Arc<TokenBook>,
    /// Whether the node has a cluster secret (then a credential is needed even without tokens).
    pub secret: bool,
}

/// Why a call was refused a credential: the gRPC status and the HTTP API's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub grpc: tonic::Code,
    pub code: &'static str,
    pub message: String,
}

impl Refused {
    pub fn status(&self) -> tonic::Status {
        tonic::Status::new(self.grpc, format!("{}: {}", self.code, self.message))
    }
}

impl ClientAuth {
    /// The credential name of a call whose metadata carries `authorization` (`None`: absent;
    /// its value as text, or `Err` when it is not text). A node that needs none answers ""
    /// (anonymous) whatever is sent.
    pub fn credential(
        &self,
        authorization: Option<Result<&str, ()>>,
        call: &str,
    ) -> Result<String, Refused> {
        let tokens = self.tokens.tokens();
        if !self.secret && !tokens.has_clients() {
            return Ok(String::new());
        }
        let unauthenticated = |message: String| Refused {
            grpc: tonic::Code::Unauthenticated,
            code: "unauthorized",
            message,
        };
        let Some(value) = authorization else {
            return Err(unauthenticated(format!(
                "{call} needs a client credential: metadata `authorization: Bearer <token>` \
                 with a token of role `check`"
            )));
        };
        let Some(token) = value.ok().and_then(|v| bearer(v.as_bytes())) else {
            return Err(unauthenticated(
                "`authorization` must be `Bearer <token>`".to_owned(),
            ));
        };
        let Some(found) = tokens.find(token) else {
            return Err(unauthenticated(
                "the bearer token is not a token of this node".to_owned(),
            ));
        };
        if found.role != Role::Check {
            return Err(Refused {
                grpc: tonic::Code::PermissionDenied,
                code: "forbidden",
                message: format!(
                    "token {:?} has role `{}`; {call} needs a client credential (role `check`)",
                    found.name,
                    found.role.as_str()
                ),
            });
        }
        Ok(found.name.clone())
    }
}

/// A long-lived call's credential (CheckStream), checked when it opened and again whenever
/// the tokens in force have changed since (a reload may have revoked it): one pointer
/// comparison a message otherwise.
pub struct StreamCredential {
    auth: ClientAuth,
    /// The call's `authorization` as [`ClientAuth::credential`] takes it, owned.
    authorization: Option<Result<String, ()>>,
    call: &'static str,
    /// The tokens it was last found valid under.
    checked: Arc<AdminTokens>,
}

impl StreamCredential {
    /// The credential name of a call opening with `authorization`, and what checks it later.
    pub fn open(
        auth: &ClientAuth,
        authorization: Option<Result<&str, ()>>,
        call: &'static str,
    ) -> Result<(String, Self), Refused> {
        let checked = arc_swap::Guard::into_inner(auth.tokens.tokens());
        let name = auth.credential(authorization, call)?;
        let held = Self {
            auth: auth.clone(),
            authorization: authorization.map(|v| v.map(str::to_owned)),
            call,
            checked,
        };
        Ok((name, held))
    }

    /// Whether the credential is still valid (checked again only when the tokens changed).
    pub fn still_valid(&mut self) -> Result<(), Refused> {
        let now = self.auth.tokens.tokens();
        if Arc::ptr_eq(&now, &self.checked) {
            return Ok(());
        }
        let now = arc_swap::Guard::into_inner(now);
        let authorization = self
            .authorization
            .as_ref()
            .map(|v| v.as_deref().map_err(|_| ()));
        self.auth.credential(authorization, self.call)?;
        self.checked = now;
        Ok(())
    }
}

/// Every credential's ledger, made on its first use. As many as the node has client
/// credentials (the operator's tokens) and one anonymous ledger: bounded by the tokens file.
#[derive(Default)]
pub struct Ledgers {
    by_name: Mutex<HashMap<String, Arc<Mutex<Holds>>>>,
}

impl Ledgers {
    /// The ledger of credential `name` ("" for anonymous calls).
    pub fn of(&self, name: &str) -> Arc<Mutex<Holds>> {
        let mut by_name = self.by_name.lock();
        if let Some(l) = by_name.get(name) {
            return l.clone();
        }
        let l = Arc::new(Mutex::new(Holds::bounded(MOST_HOLDS_PER_CREDENTIAL)));
        by_name.insert(name.to_owned(), l.clone());
        l
    }
}

/// The lease holder a credential's client is known by at the owner: the client's own id under
/// its credential's name (length first, so that no name and id can spell another's), so that
/// one client cannot take or share another credential's slices by picking its id.
pub fn holder(credential: &str, id: &str) -> String {
    format!("sdk/{}/{credential}/{id}", credential.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(file: Option<&str>, secret: bool) -> ClientAuth {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens.yaml");
        let book = match file {
            Some(text) => {
                std::fs::write(&path, text).expect("written");
                TokenBook::open(Some(path), None).expect("valid")
            }
            None => TokenBook::open(None, None).expect("valid"),
        };
        ClientAuth {
            tokens: Arc::new(book),
            secret,
        }
    }

    const TOKENS: &str = "tokens:\n  - { name: svc, token: svc-token-0000001, role: check }\n  - { name: ops, token: ops-token-00000001, role: read }\n";

    #[test]
    fn a_node_without_secret_or_client_tokens_takes_anyone() {
        let open = auth(None, false);
        assert_eq!(open.credential(None, "Lease"), Ok(String::new()));
        assert_eq!(
            open.credential(Some(Ok("Bearer whatever")), "Lease"),
            Ok(String::new())
        );
        let read_only = auth(
            Some("tokens: [{ name: ops, token: ops-token-00000001, role: read }]\n"),
            false,
        );
        assert_eq!(read_only.credential(None, "Lease"), Ok(String::new()));
    }

    #[test]
    fn a_credential_is_a_check_token_by_its_name() {
        for a in [auth(Some(TOKENS), false), auth(Some(TOKENS), true)] {
            assert_eq!(
                a.credential(Some(Ok("Bearer svc-token-0000001")), "Lease"),
                Ok("svc".to_owned())
            );
            assert_eq!(
                a.credential(Some(Ok("bearer  svc-token-0000001 ")), "Lease"),
                Ok("svc".to_owned())
            );
            let refused =
                |v: Option<Result<&str, ()>>| a.credential(v, "GiveBack").expect_err("refused");
            for v in [
                None,
                Some(Err(())),
                Some(Ok("svc-token-0000001")),
                Some(Ok("Basic svc-token-0000001")),
                Some(Ok("Bearer ")),
                Some(Ok("Bearer not-a-token-at-all")),
            ] {
                let r = refused(v);
                assert_eq!(
                    (r.grpc, r.code),
                    (tonic::Code::Unauthenticated, "unauthorized")
                );
                assert!(r.status().message().starts_with("unauthorized: "), "{r:?}");
            }
            let r = refused(Some(Ok("Bearer ops-token-00000001")));
            assert_eq!(
                (r.grpc, r.code),
                (tonic::Code::PermissionDenied, "forbidden")
            );
            assert!(
                r.message.contains("\"ops\" has role `read`"),
                "{}",
                r.message
            );
        }
        // A secret alone: no token is a credential.
        let secret = auth(None, true);
        assert_eq!(
            secret.credential(None, "Lease").map_err(|r| r.grpc),
            Err(tonic::Code::Unauthenticated)
        );
    }

    #[test]
    fn a_held_credential_is_checked_again_when_the_tokens_change() {
        let a = auth(Some(TOKENS), true);
        let (name, mut held) =
            StreamCredential::open(&a, Some(Ok("Bearer svc-token-0000001")), "CheckStream")
                .expect("valid");
        assert_eq!(name, "svc");
        assert_eq!(held.still_valid(), Ok(()));
        assert!(StreamCredential::open(&a, None, "CheckStream").is_err());
        // The file is gone (its directory was removed): a reload revokes its tokens.
        a.tokens.reload();
        let r = held.still_valid().expect_err("revoked");
        assert_eq!(r.grpc, tonic::Code::Unauthenticated);
        // A node that needs no credential keeps taking the call.
        let open = auth(None, false);
        let (name, mut held) = StreamCredential::open(&open, None, "CheckStream").expect("anyone");
        assert_eq!((name.as_str(), held.still_valid()), ("", Ok(())));
    }

    #[test]
    fn holders_of_different_credentials_never_meet() {
        assert_ne!(holder("a/b", "c"), holder("a", "b/c"));
        assert_ne!(holder("", "x"), holder("x", ""));
        assert_eq!(holder("svc", "u1"), "sdk/3/svc/u1");
    }

    #[test]
    fn each_credential_has_its_own_ledger() {
        let l = Ledgers::default();
        let mark = ringlimit_proto::peer::Mark {
            reset_ns: 1,
            at_ns: 2,
        };
        l.of("a").lock().hold(7, mark, 3);
        assert_eq!(l.of("b").lock().take(7, mark, 3), 0);
        assert_eq!(l.of("a").lock().take(7, mark, 5), 3);
    }
}
