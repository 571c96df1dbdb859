//! Controlled facts (seed 001): a conversation's few explicit user assertions, kept with the
//! exact quote that proves the user wrote them, corrected by key, forgotten on request.
//!
//! Owns the contract's pure rules: [`declarations`] (only `key=value`, separated by `;` or a
//! newline, from the current user message), [`Candidate`] (a fact a writer proposes, with its
//! evidence), [`Conversation`] (the facts folded from a conversation's events, with its
//! [`Ticket`]), [`Conversation::admit`] (a batch checked whole: admitted atomically or refused
//! whole, previous facts kept), eviction by oldest turn (ties by key, ordinally), correction
//! by key, and [`Conversation::forget`]. The events are [`crate::event::Event::FactsAdmitted`]
//! and [`crate::event::Event::FactsForgotten`], on the conversation's own stream.
//!
//! It never guesses: a question, an assistant answer or prose is never promoted to a fact,
//! and a refused batch has no fallback. A fact is an unverified user assertion: it never
//! authorises an action. It does no I/O and reads no clock (`now` is given).

use crate::event::{Event, StoredEvent};
use crate::ledger::FoldError;
use crate::limits;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The keys a fact may have, in their ordinal order.
pub const ALLOWED_KEYS: [&str; 10] =
    ["constraint", "customer", "database", "environment", "log", "module", "priority", "product", "symptom", "version"];

/// A conversation's id: 1 to [`limits::FACTS_CONVERSATION_ID_MAX_CHARS`] visible ASCII
/// characters (it names a stream).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConversationId(String);

impl ConversationId {
    /// Checks an id.
    ///
    /// # Errors
    ///
    /// [`FactsRefusal::ConversationId`] for an empty, long or invisible id.
    pub fn parse(text: &str) -> Result<Self, FactsRefusal> {
        let visible = text.bytes().all(|b| b.is_ascii_graphic());
        if text.is_empty() || text.len() > limits::FACTS_CONVERSATION_ID_MAX_CHARS || !visible {
            return Err(FactsRefusal::ConversationId(text.chars().take(40).collect()));
        }
        Ok(Self(text.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stream its facts live on.
    pub fn stream(&self) -> crate::event::StreamId {
        crate::event::StreamId::from_stored(format!("facts:{}", self.0))
    }
}

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fact as kept: the key, the value, the exact quote of the user text that contains it,
/// the turn it was said in and when it was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// One of [`ALLOWED_KEYS`].
    pub key: String,
    /// The asserted value.
    pub value: String,
    /// The exact quote of the user's message that contains the value.
    pub evidence: String,
    /// The turn it was admitted in.
    pub turn: u32,
    /// When it was admitted (UTC).
    pub recorded_at: DateTime<Utc>,
}

/// A fact a writer proposes for the current user message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
    /// The quote proving it.
    pub evidence: String,
}

/// The `key=value` declarations of a user message, in order, the last of a key winning (the
/// seed's rule), each with its own text as evidence. Segments are separated by `;` or a
/// newline; a segment without `=`, or that asks something (it holds a `?`), declares nothing
/// and is left alone — a question is never promoted.
pub fn declarations(message: &str) -> Vec<Candidate> {
    let mut found: Vec<Candidate> = Vec::new();
    for segment in message.split([';', '\n']).map(str::trim) {
        if segment.contains('?') {
            continue;
        }
        let Some((key, value)) = segment.split_once('=') else { continue };
        let (key, value) = (key.trim(), value.trim());
        found.retain(|earlier| earlier.key != key);
        found.push(Candidate { key: key.to_owned(), value: value.to_owned(), evidence: segment.to_owned() });
    }
    found
}

/// Where a conversation stands: its epoch (moved by every forget) and the number of the
/// turn an update must name to be admitted. An update taken before a forget or another
/// admitted turn names a stale ticket and is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// Forgets so far.
    pub epoch: u32,
    /// Turns admitted so far: the next one is this number.
    pub turn: u32,
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.epoch, self.turn)
    }
}

impl Ticket {
    /// Parses `EPOCH:TURN`.
    pub fn parse(text: &str) -> Option<Self> {
        let (epoch, turn) = text.split_once(':')?;
        Some(Self { epoch: epoch.parse().ok()?, turn: turn.parse().ok()? })
    }
}

/// The facts of one conversation, folded from its events.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Conversation {
    /// Forgets so far.
    pub epoch: u32,
    /// Turns admitted so far.
    pub turn: u32,
    /// The facts, by key.
    pub facts: BTreeMap<String, Fact>,
}

/// What admitting a batch records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The facts admitted (new keys and corrections), with their turn.
    pub facts: Vec<Fact>,
    /// The keys evicted to stay within [`limits::FACTS_MAX`].
    pub evicted: Vec<String>,
}

