//! The payment-method vault: a charge's payment method, sealed with AES-256-GCM beside the
//! log, so that `keel resume`, `keel reconcile` and recovery can resend a charge whose
//! caller is gone.
//!
//! Owns [`VaultKey`] (32 bytes, zeroized on drop, never printed), the sealing format, the
//! key check value, the keys file beside the log ([`keys_path`]) and every statement on the
//! `vault` and `vault_key` tables (schema versions 5 and 11, `store/FORMAT.md`). The tables
//! are outside the hash chain: an entry is kept by the reservation that carried the secret, in
//! the same commit ([`keep`], called by the writer), and shredded in the commit that makes its
//! intent final ([`shred`]). [`rotate`] and [`purge`] are maintenance commands that take
//! SQLite's write lock on their own connection.
//!
//! # Format
//!
//! Each entry is sealed under a data key of its own, random, and that data key is sealed
//! under the vault key in a fixed-size slot of the keys file (`<log>-vault-keys`). A sealing
//! is `nonce (12 random bytes) || ciphertext || tag (16 bytes)`; an entry's associated data is
//! `keel vault v2\0` followed by the intent key, a slot's `keel vault slot v1\0`, the slot's
//! index and the intent key: an entry or a slot moved to another intent, or altered in any
//! byte, does not authenticate and is refused — never decrypted to garbage. The key check
//! value is the same construction over a fixed text with its own associated data: a process
//! whose key cannot open it is refused at start, before it keeps anything under a key the
//! others cannot read. Entries kept before version 11 (no slot) are sealed under the vault
//! key itself with `keel vault v1\0` and stay readable; a rotation gives them a data key.
//!
//! # Shredding
//!
//! Deleting a row does not erase its bytes: SQLite leaves them in free pages and the WAL
//! keeps old frames until it wraps. So shredding deletes the row and then overwrites the
//! entry's slot with zeros in place and fsyncs it: without its data key the entry's bytes,
//! wherever they linger, are noise even to the holder of the vault key (every writer
//! connection also sets `secure_delete`, `schema::open_writer`).
//!
//! # Ordering and crashes
//!
//! The data key of a committed entry is never destroyed nor overwritten before the commit that
//! deletes the entry, and a slot holds a key before any commit references it:
//!
//! - a new entry's slot is written and fsynced inside the transaction, before its commit, in
//!   a slot no entry references *and* that holds zeros (else at the end of the file): a slot
//!   whose row this transaction deleted still holds its key until the commit;
//! - a shredded entry's slot is zeroed after the commit that deleted its row (`erase_freed`,
//!   called by the writer before it answers), in a transaction of its own under the write lock,
//!   and only if no entry references it by then (another process may have taken it once
//!   zeroed by a sweep);
//! - every write to the keys file happens under SQLite's write lock (the writer's
//!   transaction, or an `IMMEDIATE` one of `erase_freed`, `sweep`, [`rotate`] or
//!   [`purge`]), so two processes never take or erase a slot at once.
//!
//! A crash (or a rolled-back batch) between a slot's write and its commit, or between a commit
//! and its erasure, leaves a slot no entry references still holding a key: the next `sweep`
//! zeroes it (every writer runs one at open and after a failed batch). A crash never leaves an
//! entry without its key. The keys file, like the log, is readable by its owner only.
//!
//! This module must never log, print or return the key or a clear payment method other than
//! as the [`Secret`] a resend needs; its errors say what is wrong, never with what.

use crate::codec;
use crate::error::{Error, Result};
use aes_gcm::aead::rand_core::RngCore as _;
use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use chrono::{DateTime, Utc};
use engine::event::IntentKey;
use engine::log::Unsealed;
use engine::provider::Secret;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zeroize::Zeroizing;

/// The length of a vault key, in bytes (AES-256).
pub const KEY_BYTES: usize = 32;

/// The nonce length of AES-GCM, in bytes: random per sealing.
const NONCE_BYTES: usize = 12;

/// The tag length of AES-GCM, in bytes.
const TAG_BYTES: usize = 16;

