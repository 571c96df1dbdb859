//! What a decision reads: the entities it is about, loaded one by one.
//!
//! Owns [`View`]. A decision never folds the log: it asks for the intent it is about, the
//! run, the order's intents, the run's intents — each an indexed read in the store (or a map
//! lookup in the whole-log [`super::Ledger`]), made inside the transaction the decision's
//! events are committed in, so it sees every event committed before it.
//!
//! Every method's cost is the size of what it returns, never the size of the history.

use super::state::{Intent, Run, RunHistory};
use crate::event::{IntentKey, RunId};
use crate::facts::{Conversation, ConversationId};
use chrono::{DateTime, Utc};

/// The entities a decision may read.
pub trait View {
    /// One intent.
    fn intent(&self, key: &IntentKey) -> Option<Intent>;
    /// One run's state.
    fn run(&self, run_id: &RunId) -> Option<Run>;
    /// What replaying one run needs (read from its own stream).
    fn history(&self, run_id: &RunId) -> Option<RunHistory>;
    /// Every intent of one order (charges and refunds), for its cumulative invariants.
    fn order_intents(&self, tenant: &str, order_id: &str) -> Vec<Intent>;
    /// The charges reserved under one business reference, for "a new key while one is
    /// pending".
    fn reference_charges(&self, tenant: &str, reference: &str) -> Vec<Intent>;
    /// Every intent a run reserved, for its money budget and what it leaves behind.
    fn run_intents(&self, run_id: &RunId) -> Vec<Intent>;
    /// Intents with an attempt or a lookup in flight, in key order, at most `limit`.
    fn in_flight(&self, limit: usize) -> Vec<Intent>;
    /// Intents whose reconciliation is due at `now`, oldest due first, at most `limit`.
    fn due(&self, now: DateTime<Utc>, limit: usize) -> Vec<IntentKey>;
    /// Runs not finished that may go on at `now` — no timer, or one that has fired — in id
    /// order, at most `limit`: what a resume pass replays.
    fn awake_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run>;
    /// Runs not finished whose timer fires after `now`, soonest first, at most `limit`: what
    /// a resume pass leaves, saying when they wake.
    fn sleeping_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run>;
    /// Intents reserved with no attempt in flight — the next attempt may go, but nobody is
    /// sending it: a charge waiting for its caller, or one whose process died between a
    /// proven absence and the resend — in key order, at most `limit`.
    fn waiting(&self, limit: usize) -> Vec<IntentKey>;
    /// One conversation's controlled facts, folded from its own stream (empty when it has
    /// none). Its cost is that stream's length, which forgets and turns bound in practice.
    fn conversation(&self, id: &ConversationId) -> Conversation;
}
