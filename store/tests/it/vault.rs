//! The payment-method vault (schema version 5): kept in the reservation's commit, sealed
//! (never in clear on disk), bound to its intent, shredded in the commit that makes the intent
//! final, refused under another key, rotated and purged as a whole.

use crate::support::{Fixture, charge, contains, key, start, start_and_reserve, succeed};
use engine::clock::ManualClock;
use engine::event::IntentKey;
use engine::log::{EventLog, Unsealed};
use engine::provider::Secret;
use std::path::Path;
use std::sync::Arc;
use store::vault::{EntryState, KeyError, VaultKey};
use store::{Error, Options, Reader, SCHEMA_VERSION, Store};

const TOKEN: &str = "pm_card_vault_0123456789abcdef";

fn vault_key(byte: u8) -> VaultKey {
    VaultKey::from_bytes(&[byte; 32]).expect("32 bytes are a key")
}

fn with_key(key: &VaultKey) -> Options {
    Options { vault: Some(key.clone()), ..Options::default() }
}

fn open(path: &Path, options: Options) -> Result<Store, Error> {
    Store::open(path, options, Arc::new(ManualClock::new(start())))
}

fn unseal(store: &Store, key: &IntentKey) -> Unsealed {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(store.unseal(key))
}

fn kept(unsealed: &Unsealed) -> Option<&str> {
    match unsealed {
        Unsealed::Kept(secret) => Some(secret.expose()),
        _ => None,
    }
}

/// Reserves charge `id` keeping `token`.
fn reserve_keeping(store: &Store, id: &str, token: &str) {
    let mut command = start_and_reserve(&format!("run-{id}"), charge(id, 4_900));
    command.keep = Some(Secret::new(token));
    store.execute_blocking(command).expect("reserved");
}

fn vault_rows(path: &Path) -> Vec<(String, Vec<u8>)> {
    let raw = rusqlite::Connection::open(path).expect("raw");
    raw.prepare("SELECT intent_key, sealed FROM vault ORDER BY intent_key")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn a_key_must_be_32_bytes_and_never_prints() {
    assert_eq!(VaultKey::from_bytes(&[7; 31]).err(), Some(KeyError::WrongLength { found: 31 }));
    assert_eq!(VaultKey::from_bytes(&[7; 33]).err(), Some(KeyError::WrongLength { found: 33 }));
    assert_eq!(VaultKey::from_bytes(&[]).err(), Some(KeyError::WrongLength { found: 0 }));
    assert_eq!(format!("{:?}", vault_key(0x41)), "VaultKey(***)");
}

#[test]
fn a_version_4_file_migrates_to_an_empty_vault_and_the_first_key_sets_its_check_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v4.db");
    crate::support::file_at_version(&path, 4);
    open(&path, Options::default()).expect("migrates").shutdown().expect("shutdown");
    let raw = rusqlite::Connection::open(&path).expect("raw");
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let count = |table: &str| -> i64 {
        raw.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).expect("count")
    };
    assert_eq!((count("vault"), count("vault_key")), (0, 0), "no key yet: no check value");
    assert!(!Reader::open(&path).expect("reader").vault_configured().expect("reads"));
    open(&path, with_key(&vault_key(1))).expect("opens with a key").shutdown().expect("shutdown");
    assert_eq!(count("vault_key"), 1);
    let reader = Reader::open(&path).expect("reader");
    assert!(reader.vault_configured().expect("reads"));
    assert!(reader.vault_key_opens(&vault_key(1)).expect("reads"));
    assert!(!reader.vault_key_opens(&vault_key(2)).expect("reads"));
}

#[test]
fn a_reservation_keeps_its_payment_method_sealed_and_the_final_event_shreds_it() {
    let fixture = Fixture::new();
    let vault = vault_key(3);
    fixture.store.shutdown().expect("shutdown");
    let store = open(&fixture.path, with_key(&vault)).expect("opens with the key");
    reserve_keeping(&store, "keep-me-0001", TOKEN);
    let rows = vault_rows(&fixture.path);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, key("keep-me-0001").as_str());
    assert!(!contains(&rows[0].1, TOKEN.as_bytes()), "sealed, never in clear");
    assert_eq!(kept(&unseal(&store, &key("keep-me-0001"))), Some(TOKEN));
    let reader = Reader::open(&fixture.path).expect("reader");
    assert!(matches!(reader.vault_entry(&key("keep-me-0001"), Some(&vault)), Ok(EntryState::Readable { .. })));
    assert!(matches!(reader.vault_entry(&key("keep-me-0001"), None), Ok(EntryState::Sealed { .. })));
    store.execute_blocking(crate::support::start_attempt("run-keep-me-0001", "keep-me-0001")).expect("attempt");
    assert_eq!(vault_rows(&fixture.path).len(), 1, "in flight: still needed");
    store.execute_blocking(succeed("keep-me-0001", 1, 4_900)).expect("validated");
    assert!(vault_rows(&fixture.path).is_empty(), "shredded in the commit that made it final");
    assert!(matches!(unseal(&store, &key("keep-me-0001")), Unsealed::Missing));
    store.shutdown().expect("shutdown");
}

