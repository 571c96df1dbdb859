//! Flow control toward a provider: a declared request rate, shared fairly between tenants.
//!
//! Owns [`RateLimited`], a [`PaymentProvider`] in front of another that sends at most
//! `rate_per_s` requests a second — charges, refunds and lookups alike, since a provider
//! counts them all (Stripe answers 429 past its limit) — so Keel never manufactures the 429s
//! and the unknown outcomes they would bring. Requests are spaced at least
//! `FLOW_SPACING_MARGIN` above `1 / rate_per_s` apart (no bursts), so that no window of a second
//! at the provider holds more than `rate_per_s` of them even with the network's jitter. Waiting
//! requests take their turns tenant by tenant, round robin, each tenant's in arrival order: one
//! tenant's batch cannot starve another's single charge.
//!
//! The same [`Throttle`] is handed to the provider's client, which reports each 429 it is
//! answered ([`Throttle::hold_off`]): no request leaves until the `Retry-After` the provider
//! asked for has passed, so a provider that throttles harder than declared slows Keel down.
//!
//! It limits sending, never recording: a request waits here after its attempt is durable. One
//! that could not be sent before its run's time is up (`EffectRequest::timeout_ms`) is
//! `NotSent`, which is definitive: nothing left the process. It never changes a request or an
//! outcome.

use engine::event::IntentKey;
use engine::limits::FLOW_SPACING_MARGIN;
use engine::provider::{BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, LookupOutcome, PaymentProvider};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// `inner`, sending at most its throttle's rate, fairly between tenants.
pub struct RateLimited<P> {
    inner: P,
    gate: Arc<Throttle>,
}

impl<P> RateLimited<P> {
    /// `inner` behind `throttle` (which its client may also hold, to report 429s).
    pub fn new(inner: P, throttle: Arc<Throttle>) -> Self {
        Self { inner, gate: throttle }
    }
}

/// Who goes next, and when the next request may leave: a provider's declared rate, and how
/// long it asked Keel to hold off.
pub struct Throttle {
    spacing: Duration,
    state: Mutex<Queue>,
    /// Told whenever a request left or gave up: the next in line looks again.
    turn: Notify,
}

#[derive(Default)]
struct Queue {
    /// When the last request left.
    last: Option<Instant>,
    /// Waiting tickets by tenant, each in arrival order.
    waiting: BTreeMap<String, VecDeque<u64>>,
    /// Tenants with waiting tickets, in the order their turns come.
    turns: VecDeque<String>,
    next_ticket: u64,
}

/// A place in the queue, given up when dropped (a request that gave up or was cancelled).
struct Ticket<'a> {
    gate: &'a Throttle,
    tenant: String,
    number: u64,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle").field("spacing", &self.spacing).finish_non_exhaustive()
    }
}

impl Throttle {
    /// A throttle of `rate_per_s` requests a second (at least one).
    pub fn new(rate_per_s: u32) -> Self {
        let spacing = Duration::from_secs_f64(FLOW_SPACING_MARGIN / f64::from(rate_per_s.max(1)));
        Self { spacing, state: Mutex::default(), turn: Notify::new() }
    }

    /// The provider answered 429: no request leaves before `retry_after` has passed (counted
    /// as if one had left a spacing before then).
    pub fn hold_off(&self, retry_after: Duration) {
        let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let held = (now + retry_after).checked_sub(self.spacing).unwrap_or(now);
        queue.last = Some(queue.last.map_or(held, |last| last.max(held)));
    }

    /// The earliest instant the next request may leave.
    #[cfg(test)]
    pub(crate) fn next_at(&self) -> Option<Instant> {
        let queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        queue.last.map(|last| last + self.spacing)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut queue = self.gate.state.lock().unwrap_or_else(PoisonError::into_inner);
        let emptied = queue.waiting.get_mut(&self.tenant).is_some_and(|tickets| {
            tickets.retain(|number| *number != self.number);
            tickets.is_empty()
        });
        if emptied {
            queue.waiting.remove(&self.tenant);
            queue.turns.retain(|tenant| *tenant != self.tenant);
        }
        drop(queue);
        self.gate.turn.notify_waiters();
    }
}

