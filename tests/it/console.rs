//! The operator console in a real browser: Debian's `chromium`, headless, driven through
//! `chromedriver` over the W3C WebDriver protocol (plain JSON over HTTP on loopback, spoken
//! here with the suite's own raw HTTP, like `serve`'s tests). When the browser or its driver
//! is missing, [`browser`] installs Debian's packages (as root, under a file lock, saying what
//! it does); when it cannot, the test fails saying why — it never skips.

use crate::cli::{start_sim, temp};
use crate::serve::{OTHER_TENANT, Serve, bearer, charge_body, create_key, effects, event_count};
use serde_json::{Value, json};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The W3C name of an element reference in a WebDriver answer.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Makes sure Debian's `chromium` and `chromium-driver` are installed, installing them when
/// they are not (`apt-get`, as root, one process at a time under a lock file).
fn browser() {
    let present = || Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if present() {
        return;
    }
    let lock = std::fs::File::create(std::env::temp_dir().join("keel-chromium-install.lock"))
        .unwrap_or_else(|e| panic!("cannot create the install lock file: {e}"));
    lock.lock().unwrap_or_else(|e| panic!("cannot take the install lock: {e}"));
    if present() {
        return;
    }
    let apt = |args: &[&str]| {
        eprintln!("console test: {CHROMIUM} or {CHROMEDRIVER} is missing; running apt-get {}", args.join(" "));
        let output = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap_or_else(|e| panic!("cannot run apt-get to install the browser the console test needs: {e}"));
        (output.status.success(), String::from_utf8_lossy(&output.stderr).to_string())
    };
    let install = ["install", "-y", "--no-install-recommends", "chromium", "chromium-driver"];
    let (installed, why) = apt(&install);
    if !installed {
        let (updated, update_why) = apt(&["update"]);
        assert!(
            updated,
            "the console test needs Debian's chromium and chromium-driver; apt-get update failed: {update_why}"
        );
        let (installed, why_again) = apt(&install);
        assert!(
            installed,
            "the console test needs Debian's chromium and chromium-driver; apt-get install failed: {why} {why_again}"
        );
    }
    assert!(present(), "apt-get installed chromium and chromium-driver, yet {CHROMIUM} or {CHROMEDRIVER} is missing");
    eprintln!("console test: installed chromium and chromium-driver");
}

/// One HTTP/1.1 exchange on loopback: the status and the body, read to its `Content-Length`
/// (chromedriver keeps the connection open whatever `Connection: close` asks).
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connects to {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(120))).expect("a read timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    (&stream).write_all(request.as_bytes()).expect("sends");
    let mut reader = BufReader::new(&stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
    let status =
        status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{status_line:?}"));
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("a Content-Length");
        }
    }
    let mut answer = vec![0; length];
    reader.read_exact(&mut answer).expect("the whole body");
    (status, String::from_utf8_lossy(&answer).to_string())
}

/// A `chromedriver` child and one headless browser session on it, both ended when dropped.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
}

