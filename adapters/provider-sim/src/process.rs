//! The simulator as a child process, for callers that need it in another process than
//! their own: Keel's integration tests and the binary's `keel demo` and `keel soak`, which
//! kill `keel` processes and must not take the provider down with them.
//!
//! Owns [`Process`]. It runs a command that speaks the `keel-provider-sim` command line (the
//! binary itself, or `keel provider-sim`): the caller chooses the program, so a test can name
//! `env!("CARGO_BIN_EXE_keel-provider-sim")` and the binary its sibling, and sets stderr as
//! it likes; `Process` adds `serve --db DB [--faults FILE]` and reads the address from the
//! one line the simulator prints first, `listening on URL` (see the CLI's contract).
//!
//! # Shutdown
//!
//! Dropping a [`Process`] kills the child (SIGKILL) and reaps it. The simulator's state is
//! durable, so a caller that drops one and serves the same database again sees every effect.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A simulator serving in a child process; killed when dropped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    url: String,
}

impl Process {
    /// Runs `command` as `serve --db DB`, with `--faults` when a plan is given (written to
    /// `faults.json` beside `db`), and returns once the child has announced its address.
    ///
    /// Fails when the child cannot start or its first line is not the announcement (the
    /// child is killed then); blocks until that line arrives.
    pub fn serve(mut command: Command, db: &Path, faults: Option<&str>) -> std::io::Result<Self> {
        command.arg("serve").arg("--db").arg(db);
        if let Some(plan) = faults {
            let path = db.with_file_name("faults.json");
            std::fs::write(&path, plan)?;
            command.arg("--faults").arg(path);
        }
        let mut child = command.stdout(Stdio::piped()).spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped: set just above");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        match (read, line.trim().strip_prefix("listening on ")) {
            (Ok(_), Some(url)) => Ok(Self { url: url.to_owned(), child }),
            (read, _) => {
                let _ = child.kill();
                let _ = child.wait();
                read?;
                Err(std::io::Error::other(format!("the simulator did not announce its address (got {line:?})")))
            }
        }
    }

    /// `http://127.0.0.1:PORT`, the base URL the child serves.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Already gone is fine: either way nothing is left running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