/// Prefixed to the intent key as the associated data of an entry kept before version 11,
/// sealed under the vault key itself.
const ENTRY_AAD_V1: &[u8] = b"keel vault v1\0";

/// Prefixed to the intent key as the associated data of an entry sealed under its own data key.
const ENTRY_AAD: &[u8] = b"keel vault v2\0";

/// Prefixed to the slot's index and the intent key as a slot's associated data.
const SLOT_AAD: &[u8] = b"keel vault slot v1\0";

/// The key check value's clear text and associated data.
const CHECK_TEXT: &[u8] = b"keel vault key check v1";
const CHECK_AAD: &[u8] = b"keel vault key check\0";

/// The keys file's first bytes; the rest of its header is zeros.
const KEYS_MAGIC: &[u8] = b"keel vault keys v1\0";

/// The keys file's header length: slots start after it.
const KEYS_HEADER_BYTES: u64 = 32;

/// One slot: a data key sealed under the vault key (60 bytes), then zeros. All zeros: free.
const SLOT_BYTES: usize = 64;

/// A sealed data key: nonce, the key's ciphertext, tag.
const SEALED_KEY_BYTES: usize = NONCE_BYTES + KEY_BYTES + TAG_BYTES;

const _: () = assert!(SEALED_KEY_BYTES <= SLOT_BYTES);
const _: () = assert!(KEYS_MAGIC.len() as u64 <= KEYS_HEADER_BYTES);

/// The file beside the log `db` that holds the entries' data keys: `<db>-vault-keys`, like
/// SQLite's `<db>-wal`. It belongs to the log: copy, back up and delete them together.
pub fn keys_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-vault-keys");
    PathBuf::from(name)
}

