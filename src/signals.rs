//! Process-wide interruption (SIGINT, SIGTERM, SIGHUP) and the engines rigbench must not leave
//! behind.
//!
//! `timeout(1)`, CI runners and `kill` send SIGTERM; a terminal sends SIGINT; a dropped ssh
//! session or a closed terminal sends SIGHUP, which is handled exactly like SIGTERM (without a
//! handler it ends rigbench at once with status 129, the engine left running and no report). Without a handler
//! SIGTERM ends rigbench at once and an engine it started (in its own process group, so that a
//! terminal's Ctrl-C does not reach it) keeps running, orphaned, holding its port and GPU.
//!
//! After [`install`]:
//! - the first SIGINT, SIGTERM or SIGHUP sets a flag ([`interrupted`]) and wakes every waiter
//!   ([`wait`]); the e2e driver then aborts requests in flight, stops its engine's process group
//!   and the report is written with what was measured, marked interrupted;
//! - a second signal stops at once: every registered engine process group gets SIGKILL and the
//!   process exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for
//!   SIGHUP), the shell convention;
//! - except a repeat of the first signal within [`REPEAT_WINDOW`] of it, which is the same
//!   request delivered twice, not a second one: `timeout(1)` sends its SIGTERM to rigbench and
//!   then to its whole process group, and CI runners kill the process and then its group. Taken
//!   as a second signal it used to exit at once, losing the partial report.
//!
//! Engines started by rigbench register their process group ([`register_group`]) for that
//! second case; the launcher stops and unregisters them on every other path.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

static COUNT: AtomicUsize = AtomicUsize::new(0);
static FIRST: Mutex<Option<&'static str>> = Mutex::new(None);
static FIRST_AT: OnceLock<std::time::Instant> = OnceLock::new();
static ABSORBED: AtomicUsize = AtomicUsize::new(0);

/// A repeat of the first signal this soon after it counts as the same signal (see the module
/// docs): `timeout(1)`'s two deliveries are microseconds apart; a person pressing Ctrl-C twice
/// on purpose is slower, and a third press always stops at once.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);
static GROUPS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
static NOTIFY: OnceLock<tokio::sync::watch::Sender<bool>> = OnceLock::new();
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

fn notifier() -> &'static tokio::sync::watch::Sender<bool> {
    NOTIFY.get_or_init(|| tokio::sync::watch::channel(false).0)
}

/// Install the SIGINT/SIGTERM/SIGHUP handlers (once per process; later calls return the first
/// outcome). Returns after the handlers are in place.
///
/// # Errors
/// The listener thread or its signal streams could not be set up (the message says which).
pub fn install() -> anyhow::Result<()> {
    INSTALLED
        .get_or_init(|| {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
            let spawned = std::thread::Builder::new()
                .name("rigbench-signals".into())
                .spawn(move || listen(ready_tx));
            if let Err(e) = spawned {
                return Err(format!("cannot start the signal listener thread: {e}"));
            }
            ready_rx
                .recv()
                .unwrap_or_else(|_| Err("the signal listener thread ended early".into()))
        })
        .clone()
        .map_err(|m| anyhow::anyhow!(m))
}

fn listen(ready: std::sync::mpsc::Sender<Result<(), String>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start the signal runtime: {e}")));
            return;
        }
    };
    rt.block_on(async move {
        let (mut int, mut term, mut hup) = match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(i), Ok(t), Ok(h)) => (i, t, h),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                let _ = ready.send(Err(format!("cannot listen for SIGINT/SIGTERM/SIGHUP: {e}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        loop {
            let (name, number) = tokio::select! {
                _ = int.recv() => ("SIGINT", 2),
                _ = term.recv() => ("SIGTERM", 15),
                _ = hup.recv() => ("SIGHUP", 1),
            };
            on_signal(name, number);
        }
    });
}

fn on_signal(name: &'static str, number: i32) {
    if COUNT.load(Ordering::SeqCst) == 1
        && interrupted() == Some(name)
        && FIRST_AT
            .get()
            .is_some_and(|t| t.elapsed() < REPEAT_WINDOW)
        // One repeat is absorbed, never more: the next one is a real second signal.
        && ABSORBED.swap(1, Ordering::SeqCst) == 0
    {
        eprintln!(
            "rigbench: {name} again within {} ms: taken as the same request (timeout(1) and process-group kills deliver it twice); send it again to exit at once",
            REPEAT_WINDOW.as_millis()
        );
        return;
    }
    let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        let _ = FIRST_AT.set(std::time::Instant::now());
        if let Ok(mut f) = FIRST.lock() {
            *f = Some(name);
        }
        eprintln!(
            "\nrigbench: {name}: stopping; what was measured is kept and written (send it again to exit at once)"
        );
        notifier().send_replace(true);
        return;
    }
    let groups: Vec<u32> = GROUPS
        .lock()
        .map(|g| g.iter().copied().collect())
        .unwrap_or_default();
    eprintln!(
        "\nrigbench: second signal ({name}): killing {} engine process group(s) and exiting now",
        groups.len()
    );
    for g in groups {
        kill_group(g, libc::SIGKILL);
    }
    std::process::exit(128 + number);
}

