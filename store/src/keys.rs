//! API keys of `keel serve`: the `api_keys` table (schema version 5).
//!
//! Owns [`KeyBook`] (create, revoke, list, find by id), [`ApiKey`], [`Role`] and
//! [`Revocation`]. A key's
//! secret never reaches this module: callers hand it the secret's SHA-256 and compare
//! hashes themselves, in constant time. The table is outside the event log and its hash
//! chain, so it is written by its own connection here, never by the event writer; SQLite's
//! write lock (and the busy timeout) orders it with the writer of another process.
//!
//! It never generates secrets, never reads a clock (instants arrive as arguments) and never
//! decides who may do what: it stores what the binary decided.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension as _, params};
use std::path::Path;
use std::sync::Mutex;

/// What a key may do. The binary decides what each role allows; the store only keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Charges and refunds, and reads.
    Submit,
    /// Reads only.
    Read,
    /// Reads and operator decisions (reconcile, cancel, resolve, approve, deny).
    Operator,
}

impl Role {
    /// Every role, in the order `--help` lists them.
    pub const ALL: [Role; 3] = [Role::Submit, Role::Read, Role::Operator];

    /// The stored (and typed) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Read => "read",
            Self::Operator => "operator",
        }
    }

    /// The role named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == name)
    }
}

/// One API key as stored: never its secret, only the secret's SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKey {
    /// The public id, also the first part of the secret token (how a request finds its row).
    pub id: String,
    /// A human name, unique among every key ever created; recorded as the actor of the
    /// events its requests cause.
    pub name: String,
    /// The only tenant the key sees and acts for.
    pub tenant: String,
    /// What it may do.
    pub role: Role,
    /// SHA-256 of the secret, lower-case hex.
    pub secret_sha256: String,
    /// When it was created (stored to the microsecond, as every instant in the file).
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// What [`KeyBook::revoke`] came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revocation {
    /// The one key with that name or id, as it is now (revoked).
    Revoked(ApiKey),
    /// No key has that name or id.
    Unknown,
    /// The text is one key's name and another's id: nothing was revoked.
    Ambiguous {
        /// The key whose name it is.
        named: Box<ApiKey>,
        /// The key whose id it is.
        numbered: Box<ApiKey>,
    },
}

/// The API keys of one database file, on a connection of its own.
pub struct KeyBook {
    conn: Mutex<Connection>,
}

const SELECT: &str = "SELECT id, name, tenant, role, secret_sha256, created_at, revoked_at FROM api_keys";

fn instant(text: &str) -> rusqlite::Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.to_utc())
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))
}

fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKey> {
    let role: String = row.get(3)?;
    let revoked: Option<String> = row.get(6)?;
    Ok(ApiKey {
        id: row.get(0)?,
        name: row.get(1)?,
        tenant: row.get(2)?,
        // The table's CHECK admits exactly the three names `Role::parse` knows.
        role: Role::parse(&role).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, format!("role {role:?}").into())
        })?,
        secret_sha256: row.get(4)?,
        created_at: instant(&row.get::<_, String>(5)?)?,
        revoked_at: revoked.as_deref().map(instant).transpose()?,
    })
}

impl KeyBook {
    /// Opens the key table of the log at `path`, creating and migrating the file as the
    /// writer would. Cost: one connection; every call is one indexed statement.
    ///
    /// # Errors
    ///
    /// As [`crate::Store::open`]'s migration: a newer schema, a busy or unreadable file.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = crate::schema::open_writer(path, &crate::schema::Options::default())?;
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection as SQLite left it: usable.
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores a new key.
    ///
    /// # Errors
    ///
    /// [`Error::KeyNameTaken`] when a key (live or revoked) has this name already.
    pub fn create(&self, key: &ApiKey) -> Result<()> {
        let conn = self.conn();
        let taken: bool =
            conn.query_row("SELECT EXISTS (SELECT 1 FROM api_keys WHERE name = ?1)", [&key.name], |r| r.get(0))?;
        if taken {
            return Err(Error::KeyNameTaken { name: key.name.clone() });
        }
        conn.execute(
            "INSERT INTO api_keys (id, name, tenant, role, secret_sha256, created_at, revoked_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                key.id,
                key.name,
                key.tenant,
                key.role.as_str(),
                key.secret_sha256,
                stamp(key.created_at),
                key.revoked_at.map(stamp)
            ],
        )?;
        Ok(())
    }

    /// Revokes the one key named or numbered `name_or_id` at `at`. When it is one key's name
    /// and another's id (a name written before names shaped like ids were refused, or an id
    /// drawn equal to an older name), nothing is revoked: the caller is told both, and each
    /// can be revoked by its other handle. Revoking a revoked key keeps its first revocation
    /// instant. The read and the write are one transaction.
    ///
    /// # Errors
    ///
    /// The database's.
    pub fn revoke(&self, name_or_id: &str, at: DateTime<Utc>) -> Result<Revocation> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut matches: Vec<ApiKey> = tx
            .prepare_cached(&format!("{SELECT} WHERE name = ?1 OR id = ?1"))?
            .query_map([name_or_id], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        // Names are UNIQUE and ids the PRIMARY KEY: at most one key has it as its name, one as
        // its id.
        let key = match matches.len() {
            0 => return Ok(Revocation::Unknown),
            1 => matches.remove(0),
            _ => {
                let at = matches
                    .iter()
                    .position(|key| key.name == name_or_id)
                    .expect("of two keys found by name or id, one has the name: the other matched by id");
                let named = matches.remove(at);
                return Ok(Revocation::Ambiguous { named: Box::new(named), numbered: Box::new(matches.remove(0)) });
            }
        };
        tx.execute(
            "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
            params![key.id, stamp(at)],
        )?;
        let revoked = tx.prepare_cached(&format!("{SELECT} WHERE id = ?1"))?.query_row([&key.id], from_row)?;
        tx.commit()?;
        Ok(Revocation::Revoked(revoked))
    }

    /// Every key, in creation order.
    ///
    /// # Errors
    ///
    /// The database's.
    pub fn list(&self) -> Result<Vec<ApiKey>> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(&format!("{SELECT} ORDER BY created_at, id"))?;
        let keys = statement.query_map([], from_row)?.collect::<rusqlite::Result<_>>()?;
        Ok(keys)
    }

    /// The key with public id `id`, revoked or not (the caller tells the difference).
    ///
    /// # Errors
    ///
    /// The database's.
    pub fn find(&self, id: &str) -> Result<Option<ApiKey>> {
        let conn = self.conn();
        Ok(conn.prepare_cached(&format!("{SELECT} WHERE id = ?1"))?.query_row([id], from_row).optional()?)
    }
}
