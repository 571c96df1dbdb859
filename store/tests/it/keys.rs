//! API keys (schema version 6): a version-5 file migrates and takes keys; keys stay outside
//! the chain;
//! names are never reused; a revocation keeps the row and its first instant.

use crate::support::{Fixture, charge, start_and_reserve};
use chrono::{DateTime, SubsecRound as _, Utc};
use store::keys::{ApiKey, KeyBook, Revocation, Role};
use store::{Error, SCHEMA_VERSION};

/// The fixture's start, to the microsecond the table keeps.
fn start() -> DateTime<Utc> {
    crate::support::start().trunc_subsecs(6)
}

fn key(id: &str, name: &str, role: Role) -> ApiKey {
    ApiKey {
        id: id.to_owned(),
        name: name.to_owned(),
        tenant: "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10".to_owned(),
        role,
        secret_sha256: "ab".repeat(32),
        created_at: start(),
        revoked_at: None,
    }
}

#[test]
fn a_version_5_file_migrates_to_the_key_table_and_takes_keys() {
    // What version 5 wrote (the migrations up to it); that events survive every migration is
    // the migration suite's (from the golden logs of versions 1 and 2).
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v5.db");
    crate::support::file_at_version(&path, 5);
    let tables = |path: &std::path::Path| -> i64 {
        let raw = rusqlite::Connection::open(path).expect("raw");
        raw.query_row("SELECT count(*) FROM sqlite_master WHERE name = 'api_keys'", [], |r| r.get(0)).expect("count")
    };
    assert_eq!(tables(&path), 0, "a version-5 file has no key table yet");
    let clock = std::sync::Arc::new(engine::clock::ManualClock::new(start()));
    store::Store::open(&path, store::Options::default(), clock).expect("migrates").shutdown().expect("shutdown");
    let raw = rusqlite::Connection::open(&path).expect("raw");
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    let book = KeyBook::open(&path).expect("the key table opens");
    book.create(&key("k1", "billing", Role::Submit)).expect("a key");
    assert_eq!(book.find("k1").expect("find"), Some(key("k1", "billing", Role::Submit)));
}

#[test]
fn keys_are_outside_the_chain() {
    let mut fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    let book = KeyBook::open(&fixture.path).expect("the key table opens");
    book.create(&key("k1", "billing", Role::Submit)).expect("a key");
    fixture.store.shutdown().expect("shutdown");
    fixture.reopen();
    assert_eq!(fixture.event_count(), 3, "a key writes no event");
    assert!(fixture.store.reader().expect("a reader").verify().expect("verify").is_ok(), "keys are outside the chain");
}

#[test]
fn a_name_is_never_reused_and_a_revocation_keeps_the_row_and_its_first_instant() {
    let fixture = Fixture::new();
    let book = KeyBook::open(&fixture.path).expect("opens");
    book.create(&key("k1", "ops-ann", Role::Operator)).expect("a key");
    let later = start() + chrono::TimeDelta::minutes(5);
    let Revocation::Revoked(revoked) = book.revoke("ops-ann", later).expect("revoke") else { panic!("found by name") };
    assert_eq!(revoked.revoked_at, Some(later));
    let again = book.revoke("k1", later + chrono::TimeDelta::minutes(1)).expect("revoke");
    let Revocation::Revoked(again) = again else { panic!("found by id") };
    assert_eq!(again.revoked_at, Some(later), "the first revocation stands");
    assert_eq!(book.revoke("nobody", later).expect("revoke"), Revocation::Unknown);
    match book.create(&key("k2", "ops-ann", Role::Read)) {
        Err(Error::KeyNameTaken { name }) => assert_eq!(name, "ops-ann"),
        other => panic!("expected KeyNameTaken, got {other:?}"),
    }
    let listed = book.list().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].role, Role::Operator);
    assert_eq!(book.find("k2").expect("find"), None);
}

#[test]
fn a_text_that_is_one_keys_name_and_anothers_id_revokes_neither() {
    let fixture = Fixture::new();
    let book = KeyBook::open(&fixture.path).expect("opens");
    book.create(&key("0123456789abcdef", "billing", Role::Submit)).expect("a key");
    // A name shaped like an id, as an older keel let through.
    book.create(&key("fedcba9876543210", "0123456789abcdef", Role::Operator)).expect("a key");
    match book.revoke("0123456789abcdef", start()).expect("revoke") {
        Revocation::Ambiguous { named, numbered } => {
            assert_eq!((named.id.as_str(), numbered.name.as_str()), ("fedcba9876543210", "billing"));
        }
        other => panic!("expected Ambiguous, got {other:?}"),
    }
    assert!(book.list().expect("list").iter().all(|key| key.revoked_at.is_none()), "nothing revoked");
    assert!(matches!(book.revoke("fedcba9876543210", start()).expect("revoke"), Revocation::Revoked(_)));
}
