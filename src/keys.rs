//! `keel keys create|revoke|list`, and what a presented key proves ([`authenticate`]).
//!
//! Owns the secret token's format (`keel_<id>_<secret>`: a public id that finds the row and
//! 244 random bits from the OS generator), its hashing (SHA-256, stored; the secret is printed
//! once, at creation, and never again) and its check (hashes compared in constant time). It
//! never logs, stores or echoes a secret — not in an error, not in a listing — and never
//! decides what a role may do (the server does).

use crate::exit;
use crate::output::Output;
use crate::wiring::SystemClock;
use anyhow::Context as _;
use clap::Subcommand;
use engine::canonical::sha256_hex;
use engine::clock::Clock as _;
use engine::limits::API_KEY_NAME_MAX_CHARS;
use serde::Serialize;
use std::path::Path;
use store::keys::{ApiKey, KeyBook, Revocation, Role};

/// `keel keys …`: the API keys of `keel serve`.
#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key and print its secret, once: it is stored hashed and cannot be shown again.
    ///
    /// `submit` may charge, refund and read; `read` may only read; `operator` may read and
    /// reconcile, cancel, resolve, approve and deny (its name is recorded as the operator).
    /// A key sees its own tenant only.
    Create {
        /// The tenant the key acts for (a UUID).
        #[arg(long)]
        tenant: String,
        /// submit, read or operator.
        #[arg(long, value_parser = ["submit", "read", "operator"])]
        role: String,
        /// A unique name (1–64 visible ASCII characters, not 16 hex digits: that is an id's
        /// shape), recorded in the events the key causes.
        #[arg(long)]
        name: String,
    },
    /// Revoke a key by name or id: its requests are refused (401) from the next one on. A text
    /// that is one key's name and another's id revokes neither (exit 64, naming both).
    Revoke {
        /// The key's name or id.
        name_or_id: String,
    },
    /// List every key, live and revoked (never a secret).
    List,
}

/// A key as listed: everything but the secret's hash.
#[derive(Serialize)]
struct Listed<'a> {
    id: &'a str,
    name: &'a str,
    tenant: &'a str,
    role: &'static str,
    created_at: String,
    revoked_at: Option<String>,
}

/// A key just created: as listed, and its token, shown this once.
#[derive(Serialize)]
struct Created<'a> {
    #[serde(flatten)]
    key: Listed<'a>,
    secret: &'a str,
}

impl<'a> From<&'a ApiKey> for Listed<'a> {
    fn from(key: &'a ApiKey) -> Self {
        let at = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Self {
            id: &key.id,
            name: &key.name,
            tenant: &key.tenant,
            role: key.role.as_str(),
            created_at: at(key.created_at),
            revoked_at: key.revoked_at.map(at),
        }
    }
}

/// Runs one `keel keys` command on the log at `db`.
pub fn dispatch(db: &Path, out: &Output, command: KeysCommand) -> anyhow::Result<u8> {
    match command {
        KeysCommand::Create { tenant, role, name } => create(db, out, &tenant, &role, &name),
        KeysCommand::Revoke { name_or_id } => revoke(db, out, &name_or_id),
        KeysCommand::List => list(db, out),
    }
}

fn open(db: &Path) -> anyhow::Result<KeyBook> {
    KeyBook::open(db).with_context(|| format!("cannot open the key table of {}", db.display()))
}

fn create(db: &Path, out: &Output, tenant: &str, role: &str, name: &str) -> anyhow::Result<u8> {
    if !engine::event::is_uuid(tenant) {
        return Ok(out.usage_error(&format!("--tenant must be a UUID (8-4-4-4-12 hex digits), got {tenant:?}")));
    }
    let chars = name.chars().count();
    if chars == 0 || chars > API_KEY_NAME_MAX_CHARS || !name.chars().all(|c| c.is_ascii_graphic()) {
        return Ok(out.usage_error(&format!(
            "--name must be 1 to {API_KEY_NAME_MAX_CHARS} visible ASCII characters (no spaces), got {name:?}"
        )));
    }
    if shaped_like_an_id(name) {
        return Ok(out.usage_error(&format!(
            "--name {name:?} has the shape of a key id ({ID_HEX_DIGITS} hex digits): `keel keys revoke` could not \
             tell it from another key's id; choose a name with another character"
        )));
    }
    let role = Role::parse(role).context("clap admits the three role names only")?;
    let (id, secret) = (new_id(), new_secret());
    let key = ApiKey {
        id: id.clone(),
        name: name.to_owned(),
        tenant: tenant.to_ascii_lowercase(),
        role,
        secret_sha256: sha256_hex(secret.as_bytes()),
        created_at: SystemClock.now(),
        revoked_at: None,
    };
    match open(db)?.create(&key) {
        Ok(()) => {}
        Err(error @ store::Error::KeyNameTaken { .. }) => return Ok(out.usage_error(&error.to_string())),
        Err(other) => return Err(other.into()),
    }
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    let document = Created { key: Listed::from(&key), secret: &token };
    out.emit(&document, || {
        outln!("created key {} ({}) for tenant {}, role {}", key.name, key.id, key.tenant, role.as_str());
        outln!("secret (shown once, store it now; send it as `Authorization: Bearer …`):");
        outln!("{token}");
    });
    Ok(exit::OK)
}