#[test]
fn without_a_key_nothing_is_kept_but_final_intents_are_still_shredded() {
    let fixture = Fixture::new();
    reserve_keeping(&fixture.store, "no-key-00001", TOKEN);
    assert!(vault_rows(&fixture.path).is_empty(), "no key: nothing kept");
    assert!(matches!(unseal(&fixture.store, &key("no-key-00001")), Unsealed::NoVault));
    fixture.store.shutdown().expect("shutdown");
    let vault = vault_key(4);
    let keeper = open(&fixture.path, with_key(&vault)).expect("opens with the key");
    reserve_keeping(&keeper, "kept-000001", TOKEN);
    keeper.shutdown().expect("shutdown");
    assert_eq!(vault_rows(&fixture.path).len(), 1);
    let keyless = open(&fixture.path, Options::default()).expect("opens without the key");
    keyless.execute_blocking(crate::support::start_attempt("run-kept-000001", "kept-000001")).expect("attempt");
    keyless.execute_blocking(succeed("kept-000001", 1, 4_900)).expect("validated");
    keyless.shutdown().expect("shutdown");
    assert!(vault_rows(&fixture.path).is_empty(), "shredding needs no key");
}

#[test]
fn a_mismatching_reservation_of_the_same_key_leaves_the_kept_payment_method_alone() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let store = open(&fixture.path, with_key(&vault_key(5))).expect("opens with the key");
    reserve_keeping(&store, "mismatch-0001", TOKEN);
    let mut other = start_and_reserve("run-other", charge("mismatch-0001", 9_999));
    other.keep = Some(Secret::new("pm_card_attacker_00000000000"));
    assert!(store.execute_blocking(other).is_err(), "a different payload is refused");
    assert_eq!(kept(&unseal(&store, &key("mismatch-0001"))), Some(TOKEN));
    store.shutdown().expect("shutdown");
}

#[test]
fn another_key_is_refused_at_open() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    open(&fixture.path, with_key(&vault_key(6))).expect("sets the vault up").shutdown().expect("shutdown");
    let refused = open(&fixture.path, with_key(&vault_key(7)));
    let Err(error @ Error::VaultKeyRejected { .. }) = refused else {
        panic!("another key must be refused, got {refused:?}");
    };
    assert!(!error.to_string().contains("\u{7}"), "{error}");
}

#[test]
fn a_tampered_or_moved_entry_is_refused_not_decrypted() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let vault = vault_key(8);
    let store = open(&fixture.path, with_key(&vault)).expect("opens with the key");
    reserve_keeping(&store, "tampered-0001", TOKEN);
    reserve_keeping(&store, "moved-to-0001", "pm_card_other_000000000000");
    let rows = vault_rows(&fixture.path);
    let raw = rusqlite::Connection::open(&fixture.path).expect("raw");
    let set = |intent: &IntentKey, sealed: &[u8]| {
        raw.execute("UPDATE vault SET sealed = ?1 WHERE intent_key = ?2", rusqlite::params![sealed, intent.as_str()])
            .expect("rewrite an entry");
    };
    let sound = rows.iter().find(|(k, _)| k == key("tampered-0001").as_str()).expect("kept").1.clone();
    // One bit of the ciphertext flipped.
    let mut flipped = sound.clone();
    flipped[20] ^= 1;
    set(&key("tampered-0001"), &flipped);
    assert!(matches!(unseal(&store, &key("tampered-0001")), Unsealed::Unreadable { .. }));
    // A sound entry copied under another intent.
    set(&key("moved-to-0001"), &sound);
    let moved = unseal(&store, &key("moved-to-0001"));
    let Unsealed::Unreadable { why } = &moved else { panic!("a moved entry must be refused, got {moved:?}") };
    assert!(!why.contains(TOKEN));
    let reader = Reader::open(&fixture.path).expect("reader");
    assert!(matches!(reader.vault_entry(&key("tampered-0001"), Some(&vault)), Ok(EntryState::Unreadable { .. })));
    store.shutdown().expect("shutdown");
}

