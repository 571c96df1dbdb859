//! `keel serve`'s door to the network: the one accept loop, for plain HTTP and TLS alike.
//!
//! Owns [`Listener`]: the descriptor limit (raised to its hard limit at start) and the
//! connection bound kept under it; [`Listener::serve`], which accepts, completes the TLS
//! handshake when there is one, and hands each connection to the router with the client's
//! address; and the timeouts every connection lives under. A payment API must not be
//! killable or starvable by sockets that say nothing, so:
//!
//! - a failing `accept` (out of descriptors, a connection reset before it was taken) is logged
//!   and retried after a pause doubling from `API_ACCEPT_BACKOFF_FIRST_MS` to
//!   `API_ACCEPT_BACKOFF_MAX_MS`: it never ends the server;
//! - a TLS handshake has `API_TLS_HANDSHAKE_TIMEOUT_MS`, a request's header block (and a
//!   kept-alive connection's wait for its next request) `API_HEADER_READ_TIMEOUT_MS` (the
//!   body's own bound is the body door's);
//! - at most [`Listener::bound`] sockets are open: at the bound the connection idle the
//!   longest (no request in flight: silent, or still sending its headers) is closed to make
//!   room before the next is accepted; when every one has a request in flight, newcomers wait
//!   in the kernel's backlog until one ends;
//! - on stop, connections with no request in flight close at once, the others finish the
//!   request they are answering (the caller bounds how long it waits).
//!
//! It never decides anything about a request, and never reads one: what a connection carries
//! is the router's business.

use super::tls::Tls;
use axum::Router;
use axum::extract::ConnectInfo;
use engine::limits::{
    API_ACCEPT_BACKOFF_FIRST_MS, API_ACCEPT_BACKOFF_MAX_MS, API_CONNECTIONS_MAX, API_DESCRIPTORS_RESERVED,
    API_HEADER_READ_TIMEOUT_MS, API_TLS_HANDSHAKE_TIMEOUT_MS,
};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

/// A bound socket, the connection bound it serves under, and its TLS configuration if any.
pub struct Listener {
    socket: TcpListener,
    tls: Option<Tls>,
    bound: usize,
    descriptors: Option<u64>,
}

impl Listener {
    /// Raises the process's descriptor limit to its hard limit (where the system allows) and
    /// keeps the connection bound under it.
    pub fn new(socket: TcpListener, tls: Option<Tls>) -> Self {
        let descriptors = raise_descriptor_limit();
        Self { socket, tls, bound: connection_bound(descriptors), descriptors }
    }

    /// The most connections held open at once.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// The process's descriptor limit once raised (`None`: unlimited, or unreadable).
    pub fn descriptors(&self) -> Option<u64> {
        self.descriptors
    }