impl Browser {
    fn start(screenshots: &Path) -> Self {
        browser();
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{CHROMEDRIVER} starts: {e}"));
        let stdout = driver.stdout.take().expect("piped stdout");
        // chromedriver says it started on its first lines; drain the rest in the background.
        std::thread::spawn(move || BufReader::new(stdout).lines().for_each(drop));
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "{CHROMEDRIVER} never listened on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1400", format!("--user-data-dir={}", screenshots.join("profile").display())],
            },
        }}});
        let mut browser = Self { driver, addr, session: String::new() };
        let created = browser.command("POST", "/session", &capabilities);
        browser.session = created["sessionId"].as_str().unwrap_or_else(|| panic!("a session: {created}")).to_owned();
        browser
    }

    /// One WebDriver command: its status and its `value`.
    fn try_command(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let text = if method == "GET" { String::new() } else { body.to_string() };
        let (status, answer) =
            http(&self.addr, method, path, &[("Content-Type", "application/json; charset=utf-8")], &text);
        let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{method} {path}: {e}: {answer}"));
        (status, answer["value"].clone())
    }

    /// One WebDriver command that must succeed; its `value`.
    fn command(&self, method: &str, path: &str, body: &Value) -> Value {
        let (status, value) = self.try_command(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {value}");
        value
    }

    fn session_command(&self, method: &str, path: &str, body: &Value) -> Value {
        self.command(method, &format!("/session/{}{path}", self.session), body)
    }

    fn open(&self, url: &str) {
        self.session_command("POST", "/url", &json!({"url": url}));
    }

    fn url(&self) -> String {
        self.session_command("GET", "/url", &Value::Null).as_str().unwrap_or_default().to_owned()
    }

    /// The element `css` selects; a missing one fails the test with the page's URL and text.
    fn find(&self, css: &str) -> String {
        let path = format!("/session/{}/element", self.session);
        let (status, found) = self.try_command("POST", &path, &json!({"using": "css selector", "value": css}));
        if status != 200 {
            let text = self.script("return document.body ? document.body.innerText : ''");
            panic!("no element {css:?} on {}: {found}\npage text: {text}", self.url());
        }
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css:?}: {found}")).to_owned()
    }

    fn count(&self, css: &str) -> usize {
        let found = self.session_command("POST", "/elements", &json!({"using": "css selector", "value": css}));
        found.as_array().map_or(0, Vec::len)
    }

    fn text(&self, css: &str) -> String {
        let element = self.find(css);
        self.session_command("GET", &format!("/element/{element}/text"), &Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.session_command("POST", &format!("/element/{element}/clear"), &json!({}));
        self.session_command("POST", &format!("/element/{element}/value"), &json!({"text": text}));
    }

    /// Clicks what `css` selects and waits (at most 20 s) until the page it leads to is
    /// loaded: the old document carries a mark the new one does not.
    fn click(&self, css: &str) {
        let element = self.find(css);
        self.script("window.keelOldPage = true; return null");
        self.session_command("POST", &format!("/element/{element}/click"), &json!({}));
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.script("return window.keelOldPage !== true && document.readyState === 'complete'") != json!(true) {
            assert!(Instant::now() < deadline, "clicking {css:?} led to no new page: {}", self.url());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn script(&self, script: &str) -> Value {
        self.session_command("POST", "/execute/sync", &json!({"script": script, "args": []}))
    }

    /// The browser's session cookie (HttpOnly: the page's scripts cannot read it, WebDriver can).
    fn cookie(&self, name: &str) -> String {
        let cookie = self.session_command("GET", &format!("/cookie/{name}"), &Value::Null);
        cookie["value"].as_str().unwrap_or_else(|| panic!("a cookie {name}: {cookie}")).to_owned()
    }

    fn screenshot(&self, to: &Path) {
        use base64::Engine as _;
        let encoded = self.session_command("GET", "/screenshot", &Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("a base64 screenshot"))
            .expect("the screenshot decodes");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        std::fs::write(to, png).expect("the screenshot is written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(&self.addr, "DELETE", &format!("/session/{}", self.session), &[], "");
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Logs the browser in with `secret` through the login form.
fn log_in(browser: &Browser, base: &str, secret: &str) {
    browser.open(&format!("{base}/console/login"));
    browser.type_into("#secret", secret);
    browser.click("#login");
}

/// A charge of `amount` that awaits approval (over the server's threshold); its key.
fn awaiting(serve: &Serve, submit: &str, id: &str, amount: i64) -> String {
    let headers = [("Authorization", submit), ("Idempotency-Key", id), ("Content-Type", "application/json")];
    let (status, _, out) =
        serve.call("POST", "/v1/charges", &headers, Some(&charge_body(&format!("order_{id}"), amount)));
    assert_eq!((status, out["status"].as_str()), (202, Some("awaiting_approval")), "{out}");
    format!("charge:{TENANT}:{id}")
}

/// A form POST as a browser's session would make it, outside the browser.
fn post_form(serve: &Serve, path: &str, cookie: &str, form: &str) -> (u16, String) {
    let cookie = format!("keel_session={cookie}");
    let headers = [("Cookie", cookie.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
    let (status, _, body) = serve.call_text("POST", path, &headers, Some(form));
    (status, body)
}

#[test]
fn an_operator_logs_in_reviews_and_approves_in_a_real_browser() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let submit_secret = submit.trim_start_matches("Bearer ").to_owned();
    let operator_secret = create_key(&db, TENANT, "operator", "ops-eve");
    let read_secret = create_key(&db, TENANT, "read", "dash-read");
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "submit", "svc-other"));
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "10000"]);
    let base = format!("http://{}", serve.addr);
    let key = awaiting(&serve, &submit, "console_big_0001", 25_000);
    let other = awaiting(&serve, &submit, "console_big_0002", 30_000);
    let pending = awaiting(&serve, &submit, "console_big_0003", 20_000);
    // Another tenant's intent the console must never show.
    let headers = [
        ("Authorization", stranger.as_str()),
        ("Idempotency-Key", "theirs_big_0001"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_theirs", 40_000))).0, 202);
    let (_, _, shown) =
        serve.call("GET", &format!("/v1/intents/{key}"), &[("Authorization", &bearer(&operator_secret))], None);
    let fingerprint = shown["intent"]["fingerprint"].as_str().expect("a fingerprint").to_owned();

    let browser = Browser::start(dir.path());
    // A wrong key, then a submit key: refused, with a clear message, nothing signed in.
    log_in(&browser, &base, "keel_0000000000000000_not-a-secret");
    assert!(browser.text("#login-error").contains("not a valid API key"), "{}", browser.url());
    log_in(&browser, &base, &submit_secret);
    assert!(browser.text("#login-error").contains("submit key"), "{}", browser.url());
    browser.open(&format!("{base}/console/intents"));
    assert!(browser.url().ends_with("/console/login"), "no session, no page: {}", browser.url());

    // The operator: the intents by state, the ambiguous ones first.
    log_in(&browser, &base, &operator_secret);
    assert!(browser.url().ends_with("/console/intents"), "{}", browser.url());
    let first_state = browser.text("#counts tr:nth-child(2) td:first-child");
    assert_eq!(first_state, "outcome_unknown", "the ambiguous states come first");
    assert_eq!(browser.count("#state-awaiting_approval + table tr"), 4, "a header and three intents awaiting approval");
    assert_eq!(browser.count("a[href*='theirs_big_0001']"), 0, "another tenant's intent is not shown");
    browser.click(&format!("a[href='/console/intents/{key}/approval']"));

    // The approval page: what a human must see before saying yes.
    assert!(browser.url().ends_with("/approval"), "{}", browser.url());
    assert_eq!(browser.text("#amount"), "250.00 EUR");
    assert_eq!(browser.text("#order"), "order_console_big_0001");
    assert_eq!(browser.text("#fingerprint"), fingerprint);
    assert_eq!(browser.text("#refunded"), "0.00 EUR");
    assert!(!browser.text("#expiry").is_empty());
    assert!(browser.text("#no-ticket").contains("No third-party text"));
    browser.screenshot(&dir.path().join("approval.png"));
    eprintln!("console test: screenshot of the approval page at {}", dir.path().join("approval.png").display());

    let events = event_count(&db);
    let cookie = browser.cookie("keel_session");
    let csrf =
        browser.script("return document.querySelector('input[name=csrf]').value").as_str().expect("a token").to_owned();
    // Without the CSRF token, or with another, a decision is refused and writes nothing.
    for form in ["reason=forged".to_owned(), format!("csrf={}x&reason=forged", &csrf[..csrf.len() - 1])] {
        let (status, page) = post_form(&serve, &format!("/console/intents/{other}/deny"), &cookie, &form);
        assert_eq!(status, 403, "{form}: {page}");
        assert!(page.contains("CSRF"), "{page}");
    }
    assert_eq!(event_count(&db), events, "a forged form wrote nothing");

    browser.click("#approve");
    assert!(browser.url().ends_with(&format!("/console/intents/{key}")), "{}", browser.url());
    let history = browser.text("#history");
    assert!(history.contains("ApprovalGranted") && history.contains("operator:ops-eve"), "{history}");

    // The submitter asks again: the approved charge goes through, once, at the provider.
    assert_eq!(effects(dir.path()), 0, "an approval sends nothing by itself");
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "console_big_0001"),
        ("Content-Type", "application/json"),
    ];
    let (status, _, done) =
        serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_console_big_0001", 25_000)));
    assert_eq!((status, done["status"].as_str()), (200, Some("validated")), "{done}");
    assert_eq!(effects(dir.path()), 1, "one effect at the simulator");
    let stream = store::Reader::open(&db)
        .expect("a reader")
        .stream(&engine::event::IntentKey::parse(&key).expect("a key").stream())
        .expect("the stream");
    let granted = stream.iter().find(|e| e.event.type_name() == "ApprovalGranted").expect("an approval in the log");
    assert_eq!(granted.cause.actor, "operator:ops-eve", "the operator named is the key's");

    // A denial whose reason is markup: shown as text, never run.
    let deny = format!("csrf={csrf}&reason=%3Cscript%3Edocument.title%3D%27pwned%27%3C%2Fscript%3E");
    let (status, page) = post_form(&serve, &format!("/console/intents/{other}/deny"), &cookie, &deny);
    assert_eq!(status, 303, "{page}");
    browser.open(&format!("{base}/console/intents/{other}"));
    assert!(browser.text("#history").contains("<script>document.title='pwned'</script>"), "shown as text");
    assert_eq!(browser.count("script"), 0, "no script element on the page");
    assert_ne!(browser.script("return document.title"), "pwned");

    // A read key: the pages, no form, and its POSTs refused.
    browser.open(&format!("{base}/console/intents/{pending}/approval"));
    assert_eq!(browser.count("form.decision"), 2, "an operator may approve or deny");
    browser.click("header form button");
    assert!(browser.url().ends_with("/console/login"), "{}", browser.url());
    log_in(&browser, &base, &read_secret);
    browser.open(&format!("{base}/console/intents/{pending}/approval"));
    assert_eq!(browser.text("#amount"), "200.00 EUR", "a read key reads");
    assert_eq!(browser.count("form.decision"), 0, "a read key sees no decision form");
    let events = event_count(&db);
    let cookie = browser.cookie("keel_session");
    let csrf =
        browser.script("return document.querySelector('input[name=csrf]').value").as_str().expect("a token").to_owned();
    let (status, page) = post_form(
        &serve,
        &format!("/console/intents/{pending}/approve"),
        &cookie,
        &format!("csrf={csrf}&fingerprint=x"),
    );
    assert_eq!(status, 403, "{page}");
    assert_eq!(event_count(&db), events, "a read key's POST wrote nothing");
    for page in ["/console/runs", "/console/metrics"] {
        browser.open(&format!("{base}{page}"));
        assert_eq!(browser.count("header .who"), 1, "{page} is served to a read key");
    }
    assert_eq!(browser.count("svg"), 5, "the metrics page draws its charts");
}

/// The session cookie a response sets (the head's names are lower-cased; the id is hex).
fn set_cookie(head: &str) -> String {
    let line = head.lines().find(|l| l.starts_with("set-cookie: keel_session=")).unwrap_or_else(|| panic!("{head}"));
    for flag in ["httponly", "samesite=strict", "path=/"] {
        assert!(line.contains(flag), "{flag} in {line}");
    }
    line.trim_start_matches("set-cookie: keel_session=").split(';').next().expect("a value").to_owned()
}

/// The first CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").unwrap_or_else(|| panic!("a CSRF field in {page}")) + 19;
    page[start..].split('"').next().expect("a token").to_owned()
}

#[test]
fn console_logins_are_limited_per_client_before_any_secret_is_checked() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let operator = create_key(&db, TENANT, "operator", "ops-ana");
    let serve = Serve::start(&db, &sim, &[]);
    let (status, head, page) = serve.call_text("GET", "/console/login", &[], None);
    assert_eq!(status, 200);
    let (session, csrf) = (set_cookie(&head), csrf_of(&page));
    let login = |secret: &str| {
        let headers = [
            ("Cookie", format!("keel_session={session}")),
            ("Content-Type", "application/x-www-form-urlencoded".to_owned()),
        ];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
        serve.call_text("POST", "/console/login", &headers, Some(&format!("csrf={csrf}&secret={secret}")))
    };
    // Wrong secrets, each presenting another key id: they spend the client's own burst.
    let refused: Vec<u16> =
        (0..engine::limits::CONSOLE_LOGIN_BURST).map(|n| login(&format!("keel_{n:016x}_not-the-secret")).0).collect();
    assert!(refused.iter().all(|status| *status == 401), "refused, not yet limited: {refused:?}");
    let (status, head, page) = login("keel_ffffffffffffffff_not-the-secret");
    assert_eq!(status, 429, "past the burst: {page}");
    let retry_after = head.lines().find_map(|line| line.strip_prefix("retry-after: ")).map(str::parse::<u64>);
    assert!(retry_after.is_some_and(|seconds| seconds.is_ok_and(|s| s >= 1)), "{head}");
    // The right secret is limited too: the limit comes before any secret is looked at.
    let (status, head, _) = login(&operator);
    assert_eq!(status, 429, "{head}");
    assert!(!head.contains("set-cookie: keel_session="), "nothing signed in: {head}");
}

