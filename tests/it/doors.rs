//! `keel serve` against sockets that say nothing or say it slowly, on plain HTTP and TLS
//! alike: idle connections past the descriptor limit, a header block that never ends, a body
//! that trickles, a TLS client that never says hello, and a stop while one of them is open.
//! The server must outlive all of them, keep answering, and stop promptly.

use crate::cli::{start_sim, temp};
use crate::serve::{Serve, create_key, event_count, self_signed};
use engine::limits::{API_BODY_READ_TIMEOUT_MS, API_HEADER_READ_TIMEOUT_MS, API_TLS_HANDSHAKE_TIMEOUT_MS};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// Descriptors the server is started with (`prlimit`, soft and hard): far fewer than the idle
/// sockets the tests open.
const DESCRIPTORS: &str = "--nofile=64:64";

/// Idle sockets opened at once: several times the descriptors the server has.
const IDLE_SOCKETS: usize = 300;

/// Reads until the server closes the connection or `within` passes; whether it closed.
fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("a read timeout");
    let mut buffer = [0_u8; 4_096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            // A reset is the server closing too.
            Err(_) => return true,
        }
    }
}

/// A client trusting `pem` that resolves `localhost` to `addr`.
fn tls_client(pem: &str, addr: &str) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("the test's certificate"))
        .resolve("localhost", addr.parse().expect("an address"))
        .timeout(Duration::from_secs(20))
        .build()
        .expect("a client")
}

/// `GET /healthz`'s status over HTTPS.
fn tls_health(client: &reqwest::blocking::Client, addr: &str) -> u16 {
    let port = addr.rsplit(':').next().expect("a port");
    client.get(format!("https://localhost:{port}/healthz")).send().map_or(0, |answer| answer.status().as_u16())
}

#[test]
fn idle_sockets_past_the_descriptor_limit_neither_kill_nor_starve_the_server_on_http_or_tls() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (cert, key, pem) = self_signed(dir.path(), "server");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    for tls in [false, true] {
        let extra: Vec<&str> = if tls { vec!["--tls-cert", &cert, "--tls-key", &key] } else { vec![] };
        let mut serve = Serve::spawn(&db, &sim, &["prlimit", DESCRIPTORS, "--"], &extra);
        let client = tls_client(&pem, &serve.addr);
        let health = |serve: &Serve| {
            if tls { tls_health(&client, &serve.addr) } else { serve.call("GET", "/healthz", &[], None).0 }
        };
        assert_eq!(health(&serve), 200, "tls {tls}: it answers before the flood");

        let idle: Vec<TcpStream> = (0..IDLE_SOCKETS)
            .map(|_| TcpStream::connect(&serve.addr).expect("the kernel takes the connection"))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        assert!(serve.alive(), "tls {tls}: {IDLE_SOCKETS} idle sockets under 64 descriptors did not end the server");
        assert_eq!(health(&serve), 200, "tls {tls}: a caller still gets in while the idle sockets are open");
        assert!(serve.alive(), "tls {tls}: still running");
        drop(idle);
        assert_eq!(serve.stop(), 0, "tls {tls}: a graceful stop");
    }
}

#[test]
fn a_header_block_that_never_ends_and_a_body_that_trickles_are_closed_and_do_not_hold_the_stop() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = create_key(&db, TENANT, "submit", "slow");
    let serve = Serve::start(&db, &sim, &[]);

    // Part of a header block, then nothing: closed after the header timeout.
    let mut partial = TcpStream::connect(&serve.addr).expect("connects");
    partial.write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\nX-Slow: ").expect("writes part of a header");
    // A kept-alive connection that answered one request and says nothing more: closed too.
    let mut kept = TcpStream::connect(&serve.addr).expect("connects");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\n\r\n").expect("one whole request");
    // A body announced at 100 bytes of which 10 arrive: 408, and closed.
    let mut trickle = TcpStream::connect(&serve.addr).expect("connects");
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: keel\r\nAuthorization: Bearer {submit}\r\nIdempotency-Key: slow_body_charge\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"order_id"
    );
    trickle.write_all(head.as_bytes()).expect("writes part of a body");

    let margin = Duration::from_millis(API_HEADER_READ_TIMEOUT_MS.max(API_BODY_READ_TIMEOUT_MS) * 2);
    assert!(closed_by_server(&mut partial, margin), "a partial header block is closed by the server");
    assert!(closed_by_server(&mut kept, margin), "an idle kept-alive connection is closed by the server");
    let mut answer = String::new();
    trickle.set_read_timeout(Some(margin)).expect("a read timeout");
    let _ = trickle.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "a trickled body is answered 408 and closed: {answer:?}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert_eq!(event_count(&db), 0, "nothing was written");

    // A stop with a partial request open does not wait for it.
    let mut holding = TcpStream::connect(&serve.addr).expect("connects");
    holding.write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\n").expect("writes part of a header");
    std::thread::sleep(Duration::from_millis(200));
    let asked = Instant::now();
    assert_eq!(serve.stop(), 0, "a graceful stop");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_millis(API_HEADER_READ_TIMEOUT_MS),
        "the stop did not wait for the partial request's timeout ({took:?})"
    );
}

#[test]
fn a_tls_client_that_never_says_hello_is_closed_after_the_handshake_timeout() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (cert, key, pem) = self_signed(dir.path(), "server");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let serve = Serve::spawn(&db, &sim, &[], &["--tls-cert", &cert, "--tls-key", &key]);
    let client = tls_client(&pem, &serve.addr);
    let mut silent = TcpStream::connect(&serve.addr).expect("connects");
    assert!(
        closed_by_server(&mut silent, Duration::from_millis(API_TLS_HANDSHAKE_TIMEOUT_MS * 2)),
        "a silent TLS client is closed"
    );
    assert_eq!(tls_health(&client, &serve.addr), 200, "HTTPS still answers");
    assert_eq!(serve.stop(), 0);
}
