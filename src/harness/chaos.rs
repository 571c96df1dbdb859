//! The chaos of `keel soak --store postgres://…`: many processes on one PostgreSQL log,
//! killed, stalled and cut off from the database at seeded moments.
//!
//! Owns the PostgreSQL rounds of the soak and nothing else (the workload, the fault plan, the
//! heal and the checks are [`super::soak`]'s). It starts a [`Proxy`] in front of the server
//! and hands every child the database through it — worker 0 through a second proxy of its
//! own —, starts [`WORKERS`] `keel worker` processes, and then, round after round: starts two
//! `keel soak-worker` children submitting the same batch at once (the same keys from two
//! places, while the workers take over what the kills leave), arms a cut most rounds (the four
//! moments in turn: mid-transaction after a seeded number of messages, instead of a `COMMIT`,
//! after one with a seeded wait — at the first proxy —, and a partition of worker 0 past its
//! lease, then resumed or closed, seeded — at its own: the others take its runs over meanwhile),
//! SIGKILLs the submitters after a seeded delay, SIGKILLs a worker every third round (and
//! starts another in its place), and now and then SIGSTOPs one past its lease before letting
//! it go on — a worker alive when the others must treat it as gone, whose later writes must be
//! fenced. A worker that ends by itself is counted and restarted: a worker stops only when
//! told.
//!
//! It never runs outside the soak's own fresh database, and it never judges what happened:
//! the soak's report does.

use super::soak::{Counts, Log, keel, soak_worker};
use crate::backend::PgUrl;
use crate::output::Progress;
use anyhow::Context as _;
use provider_sim::Rng;
use std::net::ToSocketAddrs as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use store_postgres::proxy::{Cut, Cuts, Heal, Proxy};

/// `keel worker` processes on the log at once.
pub(super) const WORKERS: usize = 4;
/// The lease time to live of every child: short, so that stalls and kills end in takeovers
/// within a round or two.
pub(super) const LEASE_TTL_MS: u64 = 1_000;
/// The workers' poll interval.
const POLL_MS: u64 = 50;
/// The shortest and longest wait before the submitters are killed, in ms: a debug child
/// starts, connects through the proxy and runs its batch in 250–350 ms on an idle machine,
/// several times that on a loaded one, so kills land before, during and after its attempts.
const KILL_DELAY_MS: (u64, u64) = (50, 1_200);
/// How long past its lease a stalled worker stays stopped, and a partition lasts.
const STALL_PAST_LEASE_MS: u64 = 300;

/// One worker slot: the process in it and how many have run in it.
struct Slot {
    child: Child,
    started: u64,
}

/// The workers, their files and the command that starts one.
struct Workers<'a> {
    log: &'a Log,
    /// The log as worker 0 reaches it: through a proxy of its own, the one partitions cut off.
    island: &'a Log,
    url: &'a str,
    dir: &'a Path,
    slots: Vec<Slot>,
}

impl Workers<'_> {
    fn command(&self, index: usize) -> anyhow::Result<Command> {
        let log = if index == 0 { self.island } else { self.log };
        let mut command = keel(log, self.url, None, super::soak::WORKER_TIMEOUT_MS)?;
        command.args(["worker", "--poll-ms", &POLL_MS.to_string(), "--health-ms", "600000"]);
        command.stderr(stderr_file(self.dir, &format!("worker-{index}.err"))?).stdin(Stdio::null());
        Ok(command)
    }

    fn start(&mut self, index: usize) -> anyhow::Result<()> {
        let child = self.command(index)?.spawn().context("start keel worker")?;
        match self.slots.get_mut(index) {
            Some(slot) => {
                slot.child = child;
                slot.started += 1;
            }
            None => self.slots.push(Slot { child, started: 1 }),
        }
        Ok(())
    }

    /// SIGKILLs worker `index` and starts another in its place. True when it was alive.
    fn kill_and_restart(&mut self, index: usize) -> anyhow::Result<bool> {
        let child = &mut self.slots[index].child;
        let alive = child.try_wait()?.is_none();
        if alive {
            child.kill().context("SIGKILL a worker")?;
        }
        child.wait()?;
        self.start(index)?;
        Ok(alive)
    }

    /// Restarts every worker that ended by itself, saying how it ended.
    fn restart_exited(&mut self, counts: &mut Counts) -> anyhow::Result<()> {
        for index in 0..self.slots.len() {
            if let Some(status) = self.slots[index].child.try_wait()? {
                counts.worker_exits += 1;
                counts.details.push(format!(
                    "worker {index} (start {}) ended by itself: {status} (its stderr: {})",
                    self.slots[index].started,
                    self.dir.join(format!("worker-{index}.err")).display()
                ));
                self.start(index)?;
            }
        }
        Ok(())
    }

    fn pid(&self, index: usize) -> String {
        self.slots[index].child.id().to_string()
    }
}

/// The end of the chaos, or of a soak that failed half-way: every worker SIGKILLed (a
/// stopped one too) and reaped, none left running.
impl Drop for Workers<'_> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let _ = slot.child.kill();
            let _ = slot.child.wait();
        }
    }
}