    /// Serves `app` until `stop` completes, then closes the connections with no request in
    /// flight and lets the others finish theirs. Nothing ends it but `stop`: a failing
    /// `accept` is retried, a failing connection ends only itself.
    pub async fn serve(self, app: Router, stop: impl Future<Output = ()>) {
        let Self { socket, tls, bound, .. } = self;
        let slots = Arc::new(Slots::default());
        // One permit a connection, held until its socket is closed: what bounds descriptors.
        let room = Arc::new(Semaphore::new(bound));
        let (stopping, stopped) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut pause = Duration::from_millis(API_ACCEPT_BACKOFF_FIRST_MS);
        tokio::pin!(stop);
        'serving: loop {
            let place = loop {
                if let Ok(place) = Arc::clone(&room).try_acquire_owned() {
                    break place;
                }
                // Full: the connection idle the longest makes room. When every connection has
                // a request in flight, newcomers wait in the kernel's backlog for one to end.
                slots.evict_oldest_idle();
                tokio::select! {
                    place = Arc::clone(&room).acquire_owned() => break place.expect("the semaphore is never closed"),
                    () = tokio::time::sleep(Duration::from_millis(API_ACCEPT_BACKOFF_MAX_MS / 10)) => {}
                    () = &mut stop => break 'serving,
                }
            };
            let (tcp, peer) = tokio::select! {
                accepted = socket.accept() => match accepted {
                    Ok(accepted) => {
                        pause = Duration::from_millis(API_ACCEPT_BACKOFF_FIRST_MS);
                        accepted
                    }
                    Err(error) => {
                        tracing::warn!(%error, pause_ms = pause.as_millis(), "keel serve: accept failed; accepting again after a pause");
                        tokio::select! {
                            () = tokio::time::sleep(pause) => {}
                            () = &mut stop => break,
                        }
                        pause = (pause * 2).min(Duration::from_millis(API_ACCEPT_BACKOFF_MAX_MS));
                        continue;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                () = &mut stop => break,
            };
            let slot = slots.open(place);
            let connection = Connection { peer, slot, app: app.clone(), stopped: stopped.clone() };
            connections.spawn(connection.run(tcp, tls.clone()));
        }
        // New clients are refused from here on, not left waiting in the backlog.
        drop(socket);
        stopping.send_replace(true);
        while connections.join_next().await.is_some() {}
    }
}

/// Raises the soft descriptor limit to the hard one; the soft limit in force after.
fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.maximum != limit.current {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(%error, "keel serve: the descriptor limit stays where it is");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The connection bound under a soft descriptor limit of `descriptors`: a quarter of them (at
/// least `API_DESCRIPTORS_RESERVED`) kept for everything else, at most `API_CONNECTIONS_MAX`,
/// at least one.
fn connection_bound(descriptors: Option<u64>) -> usize {
    let Some(descriptors) = descriptors else { return API_CONNECTIONS_MAX };
    let reserved = (descriptors / 4).max(API_DESCRIPTORS_RESERVED);
    let usable = usize::try_from(descriptors.saturating_sub(reserved)).unwrap_or(usize::MAX);
    usable.clamp(1, API_CONNECTIONS_MAX)
}

/// One open connection's place in [`Slots`].
struct Open {
    /// Requests read and not yet fully answered.
    requests: Arc<AtomicUsize>,
    /// Told when the connection is to close to make room.
    evict: Arc<Notify>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Slots {
    open: Mutex<BTreeMap<u64, Open>>,
    next: AtomicU64,
}

impl Slots {
    /// Registers a new connection holding `place`.
    fn open(self: &Arc<Self>, place: OwnedSemaphorePermit) -> Slot {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let requests = Arc::new(AtomicUsize::new(0));
        let evict = Arc::new(Notify::new());
        let open = Open { requests: Arc::clone(&requests), evict: Arc::clone(&evict) };
        self.open.lock().unwrap_or_else(PoisonError::into_inner).insert(id, open);
        Slot { id, requests, evict, slots: Arc::clone(self), _place: place }
    }

    /// Tells the oldest connection with no request in flight to close (it gives its place
    /// back when its socket is closed); nothing when every one has a request in flight.
    fn evict_oldest_idle(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = open.iter().find(|(_, open)| open.requests.load(Ordering::Acquire) == 0).map(|(&id, _)| id);
        if let Some(evicted) = idle.and_then(|id| open.remove(&id)) {
            evicted.evict.notify_one();
        }
    }
}

/// A connection's place, given back when the connection ends.
struct Slot {
    id: u64,
    requests: Arc<AtomicUsize>,
    evict: Arc<Notify>,
    slots: Arc<Slots>,
    /// The connection bound's permit, released with the socket.
    _place: OwnedSemaphorePermit,
}

impl Slot {
    fn idle(&self) -> bool {
        self.requests.load(Ordering::Acquire) == 0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.open.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// A request being answered: counted from its headers until its response's body is dropped
/// (written out, or the connection gone).
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(requests: &Arc<AtomicUsize>) -> Self {
        requests.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(requests))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection.
struct Connection {
    peer: SocketAddr,
    slot: Slot,
    app: Router,
    stopped: watch::Receiver<bool>,
}

impl Connection {
    /// The handshake (TLS), then the requests, until the client leaves, a timeout, an eviction
    /// or the stop ends it.
    async fn run(mut self, tcp: TcpStream, tls: Option<Tls>) {
        let Some(tls) = tls else { return self.drive(tcp).await };
        let handshake = tokio::time::timeout(Duration::from_millis(API_TLS_HANDSHAKE_TIMEOUT_MS), tls.accept(tcp));
        let evict = Arc::clone(&self.slot.evict);
        let stream = tokio::select! {
            done = handshake => match done {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(peer = %self.peer, %error, "keel serve: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(peer = %self.peer, "keel serve: TLS handshake timed out");
                    return;
                }
            },
            () = evict.notified() => return,
            _ = self.stopped.wait_for(|stopped| *stopped) => return,
        };
        self.drive(stream).await;
    }

    async fn drive<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: I) {
        // The client's address, as axum's `into_make_service_with_connect_info` gives it.
        let router = TowerToHyperService::new(self.app.layer(axum::Extension(ConnectInfo(self.peer))));
        let requests = Arc::clone(&self.slot.requests);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_flight = InFlight::enter(&requests);
            let answered = router.call(request);
            async move {
                let response = answered.await?;
                // The request stays in flight until hyper drops the body it has written out.
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    axum::body::Body::new(body.map_frame(move |frame| {
                        let _answering = &in_flight;
                        frame
                    }))
                }))
            }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(API_HEADER_READ_TIMEOUT_MS))
            .serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let evict = Arc::clone(&self.slot.evict);
        let mut draining = false;
        loop {
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(error) = served {
                        tracing::debug!(peer = %self.peer, %error, "keel serve: connection ended");
                    }
                    return;
                }
                () = evict.notified(), if self.slot.idle() => return,
                _ = self.stopped.wait_for(|stopped| *stopped), if !draining => {
                    if self.slot.idle() {
                        return;
                    }
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{API_CONNECTIONS_MAX, API_DESCRIPTORS_RESERVED, connection_bound};

    #[test]
    fn the_connection_bound_keeps_descriptors_for_the_log_and_never_reaches_zero() {
        assert_eq!(connection_bound(None), API_CONNECTIONS_MAX);
        assert_eq!(connection_bound(Some(1 << 20)), API_CONNECTIONS_MAX);
        assert_eq!(connection_bound(Some(1_024)), 768);
        assert_eq!(connection_bound(Some(64)), 64 - API_DESCRIPTORS_RESERVED as usize);
        assert_eq!(connection_bound(Some(10)), 1);
    }
}
