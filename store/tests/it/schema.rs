//! Migrations and connection settings.

use crate::support::Fixture;
use std::sync::Arc;
use store::{Error, Options, Reader, SCHEMA_VERSION, Store};

#[test]
fn a_fresh_database_is_migrated_to_the_current_version_in_wal_mode() {
    let fixture = Fixture::new();
    let raw = fixture.raw();
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    const { assert!(SCHEMA_VERSION >= 1) };
    let mode: String = raw.pragma_query_value(None, "journal_mode", |r| r.get(0)).expect("journal_mode");
    assert_eq!(mode, "wal");
    // Every table the store creates is STRICT.
    let loose: Vec<String> = raw
        .prepare("SELECT name FROM pragma_table_list WHERE schema = 'main' AND name NOT LIKE 'sqlite_%' AND strict = 0")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(loose.is_empty(), "non-STRICT tables: {loose:?}");
}

#[test]
fn reopening_a_migrated_database_keeps_its_version_and_data() {
    let mut fixture = Fixture::new();
    fixture
        .store
        .execute_blocking(crate::support::start_and_reserve("run-1", crate::support::charge("intent-000001", 100)))
        .expect("reserved");
    fixture.reopen();
    let version: i64 = fixture.raw().pragma_query_value(None, "user_version", |r| r.get(0)).expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(fixture.event_count(), 3);
}

#[test]
fn a_database_from_a_newer_build_is_refused_by_writer_and_reader() {
    let fixture = Fixture::new();
    fixture.store.shutdown().expect("shutdown");
    fixture.raw().pragma_update(None, "user_version", SCHEMA_VERSION + 1).expect("bump the version");

    let opened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    match opened {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    let error = Reader::open(&fixture.path).expect_err("a reader refuses it too");
    assert!(matches!(error, Error::SchemaTooNew { .. }), "{error:?}");
    assert!(!error.is_retryable());
}

#[test]
fn a_reader_does_not_migrate_an_empty_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("empty.db");
    rusqlite::Connection::open(&path).expect("create an empty database");
    let error = Reader::open(&path).expect_err("nothing to read yet");
    assert!(matches!(error, Error::SchemaTooOld { found: 0, .. }), "{error:?}");
}
