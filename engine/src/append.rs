//! The one append rule every event log applies: encode, bound, number, chain.
//!
//! Owns [`seal`], which turns a decision's events into [`Sealed`] rows — each payload and
//! cause encoded once in canonical JSON, the whole command refused when one payload is above
//! [`EVENT_PAYLOAD_MAX_BYTES`] (nothing written), then each event numbered (global sequence,
//! sequence in its stream) and chained (previous hash, its own hash). The SQLite store's
//! writer, the PostgreSQL store's writers and the in-memory log all append through it, so
//! they cannot drift apart.
//!
//! Two ways of chaining ([`Chaining`]): one chain through the whole log (SQLite and the
//! in-memory log: gap-free sequences, each event chained to the one before it), or one chain
//! per stream (PostgreSQL, where commands on different entities commit concurrently and a
//! global head would serialise them: sequences from a database sequence, gaps allowed, each
//! event chained to its stream's previous event). [`ChainRule`] names which one a reader
//! checks.
//!
//! It does no I/O: the caller says where the log ends and how long each stream is.

use crate::canonical;
use crate::event::{Cause, Event, IntentKey, RunId, StoredEvent, StreamId, chain_hash};
use crate::ledger::Refusal;
use crate::limits::EVENT_PAYLOAD_MAX_BYTES;
use chrono::{DateTime, SecondsFormat, Utc};
use std::collections::HashMap;

/// One event ready to append: the envelope, and its encoded columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Sealed {
    /// The event as it will be read back.
    pub stored: StoredEvent,
    /// Its payload's canonical JSON.
    pub payload: String,
    /// Its cause's canonical JSON.
    pub cause: String,
    /// Its instant as stored: RFC 3339, microseconds, `Z`.
    pub at: String,
}

/// Where the log ends before a command's events: its last sequence and hash.
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// The last global sequence (0 for an empty log).
    pub last_seq: u64,
    /// The last event's hash (the genesis hash for an empty log).
    pub last_hash: &'a str,
}

/// How [`seal`] numbers and chains a command's events.
pub enum Chaining<'a> {
    /// One chain through the whole log: sequences follow `head` without gaps, and each
    /// event's previous hash is the hash of the event before it in the log.
    Global(Head<'a>),
    /// One chain per stream: `next_seq` hands out the global sequences (unique and increasing,
    /// gaps allowed), and each event's previous hash is the hash of its stream's previous event
    /// (the genesis hash for a stream's first). `stream_hash(stream, stream_seq)` answers the
    /// hash of the event at `stream_seq` on `stream` written before this command.
    PerStream {
        /// The next global sequence.
        next_seq: &'a mut dyn FnMut() -> u64,
        /// The hash of a stream's event written before this command.
        stream_hash: &'a mut dyn FnMut(&StreamId, u64) -> String,
    },
}

/// Which chain a log keeps, for the readers that check it ([`crate::ledger::Ledger`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChainRule {
    /// [`Chaining::Global`]: gap-free sequences, one chain in sequence order.
    #[default]
    Global,
    /// [`Chaining::PerStream`]: increasing sequences with gaps, one chain per stream.
    PerStream,
}

/// The entity whose first or latest event [`seal`] asks for.
#[derive(Clone, Copy, Debug)]
pub enum Tail<'a> {
    /// An intent's stream.
    Intent(&'a IntentKey),
    /// A run's stream.
    Run(&'a RunId),
}

/// Which end of a stream [`seal`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Its first event (a run's `RunStarted`, an intent's `IntentReserved`).
    First,
    /// Its latest event.
    Latest,
}