/// A vault key: 32 bytes, wiped from memory when the last copy is dropped, and never shown
/// by `Debug`. An entry's data key is one too, never stored in clear.
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

    /// A fresh random key from the OS: an entry's data key.
    fn random() -> Self {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        OsRng.fill_bytes(key.as_mut_slice());
        Self(Arc::new(key))
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

fn entry_aad(prefix: &[u8], key: &str) -> Vec<u8> {
    [prefix, key.as_bytes()].concat()
}

fn slot_aad(slot: u64, key: &str) -> Vec<u8> {
    [SLOT_AAD, &slot.to_be_bytes(), key.as_bytes()].concat()
}

/// The keys file of the database `conn` is open on.
fn keys_path_of(conn: &Connection) -> Result<PathBuf> {
    conn.path()
        .filter(|path| !path.is_empty())
        .map(|path| keys_path(Path::new(path)))
        .ok_or_else(|| Error::Vault { detail: "a database without a file has no vault".to_owned() })
}

/// The keys file: fixed-size slots after a header, each a sealed data key or zeros, written in
/// place (see the module's "Ordering and crashes").
struct KeysFile {
    file: File,
}

impl KeysFile {
    /// Opens the keys file for writing, creating it (owner-only, its header and directory
    /// entry fsynced) when absent. Only under the log's write lock.
    fn create_or_open(conn: &Connection) -> Result<Self> {
        let path = keys_path_of(conn)?;
        // Never truncated: the slots in it are the entries' only keys.
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path)?;
        let keys = Self { file };
        if keys.file.metadata()?.len() < KEYS_HEADER_BYTES {
            // New, or cut short by a crash while it was created: nothing references it yet.
            let mut header = [0u8; KEYS_HEADER_BYTES as usize];
            header[..KEYS_MAGIC.len()].copy_from_slice(KEYS_MAGIC);
            keys.file.write_all_at(&header, 0)?;
            keys.file.sync_all()?;
            if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
        }
        keys.checked()
    }

    /// Opens the keys file, for writing when `write`; `None` when there is none, or only the
    /// start of one (a crash while it was created: its header is written before any slot, so
    /// no entry can name a slot of it).
    fn existing(conn: &Connection, write: bool) -> Result<Option<Self>> {
        match OpenOptions::new().read(true).write(write).open(keys_path_of(conn)?) {
            Ok(file) if file.metadata()?.len() < KEYS_HEADER_BYTES => Ok(None),
            Ok(file) => Self { file }.checked().map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    fn checked(self) -> Result<Self> {
        let mut magic = [0u8; KEYS_MAGIC.len()];
        let read = self.file.read_at(&mut magic, 0)?;
        if read < magic.len() || magic != KEYS_MAGIC {
            return Err(Error::Vault { detail: "the vault's keys file does not start as one".to_owned() });
        }
        Ok(self)
    }

    /// Where slot `slot` starts; a slot no file could hold is a corrupt row.
    fn offset(slot: u64) -> Result<u64> {
        slot.checked_mul(SLOT_BYTES as u64)
            .and_then(|at| at.checked_add(KEYS_HEADER_BYTES))
            .ok_or_else(|| Error::corrupt(0, format!("a vault entry names slot {slot}")))
    }

    /// How many slots the file holds.
    fn slots(&self) -> Result<u64> {
        Ok(self.file.metadata()?.len().saturating_sub(KEYS_HEADER_BYTES) / SLOT_BYTES as u64)
    }

    /// Slot `slot`'s bytes (zeros past the end of the file).
    fn read(&self, slot: u64) -> Result<Zeroizing<[u8; SLOT_BYTES]>> {
        let mut bytes = Zeroizing::new([0u8; SLOT_BYTES]);
        let mut filled = 0;
        while filled < SLOT_BYTES {
            match self.file.read_at(&mut bytes[filled..], Self::offset(slot)? + filled as u64)? {
                0 => break,
                read => filled += read,
            }
        }
        Ok(bytes)
    }

    /// Writes slot `slot` (durable once [`KeysFile::sync`] returns).
    fn write(&self, slot: u64, bytes: &[u8; SLOT_BYTES]) -> Result<()> {
        self.file.write_all_at(bytes, Self::offset(slot)?)?;
        Ok(())
    }

    /// Makes every write so far durable.
    fn sync(&self) -> Result<()> {
        self.file.sync_data()?;
        Ok(())
    }

    /// Whether slot `slot` holds zeros: free to take, once no entry references it.
    fn is_zero(&self, slot: u64) -> Result<bool> {
        Ok(self.read(slot)?.iter().all(|&byte| byte == 0))
    }

    /// Seals a fresh data key for `intent` into slot `slot`, fsynced (durable before the
    /// commit that references it), and returns it.
    fn fresh(&self, vault: &VaultKey, slot: u64, intent: &str) -> Result<VaultKey> {
        let data_key = VaultKey::random();
        let sealed = vault.seal(data_key.0.as_slice(), &slot_aad(slot, intent))?;
        let mut bytes = Zeroizing::new([0u8; SLOT_BYTES]);
        bytes[..sealed.len()].copy_from_slice(&sealed);
        self.write(slot, &bytes)?;
        self.sync()?;
        Ok(data_key)
    }

    /// The data key in slot `slot` for `intent`, or `None` when it was erased or does not
    /// authenticate (altered, moved, sealed under another key).
    fn data_key(&self, vault: &VaultKey, slot: u64, intent: &str) -> Result<Option<VaultKey>> {
        let bytes = self.read(slot)?;
        Ok(vault
            .open(&bytes[..SEALED_KEY_BYTES], &slot_aad(slot, intent))
            .and_then(|clear| VaultKey::from_bytes(&clear).ok()))
    }
}

fn slot_number(stored: i64) -> Result<u64> {
    u64::try_from(stored).map_err(|_| Error::corrupt(0, format!("a vault entry names slot {stored}")))
}

/// A slot to keep a new data key in: the lowest one no entry references (the transaction's
/// own rows included) when it holds zeros; else one past the end of the file, which no entry
/// can reference (every referenced slot was written before its row). A slot that is
/// referenced by no row here but still holds a key may be one this transaction freed, whose
/// key its committed row still needs until the commit: it is never overwritten.
fn free_slot(conn: &Connection, keys: &KeysFile) -> Result<u64> {
    let slot: i64 = conn
        .prepare_cached(
            "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM vault WHERE slot = 0) THEN 0 ELSE
                 (SELECT v.slot + 1 FROM vault v WHERE v.slot IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM vault w WHERE w.slot = v.slot + 1)
                  ORDER BY v.slot LIMIT 1) END",
        )?
        .query_row([], |row| row.get(0))?;
    let lowest = slot_number(slot)?;
    if keys.is_zero(lowest)? { Ok(lowest) } else { keys.slots() }
}

/// Opens one entry (`slot` `None`: kept before version 11, under the vault key itself).
fn open_entry(
    conn: &Connection,
    vault: &VaultKey,
    intent: &str,
    sealed: &[u8],
    slot: Option<i64>,
) -> Result<Option<Zeroizing<Vec<u8>>>> {
    let Some(slot) = slot else {
        return Ok(vault.open(sealed, &entry_aad(ENTRY_AAD_V1, intent)));
    };
    let Some(keys) = KeysFile::existing(conn, false)? else {
        return Ok(None);
    };
    let data_key = keys.data_key(vault, slot_number(slot)?, intent)?;
    Ok(data_key.and_then(|data_key| data_key.open(sealed, &entry_aad(ENTRY_AAD, intent))))
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

/// Seals `secret` for intent `intent` under a data key of its own, kept in a slot of the keys
/// file (replacing an older entry of the same intent, whose data key is reused: the
/// reservation that carries it has the intent's fingerprint, so the same payment method).
/// Inside the writer's transaction; the slot is durable before its commit. When the vault
/// was rotated to another key since this process opened it, nothing is kept (the others
/// could not read it) and `false` is returned.
///
/// # Errors
///
/// SQLite's, the keys file's.
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
    let name = intent.as_str();
    let keys = KeysFile::create_or_open(conn)?;
    let kept: Option<Option<i64>> = conn
        .prepare_cached("SELECT slot FROM vault WHERE intent_key = ?1")?
        .query_row([name], |row| row.get(0))
        .optional()?;
    let (slot, data_key) = match kept.flatten() {
        Some(slot) => {
            let slot = slot_number(slot)?;
            match keys.data_key(key, slot, name)? {
                Some(data_key) => (slot, data_key),
                None => (slot, keys.fresh(key, slot, name)?),
            }
        }
        None => {
            let slot = free_slot(conn, &keys)?;
            (slot, keys.fresh(key, slot, name)?)
        }
    };
    let sealed = data_key.seal(secret.expose().as_bytes(), &entry_aad(ENTRY_AAD, name))?;
    conn.prepare_cached(
        "INSERT INTO vault (intent_key, sealed, kept_at, slot) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (intent_key) DO UPDATE SET sealed = excluded.sealed, kept_at = excluded.kept_at, slot = excluded.slot",
    )?
    .execute(params![name, sealed, codec::micros(now), i64::try_from(slot).expect("a slot index fits in i64")])?;
    Ok(true)
}

/// Deletes intent `intent`'s entry, if any, because its intent is final, inside the writer's
/// transaction: the entry is gone in the commit that ends the intent. Returns the slot of its
/// data key, which the writer zeroes once that commit is done ([`erase_freed`]).
///
/// # Errors
///
/// SQLite's.
pub(crate) fn shred(conn: &Connection, intent: &IntentKey) -> Result<Option<u64>> {
    let slot: Option<Option<i64>> = conn
        .prepare_cached("DELETE FROM vault WHERE intent_key = ?1 RETURNING slot")?
        .query_row([intent.as_str()], |row| row.get(0))
        .optional()?;
    slot.flatten().map(slot_number).transpose()
}

/// Zeroes (and fsyncs) each of `slots` that no committed entry references: the slots of the
/// entries the caller's last commit deleted. Takes the write lock (`conn` must be outside a
/// transaction); returns how many slots it erased.
///
/// # Errors
///
/// SQLite's ([`Error::Busy`] while another process holds the write lock), the keys file's.
pub(crate) fn erase_freed(conn: &Connection, slots: &[u64]) -> Result<u64> {
    if slots.is_empty() {
        return Ok(0);
    }
    erase_unreferenced(conn, Some(slots))
}

/// Zeroes every slot of the keys file that holds a data key no entry references: left by a
/// crash or a failed batch between a slot's write and its commit, or between a commit and the
/// erasure of the slots it freed, or by a rotation. Takes the write lock (`conn` must be
/// outside a transaction); returns how many slots it erased.
///
/// # Errors
///
/// SQLite's ([`Error::Busy`] while another process holds the write lock), the keys file's.
pub(crate) fn sweep(conn: &Connection) -> Result<u64> {
    erase_unreferenced(conn, None)
}

/// Zeroes `candidates` (every slot when `None`) that hold a key no entry references, under the
/// write lock, so no other process is between writing a slot and committing its row.
fn erase_unreferenced(conn: &Connection, candidates: Option<&[u64]>) -> Result<u64> {
    let Some(keys) = KeysFile::existing(conn, true)? else {
        return Ok(0);
    };
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    // A few slots after a commit: one indexed lookup each (`vault_by_slot`). Every slot (a
    // sweep): the set of those in use, read once.
    let (candidates, in_use): (Vec<u64>, Option<HashSet<i64>>) = match candidates {
        Some(slots) => (slots.to_vec(), None),
        None => {
            let in_use = tx
                .prepare("SELECT slot FROM vault WHERE slot IS NOT NULL")?
                .query_map([], |row| row.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            ((0..keys.slots()?).collect(), Some(in_use))
        }
    };
    let mut named = tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM vault WHERE slot = ?1)")?;
    let held = keys.slots()?;
    let mut erased = 0;
    for slot in candidates {
        let stored = i64::try_from(slot).map_err(|_| Error::corrupt(0, format!("a vault slot {slot}")))?;
        let used = match &in_use {
            Some(in_use) => in_use.contains(&stored),
            None => named.query_row([stored], |row| row.get(0))?,
        };
        if !used && slot < held && !keys.is_zero(slot)? {
            keys.write(slot, &[0u8; SLOT_BYTES])?;
            erased += 1;
        }
    }
    drop(named);
    if erased > 0 {
        keys.sync()?;
    }
    tx.commit()?;
    Ok(erased)
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

/// One stored entry: its sealed bytes, when it was kept, its data key's slot.
struct Entry {
    sealed: Vec<u8>,
    kept_at: DateTime<Utc>,
    slot: Option<i64>,
}

fn entry(conn: &Connection, intent: &IntentKey) -> Result<Option<Entry>> {
    let row: Option<(Vec<u8>, i64, Option<i64>)> = conn
        .prepare_cached("SELECT sealed, kept_at, slot FROM vault WHERE intent_key = ?1")?
        .query_row([intent.as_str()], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    row.map(|(sealed, at, slot)| Ok(Entry { sealed, kept_at: codec::from_micros(at, 0)?, slot })).transpose()
}

const TAMPERED: &str = "it does not authenticate: altered, shredded, or sealed under another key";

/// The state of intent `intent`'s entry, checked with `key` when given.
///
/// # Errors
///
/// SQLite's, the keys file's.
pub(crate) fn entry_state(conn: &Connection, key: Option<&VaultKey>, intent: &IntentKey) -> Result<EntryState> {
    let Some(Entry { sealed, kept_at, slot }) = entry(conn, intent)? else {
        return Ok(EntryState::Absent);
    };
    Ok(match key {
        None => EntryState::Sealed { kept_at },
        Some(key) => match open_entry(conn, key, intent.as_str(), &sealed, slot)? {
            Some(_) => EntryState::Readable { kept_at },
            None => EntryState::Unreadable { kept_at, why: TAMPERED.to_owned() },
        },
    })
}

/// Intent `intent`'s payment method, opened with `key`.
pub(crate) fn unseal(conn: &Connection, key: &VaultKey, intent: &IntentKey) -> Unsealed {
    let unreadable = |error: Error| Unsealed::Unreadable { why: format!("the vault could not be read: {error}") };
    let Entry { sealed, slot, .. } = match entry(conn, intent) {
        Ok(Some(found)) => found,
        Ok(None) => return Unsealed::Missing,
        Err(error) => return unreadable(error),
    };
    match open_entry(conn, key, intent.as_str(), &sealed, slot) {
        Err(error) => unreadable(error),
        Ok(None) => Unsealed::Unreadable { why: TAMPERED.to_owned() },
        Ok(Some(clear)) => match std::str::from_utf8(&clear) {
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

/// Re-encrypts every entry under a fresh data key sealed under `new`, and the key check value
/// under `new`, in one transaction: either every entry is readable under `new` afterwards, or
/// nothing changed. The new data keys go to slots above every slot in use, so the old ones
/// stand until the commit; the old slots are erased after it (`sweep`).
///
/// # Errors
///
/// [`Error::VaultKeyRejected`] when `old` is not the vault's key (or the vault has none);
/// [`Error::Vault`] when an entry does not authenticate under `old` (nothing is changed: an
/// entry nobody can read is not re-sealed as if it were sound); SQLite's, the keys file's.
pub fn rotate(path: &Path, old: &VaultKey, new: &VaultKey) -> Result<Rotation> {
    let mut conn = write_connection(path)?;
    let rotated = rotate_in(&mut conn, old, new);
    // Whether it committed or not, the slots no entry references are erased: the old keys
    // after a commit, the new ones after a failure.
    sweep(&conn)?;
    rotated
}

fn rotate_in(conn: &mut Connection, old: &VaultKey, new: &VaultKey) -> Result<Rotation> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match stored_check(&tx)? {
        Some(check) if old.open(&check, CHECK_AAD).is_some() => {}
        Some(_) => return Err(rejected_key()),
        None => return Err(Error::Vault { detail: "this database has no vault to rotate".to_owned() }),
    }
    let rows: Vec<(String, Vec<u8>, Option<i64>)> = tx
        .prepare("SELECT intent_key, sealed, slot FROM vault ORDER BY intent_key")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let above: Option<i64> = tx.query_row("SELECT max(slot) FROM vault", [], |row| row.get(0))?;
    let first = above.map_or(Ok(0), |slot| slot_number(slot).map(|slot| slot + 1))?;
    let keys = KeysFile::create_or_open(&tx)?;
    let mut entries = 0;
    for (next, (intent, sealed, slot)) in (first..).zip(rows) {
        let clear = open_entry(&tx, old, &intent, &sealed, slot)?.ok_or_else(|| Error::Vault {
            detail: format!("the entry of {intent} does not authenticate under the current key: nothing rotated"),
        })?;
        let data_key = keys.fresh(new, next, &intent)?;
        tx.execute(
            "UPDATE vault SET sealed = ?1, slot = ?2 WHERE intent_key = ?3",
            params![
                data_key.seal(&clear, &entry_aad(ENTRY_AAD, &intent))?,
                i64::try_from(next).expect("a slot index fits in i64"),
                intent
            ],
        )?;
        entries += 1;
    }
    tx.execute("UPDATE vault_key SET check_value = ?1 WHERE id = 1", [new.seal(CHECK_TEXT, CHECK_AAD)?])?;
    tx.commit()?;
    Ok(Rotation { entries })
}

/// Shreds every entry kept before `before`: the rows deleted in one transaction, then their
/// slots zeroed (`erase_freed`); returns how many.
///
/// # Errors
///
/// SQLite's, the keys file's.
pub fn purge(path: &Path, before: DateTime<Utc>) -> Result<u64> {
    let mut conn = write_connection(path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let slots: Vec<Option<i64>> = tx
        .prepare("DELETE FROM vault WHERE kept_at < ?1 RETURNING slot")?
        .query_map([codec::micros(before)], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    tx.commit()?;
    let freed = slots.iter().flatten().map(|&slot| slot_number(slot)).collect::<Result<Vec<_>>>()?;
    erase_freed(&conn, &freed)?;
    Ok(u64::try_from(slots.len()).expect("a row count fits in u64"))
}
