//! `store_postgres::Import` against a real PostgreSQL (the throwaway cluster; it fails, never
//! skips, when none can start): a SQLite log imported verifies with its provenance, a stream
//! that breaks its numbering or its source hash is refused with its whole batch, and a second
//! import into the same log is refused once the first moved on.

#[path = "../../tests/it/support.rs"]
#[allow(dead_code)] // The store's own test builders: this suite uses some of them.
mod support;

use engine::clock::ManualClock;
use engine::event::StoredEvent;
use std::sync::Arc;
use store_postgres::{Error, Import, PgReader, Source, Start};
use support::{charge, start, start_and_reserve, start_attempt, succeed};

fn pg_url(label: &str) -> String {
    let cluster =
        store_postgres::cluster::shared().unwrap_or_else(|e| panic!("the import suite needs PostgreSQL: {e}"));
    cluster.database(label).unwrap_or_else(|e| panic!("{e}"))
}

/// A SQLite log of two charges (one validated), its source, and its streams runs first.
fn sqlite_log() -> (tempfile::TempDir, Source, Vec<Vec<StoredEvent>>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("keel.db");
    let clock = Arc::new(ManualClock::new(start()));
    let store = store::Store::open(&path, store::Options::default(), clock).expect("opens");
    for command in [
        start_and_reserve("run-import-1", charge("import-charge-1", 4900)),
        start_attempt("run-import-1", "import-charge-1"),
        succeed("import-charge-1", 1, 4900),
        start_and_reserve("run-import-2", charge("import-charge-2", 2500)),
    ] {
        store.execute_blocking(command).expect("accepted");
    }
    store.shutdown().expect("shuts down");
    let reader = store::Reader::open(&path).expect("reads");
    let report = reader.verify().expect("verifies");
    assert!(report.is_ok(), "{report}");
    let mut names = reader.streams_after(None, 100).expect("names");
    names.sort_by_key(|name| !name.as_str().starts_with("run:"));
    let streams = names.iter().map(|name| reader.stream(name).expect("reads")).filter(|s| !s.is_empty()).collect();
    (dir, Source { head_hash: report.last_hash, events: report.events }, streams)
}

fn events_in(url: &str) -> i64 {
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connects");
    client.query_one("SELECT count(*) FROM events", &[]).expect("counts").get(0)
}

#[test]
fn an_imported_log_verifies_and_says_where_it_came_from() {
    let (_dir, source, streams) = sqlite_log();
    let url = pg_url("import_whole");
    let (mut import, begun) = Import::begin(&url, &source, start()).expect("begins");
    assert_eq!(begun, Start::Fresh);
    for stream in streams {
        import.push_stream(stream).expect("copies");
    }
    let done = import.finish(start()).expect("finishes");
    assert_eq!(done.copied_events, source.events);
    let report = PgReader::open(&url).expect("connects").verify().expect("reads");
    assert!(report.is_ok(), "{report}: {:?}", report.mismatches);
    assert_eq!((report.events, report.intents, report.runs), (source.events, 2, 2));
    assert_eq!(report.provenance.map(|p| p.source_head), Some(source.head_hash));
}

#[test]
fn a_stream_that_breaks_its_numbering_or_its_hash_is_refused_with_its_batch() {
    let (_dir, source, streams) = sqlite_log();
    let url = pg_url("import_refused");
    let intent = streams.iter().position(|s| s[0].stream.as_str().starts_with("intent:")).expect("an intent");
    let mut renumbered = streams[intent].clone();
    renumbered[0].stream_seq = 2;
    let mut changed = streams[intent].clone();
    changed[0].at += chrono::TimeDelta::microseconds(1);
    for (broken, why) in [(renumbered, "stream_seq 2, expected 1"), (changed, "does not hash to its own hash")] {
        let (mut import, _) = Import::begin(&url, &source, start()).expect("begins");
        import.push_stream(streams[0].clone()).expect("waits for the batch");
        import.push_stream(broken).expect("waits for the batch");
        match import.commit_pending() {
            Err(Error::ImportRefused { detail, .. }) => assert!(detail.contains(why), "{detail}"),
            other => panic!("refused because {why}, got {:?}", other.err()),
        }
        assert_eq!(events_in(&url), 0, "nothing of the batch written");
    }
}

#[test]
fn a_second_import_into_the_same_log_is_refused_once_the_first_moved_on() {
    let (_dir, source, streams) = sqlite_log();
    let url = pg_url("import_two");
    let (mut first, _) = Import::begin(&url, &source, start()).expect("begins");
    let (mut second, begun) = Import::begin(&url, &source, start()).expect("the same source resumes");
    assert!(matches!(begun, Start::Resumed(_)));
    first.push_stream(streams[0].clone()).expect("waits");
    first.commit_pending().expect("commits");
    second.push_stream(streams[1].clone()).expect("waits");
    assert!(matches!(second.commit_pending(), Err(Error::OtherImport { .. })), "never two interleaved");
    assert_eq!(events_in(&url), i64::try_from(streams[0].len()).expect("small"));
}