fn revoke(db: &Path, out: &Output, name_or_id: &str) -> anyhow::Result<u8> {
    let key = match open(db)?.revoke(name_or_id, SystemClock.now())? {
        Revocation::Revoked(key) => key,
        Revocation::Unknown => {
            return Ok(out.fail(&crate::output::Failure::NotFound(format!(
                "no API key named or numbered {name_or_id:?} (see `keel keys list`)"
            ))));
        }
        Revocation::Ambiguous { named, numbered } => {
            return Ok(out.usage_error(&format!(
                "{name_or_id:?} is the name of key {} and the id of key {:?}: nothing revoked; give the id {} to \
                 revoke the first, the name {:?} to revoke the second",
                named.id, numbered.name, named.id, numbered.name
            )));
        }
    };
    out.emit(&Listed::from(&key), || outln!("revoked key {} ({})", key.name, key.id));
    Ok(exit::OK)
}

/// Whether `name` has the shape of a key id ([`new_id`]: 16 hex digits, in any case): such a
/// name would make `keel keys revoke NAME` mean two keys.
fn shaped_like_an_id(name: &str) -> bool {
    name.len() == ID_HEX_DIGITS && name.bytes().all(|b| b.is_ascii_hexdigit())
}

fn list(db: &Path, out: &Output) -> anyhow::Result<u8> {
    let keys = open(db)?.list()?;
    let listed: Vec<Listed<'_>> = keys.iter().map(Listed::from).collect();
    out.emit(&listed, || {
        if listed.is_empty() {
            outln!("no API keys (create one with `keel keys create`)");
        }
        for key in &listed {
            let state = key.revoked_at.as_deref().map_or("live".to_owned(), |at| format!("revoked {at}"));
            outln!("{:<24} {:<16} {:<8} tenant {} {}", key.name, key.id, key.role, key.tenant, state);
        }
    });
    Ok(exit::OK)
}

/// Every secret token starts with this, so a leaked one is recognisable (secret scanners).
const TOKEN_PREFIX: &str = "keel_";

/// How many hex digits a key id has.
const ID_HEX_DIGITS: usize = 16;

/// A public key id: 16 hex digits (the random part of a UUIDv4 and its version digit).
fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..ID_HEX_DIGITS].to_owned()
}

/// A secret: two UUIDv4s from the OS generator, 244 random bits in 64 hex digits. The
/// console's session ids and CSRF tokens are made the same way.
pub fn new_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Why a presented key proves nothing. The messages never repeat what was presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// Not a Keel token, an unknown id, or the wrong secret (told apart to nobody).
    Invalid,
    /// A key that was revoked.
    Revoked,
}

impl Refused {
    /// The message a caller is shown.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "no API key: send `Authorization: Bearer <secret>` (create one with `keel keys create`)",
            Self::Invalid => "the API key is not valid",
            Self::Revoked => "the API key was revoked",
        }
    }
}

/// The key `authorization` (the header's value) proves, if any.
///
/// # Errors
///
/// The store's, when the key table cannot be read.
pub fn authenticate(book: &KeyBook, authorization: Option<&str>) -> Result<Result<ApiKey, Refused>, store::Error> {
    let Some(header) = authorization else { return Ok(Err(Refused::Missing)) };
    let Some(token) = header.strip_prefix("Bearer ").map(str::trim) else { return Ok(Err(Refused::Invalid)) };
    check_token(book, token)
}

/// The key a secret token (`keel_<id>_<secret>`, as `keel keys create` printed it) proves, if
/// any: what a bearer header carries, and what the console's login form takes.
///
/// # Errors
///
/// The store's, when the key table cannot be read.
pub fn check_token(book: &KeyBook, token: &str) -> Result<Result<ApiKey, Refused>, store::Error> {
    let Some((id, secret)) = split_token(token) else {
        return Ok(Err(Refused::Invalid));
    };
    let Some(key) = book.find(id)? else { return Ok(Err(Refused::Invalid)) };
    if !constant_time_eq(sha256_hex(secret.as_bytes()).as_bytes(), key.secret_sha256.as_bytes()) {
        return Ok(Err(Refused::Invalid));
    }
    if key.revoked_at.is_some() {
        return Ok(Err(Refused::Revoked));
    }
    Ok(Ok(key))
}

/// The public key id a token presents (whether or not such a key exists), when it has the
/// token's shape: what the console's login limit counts attempts against.
pub fn token_id(token: &str) -> Option<&str> {
    split_token(token).map(|(id, _)| id)
}

/// A token's public id and its secret.
fn split_token(token: &str) -> Option<(&str, &str)> {
    token.strip_prefix(TOKEN_PREFIX).and_then(|rest| rest.split_once('_'))
}

/// Whether `a == b`, in a time that depends on their lengths only (both are 64 hex digits).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_eq_tells_every_byte() {
        assert!(constant_time_eq(b"abcd", b"abcd"));
        assert!(!constant_time_eq(b"abcd", b"abce"));
        assert!(!constant_time_eq(b"xbcd", b"abcd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