#[test]
fn rotation_re_seals_every_entry_atomically_and_only_the_new_key_opens_them() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let (old, new) = (vault_key(9), vault_key(10));
    let store = open(&fixture.path, with_key(&old)).expect("opens with the key");
    reserve_keeping(&store, "rotate-00001", TOKEN);
    reserve_keeping(&store, "rotate-00002", "pm_card_second_0000000000");
    store.shutdown().expect("shutdown");
    let before = vault_rows(&fixture.path);
    let wrong = store::vault::rotate(&fixture.path, &vault_key(11), &new);
    assert!(matches!(wrong, Err(Error::VaultKeyRejected { .. })), "{wrong:?}");
    assert_eq!(vault_rows(&fixture.path), before, "nothing changed");
    let rotation = store::vault::rotate(&fixture.path, &old, &new).expect("rotates");
    assert_eq!(rotation.entries, 2);
    assert!(matches!(open(&fixture.path, with_key(&old)), Err(Error::VaultKeyRejected { .. })));
    let store = open(&fixture.path, with_key(&new)).expect("the new key opens it");
    assert_eq!(kept(&unseal(&store, &key("rotate-00001"))), Some(TOKEN));
    assert_eq!(kept(&unseal(&store, &key("rotate-00002"))), Some("pm_card_second_0000000000"));
    store.shutdown().expect("shutdown");
    let dir = fixture.path.parent().expect("the log's directory");
    assert!(recoverable(dir, &[9; 32], &key("rotate-00001"), TOKEN.len()).is_empty(), "the old key opens nothing");
    assert_eq!(recoverable(dir, &[10; 32], &key("rotate-00001"), TOKEN.len()), [TOKEN.as_bytes()]);
}

#[test]
fn rotation_refuses_an_entry_that_does_not_authenticate_and_changes_nothing() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let old = vault_key(12);
    let store = open(&fixture.path, with_key(&old)).expect("opens with the key");
    reserve_keeping(&store, "broken-00001", TOKEN);
    store.shutdown().expect("shutdown");
    let raw = rusqlite::Connection::open(&fixture.path).expect("raw");
    raw.execute("UPDATE vault SET sealed = zeroblob(40)", []).expect("tamper");
    let before = vault_rows(&fixture.path);
    let refused = store::vault::rotate(&fixture.path, &old, &vault_key(13));
    assert!(matches!(refused, Err(Error::Vault { .. })), "{refused:?}");
    assert_eq!(vault_rows(&fixture.path), before);
    assert!(open(&fixture.path, with_key(&old)).is_ok(), "the old key still opens the vault");
}

#[test]
fn purge_deletes_the_entries_kept_before_its_bound() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let clock = Arc::new(ManualClock::new(start()));
    let store = Store::open(&fixture.path, with_key(&vault_key(14)), clock.clone()).expect("opens");
    reserve_keeping(&store, "old-entry-001", TOKEN);
    clock.advance_ms(60_000);
    reserve_keeping(&store, "new-entry-001", TOKEN);
    store.shutdown().expect("shutdown");
    let purged = store::vault::purge(&fixture.path, start() + chrono::TimeDelta::seconds(30)).expect("purges");
    assert_eq!(purged, 1);
    let rows: Vec<String> = vault_rows(&fixture.path).into_iter().map(|(k, _)| k).collect();
    assert_eq!(rows, [key("new-entry-001").as_str().to_owned()]);
    let dir = fixture.path.parent().expect("the log's directory");
    assert!(recoverable(dir, &[14; 32], &key("old-entry-001"), TOKEN.len()).is_empty(), "purged is shredded");
    assert_eq!(recoverable(dir, &[14; 32], &key("new-entry-001"), TOKEN.len()).len(), 1, "the other is kept");
}

/// Every sealing in `bytes` (at any offset) that opens under `key` with associated data `aad`
/// to `clear_len` bytes: what an attacker holding the files and the key would try.
fn openings(bytes: &[u8], key: &[u8], aad: &[u8], clear_len: usize) -> Vec<Vec<u8>> {
    use aes_gcm::aead::{Aead, KeyInit, Payload};
    let cipher = aes_gcm::Aes256Gcm::new(key.into());
    let window = 12 + clear_len + 16;
    if bytes.len() < window {
        return Vec::new();
    }
    (0..=bytes.len() - window)
        .filter_map(|at| {
            let (nonce, sealed) = bytes[at..at + window].split_at(12);
            // A random nonce is never twelve zeros (2^-96); the files are mostly zeros.
            if nonce.iter().all(|&byte| byte == 0) {
                return None;
            }
            cipher.decrypt(aes_gcm::Nonce::from_slice(nonce), Payload { msg: sealed, aad }).ok()
        })
        .collect()
}