/// The event that caused `event`, as the stream and end whose event it is (`None` for a run's
/// first event): the rule [`seal`] records in each cause's `parent`.
fn caused_by(event: &Event) -> Option<(Tail<'_>, End)> {
    match event {
        Event::RunStarted { .. } => None,
        // A journal step follows what asked for it (an agent's tool call, the workflow's
        // previous step), and a reservation is asked for by its journal link.
        Event::StepRecorded { run_id, .. } | Event::IntentReserved { run_id, .. } => {
            Some((Tail::Run(run_id), End::Latest))
        }
        // An answer belongs to what asked for it: an attempt's outcome to the attempt, a
        // lookup's answer to its reconciliation.
        Event::IntentValidated { key, .. }
        | Event::IntentDeclined { key, .. }
        | Event::OutcomeUnknown { key, .. }
        | Event::AttemptNotSent { key, .. }
        | Event::ReconciliationResolved { key, .. }
        | Event::LateAnswerRecorded { key, .. } => Some((Tail::Intent(key), End::Latest)),
        // Attempts, reconciliations, approvals and operators' actions act on the intent.
        other => match (other.intent_key(), other.subject()) {
            (Some(key), _) => Some((Tail::Intent(key), End::First)),
            // A run's steps, agent facts, signals and end belong to the run.
            (None, Some(run_id)) => Some((Tail::Run(run_id), End::First)),
            (None, None) => None,
        },
    }
}

