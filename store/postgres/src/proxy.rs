//! A TCP proxy between Keel processes and PostgreSQL that cuts connections at chosen moments
//! of a transaction, or partitions them away for a while: the network failures the writers
//! must survive, on demand.
//!
//! Owns [`Proxy`] (a listener on 127.0.0.1 forwarding every connection to one upstream
//! server, byte for byte) and [`Cut`] (what the next cut is). The proxy reads the frontend
//! side of the wire protocol message by message — the startup packet, then typed messages —
//! so that it knows when a connection is inside a transaction (a simple-query `BEGIN` or
//! `START TRANSACTION` until `COMMIT` or `ROLLBACK`) and when a message is the `COMMIT`
//! itself. Once armed, the next connection to reach the armed moment is cut, once:
//!
//! - [`Cut::MidTransaction`]: a message inside a transaction (not its `COMMIT`) is never
//!   forwarded and both sides are closed: the server rolls the transaction back.
//! - [`Cut::BeforeCommit`]: the `COMMIT` is never forwarded: the server never commits, and
//!   the client cannot know that.
//! - [`Cut::AfterCommit`]: the `COMMIT` is forwarded, the server's answer never is, and both
//!   sides are closed after a wait: the server commits (or, with no wait, may or may not),
//!   the client cannot know which.
//! - [`Cut::Partition`]: a blackhole, not a cut, and not one connection's: from the moment it
//!   is armed, every connection — each at its next message outside a transaction, so that no
//!   server-side transaction is left holding its locks — has nothing forwarded in either
//!   direction, and is not closed, until the partition's time is up (or [`Proxy::heal`]);
//!   then what was held goes on ([`Heal::Resume`]) or the connection is closed
//!   ([`Heal::Close`]). A connection that sends nothing meanwhile never notices, as an idle
//!   TCP connection survives a short partition.
//!
//! What comes from the server is forwarded as it comes, unread. It is test tooling: the
//! conformance suite and `keel soak --store postgres://…` use it; it must never stand between
//! an operator's Keel and its database, and it never changes a byte it forwards.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the next cut lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// At a message inside a transaction other than its `COMMIT`, after `skip` such messages
    /// (counted over every connection) went through.
    MidTransaction {
        /// In-transaction messages forwarded before the one cut.
        skip: u32,
    },
    /// Instead of forwarding a `COMMIT`.
    BeforeCommit,
    /// After forwarding a `COMMIT`: the answer is dropped, the connection closed `wait_ms`
    /// later.
    AfterCommit {
        /// How long the server has to commit before its connection is closed.
        wait_ms: u64,
    },
    /// Every connection held, neither side closed, for `ms` from the moment it is armed;
    /// then `heal`.
    Partition {
        /// How long the partition lasts.
        ms: u64,
        /// What becomes of the connections it held.
        heal: Heal,
    },
}

/// What becomes of a connection a partition held, once it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heal {
    /// What was held is forwarded and the connection goes on, as after a network blip.
    Resume,
    /// The connection is closed, as after a TCP timeout: the client connects again.
    Close,
}

/// How many cuts of each kind the proxy made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Cuts {
    /// [`Cut::MidTransaction`] cuts.
    pub mid_transaction: u64,
    /// [`Cut::BeforeCommit`] cuts.
    pub before_commit: u64,
    /// [`Cut::AfterCommit`] cuts.
    pub after_commit: u64,
    /// [`Cut::Partition`]s.
    pub partitions: u64,
}

/// A partition in progress (or just over: `until` passed).
#[derive(Clone, Copy, Debug)]
struct Partition {
    until: Instant,
    heal: Heal,
}

#[derive(Debug, Default)]
struct Shared {
    armed: Mutex<Option<Cut>>,
    mid_transaction: AtomicU64,
    before_commit: AtomicU64,
    after_commit: AtomicU64,
    partitions: AtomicU64,
    partition: Mutex<Option<Partition>>,
    /// Connections a partition holds now.
    held: AtomicU64,
    /// Wakes the connections a partition holds when it ends early.
    healed: Condvar,
    closed: AtomicBool,
}

impl Shared {
    fn armed(&self) -> MutexGuard<'_, Option<Cut>> {
        // A poisoned lock only means a forwarding thread panicked; the cut it holds is data.
        self.armed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn partition(&self) -> MutexGuard<'_, Option<Partition>> {
        // As above: a poisoned lock only means a forwarding thread panicked.
        self.partition.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a partition holds the connections now.
    fn partitioned(&self) -> bool {
        self.partition().is_some_and(|p| Instant::now() < p.until)
    }