/// The clear payment methods of `intent` that the raw bytes of every file in `dir` (the log,
/// its `-wal` and `-shm`, the vault's keys file: free pages and old frames included) yield to
/// the holder of `vault`: entries sealed under the vault key itself, or under a data key
/// opened from any slot-sized window.
fn recoverable(dir: &Path, vault: &[u8; 32], intent: &IntentKey, token_len: usize) -> Vec<Vec<u8>> {
    let files: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .expect("the log's directory")
        .map(|entry| std::fs::read(entry.expect("an entry").path()).expect("a file of the log"))
        .collect();
    let name = intent.as_str().as_bytes();
    let mut keys = vec![vault.to_vec()];
    for bytes in &files {
        for slot in 0..4u64 {
            let aad = [b"keel vault slot v1\0".as_slice(), &slot.to_be_bytes(), name].concat();
            keys.extend(openings(bytes, vault, &aad, 32));
        }
    }
    let mut found = Vec::new();
    for key in &keys {
        for prefix in [b"keel vault v1\0".as_slice(), b"keel vault v2\0"] {
            let aad = [prefix, name].concat();
            for bytes in &files {
                found.extend(openings(bytes, key, &aad, token_len));
            }
        }
    }
    found
}

#[test]
fn a_shredded_entry_opens_under_no_key_from_any_byte_of_the_log_files() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let vault_bytes = [22u8; 32];
    let vault = VaultKey::from_bytes(&vault_bytes).expect("32 bytes are a key");
    let store = open(&fixture.path, with_key(&vault)).expect("opens with the key");
    let dir = fixture.path.parent().expect("the log's directory");
    let (shredded, live) = (key("shredded-0001"), key("still-live-01"));
    let other_token = "pm_card_live_00000000000000000";
    reserve_keeping(&store, "shredded-0001", TOKEN);
    reserve_keeping(&store, "still-live-01", other_token);
    // The scan finds what is there: the live entry opens, and so does the other before shredding.
    assert_eq!(recoverable(dir, &vault_bytes, &live, other_token.len()), [other_token.as_bytes()]);
    assert!(!recoverable(dir, &vault_bytes, &shredded, TOKEN.len()).is_empty());
    store.execute_blocking(crate::support::start_attempt("run-shredded-0001", "shredded-0001")).expect("attempt");
    store.execute_blocking(succeed("shredded-0001", 1, 4_900)).expect("validated: final");
    let left = recoverable(dir, &vault_bytes, &shredded, TOKEN.len());
    assert!(left.is_empty(), "a shredded entry opens from the files while the log is open: {} found", left.len());
    store.shutdown().expect("shutdown");
    let left = recoverable(dir, &vault_bytes, &shredded, TOKEN.len());
    assert!(left.is_empty(), "a shredded entry opens from the files after shutdown: {} found", left.len());
    assert_eq!(recoverable(dir, &vault_bytes, &live, other_token.len()).len(), 1, "the live entry is untouched");
}

/// `clear` sealed under `key` as the vault seals: nonce, ciphertext, tag.
fn seal(key: &[u8], clear: &[u8], aad: &[u8]) -> Vec<u8> {
    use aes_gcm::aead::{Aead, KeyInit, Payload};
    let nonce = [7u8; 12];
    let sealed = aes_gcm::Aes256Gcm::new(key.into())
        .encrypt(aes_gcm::Nonce::from_slice(&nonce), Payload { msg: clear, aad })
        .expect("seals");
    [nonce.as_slice(), &sealed].concat()
}

#[test]
fn an_entry_kept_before_per_entry_keys_stays_readable_and_rotation_gives_it_a_data_key() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let old_bytes = [23u8; 32];
    let old = VaultKey::from_bytes(&old_bytes).expect("a key");
    open(&fixture.path, with_key(&old)).expect("sets the vault up").shutdown().expect("shutdown");
    let intent = key("legacy-00001");
    let raw = rusqlite::Connection::open(&fixture.path).expect("raw");
    let legacy =
        seal(&old_bytes, TOKEN.as_bytes(), &[b"keel vault v1\0".as_slice(), intent.as_str().as_bytes()].concat());
    raw.execute(
        "INSERT INTO vault (intent_key, sealed, kept_at, slot) VALUES (?1, ?2, 0, NULL)",
        rusqlite::params![intent.as_str(), legacy],
    )
    .expect("an entry as version 10 kept it");
    let store = open(&fixture.path, with_key(&old)).expect("opens");
    assert_eq!(kept(&unseal(&store, &intent)), Some(TOKEN));
    store.shutdown().expect("shutdown");
    let new = vault_key(24);
    assert_eq!(store::vault::rotate(&fixture.path, &old, &new).expect("rotates").entries, 1);
    let slot: Option<i64> = raw.query_row("SELECT slot FROM vault", [], |r| r.get(0)).expect("the entry");
    assert!(slot.is_some(), "rotated under a data key of its own");
    let store = open(&fixture.path, with_key(&new)).expect("opens with the new key");
    assert_eq!(kept(&unseal(&store, &intent)), Some(TOKEN));
    store.shutdown().expect("shutdown");
}

