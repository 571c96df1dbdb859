//! `keel facts …`: a conversation's controlled facts (seed 001), on the event log.
//!
//! Owns the three commands' arguments, their translation into `Ask::apply_facts` /
//! `Ask::forget_facts`, and their rendering. The rules are `engine::facts`' and the decision
//! is the ledger's, inside the commit; this module never decides whether a fact is admitted,
//! and never shows a fact as anything but an unverified user assertion.

use crate::output::Output;
use crate::wiring::open_store;
use anyhow::Context as _;
use clap::Subcommand;
use engine::event::Cause;
use engine::facts::{Candidate, Conversation, ConversationId, Ticket};
use engine::log::{Ask, Asking as _, EventLog, LogError};
use serde_json::json;
use std::path::Path;

/// `keel facts …`.
#[derive(Subcommand, Debug)]
pub enum FactsCommand {
    /// Admit the `key=value` declarations of the current user message, whole or not at all.
    ///
    /// Declarations are separated by `;` or newlines (keys: product, module, priority,
    /// database, constraint, customer, version, environment, symptom, log); each fact keeps the
    /// exact quote it came from. A question or prose declares nothing. A correction replaces its
    /// key; past five facts the oldest turn's is evicted (ties by key). Any bad declaration
    /// refuses the whole batch (exit 2): the previous facts are kept, there is no fallback.
    Apply {
        /// The conversation (1 to 128 visible ASCII characters).
        conversation: String,
        /// The current user message (at most 4096 characters). Never an assistant's answer.
        #[arg(long)]
        message: String,
        /// A writer's proposed facts, a JSON array of {"key", "value", "evidence"} (FILE, or `-`
        /// for stdin), checked against the message's own declarations instead of taking them
        /// as they are.
        #[arg(long, value_name = "FILE|-")]
        candidates: Option<String>,
        /// The ticket (EPOCH:TURN) the update was taken under, as `keel facts show` printed
        /// it: refused when a forget or another turn came since. Default: the current one.
        #[arg(long, value_name = "EPOCH:TURN")]
        ticket: Option<String>,
    },
    /// Show a conversation's facts: unverified user assertions, each with its quote and turn.
    Show {
        /// The conversation.
        conversation: String,
    },
    /// Forget one fact (KEY) or all of them. Updates taken before it are refused afterwards.
    Forget {
        /// The conversation.
        conversation: String,
        /// The key to forget; without it, every fact.
        key: Option<String>,
        /// The ticket (EPOCH:TURN) the forget was taken under. Default: the current one.
        #[arg(long, value_name = "EPOCH:TURN")]
        ticket: Option<String>,
    },
}

/// Runs one `keel facts` command.
pub async fn dispatch(
    db: &Path,
    durability: store::Durability,
    out: &Output,
    command: FactsCommand,
) -> anyhow::Result<u8> {
    match command {
        FactsCommand::Apply { conversation, message, candidates, ticket } => {
            let (conversation, ticket) = match parse(&conversation, ticket.as_deref()) {
                Ok(parsed) => parsed,
                Err(message) => return Ok(out.usage_error(&message)),
            };
            let candidates = match candidates.as_deref().map(read_candidates).transpose() {
                Ok(read) => read.unwrap_or_else(|| engine::facts::declarations(&message)),
                Err(message) => return Ok(out.usage_error(&message)),
            };
            let ask =
                Ask::apply_facts(Cause::command("facts apply"), conversation.clone(), ticket, message, candidates);
            decide(db, durability, out, &conversation, ask).await
        }
        FactsCommand::Forget { conversation, key, ticket } => {
            let (conversation, ticket) = match parse(&conversation, ticket.as_deref()) {
                Ok(parsed) => parsed,
                Err(message) => return Ok(out.usage_error(&message)),
            };
            let ask = Ask::forget_facts(Cause::command("facts forget"), conversation.clone(), ticket, key);
            decide(db, durability, out, &conversation, ask).await
        }
        FactsCommand::Show { conversation } => {
            let conversation = match ConversationId::parse(&conversation) {
                Ok(id) => id,
                Err(refusal) => return Ok(out.usage_error(&refusal.to_string())),
            };
            let state = if db.exists() {
                let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
                engine::facts::fold(&reader.stream(&conversation.stream())?)?
            } else {
                Conversation::default()
            };
            print(out, &conversation, &state);
            Ok(crate::exit::OK)
        }
    }
}

fn parse(conversation: &str, ticket: Option<&str>) -> Result<(ConversationId, Option<Ticket>), String> {
    let conversation = ConversationId::parse(conversation).map_err(|e| e.to_string())?;
    let ticket = match ticket {
        None => None,
        Some(text) => {
            Some(Ticket::parse(text).ok_or_else(|| format!("--ticket {text:?} is not EPOCH:TURN (e.g. 0:2)"))?)
        }
    };
    Ok((conversation, ticket))
}

fn read_candidates(path: &str) -> Result<Vec<Candidate>, String> {
    let text = crate::ops::read_request(path)?;
    let value =
        engine::canonical::parse_strict(&text).map_err(|e| format!("--candidates {path}: not strict JSON: {e}"))?;
    engine::canonical::decode(value).map_err(|e| format!("--candidates {path}: {e}"))
}

async fn decide(
    db: &Path,
    durability: store::Durability,
    out: &Output,
    conversation: &ConversationId,
    ask: Ask<Conversation>,
) -> anyhow::Result<u8> {
    let store = open_store(db, durability)?;
    let result = (&store as &dyn EventLog).ask(ask).await;
    store.shutdown()?;
    match result {
        Ok(state) => {
            print(out, conversation, &state);
            Ok(crate::exit::OK)
        }
        Err(LogError::Refused(refusal)) => Ok(out.fail(&crate::output::Failure::Refused(refusal.to_string()))),
        Err(other) => Err(other.into()),
    }
}

fn print(out: &Output, conversation: &ConversationId, state: &Conversation) {
    let facts: Vec<_> = state.facts.values().collect();
    let document = json!({
        "conversation": conversation.as_str(),
        "ticket": state.ticket().to_string(),
        "epoch": state.epoch,
        "turn": state.turn,
        "unverified": true,
        "facts": facts,
    });
    out.emit(&document, || {
        outln!("conversation {conversation}, ticket {}", state.ticket());
        outln!("{}", state.prompt_block().trim_end_matches('\n'));
    });
}
