//! Deadline and cancellation without reading a clock.
//!
//! Owns [`Timer`] (the capability to wait until an absolute instant, injected by the caller:
//! the binary gives a tokio-backed one, tests give [`ManualTimer`]), [`Cancellation`] (the
//! caller's cooperative stop) and the race the loop runs every model call and tool body in.
//!
//! # Choice
//!
//! The harness never reads time and never sleeps by itself: the loop asks the injected
//! [`engine::clock::Clock`] for `now` (budget checks) and the injected [`Timer`] for a future
//! that resolves at the run's absolute deadline, and races the work against it. Caller
//! cancellation wins every race; the work is polled before the deadline, so work that is
//! already finished is never thrown away.

use chrono::{DateTime, Utc};
use engine::clock::{Clock, ManualClock, ms_between};
use engine::provider::BoxFuture;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use tokio::sync::Notify;

/// Waits until an absolute instant.
pub trait Timer: Send + Sync {
    /// A future that resolves once `at` has passed.
    fn sleep_until(&self, at: DateTime<Utc>) -> BoxFuture<'_, ()>;
}

/// A timer for tests over a [`ManualClock`]: waiting until `at` moves the clock to `at` and
/// resolves at once, so a hanging transport meets its deadline without real waiting.
/// Fits work that is ready on its first poll or never (scripted transports, in-memory
/// tools); work that takes real time (HTTP) needs a real timer, or it meets the deadline
/// on its first `Pending`.
#[derive(Clone, Debug)]
pub struct ManualTimer {
    clock: Arc<ManualClock>,
}

impl ManualTimer {
    /// A timer driving `clock`.
    pub fn new(clock: Arc<ManualClock>) -> Self {
        Self { clock }
    }
}

impl Timer for ManualTimer {
    fn sleep_until(&self, at: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ms = ms_between(self.clock.now(), at);
            self.clock.advance_ms(i64::try_from(ms).unwrap_or(i64::MAX));
        })
    }
}

/// The caller's stop: cheap to clone, set once. Two kinds: [`Cancellation::cancel`] (ctrl-c:
/// the run stops `cancelled` at once, every race in progress ends) and
/// [`Cancellation::terminate`] (SIGTERM: a graceful stop — the step in progress finishes and
/// is recorded, then the run pauses, resumable, with nothing else recorded).
#[derive(Clone, Debug, Default)]
pub struct Cancellation {
    inner: Arc<(AtomicBool, Notify)>,
    terminating: Arc<AtomicBool>,
}

impl Cancellation {
    /// Not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels: every race in progress ends `cancelled`, and the guard refuses new calls.
    pub fn cancel(&self) {
        self.inner.0.store(true, Ordering::SeqCst);
        self.inner.1.notify_waiters();
    }

    /// True once cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.0.load(Ordering::SeqCst)
    }

    /// Asks for a graceful stop: no new step starts; the one in progress is not cut.
    pub fn terminate(&self) {
        self.terminating.store(true, Ordering::SeqCst);
    }

    /// True once a graceful stop was asked for.
    pub fn is_terminating(&self) -> bool {
        self.terminating.load(Ordering::SeqCst)
    }

    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        loop {
            // Created before the flag is read, so a cancel in between still wakes it.
            let notified = self.inner.1.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// How a raced piece of work ended.
pub(crate) enum Raced<T> {
    Done(T),
    Deadline,
    Cancelled,
}

/// Runs `work` until it finishes, the deadline passes or the caller cancels. Cancellation
/// is checked first, then the work, then the deadline.
pub(crate) async fn race<T>(
    work: impl Future<Output = T>,
    deadline: impl Future<Output = ()>,
    cancelled: impl Future<Output = ()>,
) -> Raced<T> {
    let mut work = pin!(work);
    let mut deadline = pin!(deadline);
    let mut cancelled = pin!(cancelled);
    poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Raced::Cancelled);
        }
        if let Poll::Ready(value) = work.as_mut().poll(cx) {
            return Poll::Ready(Raced::Done(value));
        }
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Raced::Deadline);
        }
        Poll::Pending
    })
    .await
}
