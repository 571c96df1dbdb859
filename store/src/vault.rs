//! The payment-method vault: a charge's payment method, sealed with AES-256-GCM beside the
//! log, so that `keel resume`, `keel reconcile` and recovery can resend a charge whose
//! caller is gone.
//!
//! Owns [`VaultKey`] (32 bytes, zeroized on drop, never printed), the sealing format, the
//! key check value, and every statement on the `vault` and `vault_key` tables (schema
//! version 5, `store/FORMAT.md`). The tables are outside the hash chain: an entry is kept by
//! the reservation that carried the secret, in the same commit ([`keep`], called by the
//! writer), and deleted in the commit that makes its intent final ([`shred`]:
//! crypto-shredding). [`rotate`] and [`purge`] are maintenance commands that take SQLite's
//! write lock on their own connection.
//!
//! # Format
//!
//! An entry is `nonce (12 random bytes) || ciphertext || tag (16 bytes)`, the associated
//! data being `keel vault v1\0` followed by the intent key: an entry moved to another
//! intent, or altered in any byte, does not authenticate and is refused — never decrypted
//! to garbage. The key check value is the same construction over a fixed text with its own
//! associated data: a process whose key cannot open it is refused at start, before it keeps
//! anything under a key the others cannot read.
//!
//! This module must never log, print or return the key or a clear payment method other than
//! as the [`Secret`] a resend needs; its errors say what is wrong, never with what.

use crate::codec;
use crate::error::{Error, Result};
use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use chrono::{DateTime, Utc};
use engine::event::IntentKey;
use engine::log::Unsealed;
use engine::provider::Secret;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::path::Path;
use std::sync::Arc;
use zeroize::Zeroizing;

/// The length of a vault key, in bytes (AES-256).
pub const KEY_BYTES: usize = 32;

/// The nonce length of AES-GCM, in bytes: random per entry.
const NONCE_BYTES: usize = 12;

/// Prefixed to the intent key as an entry's associated data.
const ENTRY_AAD: &[u8] = b"keel vault v1\0";

/// The key check value's clear text and associated data.
const CHECK_TEXT: &[u8] = b"keel vault key check v1";
const CHECK_AAD: &[u8] = b"keel vault key check\0";

/// A vault key: 32 bytes, wiped from memory when the last copy is dropped, and never shown
/// by `Debug`.
#[derive(Clone)]
pub struct VaultKey(Arc<Zeroizing<[u8; KEY_BYTES]>>);

impl std::fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VaultKey(***)")
    }
}

/// Why bytes are not a vault key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not 32 bytes.
    #[error("a vault key is {KEY_BYTES} bytes; this one is {found} bytes")]
    WrongLength {
        /// How many bytes it has.
        found: usize,
    },
}

impl VaultKey {
    /// The key made of `bytes`.
    ///
    /// # Errors
    ///
    /// [`KeyError::WrongLength`] unless `bytes` is [`KEY_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, KeyError> {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        if bytes.len() != KEY_BYTES {
            return Err(KeyError::WrongLength { found: bytes.len() });
        }
        key.copy_from_slice(bytes);
        Ok(Self(Arc::new(key)))
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(self.0.as_slice().into())
    }

    fn seal(&self, clear: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher()
            .encrypt(&nonce, Payload { msg: clear, aad })
            .map_err(|_| Error::Vault { detail: "sealing failed".to_owned() })?;
        let mut entry = Vec::with_capacity(NONCE_BYTES + sealed.len());
        entry.extend_from_slice(nonce.as_slice());
        entry.extend_from_slice(&sealed);
        Ok(entry)
    }

    /// The clear text of `entry`, or `None` when it does not authenticate under this key and
    /// `aad`.
    fn open(&self, entry: &[u8], aad: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if entry.len() < NONCE_BYTES {
            return None;
        }
        let (nonce, sealed) = entry.split_at(NONCE_BYTES);
        self.cipher().decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad }).ok().map(Zeroizing::new)
    }
}

fn entry_aad(key: &IntentKey) -> Vec<u8> {
    let mut aad = ENTRY_AAD.to_vec();
    aad.extend_from_slice(key.as_str().as_bytes());
    aad
}