    /// Blocks until the partition in progress ends, and says what becomes of a connection it
    /// held (`Resume` when none is in progress).
    fn wait_out_partition(&self) -> Heal {
        let mut partition = self.partition();
        loop {
            let Some(Partition { until, heal }) = *partition else { return Heal::Resume };
            let now = Instant::now();
            if now >= until {
                return heal;
            }
            partition = self.healed.wait_timeout(partition, until - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Ends the partition in progress now, as it was to end.
    fn end_partition(&self) {
        if let Some(partition) = self.partition().as_mut() {
            partition.until = partition.until.min(Instant::now());
        }
        self.healed.notify_all();
    }
}

/// One connection's part in a partition, shared by its two directions.
#[derive(Debug, Default)]
struct Held(AtomicBool);

impl Held {
    /// Before forwarding anything: once the connection is held (`enter` says whether it may
    /// be held now), waits the partition out. False when the connection must be closed.
    fn pass(&self, shared: &Shared, enter: bool) -> bool {
        if !self.0.load(Ordering::SeqCst) {
            if !(enter && shared.partitioned()) {
                return true;
            }
            self.0.store(true, Ordering::SeqCst);
            shared.held.fetch_add(1, Ordering::SeqCst);
        }
        let heal = shared.wait_out_partition();
        if self.0.swap(false, Ordering::SeqCst) {
            shared.held.fetch_sub(1, Ordering::SeqCst);
        }
        heal == Heal::Resume
    }
}

/// A listening proxy; dropping it stops accepting connections (open ones carry on).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

/// The upper bound of one frontend message the proxy buffers (PostgreSQL's own is 1 GB; a
/// Keel command's messages are far below this).
const MESSAGE_MAX: usize = 64 << 20;

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        std::thread::Builder::new().name("keel-pg-proxy".to_owned()).spawn(move || {
            for client in listener.incoming() {
                if accepting.closed.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                // Message by message without Nagle's delay: the proxy adds no latency of its own.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let shared = Arc::clone(&accepting);
                // A connection whose threads cannot start is dropped: a cut like any other.
                let _ = forward(client, server, shared);
            }
        })?;
        Ok(Proxy { port, shared })
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Arms `cut`, replacing one armed and not yet made. A [`Cut::Partition`] is made at
    /// once (replacing one in progress), on every connection, and leaves an armed cut armed.
    pub fn arm(&self, cut: Cut) {
        match cut {
            Cut::Partition { ms, heal } => {
                *self.shared.partition() = Some(Partition { until: Instant::now() + Duration::from_millis(ms), heal });
                self.shared.partitions.fetch_add(1, Ordering::SeqCst);
            }
            other => *self.shared.armed() = Some(other),
        }
    }

    /// Ends a partition in progress now: what it held is forwarded, or closed, as its
    /// [`Heal`] says.
    pub fn heal(&self) {
        self.shared.end_partition();
    }

    /// Disarms: nothing more is cut, and a partition in progress ends ([`Proxy::heal`]).
    pub fn disarm(&self) {
        *self.shared.armed() = None;
        self.heal();
    }

    /// How many connections a partition holds now (each reached it with a message to send).
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Whether a cut is armed and not yet made.
    pub fn is_armed(&self) -> bool {
        self.shared.armed().is_some()
    }

    /// The cuts made so far.
    pub fn cuts(&self) -> Cuts {
        Cuts {
            mid_transaction: self.shared.mid_transaction.load(Ordering::SeqCst),
            before_commit: self.shared.before_commit.load(Ordering::SeqCst),
            after_commit: self.shared.after_commit.load(Ordering::SeqCst),
            partitions: self.shared.partitions.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.disarm();
        self.shared.closed.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees `closed` and ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Starts the two forwarding threads of one connection.
fn forward(client: TcpStream, server: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let mute = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Held::default());
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    let (muted, down_held, down_shared) = (Arc::clone(&mute), Arc::clone(&held), Arc::clone(&shared));
    std::thread::Builder::new().name("keel-pg-proxy-down".to_owned()).spawn(move || {
        let mut buffer = [0_u8; 16_384];
        while let Ok(n) = from_server.read(&mut buffer) {
            // The server's side enters no partition itself: only once its client's did.
            if n == 0
                || muted.load(Ordering::SeqCst)
                || !down_held.pass(&down_shared, false)
                || to_client.write_all(&buffer[..n]).is_err()
            {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Both);
    })?;
    std::thread::Builder::new().name("keel-pg-proxy-up".to_owned()).spawn(move || {
        let mut up = Upstream { client, server, shared, mute, held, in_transaction: false };
        up.run();
        let _ = up.server.shutdown(Shutdown::Both);
        let _ = up.client.shutdown(Shutdown::Both);
    })?;
    Ok(())
}

/// What a frontend message is, as far as a cut is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Begin,
    Commit,
    Rollback,
    Other,
}

/// A simple query's text (`Q` message body), classified. `ROLLBACK TO SAVEPOINT` ends no
/// transaction (a batch's refused command is undone with it), so it is no rollback here.
fn classify(tag: u8, body: &[u8]) -> Kind {
    if tag != b'Q' {
        return Kind::Other;
    }
    let text = String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(body)).trim().to_ascii_uppercase();
    let mut words = text.split(|c: char| !c.is_ascii_alphabetic()).filter(|word| !word.is_empty());
    match (words.next().unwrap_or(""), words.next()) {
        ("BEGIN" | "START", _) => Kind::Begin,
        ("COMMIT" | "END", _) => Kind::Commit,
        ("ROLLBACK", Some("TO")) => Kind::Other,
        ("ROLLBACK" | "ABORT", _) => Kind::Rollback,
        _ => Kind::Other,
    }
}

/// The client-to-server half of one connection.
struct Upstream {
    client: TcpStream,
    server: TcpStream,
    shared: Arc<Shared>,
    mute: Arc<AtomicBool>,
    held: Arc<Held>,
    in_transaction: bool,
}

/// What to do with one message.
enum Step {
    Forward,
    /// Cut without forwarding it.
    Drop,
    /// Forward it, then cut after the wait.
    ForwardThenCut(u64),
}

impl Upstream {
    fn run(&mut self) {
        if self.startup().is_err() {
            return;
        }
        loop {
            let mut header = [0_u8; 5];
            if self.client.read_exact(&mut header).is_err() {
                return;
            }
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            let Some(body_length) = length.checked_sub(4).filter(|n| *n <= MESSAGE_MAX) else { return };
            let mut message = header.to_vec();
            message.resize(5 + body_length, 0);
            if self.client.read_exact(&mut message[5..]).is_err() {
                return;
            }
            let kind = classify(header[0], &message[5..]);
            // A partition holds a connection between its transactions, never inside one.
            if !self.held.pass(&self.shared, !self.in_transaction) {
                return;
            }
            match self.step(kind) {
                Step::Forward => {
                    if self.server.write_all(&message).is_err() {
                        return;
                    }
                }
                Step::Drop => {
                    self.mute.store(true, Ordering::SeqCst);
                    return;
                }
                Step::ForwardThenCut(wait_ms) => {
                    self.mute.store(true, Ordering::SeqCst);
                    let _ = self.server.write_all(&message);
                    std::thread::sleep(Duration::from_millis(wait_ms));
                    return;
                }
            }
            match kind {
                Kind::Begin => self.in_transaction = true,
                Kind::Commit | Kind::Rollback => self.in_transaction = false,
                Kind::Other => {}
            }
        }
    }

    /// Forwards the untyped packets that open a connection: a TLS or GSS request (answered
    /// by one byte the other direction carries), then the startup packet.
    fn startup(&mut self) -> std::io::Result<()> {
        const SSL_REQUEST: u32 = 80_877_103;
        const GSS_REQUEST: u32 = 80_877_104;
        loop {
            let mut header = [0_u8; 8];
            self.client.read_exact(&mut header)?;
            let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let code = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            let rest = length.checked_sub(8).filter(|n| *n <= MESSAGE_MAX).ok_or(std::io::ErrorKind::InvalidData)?;
            let mut packet = header.to_vec();
            packet.resize(8 + rest, 0);
            self.client.read_exact(&mut packet[8..])?;
            if !self.held.pass(&self.shared, true) {
                return Err(std::io::ErrorKind::ConnectionAborted.into());
            }
            self.server.write_all(&packet)?;
            if code != SSL_REQUEST && code != GSS_REQUEST {
                return Ok(());
            }
        }
    }

    /// Whether the armed cut lands on this message (disarming it when it does).
    fn step(&self, kind: Kind) -> Step {
        let mut armed = self.shared.armed();
        let step = match (*armed, kind) {
            (Some(Cut::BeforeCommit), Kind::Commit) if self.in_transaction => {
                self.shared.before_commit.fetch_add(1, Ordering::SeqCst);
                Step::Drop
            }
            (Some(Cut::AfterCommit { wait_ms }), Kind::Commit) if self.in_transaction => {
                self.shared.after_commit.fetch_add(1, Ordering::SeqCst);
                Step::ForwardThenCut(wait_ms)
            }
            (Some(Cut::MidTransaction { skip }), Kind::Other) if self.in_transaction => {
                if skip > 0 {
                    *armed = Some(Cut::MidTransaction { skip: skip - 1 });
                    return Step::Forward;
                }
                self.shared.mid_transaction.fetch_add(1, Ordering::SeqCst);
                Step::Drop
            }
            // A partition is never armed: `Proxy::arm` makes it at once.
            _ => return Step::Forward,
        };
        *armed = None;
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_queries_are_classified_by_their_first_word() {
        assert_eq!(classify(b'Q', b"COMMIT\0"), Kind::Commit);
        assert_eq!(classify(b'Q', b"START TRANSACTION ISOLATION LEVEL READ COMMITTED\0"), Kind::Begin);
        assert_eq!(classify(b'Q', b"begin\0"), Kind::Begin);
        assert_eq!(classify(b'Q', b"ROLLBACK\0"), Kind::Rollback);
        assert_eq!(classify(b'Q', b"ROLLBACK TO SAVEPOINT command\0"), Kind::Other, "a savepoint ends no transaction");
        assert_eq!(classify(b'Q', b"RELEASE SAVEPOINT command; SAVEPOINT command\0"), Kind::Other);
        assert_eq!(classify(b'Q', b"SELECT 'COMMIT'\0"), Kind::Other);
        assert_eq!(classify(b'P', b"\0COMMIT\0"), Kind::Other, "only a simple query ends a transaction here");
    }
}