#[test]
fn a_data_key_no_entry_references_is_erased_at_open() {
    use std::os::unix::fs::FileExt as _;
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let vault = vault_key(25);
    let store = open(&fixture.path, with_key(&vault)).expect("opens");
    reserve_keeping(&store, "sweep-kept-01", TOKEN);
    store.shutdown().expect("shutdown");
    let keys_path = store::vault::keys_path(&fixture.path);
    let before = std::fs::read(&keys_path).expect("the keys file");
    // What a crash between a slot's write and its commit leaves: a data key nobody references.
    let orphan_at = u64::try_from(before.len()).expect("small") + 64 * 2;
    let file = std::fs::OpenOptions::new().write(true).open(&keys_path).expect("opens");
    file.write_all_at(&[0x5a; 64], orphan_at).expect("writes");
    drop(file);
    let store = open(&fixture.path, with_key(&vault)).expect("opens");
    let after = std::fs::read(&keys_path).expect("the keys file");
    assert!(after[before.len()..].iter().all(|&byte| byte == 0), "the orphan slot is zeroed");
    assert_eq!(&after[..before.len()], &before[..], "the referenced slot is kept");
    assert_eq!(kept(&unseal(&store, &key("sweep-kept-01"))), Some(TOKEN));
    store.shutdown().expect("shutdown");
}

#[test]
fn a_batch_that_dies_before_committing_a_shred_leaves_the_entry_and_its_key_whole() {
    use engine::failpoints::{Failpoints, Point};
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let vault = vault_key(26);
    // The fourth batch (two reservations, an attempt, then the answer that makes the intent
    // final) dies after its statements, before its COMMIT: what a SIGKILL there leaves.
    let dies = Failpoints::armed(Point::InBatchBeforeCommit, 4, Arc::new(|_| panic!("killed before the commit")));
    let store = open(&fixture.path, Options { failpoints: dies, ..with_key(&vault) }).expect("opens");
    reserve_keeping(&store, "dies-shred-01", TOKEN);
    // Another entry, so the dead batch's slot could be taken by a reservation after it.
    reserve_keeping(&store, "dies-other-01", "pm_card_other_000000000000");
    store.execute_blocking(crate::support::start_attempt("run-dies-shred-01", "dies-shred-01")).expect("attempt");
    assert!(store.execute_blocking(succeed("dies-shred-01", 1, 4_900)).is_err(), "the writer died");
    let _ = store.shutdown();
    let store = open(&fixture.path, with_key(&vault)).expect("reopens");
    assert_eq!(kept(&unseal(&store, &key("dies-shred-01"))), Some(TOKEN), "not final: its key is whole");
    reserve_keeping(&store, "dies-after-01", "pm_card_after_000000000000");
    assert_eq!(kept(&unseal(&store, &key("dies-shred-01"))), Some(TOKEN), "its slot was not taken");
    assert_eq!(kept(&unseal(&store, &key("dies-other-01"))), Some("pm_card_other_000000000000"));
    assert_eq!(kept(&unseal(&store, &key("dies-after-01"))), Some("pm_card_after_000000000000"));
    store.shutdown().expect("shutdown");
}

#[test]
fn a_keys_file_cut_short_while_it_was_created_is_completed_by_the_next_keeper() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    let vault = vault_key(27);
    // A crash right after the file was created, before its header was written.
    std::fs::write(store::vault::keys_path(&fixture.path), b"keel va").expect("a partial header");
    let store = open(&fixture.path, with_key(&vault)).expect("opens: nothing can name a slot of it");
    reserve_keeping(&store, "short-keys-01", TOKEN);
    assert_eq!(kept(&unseal(&store, &key("short-keys-01"))), Some(TOKEN));
    store.shutdown().expect("shutdown");
}