/// `dir/name`, appended to: where a child's stderr goes, for whoever reads a kept soak.
fn stderr_file(dir: &Path, name: &str) -> anyhow::Result<Stdio> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .with_context(|| format!("open {}", dir.join(name).display()))?;
    Ok(Stdio::from(file))
}

/// Sends `signal` (`STOP`, `CONT`) to `pid` with `kill(1)`.
fn signal(pid: &str, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").args([&format!("-{signal}"), pid]).status().context("run kill")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} ended with {status}");
    Ok(())
}

/// The `n`th cut: the four moments in turn, their details seeded. A partition (of worker 0)
/// outlasts the lease, so that the other workers take over what it held meanwhile, and its
/// late writes are fenced once it ends.
fn draw_cut(n: u64, rng: &mut Rng) -> Cut {
    match n % 4 {
        0 => Cut::MidTransaction { skip: rng.below(8) as u32 },
        1 => Cut::BeforeCommit,
        2 => Cut::AfterCommit { wait_ms: [0, 5, 50][rng.below(3) as usize] },
        _ => Cut::Partition {
            ms: LEASE_TTL_MS + STALL_PAST_LEASE_MS,
            heal: if rng.chance(0.5) { Heal::Resume } else { Heal::Close },
        },
    }
}

/// The chaos rounds on the PostgreSQL log at `url`, until `kills` SIGKILLs were delivered.
pub(super) fn run(
    url: &PgUrl,
    provider: &str,
    dir: &Path,
    rng: &mut Rng,
    kills: u64,
    seed: u64,
    progress: &Progress,
) -> anyhow::Result<Counts> {
    let upstream = url
        .server()
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", url.server()))?
        .next()
        .with_context(|| format!("{} resolves to no address", url.server()))?;
    let proxy = Proxy::start(upstream).context("cannot start the chaos proxy")?;
    let through = Log::Postgres(url.through("127.0.0.1", proxy.port()));
    // Worker 0 alone behind the partitions: the others take its runs over meanwhile.
    let island = Proxy::start(upstream).context("cannot start the chaos proxy")?;
    let islanded = Log::Postgres(url.through("127.0.0.1", island.port()));
    let mut workers =
        Workers { log: &through, island: &islanded, url: provider, dir, slots: Vec::with_capacity(WORKERS) };
    for index in 0..WORKERS {
        workers.start(index)?;
    }
    let mut counts = Counts::default();
    let mut stalled: Option<(usize, Instant)> = None;
    let mut armed = 0;
    while counts.kills < kills {
        progress.set(counts.kills);
        let submit = || -> anyhow::Result<Child> {
            let mut command = soak_worker(&through, provider, None, seed, counts.rounds)?;
            command.stderr(stderr_file(dir, "submitters.err")?);
            command.spawn().context("start a soak-worker")
        };
        let submitters = [submit()?, submit()?];
        if rng.chance(0.8) {
            match draw_cut(armed, rng) {
                partition @ Cut::Partition { .. } => island.arm(partition),
                cut => proxy.arm(cut),
            }
            armed += 1;
        }
        std::thread::sleep(Duration::from_millis(KILL_DELAY_MS.0 + rng.below(KILL_DELAY_MS.1 - KILL_DELAY_MS.0)));
        for mut submitter in submitters {
            if submitter.try_wait()?.is_none() {
                submitter.kill().context("SIGKILL a soak-worker")?;
                counts.kills += 1;
            }
            submitter.wait()?;
        }
        // A worker dies every third round (which one is seeded), never the stalled one.
        let victim = rng.below(WORKERS as u64) as usize;
        if counts.rounds % 3 == 1
            && stalled.is_none_or(|(index, _)| index != victim)
            && workers.kill_and_restart(victim)?
        {
            counts.kills += 1;
            counts.recovery_kills += 1;
        }
        match stalled {
            Some((index, until)) if Instant::now() >= until => {
                signal(&workers.pid(index), "CONT")?;
                stalled = None;
            }
            // The first stall at the third round, the next ones seeded, one at a time.
            None if counts.rounds == 2 || (counts.rounds > 2 && rng.chance(0.3)) => {
                let index = rng.below(WORKERS as u64) as usize;
                signal(&workers.pid(index), "STOP")?;
                counts.stalls += 1;
                stalled = Some((index, Instant::now() + Duration::from_millis(LEASE_TTL_MS + STALL_PAST_LEASE_MS)));
            }
            _ => {}
        }
        workers.restart_exited(&mut counts)?;
        counts.rounds += 1;
    }
    if let Some((index, _)) = stalled {
        signal(&workers.pid(index), "CONT")?;
    }
    // Let the workers take over what the last kills left, then stop every fault.
    std::thread::sleep(Duration::from_millis(2 * LEASE_TTL_MS));
    workers.restart_exited(&mut counts)?;
    proxy.disarm();
    island.disarm();
    drop(workers);
    counts.proxy_cuts = Some(Cuts { partitions: island.cuts().partitions, ..proxy.cuts() });
    Ok(counts)
}
