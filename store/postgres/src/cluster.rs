//! A throwaway PostgreSQL for tests: found or installed, started in a temporary directory
//! on a free port, one database per test, stopped when done.
//!
//! Owns [`Cluster`], [`shared`] (one cluster per test binary) and [`wait_for_lock_waiters`] (how a
//! test knows a session stopped at a lock it holds). It finds `initdb` and
//! `pg_ctl` on the `PATH`, then under `/usr/lib/postgresql/*/bin`; when they are missing and
//! the process runs as root, it installs Debian's `postgresql` package itself (under a file
//! lock, so parallel test binaries do not race, saying what it does on stderr). As root, the
//! PostgreSQL programs run as the `postgres` user (`initdb` refuses root). If the cluster
//! cannot be started, [`shared`] says why and the test using it fails: it never skips.
//!
//! It must never be linked into a decision path: only tests enable the `cluster` feature.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a cluster could not be had.
#[derive(Debug, thiserror::Error)]
#[error("cannot start a throwaway PostgreSQL: {0}")]
pub struct ClusterError(String);

fn fail(what: impl Into<String>) -> ClusterError {
    ClusterError(what.into())
}

/// A running PostgreSQL in a temporary directory, trust authentication, listening on
/// 127.0.0.1 only. Stopped (`pg_ctl stop -m immediate`) and removed on drop; the cluster of
/// [`shared`], never dropped, is stopped by a watchdog process once the test binary exits.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    databases: AtomicU64,
}

/// The test binary's one cluster, started on first use.
///
/// # Errors
///
/// Why it could not be started (the same answer to every later call).
pub fn shared() -> Result<&'static Cluster, &'static ClusterError> {
    static CLUSTER: OnceLock<Result<Cluster, ClusterError>> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start().and_then(Cluster::watched)).as_ref()
}

/// Runs `program` with `args`; `Err` quotes its output when it fails.
fn run(program: &mut Command) -> Result<String, ClusterError> {
    let shown = format!("{program:?}");
    let output = program.output().map_err(|e| fail(format!("{shown} could not run: {e}")))?;
    if !output.status.success() {
        return Err(fail(format!(
            "{shown} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn is_root() -> Result<bool, ClusterError> {
    Ok(run(Command::new("id").arg("-u"))? == "0")
}

/// The directory holding `initdb` and `pg_ctl`, if any.
fn find_bin() -> Option<PathBuf> {
    let on_path = run(Command::new("sh").args(["-c", "command -v pg_ctl"])).ok();
    if let Some(pg_ctl) = on_path.filter(|p| !p.is_empty()) {
        let resolved = std::fs::canonicalize(&pg_ctl).unwrap_or_else(|_| PathBuf::from(&pg_ctl));
        if let Some(dir) = resolved.parent().filter(|dir| dir.join("initdb").exists()) {
            return Some(dir.to_owned());
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// Installs Debian's `postgresql` package, once across parallel test binaries.
fn install() -> Result<PathBuf, ClusterError> {
    if !is_root()? {
        return Err(fail("initdb and pg_ctl are missing, and only root may install the postgresql package"));
    }
    let lock = File::create("/tmp/keel-postgresql-install.lock")
        .map_err(|e| fail(format!("cannot create the install lock: {e}")))?;
    lock.lock().map_err(|e| fail(format!("cannot take the install lock: {e}")))?;
    if let Some(bin) = find_bin() {
        return Ok(bin);
    }
    eprintln!("keel tests: PostgreSQL is missing; running apt-get update and apt-get install -y postgresql");
    let apt = |args: &[&str]| run(Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive"));
    apt(&["update"])?;
    apt(&["install", "-y", "--no-install-recommends", "postgresql"])?;
    find_bin().ok_or_else(|| fail("apt-get installed postgresql but initdb and pg_ctl are still not found"))
}

/// A free TCP port on 127.0.0.1 (free when asked; PostgreSQL binds it right after).
fn free_port() -> Result<u16, ClusterError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| fail(format!("no free port: {e}")))?;
    Ok(listener.local_addr().map_err(|e| fail(e.to_string()))?.port())
}

impl Cluster {
    /// Finds (or installs) PostgreSQL, runs `initdb` in a new temporary directory and starts
    /// the server on a free port, its socket in that directory.
    ///
    /// # Errors
    ///
    /// Why it could not: missing programs that cannot be installed, `initdb` or `pg_ctl`
    /// failing (their output is quoted).
    pub fn start() -> Result<Cluster, ClusterError> {
        let bin = match find_bin() {
            Some(bin) => bin,
            None => install()?,
        };
        let as_postgres = is_root()?;
        let dir = Path::new("/tmp").join(format!("keel-pg-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&dir))?;
        }
        let port = free_port()?;
        let cluster = Cluster { dir, bin, port, as_postgres, databases: AtomicU64::new(0) };
        let data = cluster.dir.join("data");
        run(cluster.program("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]))?;
        // fsync off: a throwaway cluster that no test survives a power loss of.
        let settings = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            cluster.dir.display()
        );
        run(cluster
            .program("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("log"))
            .args(["-w", "-o"])
            .arg(settings)
            .arg("start"))?;
        Ok(cluster)
    }

    /// Starts a watchdog process that stops the cluster and removes its directory once this
    /// process has exited (a `static` is never dropped).
    fn watched(self) -> Result<Cluster, ClusterError> {
        let stop = self.stop_command();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = self.dir.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| fail(format!("cannot start the cluster's watchdog: {e}")))?;
        Ok(self)
    }

    fn stop_command(&self) -> String {
        let pg_ctl = self.bin.join("pg_ctl");
        let data = self.dir.join("data");
        let stop = format!("'{}' -D '{}' stop -m immediate", pg_ctl.display(), data.display());
        if self.as_postgres { format!("runuser -u postgres -- {stop}") } else { stop }
    }

    fn program(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the administrative database (`postgres`), as the superuser.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a new empty database named after `label` and returns its URL.
    ///
    /// # Errors
    ///
    /// When the server does not accept the `CREATE DATABASE`.
    pub fn database(&self, label: &str) -> Result<String, ClusterError> {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let clean: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(40)
            .collect();
        let name = format!("keel_{clean}_{n}");
        let mut admin = postgres::Client::connect(&self.admin_url(), postgres::NoTls)
            .map_err(|e| fail(format!("cannot connect to the cluster: {e}")))?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| fail(format!("CREATE DATABASE {name}: {e}")))?;
        Ok(format!("postgres://postgres@127.0.0.1:{}/{name}", self.port))
    }

    /// Its directory (data, log, socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The longest [`wait_for_lock_waiters`] polls.
const LOCK_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until `n` sessions of the database at `url` wait for an advisory lock (polled in
/// `pg_locks`: the server is the only one who knows), at most 30 s, and returns how many do
/// then — `n` unless the wait ran out, which the caller asserts.
///
/// # Errors
///
/// When the database cannot be reached or read.
pub fn wait_for_lock_waiters(url: &str, n: i64) -> Result<i64, postgres::Error> {
    let mut watcher = postgres::Client::connect(url, postgres::NoTls)?;
    let deadline = std::time::Instant::now() + LOCK_WAIT_MAX;
    loop {
        let found: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )?
            .get(0);
        if found >= n || std::time::Instant::now() >= deadline {
            return Ok(found);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(Command::new("sh").args(["-c", &self.stop_command()]));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
