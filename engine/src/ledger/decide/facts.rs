//! Controlled facts: admitting a batch, forgetting — decided inside the transaction that
//! appends them, over the conversation as its stream says, so two updates taken under one
//! ticket cannot both land.
//!
//! The rules are `crate::facts`'; this file only turns their verdict into events. A refusal
//! writes nothing: the previous facts stay.

use super::Decider;
use crate::event::Event;
use crate::facts::{Candidate, ConversationId, Ticket};
use crate::ledger::protocol::{Refusal, ReplyTarget};

impl Decider<'_> {
    pub(super) fn apply_facts(
        &mut self,
        conversation: &ConversationId,
        ticket: Option<Ticket>,
        message: &str,
        candidates: &[Candidate],
    ) -> Result<ReplyTarget, Refusal> {
        let current = self.view.conversation(conversation);
        let ticket = ticket.unwrap_or_else(|| current.ticket());
        let admitted = current.admit(ticket, message, candidates, self.now)?;
        // A message that declares nothing (a question, prose) changes nothing: no turn.
        if !admitted.facts.is_empty() {
            self.push(Event::FactsAdmitted {
                conversation: conversation.clone(),
                ticket,
                facts: admitted.facts,
                evicted: admitted.evicted,
            });
        }
        Ok(ReplyTarget::Facts(conversation.clone()))
    }

    pub(super) fn forget_facts(
        &mut self,
        conversation: &ConversationId,
        ticket: Option<Ticket>,
        key: Option<&str>,
    ) -> Result<ReplyTarget, Refusal> {
        let current = self.view.conversation(conversation);
        let ticket = ticket.unwrap_or_else(|| current.ticket());
        current.forget(ticket, key)?;
        self.push(Event::FactsForgotten { conversation: conversation.clone(), ticket, key: key.map(str::to_owned) });
        Ok(ReplyTarget::Facts(conversation.clone()))
    }
}