fn stored_check(conn: &Connection) -> Result<Option<Vec<u8>>> {
    Ok(conn.query_row("SELECT check_value FROM vault_key WHERE id = 1", [], |row| row.get(0)).optional()?)
}

/// Whether this database has a vault key set (a process kept payment methods in it).
///
/// # Errors
///
/// SQLite's.
pub(crate) fn configured(conn: &Connection) -> Result<bool> {
    Ok(stored_check(conn)?.is_some())
}

/// Whether `key` opens the database's key check value (`false` when it has none).
///
/// # Errors
///
/// SQLite's.
pub(crate) fn key_opens(conn: &Connection, key: &VaultKey) -> Result<bool> {
    Ok(stored_check(conn)?.is_some_and(|check| key.open(&check, CHECK_AAD).is_some()))
}

fn rejected_key() -> Error {
    Error::VaultKeyRejected {
        detail: "the vault key does not open this database's vault (it was set up, or rotated, with another key)"
            .to_owned(),
    }
}

/// Checks `key` against the database's key check value, setting it when the vault has none
/// yet. Called once when the writer opens with a key, before anything is kept.
///
/// # Errors
///
/// [`Error::VaultKeyRejected`] when another key set up the vault.
pub(crate) fn check_key(conn: &Connection, key: &VaultKey, now: DateTime<Utc>) -> Result<()> {
    if stored_check(conn)?.is_none() {
        // Two processes setting the vault up at once: the first row stands, and the second
        // is checked against it below.
        conn.execute(
            "INSERT OR IGNORE INTO vault_key (id, check_value, set_at) VALUES (1, ?1, ?2)",
            params![key.seal(CHECK_TEXT, CHECK_AAD)?, codec::micros(now)],
        )?;
    }
    let check = stored_check(conn)?.ok_or_else(rejected_key)?;
    key.open(&check, CHECK_AAD).map(|_| ()).ok_or_else(rejected_key)
}

/// Seals `secret` for intent `intent` (replacing an older entry of the same intent: the
/// reservation that carries it has the intent's fingerprint, so the same payment method).
/// Inside the writer's transaction. When the vault was rotated to another key since this
/// process opened it, nothing is kept (the others could not read it) and `false` is returned.
///
/// # Errors
///
/// SQLite's.
pub(crate) fn keep(
    conn: &Connection,
    key: &VaultKey,
    intent: &IntentKey,
    secret: &Secret,
    now: DateTime<Utc>,
) -> Result<bool> {
    if stored_check(conn)?.is_none_or(|check| key.open(&check, CHECK_AAD).is_none()) {
        return Ok(false);
    }
    let sealed = key.seal(secret.expose().as_bytes(), &entry_aad(intent))?;
    conn.prepare_cached(
        "INSERT INTO vault (intent_key, sealed, kept_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (intent_key) DO UPDATE SET sealed = excluded.sealed, kept_at = excluded.kept_at",
    )?
    .execute(params![intent.as_str(), sealed, codec::micros(now)])?;
    Ok(true)
}

/// Deletes intent `intent`'s entry, if any: its intent is final. Inside the writer's
/// transaction, so the entry is gone in the commit that ends the intent.
///
/// # Errors
///
/// SQLite's.
pub(crate) fn shred(conn: &Connection, intent: &IntentKey) -> Result<()> {
    conn.prepare_cached("DELETE FROM vault WHERE intent_key = ?1")?.execute([intent.as_str()])?;
    Ok(())
}

/// What the vault holds for one intent, as `keel show` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// No entry.
    Absent,
    /// An entry, kept at `kept_at`, that was not checked (no key at hand).
    Sealed {
        /// When it was kept.
        kept_at: DateTime<Utc>,
    },
    /// An entry that authenticates under the key given.
    Readable {
        /// When it was kept.
        kept_at: DateTime<Utc>,
    },
    /// An entry that does not authenticate under the key given.
    Unreadable {
        /// When it was kept.
        kept_at: DateTime<Utc>,
        /// Why, in words (never with the key nor the secret).
        why: String,
    },
}

