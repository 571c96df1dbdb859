//! Printing: one JSON document with `--json`, a short human rendering otherwise; the exit
//! codes and what each means; progress on a terminal.
//!
//! Owns [`Output`], [`Failure`] (every way a command fails, typed, and the one mapping from
//! a failure to its exit code and its JSON `status`: the README's table), the [`outln!`] /
//! [`errln!`] macros every printing goes through (a closed stdout or stderr — `keel intents |
//! head -1` — ends the printing quietly, never a panic, and every character a terminal would
//! act on is shown as its escape: [`inert`]), [`plural`] and [`Progress`].
//! Errors and logs go to stderr; results to stdout.

use serde::Serialize;
use serde_json::Value;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Exit codes: the README's table, written once here.
pub mod exit {
    /// Validated / ok.
    pub const OK: u8 = 0;
    /// Internal error, or `verify` found a mismatch.
    pub const INTERNAL: u8 = 1;
    /// A controlled outcome: rejected, declined, unknown, escalated, cancelled, awaiting
    /// approval, a controlled agent stop, or a command the ledger refused (nothing written).
    pub const CONTROLLED: u8 = 2;
    /// Usage: a bad flag or value, unreadable input, no provider where one is needed, no
    /// event log (without `--create`), no such intent or run, a missing API key.
    pub const USAGE: u8 = 64;
    /// Interrupted by the caller (SIGINT).
    pub const INTERRUPTED: u8 = 130;
    /// Stopped by SIGTERM: a graceful stop, the run resumable.
    pub const TERMINATED: u8 = 143;
}

/// Set once stdout is closed: nothing more is written to it.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
/// Set once stderr is closed.
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes one line to stdout; a closed stdout (a reader that went away) ends stdout's
/// output quietly, the command going on to its own exit code.
pub fn write_out(args: std::fmt::Arguments<'_>, newline: bool) {
    write_to(&mut std::io::stdout().lock(), &STDOUT_CLOSED, args, newline);
}

/// Writes one line to stderr, quietly giving up on a closed stderr.
pub fn write_err(args: std::fmt::Arguments<'_>, newline: bool) {
    write_to(&mut std::io::stderr().lock(), &STDERR_CLOSED, args, newline);
}

fn write_to(stream: &mut dyn std::io::Write, closed: &AtomicBool, args: std::fmt::Arguments<'_>, newline: bool) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let text = args.to_string();
    let written =
        stream.write_all(inert(&text).as_bytes()).and_then(|()| if newline { stream.write_all(b"\n") } else { Ok(()) });
    if written.and_then(|()| stream.flush()).is_err() {
        // Broken pipe, or any other write error: there is no one left to tell.
        closed.store(true, Ordering::Relaxed);
    }
}

/// `text` with every character a terminal would act on instead of showing written as its
/// escape, `\u001b` for ESC: control characters (C0 but line feed and tab, DEL, C1) and the
/// bidirectional overrides that reorder what follows. An operator's `--by`, a reason, an id or
/// a provider's words are shown, never obeyed. In a JSON document the escape is JSON's own, so
/// `--json` output stays the same document (`serde_json` already escapes C0 in strings).
pub fn inert(text: &str) -> std::borrow::Cow<'_, str> {
    let acts = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(acts) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if acts(c) {
            shown.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// `println!` that never panics on a closed stdout.
#[macro_export]
macro_rules! outln {
    () => { $crate::output::write_out(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::output::write_out(format_args!($($arg)*), true) };
}

/// `eprintln!` that never panics on a closed stderr.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::write_err(format_args!($($arg)*), true) };
}

/// `eprint!` that never panics on a closed stderr.
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => { $crate::output::write_err(format_args!($($arg)*), false) };
}

/// `n thing` or `n things`: "1 model call", "2 attempts".
pub fn plural(n: impl Into<u64>, thing: &str) -> String {
    let n = n.into();
    let suffix = if ["s", "x", "ch", "sh"].iter().any(|end| thing.ends_with(end)) { "es" } else { "s" };
    if n == 1 { format!("1 {thing}") } else { format!("{n} {thing}{suffix}") }
}