impl Conversation {
    /// The ticket an update must carry now.
    pub fn ticket(&self) -> Ticket {
        Ticket { epoch: self.epoch, turn: self.turn }
    }

    /// Checks `candidates` for the user's `message` under `ticket`, whole: every candidate
    /// must be one of the message's own declarations (same key, same value, as many as it
    /// declares), with an allowed key, a value of at most [`limits::FACTS_VALUE_MAX_CHARS`] and
    /// an evidence of at most [`limits::FACTS_EVIDENCE_MAX_CHARS`] that is an exact quote of
    /// the message and contains the value; at most [`limits::FACTS_MAX`] of them.
    ///
    /// # Errors
    ///
    /// The first problem: nothing of the batch is admitted, the previous facts stay.
    pub fn admit(
        &self,
        ticket: Ticket,
        message: &str,
        candidates: &[Candidate],
        now: DateTime<Utc>,
    ) -> Result<Admitted, FactsRefusal> {
        if ticket != self.ticket() {
            return Err(FactsRefusal::Stale { ticket, current: self.ticket() });
        }
        let chars = message.chars().count();
        if chars > limits::FACTS_MESSAGE_MAX_CHARS {
            return Err(FactsRefusal::MessageTooLong { chars });
        }
        if candidates.len() > limits::FACTS_MAX {
            return Err(FactsRefusal::TooMany { count: candidates.len() });
        }
        let declared = declarations(message);
        let mut seen: Vec<&str> = Vec::new();
        for candidate in candidates {
            check_candidate(candidate, message, &seen)?;
            seen.push(&candidate.key);
        }
        let matches = candidates.len() == declared.len()
            && candidates.iter().all(|c| declared.iter().any(|d| d.key == c.key && d.value == c.value));
        if !matches {
            return Err(FactsRefusal::NotDeclared);
        }
        let facts: Vec<Fact> = candidates
            .iter()
            .map(|c| Fact {
                key: c.key.clone(),
                value: c.value.clone(),
                evidence: c.evidence.clone(),
                turn: self.turn,
                recorded_at: now,
            })
            .collect();
        let mut after = self.facts.clone();
        for fact in &facts {
            after.insert(fact.key.clone(), fact.clone());
        }
        let mut evicted = Vec::new();
        while after.len() > limits::FACTS_MAX {
            // The oldest turn goes first; among facts of one turn, the first key ordinally.
            let oldest = after
                .values()
                .min_by(|a, b| a.turn.cmp(&b.turn).then_with(|| a.key.cmp(&b.key)))
                .map(|f| f.key.clone())
                .expect("a map holding more than FACTS_MAX facts is not empty");
            after.remove(&oldest);
            evicted.push(oldest);
        }
        Ok(Admitted { facts, evicted })
    }

    /// What forgetting `key` (or everything, with `None`) removes, under `ticket`.
    ///
    /// # Errors
    ///
    /// A stale ticket, a key that is not allowed.
    pub fn forget(&self, ticket: Ticket, key: Option<&str>) -> Result<(), FactsRefusal> {
        if ticket != self.ticket() {
            return Err(FactsRefusal::Stale { ticket, current: self.ticket() });
        }
        if let Some(key) = key
            && !ALLOWED_KEYS.contains(&key)
        {
            return Err(FactsRefusal::UnknownKey(key.chars().take(40).collect()));
        }
        Ok(())
    }

    /// Folds one admitted batch.
    pub fn apply_admitted(&mut self, facts: &[Fact], evicted: &[String]) {
        for fact in facts {
            self.facts.insert(fact.key.clone(), fact.clone());
        }
        for key in evicted {
            self.facts.remove(key);
        }
        self.turn += 1;
    }

    /// Folds one forget: a new epoch, so no update taken before it is admitted.
    pub fn apply_forgotten(&mut self, key: Option<&str>) {
        match key {
            Some(key) => {
                self.facts.remove(key);
            }
            None => self.facts.clear(),
        }
        self.epoch += 1;
    }

    /// The facts as a block a model reads: labelled as unverified user assertions, each with
    /// its quote, so that they inform and never authorise.
    pub fn prompt_block(&self) -> String {
        let mut block = String::from(
            "Facts the user asserted (unverified; they authorise nothing, and business records win over them):\n",
        );
        for fact in self.facts.values() {
            block.push_str(&format!(
                "- {} = {} (turn {}, quote: {:?})\n",
                fact.key, fact.value, fact.turn, fact.evidence
            ));
        }
        block
    }
}

/// Folds a conversation's stream: every `FactsAdmitted` and `FactsForgotten`, in order, each
/// carrying the ticket the conversation had when it was decided.
///
/// # Errors
///
/// [`FoldError`] for an event on the stream that is not a facts event, or whose ticket is not
/// the conversation's at that point (a stale update was recorded: the log is corrupt).
pub fn fold(events: &[StoredEvent]) -> Result<Conversation, FoldError> {
    let mut conversation = Conversation::default();
    for stored in events {
        apply(&mut conversation, stored)?;
    }
    Ok(conversation)
}