fn entry(conn: &Connection, intent: &IntentKey) -> Result<Option<(Vec<u8>, DateTime<Utc>)>> {
    let row: Option<(Vec<u8>, i64)> = conn
        .prepare_cached("SELECT sealed, kept_at FROM vault WHERE intent_key = ?1")?
        .query_row([intent.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    row.map(|(sealed, at)| Ok((sealed, codec::from_micros(at, 0)?))).transpose()
}

const TAMPERED: &str = "it does not authenticate: altered, or sealed under another key";

/// The state of intent `intent`'s entry, checked with `key` when given.
///
/// # Errors
///
/// SQLite's.
pub(crate) fn entry_state(conn: &Connection, key: Option<&VaultKey>, intent: &IntentKey) -> Result<EntryState> {
    let Some((sealed, kept_at)) = entry(conn, intent)? else {
        return Ok(EntryState::Absent);
    };
    Ok(match key {
        None => EntryState::Sealed { kept_at },
        Some(key) => match key.open(&sealed, &entry_aad(intent)) {
            Some(_) => EntryState::Readable { kept_at },
            None => EntryState::Unreadable { kept_at, why: TAMPERED.to_owned() },
        },
    })
}

/// Intent `intent`'s payment method, opened with `key`.
pub(crate) fn unseal(conn: &Connection, key: &VaultKey, intent: &IntentKey) -> Unsealed {
    let found = match entry(conn, intent) {
        Ok(found) => found,
        Err(error) => return Unsealed::Unreadable { why: format!("the vault could not be read: {error}") },
    };
    let Some((sealed, _)) = found else {
        return Unsealed::Missing;
    };
    match key.open(&sealed, &entry_aad(intent)) {
        None => Unsealed::Unreadable { why: TAMPERED.to_owned() },
        Some(clear) => match std::str::from_utf8(&clear) {
            Ok(text) => Unsealed::Kept(Secret::new(text)),
            Err(_) => Unsealed::Unreadable { why: "it authenticates but does not hold text".to_owned() },
        },
    }
}

/// What [`rotate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rotation {
    /// Entries re-encrypted under the new key.
    pub entries: u64,
}

fn write_connection(path: &Path) -> Result<Connection> {
    if !path.exists() {
        return Err(Error::Vault { detail: format!("{} does not exist", path.display()) });
    }
    crate::schema::open_writer(path, &crate::schema::Options::default())
}

/// Re-encrypts every entry and the key check value under `new`, in one transaction: either
/// every entry is readable under `new` afterwards, or nothing changed.
///
/// # Errors
///
/// [`Error::VaultKeyRejected`] when `old` is not the vault's key (or the vault has none);
/// [`Error::Vault`] when an entry does not authenticate under `old` (nothing is changed: an
/// entry nobody can read is not re-sealed as if it were sound); SQLite's.
pub fn rotate(path: &Path, old: &VaultKey, new: &VaultKey) -> Result<Rotation> {
    let mut conn = write_connection(path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match stored_check(&tx)? {
        Some(check) if old.open(&check, CHECK_AAD).is_some() => {}
        Some(_) => return Err(rejected_key()),
        None => return Err(Error::Vault { detail: "this database has no vault to rotate".to_owned() }),
    }
    let rows: Vec<(String, Vec<u8>)> = tx
        .prepare("SELECT intent_key, sealed FROM vault ORDER BY intent_key")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut entries = 0;
    for (intent, sealed) in rows {
        let aad = [ENTRY_AAD, intent.as_bytes()].concat();
        let clear = old.open(&sealed, &aad).ok_or_else(|| Error::Vault {
            detail: format!("the entry of {intent} does not authenticate under the current key: nothing rotated"),
        })?;
        tx.execute("UPDATE vault SET sealed = ?1 WHERE intent_key = ?2", params![new.seal(&clear, &aad)?, intent])?;
        entries += 1;
    }
    tx.execute("UPDATE vault_key SET check_value = ?1 WHERE id = 1", [new.seal(CHECK_TEXT, CHECK_AAD)?])?;
    tx.commit()?;
    Ok(Rotation { entries })
}

/// Deletes every entry kept before `before`; returns how many.
///
/// # Errors
///
/// SQLite's.
pub fn purge(path: &Path, before: DateTime<Utc>) -> Result<u64> {
    let conn = write_connection(path)?;
    let deleted = conn.execute("DELETE FROM vault WHERE kept_at < ?1", [codec::micros(before)])?;
    Ok(u64::try_from(deleted).expect("a row count fits in u64"))
}