/// Renames every object field `key` in `document` to `intent_key`: the one name Keel's JSON
/// outputs give an intent key, whatever the engine type or stored payload calls it.
pub fn name_intent_keys(mut document: Value) -> Value {
    rename_keys(&mut document);
    document
}

fn rename_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(key) = map.remove("key") {
                map.insert("intent_key".to_owned(), key);
            }
            map.values_mut().for_each(rename_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(rename_keys),
        _ => {}
    }
}

/// Why a command did not do what it was asked: each kind has one exit code and one JSON
/// `status` ([`Failure::code`], [`Failure::status`]), whichever command meets it.
#[derive(Debug)]
pub enum Failure {
    /// A bad invocation: a flag, a value, an input file (64).
    Usage(String),
    /// The event log does not exist and the command does not create one (64).
    MissingDatabase(PathBuf),
    /// The PostgreSQL database named holds no Keel log and `--create` was not given (64): the
    /// server and database, as [`crate::backend::PgUrl`] shows them (no password).
    MissingPostgresLog(String),
    /// The command needs the payment provider and none was given (64).
    MissingProvider(String),
    /// No intent or run by that name in this log (64).
    NotFound(String),
    /// The ledger refused the command: nothing was written (2).
    Refused(String),
    /// Interrupted by the caller (130).
    Interrupted(String),
    /// Keel itself failed (1).
    Internal(String),
}

impl Failure {
    /// The exit code.
    pub fn code(&self) -> u8 {
        match self {
            Self::Usage(_)
            | Self::MissingDatabase(_)
            | Self::MissingPostgresLog(_)
            | Self::MissingProvider(_)
            | Self::NotFound(_) => exit::USAGE,
            Self::Refused(_) => exit::CONTROLLED,
            Self::Interrupted(_) => exit::INTERRUPTED,
            Self::Internal(_) => exit::INTERNAL,
        }
    }

    /// The JSON document's `status`.
    pub fn status(&self) -> &'static str {
        match self {
            Self::Usage(_)
            | Self::MissingDatabase(_)
            | Self::MissingPostgresLog(_)
            | Self::MissingProvider(_)
            | Self::NotFound(_) => "usage_error",
            Self::Refused(_) => "refused",
            Self::Interrupted(_) => "interrupted",
            Self::Internal(_) => "error",
        }
    }

    /// What kind of usage error (the JSON document's `reason`), for a machine.
    fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Usage(_) => Some("bad_input"),
            Self::MissingDatabase(_) | Self::MissingPostgresLog(_) => Some("missing_database"),
            Self::MissingProvider(_) => Some("missing_provider"),
            Self::NotFound(_) => Some("not_found"),
            Self::Refused(_) | Self::Interrupted(_) | Self::Internal(_) => None,
        }
    }

    /// The one line an operator reads.
    pub fn message(&self) -> String {
        match self {
            Self::MissingDatabase(path) => missing_database(path),
            Self::MissingPostgresLog(database) => format!(
                "no event log in the PostgreSQL database {database}: pass --create to start an empty one there (it \
                 creates Keel's tables)"
            ),
            Self::Usage(m) | Self::MissingProvider(m) | Self::NotFound(m) | Self::Refused(m) => m.clone(),
            Self::Interrupted(m) | Self::Internal(m) => m.clone(),
        }
    }

    /// The ledger's refusal as a failure: a name that matches nothing is not found, every
    /// other refusal a controlled one.
    pub fn refusal(refusal: &engine::ledger::Refusal) -> Self {
        use engine::ledger::Refusal;
        match refusal {
            Refusal::UnknownIntent(_) | Refusal::UnknownRun(_) => Self::NotFound(refusal.to_string()),
            other => Self::Refused(other.to_string()),
        }
    }
}

fn missing_database(path: &Path) -> String {
    format!("no event log at {}: pass --db PATH (or set KEEL_DB), or --create to start an empty one", path.display())
}