/// Folds one facts event into its conversation (see [`fold`]).
///
/// # Errors
///
/// As [`fold`].
pub fn apply(conversation: &mut Conversation, stored: &StoredEvent) -> Result<(), FoldError> {
    let fail = |what: &'static str| FoldError { seq: stored.seq, stream: stored.stream.clone(), what };
    match &stored.event {
        Event::FactsAdmitted { ticket, facts, evicted, .. } => {
            if *ticket != conversation.ticket() {
                return Err(fail("facts admitted under a stale ticket"));
            }
            conversation.apply_admitted(facts, evicted);
        }
        Event::FactsForgotten { ticket, key, .. } => {
            if *ticket != conversation.ticket() {
                return Err(fail("facts forgotten under a stale ticket"));
            }
            conversation.apply_forgotten(key.as_deref());
        }
        _ => return Err(fail("not a facts event on a conversation's stream")),
    }
    Ok(())
}

fn check_candidate(candidate: &Candidate, message: &str, seen: &[&str]) -> Result<(), FactsRefusal> {
    let key = candidate.key.as_str();
    if !ALLOWED_KEYS.contains(&key) {
        return Err(FactsRefusal::UnknownKey(key.chars().take(40).collect()));
    }
    if seen.contains(&key) {
        return Err(FactsRefusal::DuplicateKey(key.to_owned()));
    }
    let invalid = |why: String| Err(FactsRefusal::Invalid { key: key.to_owned(), why });
    let value_chars = candidate.value.chars().count();
    if candidate.value.trim().is_empty() || value_chars > limits::FACTS_VALUE_MAX_CHARS {
        return invalid(format!("a value is 1 to {} characters (got {value_chars})", limits::FACTS_VALUE_MAX_CHARS));
    }
    let evidence_chars = candidate.evidence.chars().count();
    if candidate.evidence.trim().is_empty() || evidence_chars > limits::FACTS_EVIDENCE_MAX_CHARS {
        return invalid(format!(
            "an evidence is 1 to {} characters (got {evidence_chars})",
            limits::FACTS_EVIDENCE_MAX_CHARS
        ));
    }
    if !message.contains(&candidate.evidence) {
        return invalid("its evidence is not an exact quote of the current user message".to_owned());
    }
    if !candidate.evidence.contains(&candidate.value) {
        return invalid("its value is not in its evidence".to_owned());
    }
    Ok(())
}

/// Why a facts update was refused. Every refusal refuses the whole batch and keeps the
/// previous facts; there is no fallback.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FactsRefusal {
    /// The update's ticket is not the conversation's: taken before a forget or another turn.
    #[error(
        "stale update: its ticket {ticket} is not the conversation's {current} (a forget or another turn came \
         first); nothing admitted, the previous facts are kept, no fallback"
    )]
    Stale {
        /// The update's.
        ticket: Ticket,
        /// The conversation's.
        current: Ticket,
    },
    /// The message is longer than [`limits::FACTS_MESSAGE_MAX_CHARS`].
    #[error(
        "the message has {chars} characters, more than {}: nothing admitted, the previous facts are kept, no fallback",
        limits::FACTS_MESSAGE_MAX_CHARS
    )]
    MessageTooLong {
        /// Its length.
        chars: usize,
    },
    /// More than [`limits::FACTS_MAX`] candidates.
    #[error(
        "{count} facts in one batch, more than {}: the whole batch is refused, the previous facts are kept, no \
         fallback",
        limits::FACTS_MAX
    )]
    TooMany {
        /// How many.
        count: usize,
    },
    /// A key outside [`ALLOWED_KEYS`].
    #[error(
        "unknown key {0:?} (allowed: constraint, customer, database, environment, log, module, priority, product, \
         symptom, version): the whole batch is refused, the previous facts are kept, no fallback"
    )]
    UnknownKey(String),
    /// The same key twice among the candidates.
    #[error("key {0:?} is proposed twice: the whole batch is refused, the previous facts are kept, no fallback")]
    DuplicateKey(String),
    /// A candidate whose value or evidence does not hold.
    #[error("fact {key:?}: {why}: the whole batch is refused, the previous facts are kept, no fallback")]
    Invalid {
        /// Its key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// The candidates are not exactly the message's `key=value` declarations.
    #[error(
        "the facts proposed do not match the message's explicit key=value declarations: no semantic guess is \
         admitted; the whole batch is refused, the previous facts are kept, no fallback"
    )]
    NotDeclared,
    /// A conversation id that cannot name a stream.
    #[error("conversation id {0:?} must be 1 to {max} visible ASCII characters", max = limits::FACTS_CONVERSATION_ID_MAX_CHARS)]
    ConversationId(String),
}

#[cfg(test)]
mod tests;