/// Seals `events`, written by `cause` at `at`, numbered and chained by `chaining`.
/// `stream_length` answers how many
/// events a stream held before this command; `latest` the global sequence of an entity's
/// first or latest event before it (`None` when it has none).
///
/// Each event's cause gets its `parent`, the event that caused it (in this command or
/// before), by one rule over its type: none for a `RunStarted`; for a journal step or an
/// `IntentReserved`, its run's latest event (the tool call or step that asked for it, the
/// journal link); for an attempt's outcome or a lookup's answer, its intent's
/// latest event (the attempt, the reconciliation); for any other event, its stream's first
/// event (the run, the intent).
///
/// `at` must already be truncated to microseconds (the stored precision), so that it reads
/// back exactly.
///
/// # Errors
///
/// [`Refusal::PayloadTooLarge`] when one payload is above the limit: nothing of the command
/// may be written.
pub fn seal(
    events: Vec<Event>,
    cause: &Cause,
    at: DateTime<Utc>,
    chaining: Chaining<'_>,
    stream_length: &mut dyn FnMut(&StreamId) -> u64,
    seq_of: &mut dyn FnMut(Tail<'_>, End) -> Option<u64>,
) -> Result<Vec<Sealed>, Refusal> {
    // Encode every payload before numbering any, so a too-large one refuses the whole command.
    let mut payloads = Vec::with_capacity(events.len());
    for event in &events {
        let payload = canonical::to_string(&event.payload());
        if payload.len() > EVENT_PAYLOAD_MAX_BYTES {
            return Err(Refusal::PayloadTooLarge {
                event_type: event.type_name(),
                bytes: payload.len(),
                max: EVENT_PAYLOAD_MAX_BYTES,
            });
        }
        payloads.push(payload);
    }
    let at_text = at.to_rfc3339_opts(SecondsFormat::Micros, true);
    let mut chaining = chaining;
    // The global chain's running head; the per-stream chains' heads are in `stream_heads`.
    let (mut seq, mut prev_hash) = match &chaining {
        Chaining::Global(head) => (head.last_seq, head.last_hash.to_owned()),
        Chaining::PerStream { .. } => (0, String::new()),
    };
    let mut stream_heads: HashMap<StreamId, String> = HashMap::new();
    let mut lengths: HashMap<StreamId, u64> = HashMap::new();
    // The first and latest seq this command gave each stream.
    let mut written: HashMap<StreamId, (u64, u64)> = HashMap::new();
    let mut sealed = Vec::with_capacity(events.len());
    for (event, payload) in events.into_iter().zip(payloads) {
        seq = match &mut chaining {
            Chaining::Global(_) => seq + 1,
            Chaining::PerStream { next_seq, .. } => next_seq(),
        };
        let stream = event.stream();
        let parent = caused_by(&event).and_then(|(tail, end)| {
            let name = match tail {
                Tail::Intent(key) => key.stream(),
                Tail::Run(run_id) => run_id.stream(),
            };
            let mut before = || seq_of(tail, end);
            match (written.get(&name), end) {
                // The stream's first event was written before this command, or by it.
                (Some(&(first, _)), End::First) => before().or(Some(first)),
                (Some(&(_, latest)), End::Latest) => Some(latest),
                (None, _) => before(),
            }
        });
        written.entry(stream.clone()).and_modify(|(_, latest)| *latest = seq).or_insert((seq, seq));
        let cause = Cause { parent, ..cause.clone() };
        let cause_text = canonical::to_string(&serde_json::to_value(&cause).expect("a cause serializes: plain fields"));
        let length = lengths.entry(stream.clone()).or_insert_with(|| stream_length(&stream));
        *length += 1;
        let stream_seq = *length;
        if let Chaining::PerStream { stream_hash, .. } = &mut chaining {
            prev_hash = match stream_heads.get(&stream) {
                Some(hash) => hash.clone(),
                None if stream_seq == 1 => crate::event::GENESIS_HASH.to_owned(),
                None => stream_hash(&stream, stream_seq - 1),
            };
        }
        let hash = chain_hash_encoded(
            &prev_hash,
            seq,
            stream.as_str(),
            stream_seq,
            &at_text,
            event.type_name(),
            &cause_text,
            &payload,
        );
        debug_assert_eq!(
            hash,
            chain_hash(&prev_hash, seq, &stream, stream_seq, at, &cause, &event),
            "the encoded chain hash is chain_hash's, byte for byte"
        );
        let stored = StoredEvent { seq, stream, stream_seq, at, cause, event, prev_hash: prev_hash.clone(), hash };
        prev_hash = stored.hash.clone();
        if matches!(chaining, Chaining::PerStream { .. }) {
            stream_heads.insert(stored.stream.clone(), stored.hash.clone());
        }
        sealed.push(Sealed { stored, payload, cause: cause_text, at: at_text.clone() });
    }
    Ok(sealed)
}

/// An event sealed by another log whose content no longer hashes to its own `hash`: it was
/// changed after it was sealed, and must not be carried anywhere.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("event seq {seq} on stream {stream} does not hash to its own hash: changed after it was sealed")]
pub struct NotItsHash {
    /// The event's sequence.
    pub seq: u64,
    /// Its stream.
    pub stream: StreamId,
}

/// An event already decided and sealed by one log, sealed again for a log that chains it
/// after `prev_hash` (a migration from the global chain to the per-stream one): its `seq`,
/// stream, `stream_seq`, instant, type, cause and payload are kept byte for byte; only
/// `prev_hash` and `hash` are new. Nothing is decided: no number, no parent, no instant.
///
/// # Errors
///
/// [`NotItsHash`] when `stored`'s content does not hash, over its own `prev_hash`, to its
/// own `hash`: what is carried is exactly what the old chain covered, or nothing.
pub fn reseal(stored: StoredEvent, prev_hash: &str) -> Result<Sealed, NotItsHash> {
    let at = stored.at.to_rfc3339_opts(SecondsFormat::Micros, true);
    let cause = canonical::to_string(&serde_json::to_value(&stored.cause).expect("a cause serializes: plain fields"));
    let payload = canonical::to_string(&stored.event.payload());
    let hash_over = |prev: &str| {
        let (stream, type_name) = (stored.stream.as_str(), stored.event.type_name());
        chain_hash_encoded(prev, stored.seq, stream, stored.stream_seq, &at, type_name, &cause, &payload)
    };
    if hash_over(&stored.prev_hash) != stored.hash {
        return Err(NotItsHash { seq: stored.seq, stream: stored.stream });
    }
    let hash = hash_over(prev_hash);
    let stored = StoredEvent { prev_hash: prev_hash.to_owned(), hash, ..stored };
    Ok(Sealed { stored, payload, cause, at })
}

/// [`chain_hash`] computed from the parts already encoded (`at` as stored, the canonical
/// cause and payload), so an event is serialized once per append instead of twice.
///
/// It hashes the same bytes: the canonical JSON of the object `chain_hash` builds, whose keys
/// in code-point order are `at, cause, payload, prev, seq, stream, stream_seq, type`, strings
/// escaped by serde_json exactly as `crate::canonical` escapes them. Debug builds (every
/// test) assert equality with `chain_hash` on each append; readers and `verify` only ever
/// use `chain_hash` itself, so a divergence could never pass unnoticed.
#[allow(clippy::too_many_arguments)] // One field per hashed column; a struct would only rename them.
fn chain_hash_encoded(
    prev_hash: &str,
    seq: u64,
    stream: &str,
    stream_seq: u64,
    at: &str,
    type_name: &str,
    cause: &str,
    payload: &str,
) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let quoted = |text: &str| serde_json::to_string(text).expect("serializing a &str to JSON cannot fail");
    let mut content = String::with_capacity(payload.len() + cause.len() + stream.len() + 192);
    content.push_str("{\"at\":");
    content.push_str(&quoted(at));
    content.push_str(",\"cause\":");
    content.push_str(cause);
    content.push_str(",\"payload\":");
    content.push_str(payload);
    content.push_str(",\"prev\":");
    content.push_str(&quoted(prev_hash));
    let _ = write!(content, ",\"seq\":{seq},\"stream\":");
    content.push_str(&quoted(stream));
    let _ = write!(content, ",\"stream_seq\":{stream_seq},\"type\":");
    content.push_str(&quoted(type_name));
    content.push('}');
    hex::encode(Sha256::digest(content.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{GENESIS_HASH, RunId};
    use serde_json::json;

    fn step(run: &RunId, position: u32, output: serde_json::Value) -> Event {
        Event::StepRecorded { run_id: run.clone(), position, name: "step é".to_owned(), output }
    }

    #[test]
    fn a_resealed_event_keeps_its_content_and_refuses_a_changed_one() {
        let at = DateTime::parse_from_rfc3339("2025-03-01T12:00:00.123456Z").expect("valid").to_utc();
        let run = RunId::new("r1");
        let cause = Cause::operator("ann").for_run(&run);
        let mut lengths = |_: &StreamId| 0;
        let mut ends = |_: Tail<'_>, _: End| None;
        let last_hash = "ab".repeat(32);
        let head = Head { last_seq: 40, last_hash: &last_hash };
        let sealed =
            seal(vec![step(&run, 0, json!({"b": 4.2e1}))], &cause, at, Chaining::Global(head), &mut lengths, &mut ends)
                .expect("small payload");
        let original = sealed[0].clone();
        let moved = reseal(original.stored.clone(), GENESIS_HASH).expect("its own hash");
        assert_eq!(
            (moved.payload.as_str(), moved.cause.as_str(), moved.at.as_str()),
            (original.payload.as_str(), original.cause.as_str(), original.at.as_str())
        );
        assert_eq!((moved.stored.seq, moved.stored.stream_seq, moved.stored.at), (41, 1, at));
        assert_eq!(moved.stored.prev_hash, GENESIS_HASH);
        let stored = &moved.stored;
        assert_eq!(stored.hash, chain_hash(GENESIS_HASH, 41, &stored.stream, 1, at, &stored.cause, &stored.event));
        assert_ne!(moved.stored.hash, original.stored.hash, "chained anew");
        let mut changed = original.stored;
        changed.at += chrono::TimeDelta::microseconds(1);
        assert_eq!(reseal(changed, GENESIS_HASH), Err(NotItsHash { seq: 41, stream: run.stream() }));
    }

    #[test]
    fn events_are_numbered_per_stream_and_chained() {
        let at = DateTime::parse_from_rfc3339("2025-03-01T12:00:00.123456Z").expect("valid").to_utc();
        let run = RunId::new("run \"quoted\" ～😀\n");
        let other = RunId::new("r2");
        let cause = Cause::operator("ann").for_run(&run);
        let events =
            vec![step(&run, 3, json!({"b": 4.2e1})), step(&other, 0, json!(null)), step(&run, 4, json!([1.0]))];
        let mut lengths = |stream: &StreamId| if stream == &run.stream() { 3 } else { 0 };
        let mut ends = |tail: Tail<'_>, end: End| match (tail, end) {
            (Tail::Run(r), End::First) if *r == run => Some(2),
            (Tail::Run(r), End::Latest) if *r == run => Some(16),
            _ => None,
        };
        let sealed = seal(
            events,
            &cause,
            at,
            Chaining::Global(Head { last_seq: 16, last_hash: GENESIS_HASH }),
            &mut lengths,
            &mut ends,
        )
        .expect("small payloads");
        let parents: Vec<Option<u64>> = sealed.iter().map(|s| s.stored.cause.parent).collect();
        assert_eq!(
            parents,
            [Some(16), None, Some(17)],
            "a step follows its run's latest event, before this command or in it; a run's first step has none \
             when the run has no event"
        );
        let numbers: Vec<(u64, u64)> = sealed.iter().map(|s| (s.stored.seq, s.stored.stream_seq)).collect();
        assert_eq!(numbers, [(17, 4), (18, 1), (19, 5)]);
        assert_eq!(sealed[0].stored.prev_hash, GENESIS_HASH);
        assert_eq!(sealed[1].stored.prev_hash, sealed[0].stored.hash);
        for s in &sealed {
            let e = &s.stored;
            assert_eq!(e.hash, chain_hash(&e.prev_hash, e.seq, &e.stream, e.stream_seq, e.at, &e.cause, &e.event));
        }
    }

    #[test]
    fn one_payload_too_large_refuses_the_whole_command() {
        let run = RunId::new("r1");
        let big = "x".repeat(EVENT_PAYLOAD_MAX_BYTES);
        let events = vec![step(&run, 0, json!("small")), step(&run, 1, json!(big))];
        let refused = seal(
            events,
            &Cause::command("t"),
            DateTime::UNIX_EPOCH,
            Chaining::Global(Head { last_seq: 0, last_hash: GENESIS_HASH }),
            &mut |_| 0,
            &mut |_, _| None,
        );
        assert!(matches!(refused, Err(Refusal::PayloadTooLarge { event_type: "StepRecorded", .. })), "{refused:?}");
    }

    #[test]
    fn per_stream_chaining_links_each_event_to_its_streams_previous_one() {
        let at = DateTime::parse_from_rfc3339("2025-03-01T12:00:00.5Z").expect("valid").to_utc();
        let run = RunId::new("r1");
        let other = RunId::new("r2");
        let events = vec![step(&run, 2, json!(1)), step(&other, 0, json!(2)), step(&run, 3, json!(3))];
        // `run` holds two events before the command, `other` none; sequences have a gap.
        let mut lengths = |stream: &StreamId| if stream == &run.stream() { 2 } else { 0 };
        let mut seqs = [40_u64, 41, 45].into_iter();
        let mut next_seq = || seqs.next().expect("three events, three sequences");
        let mut asked = Vec::new();
        let mut stream_hash = |stream: &StreamId, stream_seq: u64| {
            asked.push((stream.clone(), stream_seq));
            "a".repeat(64)
        };
        let sealed = seal(
            events,
            &Cause::command("t"),
            at,
            Chaining::PerStream { next_seq: &mut next_seq, stream_hash: &mut stream_hash },
            &mut lengths,
            &mut |_, _| None,
        )
        .expect("small payloads");
        assert_eq!(asked, [(run.stream(), 2)], "only the stream with earlier events is asked, once");
        let numbers: Vec<_> = sealed.iter().map(|s| (s.stored.seq, s.stored.stream_seq)).collect();
        assert_eq!(numbers, [(40, 3), (41, 1), (45, 4)]);
        assert_eq!(sealed[0].stored.prev_hash, "a".repeat(64));
        assert_eq!(sealed[1].stored.prev_hash, GENESIS_HASH, "a stream's first event starts its chain");
        assert_eq!(sealed[2].stored.prev_hash, sealed[0].stored.hash, "chained to its stream, not to seq 41");
        for s in &sealed {
            let e = &s.stored;
            assert_eq!(e.hash, chain_hash(&e.prev_hash, e.seq, &e.stream, e.stream_seq, e.at, &e.cause, &e.event));
        }
        // The whole-log fold over a per-stream log checks the same links.
        let mut ledger = crate::ledger::Ledger::per_stream();
        let started = |run_id: &RunId, seq| StoredEvent {
            seq,
            stream: run_id.stream(),
            stream_seq: 1,
            at,
            cause: Cause::command("t"),
            event: Event::RunStarted {
                run_id: run_id.clone(),
                workflow: "w".to_owned(),
                input: json!(null),
                deadline_at: at,
                limits: crate::event::RunLimits::default(),
                versions: crate::event::RunVersions::default(),
            },
            prev_hash: GENESIS_HASH.to_owned(),
            hash: String::new(),
        };
        ledger.try_apply(&started(&other, 3)).expect("a first event chains to the genesis hash");
        let mut gap = started(&run, 2);
        assert!(ledger.try_apply(&gap).is_err(), "a sequence that does not increase is refused");
        gap.seq = 9;
        ledger.try_apply(&gap).expect("a gap is allowed");
    }
}