/// Any other error is Keel's own failure.
impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        Self::Internal(format!("{:#}", error.into()))
    }
}

/// What a command returns: its exit code, or why it failed.
pub type Outcome = Result<u8, Failure>;

/// Where and how results are printed.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// Print JSON.
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON (with `--json`) or calls `human` to print the rendering.
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce()) {
        if self.json {
            match serde_json::to_string_pretty(value) {
                Ok(text) => outln!("{text}"),
                Err(error) => errln!("keel: cannot render JSON: {error}"),
            }
        } else {
            human();
        }
    }

    /// Reports `failure` (one line on stderr; with `--json` also its document on stdout) and
    /// returns its exit code.
    pub fn fail(&self, failure: &Failure) -> u8 {
        let message = failure.message();
        if self.json {
            let mut document = serde_json::json!({"status": failure.status(), "error": message});
            if let (Some(reason), Some(map)) = (failure.reason(), document.as_object_mut()) {
                map.insert("reason".into(), Value::from(reason));
            }
            outln!("{document}");
        }
        match failure {
            Failure::Refused(_) => errln!("keel: refused: {message}"),
            Failure::Internal(_) => errln!("keel: error: {message}"),
            _ => errln!("keel: {message}"),
        }
        failure.code()
    }

    /// Reports a bad invocation and returns the usage exit code.
    pub fn usage_error(&self, message: &str) -> u8 {
        self.fail(&Failure::Usage(message.to_owned()))
    }

    /// Reports an internal error and returns its exit code.
    pub fn internal_error(&self, message: &str) -> u8 {
        self.fail(&Failure::Internal(message.to_owned()))
    }

    /// Reports an interruption by the caller and returns its exit code.
    pub fn interrupted(&self, message: &str) -> u8 {
        self.fail(&Failure::Interrupted(message.to_owned()))
    }

    /// Whether progress may be shown: a terminal on stderr, and no `--json`.
    pub fn progress_allowed(&self) -> bool {
        !self.json && std::io::stderr().is_terminal()
    }

    /// A progress bar over `total` steps on stderr, or a silent one off a terminal and under
    /// `--json`.
    pub fn progress(&self, total: u64, what: &str) -> Progress {
        if !self.progress_allowed() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        let style = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed}, eta {eta})")
            .map(|style| style.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(what.to_owned());
        Progress(Some(bar))
    }
}

/// A progress bar that is there only on a terminal (see [`Output::progress`]). Clones share
/// the bar (workers advance it together); [`Progress::finish`] removes it.
#[derive(Clone)]
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    /// Sets how many steps are done.
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }

    /// Adds `n` steps.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }

    /// Starts a new phase: another message and total, from 0.
    pub fn phase(&self, what: &str, total: u64) {
        if let Some(bar) = &self.0 {
            bar.set_message(what.to_owned());
            bar.set_length(total);
            bar.set_position(0);
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_pluralised() {
        assert_eq!(plural(1u32, "model call"), "1 model call");
        assert_eq!(plural(2u32, "attempt"), "2 attempts");
        assert_eq!(plural(0u32, "attempt"), "0 attempts");
        assert_eq!(plural(3u32, "mismatch"), "3 mismatches");
    }

    #[test]
    fn every_failure_has_its_row_of_the_table() {
        let rows = [
            (Failure::Usage("x".into()), 64, "usage_error"),
            (Failure::MissingDatabase("a.db".into()), 64, "usage_error"),
            (Failure::MissingProvider("x".into()), 64, "usage_error"),
            (Failure::NotFound("x".into()), 64, "usage_error"),
            (Failure::Refused("x".into()), 2, "refused"),
            (Failure::Interrupted("x".into()), 130, "interrupted"),
            (Failure::Internal("x".into()), 1, "error"),
        ];
        for (failure, code, status) in rows {
            assert_eq!((failure.code(), failure.status()), (code, status), "{failure:?}");
        }
        assert_eq!(Failure::MissingDatabase("a.db".into()).message().matches("a.db").count(), 1, "the path once");
    }
}