impl Throttle {
    /// Waits for `tenant`'s turn and the spacing since the last request; `false` when that
    /// would take past `within` (the request is then not to be sent).
    async fn pass(&self, tenant: &str, within: Option<Duration>) -> bool {
        let give_up = within.map(|within| Instant::now() + within);
        let ticket = {
            let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let number = queue.next_ticket;
            queue.next_ticket += 1;
            let tickets = queue.waiting.entry(tenant.to_owned()).or_default();
            tickets.push_back(number);
            if tickets.len() == 1 {
                queue.turns.push_back(tenant.to_owned());
            }
            Ticket { gate: self, tenant: tenant.to_owned(), number }
        };
        loop {
            let turned = self.turn.notified();
            tokio::pin!(turned);
            turned.as_mut().enable();
            let wait = {
                let mut queue = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let mine = queue.turns.front() == Some(&ticket.tenant)
                    && queue.waiting.get(&ticket.tenant).and_then(VecDeque::front) == Some(&ticket.number);
                let now = Instant::now();
                let ready_at = queue.last.map_or(now, |last| last + self.spacing);
                if mine && ready_at <= now {
                    queue.last = Some(now);
                    // This tenant's next request waits for the other tenants' turns.
                    queue.turns.rotate_left(1);
                    drop(queue);
                    drop(ticket);
                    return true;
                }
                if mine { ready_at - now } else { self.spacing }
            };
            if give_up.is_some_and(|at| Instant::now() + wait > at) {
                return false;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = &mut turned => {}
            }
        }
    }
}

impl<P: PaymentProvider> PaymentProvider for RateLimited<P> {
    fn capability(&self) -> Capability {
        self.inner.capability()
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let within = request.timeout_ms.map(Duration::from_millis);
            if !self.gate.pass(&request.tenant, within).await {
                return CallOutcome::NotSent {
                    detail: "the provider's declared rate left no turn before the run's time was up".to_owned(),
                };
            }
            self.inner.execute(request).await
        })
    }

    fn lookup<'a>(&'a self, kind: EffectKind, idempotency_key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            let key = IntentKey::parse(idempotency_key);
            let tenant = key.as_ref().map_or("", IntentKey::tenant);
            self.gate.pass(tenant, None).await;
            self.inner.lookup(kind, idempotency_key).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::Duration;
    use tokio::sync::Notify;

    fn gate(spacing_ms: u64) -> std::sync::Arc<Throttle> {
        std::sync::Arc::new(Throttle {
            spacing: Duration::from_millis(spacing_ms),
            state: std::sync::Mutex::default(),
            turn: Notify::new(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn requests_leave_spaced_and_take_turns_tenant_by_tenant() {
        let gate = gate(100);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // Tenant "big" queues five requests before "small" queues one.
        for (n, tenant) in ["big", "big", "big", "big", "big", "small"].into_iter().enumerate() {
            let (gate, order) = (std::sync::Arc::clone(&gate), std::sync::Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                assert!(gate.pass(tenant, None).await);
                order.lock().expect("not poisoned").push((tenant, n, tokio::time::Instant::now()));
            }));
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.expect("the task ends");
        }
        let order = order.lock().expect("not poisoned").clone();
        let tenants: Vec<&str> = order.iter().map(|(tenant, _, _)| *tenant).collect();
        // The first request leaves at once; the second already had the turn when "small" came;
        // then "small" goes before the three "big" requests still waiting.
        assert_eq!(tenants, ["big", "big", "small", "big", "big", "big"], "the small tenant waits one turn, not five");
        for pair in order.windows(2) {
            assert!(pair[1].2 - pair[0].2 >= Duration::from_millis(100), "spaced: {order:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_provider_holds_every_request_off_for_its_retry_after() {
        let gate = gate(100);
        assert!(gate.pass("t", None).await);
        let asked = tokio::time::Instant::now();
        gate.hold_off(Duration::from_secs(2));
        assert!(gate.pass("u", None).await);
        assert!(asked.elapsed() >= Duration::from_secs(2), "held off {:?}", asked.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_cannot_leave_in_time_gives_up_its_place() {
        let gate = gate(1_000);
        assert!(gate.pass("t", None).await);
        assert!(!gate.pass("t", Some(Duration::from_millis(10))).await, "the next turn is a second away");
        assert!(gate.pass("u", None).await, "the place given up blocks nobody");
    }
}
