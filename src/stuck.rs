//! What needs a human: `keel intents --stuck`, and the words `keel show` uses for a charge
//! that waits for its caller.
//!
//! Owns [`Waiting`] (why a charge ready for its next attempt is not being sent) and the
//! `--stuck` listing: escalated intents, intents awaiting approval, and charges waiting for
//! their caller, each with the reason and since when (its latest event). It only reads the
//! log and the vault (checking an entry with this process's key, when it has one); it never
//! decides nor writes.

use crate::exit;
use crate::output::Output;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use engine::ledger::{Intent, IntentStatus};
use engine::log::Unsealed;
use serde::Serialize;
use std::path::Path;
use store::vault::EntryState;

/// Why a charge ready for its next attempt is not being sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "waits_for", content = "reason", rename_all = "snake_case")]
pub enum Waiting {
    /// Only its caller can send it: re-submitting the same request does.
    Caller(String),
    /// Its payment method is in the vault: the next `keel reconcile --due` (with the key)
    /// sends it.
    Vault(String),
}

/// Why `intent`, at `now`, is not being sent, if it is a charge ready for its next attempt.
///
/// # Errors
///
/// The vault's table cannot be read.
pub fn waiting(reader: &store::Reader, intent: &Intent, now: DateTime<Utc>) -> anyhow::Result<Option<Waiting>> {
    if !intent.waits_for_payment_method(now) {
        return Ok(None);
    }
    let key = crate::vault::key();
    let unsealed = match reader.vault_entry(intent.key(), key.as_ref())? {
        EntryState::Readable { .. } => {
            return Ok(Some(Waiting::Vault(
                "its payment method is kept in the vault: `keel reconcile --due` sends it".to_owned(),
            )));
        }
        EntryState::Sealed { .. } => {
            return Ok(Some(Waiting::Vault(
                "its payment method is kept in the vault: `keel reconcile --due`, with the vault key, sends it"
                    .to_owned(),
            )));
        }
        EntryState::Unreadable { why, .. } => Unsealed::Unreadable { why },
        EntryState::Absent if reader.vault_configured()? => Unsealed::Missing,
        EntryState::Absent => Unsealed::NoVault,
    };
    Ok(Some(Waiting::Caller(format!("waits for its caller: {}", unsealed.waiting_reason()))))
}

/// [`waiting`] on a log without a vault (PostgreSQL's, for now): only its caller can send it.
pub fn waiting_without_vault(intent: &Intent, now: DateTime<Utc>) -> Option<Waiting> {
    intent
        .waits_for_payment_method(now)
        .then(|| Waiting::Caller(format!("waits for its caller: {}", Unsealed::NoVault.waiting_reason())))
}

/// [`waiting`] for each row of a listing, reading the full state of the reserved and unknown
/// charges only (the others cannot wait for their caller).
///
/// # Errors
///
/// The log or the vault cannot be read.
pub fn waiting_rows(
    reader: &store::Reader,
    rows: &[store::IntentRow],
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<Option<Waiting>>> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let candidate = row.kind == "charge"
            && (row.status == IntentStatus::Reserved.as_str() || row.status == IntentStatus::OutcomeUnknown.as_str());
        let intent = match engine::event::IntentKey::parse(&row.key) {
            Some(key) if candidate => reader.intent_state(&key)?,
            _ => None,
        };
        out.push(match intent {
            Some(intent) => waiting(reader, &intent, now)?,
            None => None,
        });
    }
    Ok(out)
}

/// One intent that needs a human.
#[derive(Clone, Debug, Serialize)]
pub struct Stuck {
    /// The intent key.
    pub intent_key: String,
    /// Where it is.
    pub status: IntentStatus,
    /// What a human must do, and why.
    pub reason: String,
    /// Since when it is there: its latest event.
    pub since: DateTime<Utc>,
    /// The order.
    pub order_id: String,
    /// Amount, minor units.
    pub amount_minor: i64,
    /// Currency.
    pub currency: String,
}

/// Why `intent` needs a human, if it does.
fn needs_human(reader: &store::Reader, intent: &Intent, now: DateTime<Utc>) -> anyhow::Result<Option<String>> {
    Ok(match intent.status {
        IntentStatus::Escalated => Some(format!(
            "escalated: {}; resolve it by hand (`keel resolve`)",
            intent.note.as_deref().unwrap_or("no automatic step is left")
        )),
        IntentStatus::AwaitingApproval => Some("awaits a human approval (`keel approve` or `keel deny`)".to_owned()),
        _ => match waiting(reader, intent, now)? {
            Some(Waiting::Caller(reason)) => Some(reason),
            Some(Waiting::Vault(_)) | None => None,
        },
    })
}

/// `keel intents --stuck`: everything that needs a human, oldest first.
///
/// # Errors
///
/// The log cannot be read.
pub fn list(db: &Path, out: &Output, now: DateTime<Utc>) -> anyhow::Result<u8> {
    let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
    let mut stuck = Vec::new();
    for status in
        [IntentStatus::Escalated, IntentStatus::AwaitingApproval, IntentStatus::Reserved, IntentStatus::OutcomeUnknown]
    {
        for row in reader.intents(Some(status.as_str()))? {
            let Some(key) = engine::event::IntentKey::parse(&row.key) else { continue };
            let Some(intent) = reader.intent_state(&key)? else { continue };
            let Some(reason) = needs_human(&reader, &intent, now)? else { continue };
            let since = reader.stream(&key.stream())?.last().map_or(now, |event| event.at);
            stuck.push(Stuck {
                intent_key: row.key,
                status: intent.status,
                reason,
                since,
                order_id: intent.definition.order_id.clone(),
                amount_minor: intent.definition.amount_minor,
                currency: intent.definition.currency.clone(),
            });
        }
    }
    stuck.sort_by(|a, b| (a.since, &a.intent_key).cmp(&(b.since, &b.intent_key)));
    out.emit(&stuck, || {
        if stuck.is_empty() {
            outln!("nothing needs a human");
        }
        for item in &stuck {
            outln!(
                "{:<18} {} since {}\n  {}",
                item.status.as_str(),
                item.intent_key,
                item.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                item.reason
            );
        }
    });
    Ok(exit::OK)
}