/// The first signal received (`"SIGINT"`, `"SIGTERM"` or `"SIGHUP"`), once one has been.
pub fn interrupted() -> Option<&'static str> {
    if COUNT.load(Ordering::SeqCst) == 0 {
        return None;
    }
    FIRST.lock().ok().and_then(|f| *f)
}

/// Resolves when the first SIGINT, SIGTERM or SIGHUP arrives (at once if one already has). Waits
/// forever when [`install`] was never called.
pub async fn wait() {
    let mut rx = notifier().subscribe();
    let _ = rx.wait_for(|v| *v).await;
}

/// The environment variable of [`test_hold`] (read only with `RIGBENCH_TEST_HOOKS=1`).
pub const TEST_HOLD_ENV: &str = "RIGBENCH_TEST_HOLD";

/// Test hook, for the tests of the exit codes: with `RIGBENCH_TEST_HOOKS=1` and
/// `RIGBENCH_TEST_HOLD=first-signal`, a measuring command (`report`, `kernels`, `e2e`) waits here,
/// before it measures anything, until the first SIGINT or SIGTERM (then it goes on, interrupted);
/// with `RIGBENCH_TEST_HOLD=forever` it waits on after that too, so that only a second signal
/// ends it. It says so on stderr first, so a test sends its signals once it has read that line,
/// not after a guessed delay. Without the two variables it returns at once.
pub fn test_hold() {
    if std::env::var("RIGBENCH_TEST_HOOKS").as_deref() != Ok("1") {
        return;
    }
    let forever = match std::env::var(TEST_HOLD_ENV).as_deref() {
        Ok("first-signal") => false,
        Ok("forever") => true,
        _ => return,
    };
    eprintln!("rigbench: test hook: holding until a signal");
    while interrupted().is_none() || forever {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Record an engine's process group (its leader's pid), to be killed on a second signal.
pub fn register_group(pgid: u32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.insert(pgid);
    }
}

/// Forget a process group (its members are gone).
pub fn unregister_group(pgid: u32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.remove(&pgid);
    }
}

/// Send `signal` to every process of group `pgid` (`kill(-pgid, signal)`); true when the call
/// reached at least one process.
pub fn kill_group(pgid: u32, signal: i32) -> bool {
    let Ok(p) = i32::try_from(pgid) else {
        return false;
    };
    if p <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-p, signal) == 0 }
}

/// Whether any live process of group `pgid` still exists. Zombies (exited, not yet reaped:
/// in a container whose init does not reap, orphans stay zombies) do not count; on Linux this
/// reads `/proc/*/stat`, elsewhere it asks `kill(-pgid, 0)`.
pub fn group_alive(pgid: u32) -> bool {
    match live_members(pgid) {
        Some(m) => !m.is_empty(),
        None => kill_group(pgid, 0),
    }
}

/// The live (non-zombie) processes of group `pgid`, from `/proc`; `None` without `/proc`.
pub fn live_members(pgid: u32) -> Option<Vec<u32>> {
    let rd = std::fs::read_dir("/proc").ok()?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() >= 3 && f[2].parse::<u32>().ok() == Some(pgid) && f[0] != "Z" && f[0] != "X" {
            out.push(pid);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_signalled_and_seen_to_end() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30; wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        register_group(pgid);
        assert!(group_alive(pgid));
        assert!(kill_group(pgid, libc::SIGTERM));
        child.wait().unwrap();
        // The background `sleep` belonged to the group too: it ends as well.
        let t = std::time::Instant::now();
        while group_alive(pgid) && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!group_alive(pgid), "a member of the group survived SIGTERM");
        unregister_group(pgid);
        assert!(!GROUPS.lock().unwrap().contains(&pgid));
        assert!(
            !kill_group(0, 0) && !kill_group(1, 0),
            "never signal init or our own group"
        );
    }
}