#[test]
fn a_flood_of_login_forms_expires_nobody_s_and_failures_with_a_key_s_id_never_lock_its_owner_out() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let operator = create_key(&db, TENANT, "operator", "ops-ana");
    let serve = Serve::start(&db, &sim, &[]);
    let form = |from: Ipv4Addr| {
        let (status, head, page) = serve.call_text_from(from, "GET", "/console/login", &[], None);
        assert_eq!(status, 200);
        (set_cookie(&head), csrf_of(&page))
    };
    let login = |from: Ipv4Addr, (session, csrf): &(String, String), secret: &str| {
        let cookie = format!("keel_session={session}");
        let headers = [("Cookie", cookie.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
        let body = format!("csrf={csrf}&secret={secret}");
        serve.call_text_from(from, "POST", "/console/login", &headers, Some(&body)).0
    };
    let (operator_at, attacker_at) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let pending = form(operator_at);

    // Someone opens more login forms than the server holds sessions.
    for _ in 0..=engine::limits::CONSOLE_SESSIONS_MAX {
        form(attacker_at);
    }
    // Someone who knows the operator key's id (its public part) tries secrets until refused.
    let id = operator.rsplit_once('_').map(|(id, _)| id).expect("keel_<id>_<secret>");
    let wrong = format!("{id}_not-the-secret");
    let attacker = form(attacker_at);
    let tries: Vec<u16> =
        (0..=engine::limits::CONSOLE_LOGIN_BURST).map(|_| login(attacker_at, &attacker, &wrong)).collect();
    assert_eq!(tries.last(), Some(&429), "the guesser is limited: {tries:?}");

    // The operator's form, opened before all that, still signs in with the right secret.
    assert_eq!(login(operator_at, &pending, &operator), 303, "the operator gets in");
}

#[test]
fn console_forms_refuse_what_they_cannot_do_and_write_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let operator = create_key(&db, TENANT, "operator", "ops-fay");
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "submit", "svc-other"));
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "100"]);
    let key = awaiting(&serve, &submit, "forms_big_0001", 500);
    let headers = [
        ("Authorization", stranger.as_str()),
        ("Idempotency-Key", "forms_theirs_01"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(serve.call("POST", "/v1/charges", &headers, Some(&charge_body("o_theirs", 500))).0, 202);
    let theirs = format!("charge:{OTHER_TENANT}:forms_theirs_01");

    let (status, head, _) = serve.call_text("GET", "/console/intents", &[], None);
    assert!(status == 303 && head.contains("location: /console/login"), "no session, the login form: {head}");
    let (status, head, page) = serve.call_text("GET", "/console/login", &[], None);
    assert_eq!(status, 200);
    let form_session = set_cookie(&head);
    let login = format!("secret={operator}");
    let (status, _) = post_form(&serve, "/console/login", &form_session, &login);
    assert_eq!(status, 403, "a login without the form's CSRF token is refused");
    let login = format!("csrf={}&{login}", csrf_of(&page));
    let (status, head, _) = serve.call_text(
        "POST",
        "/console/login",
        &[("Cookie", &format!("keel_session={form_session}")), ("Content-Type", "application/x-www-form-urlencoded")],
        Some(&login),
    );
    assert_eq!(status, 303, "{head}");
    let session = set_cookie(&head);
    assert_ne!(session, form_session, "a login gives a new session id");
    let cookie = format!("keel_session={session}");
    let (status, _, page) =
        serve.call_text("GET", &format!("/console/intents/{key}/approval"), &[("Cookie", &cookie)], None);
    assert_eq!(status, 200, "{page}");
    let csrf = csrf_of(&page);

    let before = event_count(&db);
    let deny = format!("/console/intents/{key}/deny");
    for (what, path, content_type, form, status) in [
        ("no session", deny.clone(), "application/x-www-form-urlencoded", format!("csrf={csrf}&reason=x"), 403),
        (
            "another tenant's intent",
            format!("/console/intents/{theirs}/deny"),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&reason=x"),
            404,
        ),
        ("not a form", deny.clone(), "text/plain", format!("csrf={csrf}&reason=x"), 415),
        (
            "an unknown field",
            deny.clone(),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&reason=x&by=mallory"),
            400,
        ),
        ("a blank reason", deny.clone(), "application/x-www-form-urlencoded", format!("csrf={csrf}&reason=+"), 400),
        (
            "a reason twice",
            deny.clone(),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&reason=a&reason=b"),
            400,
        ),
        (
            "the token twice",
            deny.clone(),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&csrf={csrf}&reason=a"),
            403,
        ),
        (
            "another fingerprint",
            format!("/console/intents/{key}/approve"),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&fingerprint=0000"),
            409,
        ),
        (
            "no such intent",
            format!("/console/intents/charge:{TENANT}:nothing_here_01/deny"),
            "application/x-www-form-urlencoded",
            format!("csrf={csrf}&reason=x"),
            404,
        ),
    ] {
        let sent_cookie = if what == "no session" { String::new() } else { cookie.clone() };
        let (got, _, page) = serve.call_text(
            "POST",
            &path,
            &[("Cookie", sent_cookie.as_str()), ("Content-Type", content_type)],
            Some(&form),
        );
        assert_eq!(got, status, "{what}: {page}");
        assert!(page.contains("class=\"error\""), "{what}: a page saying why: {page}");
    }
    assert_eq!(event_count(&db), before, "no refused form wrote anything");

    // A revoked key's session ends at its next page; a logged-out one is refused.
    let (code, _, _) = crate::cli::keel(&db, None, &["keys", "revoke", "ops-fay"]);
    assert_eq!(code, 0);
    let (status, head, _) = serve.call_text("GET", "/console/intents", &[("Cookie", &cookie)], None);
    assert!(status == 303 && head.contains("location: /console/login"), "{head}");
    let (status, _) = post_form(&serve, &deny, &session, &format!("csrf={csrf}&reason=x"));
    assert_eq!(status, 403, "the session ended with its key");
    assert_eq!(event_count(&db), before);
}
