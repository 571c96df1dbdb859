//! A TCP proxy between Keel processes and PostgreSQL that cuts connections at chosen moments
//! of a transaction: the network failures the writers must survive, on demand.
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
//!
//! What comes from the server is forwarded as it comes, unread. It is test tooling: the
//! conformance suite and `keel soak --store postgres://…` use it; it must never stand between
//! an operator's Keel and its database, and it never changes a byte it forwards.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
}

#[derive(Debug, Default)]
struct Shared {
    armed: Mutex<Option<Cut>>,
    mid_transaction: AtomicU64,
    before_commit: AtomicU64,
    after_commit: AtomicU64,
    closed: AtomicBool,
}

impl Shared {
    fn armed(&self) -> MutexGuard<'_, Option<Cut>> {
        // A poisoned lock only means a forwarding thread panicked; the cut it holds is data.
        self.armed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Arms `cut`, replacing one armed and not yet made.
    pub fn arm(&self, cut: Cut) {
        *self.shared.armed() = Some(cut);
    }

    /// Disarms: nothing more is cut.
    pub fn disarm(&self) {
        *self.shared.armed() = None;
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
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    let muted = Arc::clone(&mute);
    std::thread::Builder::new().name("keel-pg-proxy-down".to_owned()).spawn(move || {
        let mut buffer = [0_u8; 16_384];
        while let Ok(n) = from_server.read(&mut buffer) {
            if n == 0 || muted.load(Ordering::SeqCst) || to_client.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Both);
    })?;
    std::thread::Builder::new().name("keel-pg-proxy-up".to_owned()).spawn(move || {
        let mut up = Upstream { client, server, shared, mute, in_transaction: false };
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
