//! Engine launcher: start the built-in server (`rigbench serve`) or any engine command, capture
//! its log, wait for `GET /health`, watch it while it runs, and stop it afterwards (also on error
//! and Ctrl-C: the handle kills the engine's whole process group when dropped).
//!
//! The built-in server is started as `<rigbench> serve --model M --host 127.0.0.1 --port 0 ...`;
//! it prints `rigbench serve: listening on http://127.0.0.1:PORT` on stdout once bound.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{oneshot, watch};

use super::bootlog::BootLog;
use super::client::EngineClient;
use super::executor::{StopCause, StopSignal};

/// Which engine to drive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineChoice {
    /// `rigbench serve`, started by rigbench.
    Builtin {
        /// The rigbench binary (default: the running executable).
        program: Option<PathBuf>,
        /// Arguments after `serve` besides `--host`/`--port` (model, quantization, spec flags).
        args: Vec<String>,
    },
    /// Any engine command, run through `sh -c`.
    Command {
        /// The command line.
        command: String,
        /// Where it will listen.
        url: String,
    },
    /// An engine already running.
    Url {
        /// Its base URL.
        url: String,
    },
}

impl EngineChoice {
    /// `builtin`, `command` or `url`.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineChoice::Builtin { .. } => "builtin",
            EngineChoice::Command { .. } => "command",
            EngineChoice::Url { .. } => "url",
        }
    }
}

/// The first `HEAD` lines and the last `TAIL` lines of an engine's output.
#[derive(Debug, Default)]
pub struct LogBuffer {
    head: Vec<String>,
    tail: VecDeque<String>,
    dropped: usize,
}

const HEAD: usize = 5000;
const TAIL: usize = 5000;

impl LogBuffer {
    fn push(&mut self, line: String) {
        if self.head.len() < HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == TAIL {
            self.tail.pop_front();
            self.dropped += 1;
        }
        self.tail.push_back(line);
    }

    /// The captured text (with a marker where lines were dropped).
    pub fn text(&self) -> String {
        let mut s = self.head.join("\n");
        if self.dropped > 0 {
            s.push_str(&format!(
                "\n[rigbench: {} log lines not kept]",
                self.dropped
            ));
        }
        for l in &self.tail {
            s.push('\n');
            s.push_str(l);
        }
        s.push('\n');
        s
    }

    /// The last `n` lines.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let all: Vec<&String> = self.head.iter().chain(self.tail.iter()).collect();
        all[all.len().saturating_sub(n)..]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

/// The longest engine log line kept, bytes: 64 KiB (the rest of a longer line is dropped with a
/// marker; the pipe is still read to its end).
pub const MAX_LOG_LINE_BYTES: usize = 64 << 10;

/// Read `pipe` to its end, line by line, as bytes: each line decoded lossily (invalid UTF-8
/// becomes U+FFFD), cut at [`MAX_LOG_LINE_BYTES`], and passed to `each`. Nothing stops reading
/// before end of file, so the engine never writes into a closed pipe (a pipe closed early
/// would kill it with SIGPIPE, or lose the rest of its log). A read error ends the loop only
/// after it is recorded as a line.
pub async fn read_lines_lossy<R: AsyncRead + Unpin>(pipe: R, mut each: impl FnMut(String)) {
    let mut r = BufReader::new(pipe);
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    loop {
        let (done, used) = match r.fill_buf().await {
            Ok([]) => break,
            Ok(buf) => match buf.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    take_bounded(&mut line, &buf[..i], &mut cut);
                    (true, i + 1)
                }
                None => {
                    take_bounded(&mut line, buf, &mut cut);
                    (false, buf.len())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                each(format!(
                    "[rigbench: reading the engine's output failed: {e}]"
                ));
                break;
            }
        };
        r.consume(used);
        if done {
            each(finish_line(&mut line, &mut cut));
        }
    }
    if !line.is_empty() || cut {
        each(finish_line(&mut line, &mut cut));
    }
}

fn take_bounded(line: &mut Vec<u8>, bytes: &[u8], cut: &mut bool) {
    let room = MAX_LOG_LINE_BYTES.saturating_sub(line.len());
    if bytes.len() > room {
        *cut = true;
    }
    line.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

fn finish_line(line: &mut Vec<u8>, cut: &mut bool) -> String {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    let mut s = String::from_utf8_lossy(line).into_owned();
    if *cut {
        s.push_str(&format!(
            " [rigbench: line cut at {MAX_LOG_LINE_BYTES} bytes]"
        ));
    }
    line.clear();
    *cut = false;
    s
}

/// The processes seen descending from the engine, by pid (with start time and group).
type Tracked = Arc<Mutex<BTreeMap<u32, super::ownership::ProcStat>>>;

/// The engine's processes that left its process group (`setsid`, a new group), still alive:
/// they are stopped by their own group (or alone when they lead none).
fn strays(tracked: &Tracked, pgid: u32) -> Vec<super::ownership::ProcStat> {
    tracked
        .lock()
        .map(|m| {
            m.values()
                .filter(|p| p.pgrp != pgid && super::ownership::same_process_alive(p.pid, p.start))
                .copied()
                .collect()
        })
        .unwrap_or_default()
}

/// Note the engine's live descendants now (a scan of `/proc`, milliseconds), beside what the
/// periodic sampling saw: called right before the engine is stopped, while its leader still
/// holds them as children, so that one that detached (`setsid`) since the last sample — or
/// an engine stopped within its first sampling interval — is not missed.
fn track_now(tracked: &Tracked, pid: u32) {
    let Some(all) = super::ownership::all_processes() else {
        return;
    };
    let d = super::ownership::descendants(pid, &all);
    if let Ok(mut m) = tracked.lock() {
        for x in d {
            m.insert(x.pid, x);
        }
    }
}

/// Note every live process that carries the engine's tag in its environment (`tag`, the
/// `RIGBENCH_ENGINE_TAG=…` entry): also the ones no descendant scan can see any more, whose
/// parent exited right after they detached (`setsid -f`). Called when the engine is stopped or
/// killed, whether or not its own group is still alive.
fn track_tagged(tracked: &Tracked, tag: &str) {
    let Some(all) = super::ownership::all_processes() else {
        return;
    };
    let found = super::ownership::with_env(&all, tag);
    if let Ok(mut m) = tracked.lock() {
        for x in found {
            m.insert(x.pid, x);
        }
    }
}

/// A tag no other engine of this machine carries: rigbench's pid, a counter and the time.
fn new_engine_tag() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}={}-{}-{nanos}",
        super::ownership::ENGINE_TAG_ENV,
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn signal_strays(tracked: &Tracked, pgid: u32, sig: i32) -> usize {
    let s = strays(tracked, pgid);
    for p in &s {
        if p.pgrp == p.pid {
            crate::signals::kill_group(p.pid, sig);
        } else if let Ok(pid) = i32::try_from(p.pid) {
            // SAFETY: kill(2) on one process id checked alive just above.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
    s.len()
}

/// A running (or reachable) engine.
pub struct EngineHandle {
    /// Base URL.
    pub url: String,
    /// What was started.
    pub choice: EngineChoice,
    log: Arc<Mutex<LogBuffer>>,
    tracked: Tracked,
    /// `RIGBENCH_ENGINE_TAG=…`, in the environment of the engine rigbench started.
    tag: Option<String>,
    pid: Option<u32>,
    kill_tx: Option<oneshot::Sender<()>>,
    exit_rx: Option<watch::Receiver<Option<String>>>,
    /// How [`EngineHandle::stop`] stopped it (appended to the exit description).
    stop_note: Option<String>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("url", &self.url)
            .field("pid", &self.pid)
            .finish()
    }
}

fn signal_group(pid: u32, sig: i32) {
    // The engine leads its own process group (process_group(0)), so `kill(-PID)` reaches its
    // workers too (vLLM spawns engine-core and worker processes; `sh -c` its server).
    crate::signals::kill_group(pid, sig);
}

/// Stop every process of group `pgid`: SIGTERM (unless `termed`: the group already got its one
/// SIGTERM), then SIGKILL to what is left after `grace`; returns once none is alive (or after
/// another 5 s), and whether SIGKILL was needed. The leader may be gone already: a shell that
/// died leaves its server behind in the same group, shutting down gracefully. Never a second
/// SIGTERM: llama-server takes it as "terminate immediately" (`tools/server/server.cpp`,
/// `signal_handler`: "Received second interrupt, terminating immediately", exit 1), skipping its
/// graceful shutdown.
async fn stop_group(pgid: u32, grace: Duration, termed: bool) -> bool {
    let mut killed = false;
    if crate::signals::group_alive(pgid) {
        if !termed {
            signal_group(pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while crate::signals::group_alive(pgid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if crate::signals::group_alive(pgid) {
            killed = true;
            signal_group(pgid, libc::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while crate::signals::group_alive(pgid) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    crate::signals::unregister_group(pgid);
    killed
}

/// One startup error of the engine's log as a sentence: where it is, what it says (its cause,
/// exception or headline, [`super::bootlog::ErrorGroup::summary`]), and how often; never the
/// record's internal fields.
pub fn startup_error_sentence(e: &super::bootlog::ErrorGroup) -> String {
    let lines = if e.last_line > e.line {
        format!("lines {}–{}", e.line, e.last_line)
    } else {
        format!("line {}", e.line)
    };
    let times = if e.occurrences > 1 {
        format!(" ({} times)", e.occurrences)
    } else {
        String::new()
    };
    format!("log {lines}: {}{times}", e.summary())
}

/// Lines of an engine log that say it ended abnormally (an abort, a failed assertion, a crash
/// or a backtrace, llama-server's immediate termination on a second signal).
const ABNORMAL_END: [&str; 8] = [
    "Aborted",
    "terminate called",
    "GGML_ASSERT",
    "Segmentation fault",
    "core dumped",
    "backtrace",
    "Received second interrupt",
    "panicked at",
];

/// The first line of `log` that says the engine ended abnormally, 1-based, among its last 200
/// lines: `line N: text`.
pub fn abnormal_end(log: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(200);
    lines[from..]
        .iter()
        .position(|l| ABNORMAL_END.iter().any(|m| l.contains(m)))
        .map(|i| {
            let l = lines[from + i].trim();
            format!(
                "line {}: {}",
                from + i + 1,
                l.chars().take(200).collect::<String>()
            )
        })
}

/// An engine that did not become healthy: the message (with the tail of its log and the
/// startup errors found in it) and the whole captured log, which the caller keeps as
/// `engine.log` (that is when it matters).
#[derive(Debug)]
pub struct EngineStartFailure {
    /// What happened, with the log tail.
    pub message: String,
    /// Everything the engine printed (empty for `--url`).
    pub log: String,
}

impl std::fmt::Display for EngineStartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EngineStartFailure {}

impl EngineHandle {
    /// The captured log so far (empty for `--url`).
    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.text()).unwrap_or_default()
    }

    /// The last `n` lines of the captured log, joined with ` | ` (empty for `--url`).
    pub fn log_tail(&self, n: usize) -> String {
        self.log
            .lock()
            .map(|l| l.last_lines(n).join(" | "))
            .unwrap_or_default()
    }

    /// Parse the captured log so far.
    pub fn boot_log(&self) -> BootLog {
        BootLog::parse(&self.log_text())
    }

    /// The process id of the engine (leader of its process group), when rigbench started it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// How the engine exited, if it has.
    /// With how rigbench stopped it (one SIGTERM, or SIGKILL after the grace period) and the
    /// first line of its log that shows an abnormal end (an abort, a backtrace), if any.
    pub fn exit_status(&self) -> Option<String> {
        let mut d = self.exit_rx.as_ref().and_then(|r| r.borrow().clone())?;
        if let Some(n) = &self.stop_note {
            d.push_str(n);
        }
        if let Some(a) = abnormal_end(&self.log_text()) {
            d.push_str(&format!("; its log shows an abnormal end ({a})"));
        }
        Some(d)
    }

    /// Wait up to `within` for the engine process to exit; its exit description if it did
    /// (`None` at once for `--url`). A request failure may be the first sign of a death the
    /// watcher is about to report.
    pub async fn wait_exit(&self, within: Duration) -> Option<String> {
        let mut rx = self.exit_rx.clone()?;
        let _ = tokio::time::timeout(within, rx.wait_for(|e| e.is_some())).await;
        let e = rx.borrow().clone();
        e
    }

    /// Start (or reach) the engine and wait until `GET /health` answers. An unexpected exit
    /// later triggers `stop` with [`StopCause::EngineFailed`].
    ///
    /// # Errors
    /// The engine cannot be started, exits before it is healthy, or is not healthy within
    /// `startup_timeout`; the message carries the tail of its log and any startup errors found
    /// in it.
    pub async fn start(
        choice: &EngineChoice,
        startup_timeout: Duration,
        stop: &StopSignal,
    ) -> anyhow::Result<Self> {
        let log = Arc::new(Mutex::new(LogBuffer::default()));
        // Whose exit status the watcher sees: the engine's, or the `sh -c` that runs it.
        let mut via_shell = false;
        let (mut cmd, url_known) = match choice {
            EngineChoice::Url { url } => return Self::reach(choice, url, log).await,
            EngineChoice::Builtin { program, args } => {
                let program = match program {
                    Some(p) => p.clone(),
                    None => std::env::current_exe()
                        .context("cannot find the rigbench executable to start `rigbench serve`")?,
                };
                let mut c = tokio::process::Command::new(&program);
                c.arg("serve")
                    .args(["--host", "127.0.0.1", "--port", "0"])
                    .args(args);
                (c, None)
            }
            EngineChoice::Command { command, url } => {
                refuse_busy_port(url).await?;
                let mut c = tokio::process::Command::new("sh");
                match exec_form(command) {
                    Some(exec) => c.arg("-c").arg(exec),
                    None => {
                        via_shell = true;
                        c.arg("-c").arg(command)
                    }
                };
                (c, Some(url.clone()))
            }
        };
        confine(&mut cmd);
        let tag = new_engine_tag();
        if let Some((k, v)) = tag.split_once('=') {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start the engine ({})", describe(choice)))?;
        let pid = child.id();
        if let Some(p) = pid {
            crate::signals::register_group(p);
        }
        // Every process the engine starts, noted while it runs, so that one that left the
        // engine's process group (`setsid`) is still stopped with it.
        let tracked: Tracked = Arc::new(Mutex::new(BTreeMap::new()));
        if let Some(p) = pid {
            track_descendants(p, tracked.clone());
        }
        let url_rx = capture_output(&mut child, &log);
        let (kill_tx, exit_rx) = watch_child(child, pid, via_shell, stop, &log);
        let mut handle = Self {
            url: url_known.clone().unwrap_or_default(),
            choice: choice.clone(),
            log,
            tracked,
            tag: Some(tag),
            pid,
            kill_tx: Some(kill_tx),
            stop_note: None,
            exit_rx: Some(exit_rx),
        };
        handle
            .wait_healthy(url_known.is_none(), url_rx, startup_timeout, stop)
            .await?;
        if let Err(why) = handle.check_listener().await {
            return Err(handle.startup_failure(&why).await);
        }
        Ok(handle)
    }

    /// `--url`: an engine already running, reached at `GET /health` (else `/v1/models`);
    /// nothing answering is the environment (exit 1).
    async fn reach(
        choice: &EngineChoice,
        url: &str,
        log: Arc<Mutex<LogBuffer>>,
    ) -> anyhow::Result<Self> {
        let client = EngineClient::new(url)?;
        // /health, else /v1/models; nothing answering is the environment (exit 1).
        if let Err((_, why)) = super::engines::reach(client.base(), Duration::from_secs(10)).await {
            if why.contains(super::client::API_KEY_FIX) {
                bail!("{why} (--url)");
            }
            bail!("{why} (--url); start the engine first, or leave out --url to use the built-in engine");
        }
        Ok(Self {
            url: client.base().to_string(),
            choice: choice.clone(),
            log,
            tracked: Arc::new(Mutex::new(BTreeMap::new())),
            tag: None,
            pid: None,
            kill_tx: None,
            stop_note: None,
            exit_rx: None,
        })
    }

    /// Wait until the engine says where it listens (when `wait_for_url`: the built-in engine's
    /// `listening on` line) and answers `GET /health`; a startup failure (with its log) when it
    /// exits, is stopped, or runs past `startup_timeout`.
    async fn wait_healthy(
        &mut self,
        wait_for_url: bool,
        url_rx: oneshot::Receiver<String>,
        startup_timeout: Duration,
        stop: &StopSignal,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + startup_timeout;
        if wait_for_url {
            let mut exit = self.exit_rx.clone().context("exit channel")?;
            let url = tokio::select! {
                u = tokio::time::timeout(startup_timeout, url_rx) => match u {
                    Ok(Ok(u)) => u,
                    Ok(Err(_)) => return Err(self.startup_failure("closed its output before printing `listening on`").await),
                    Err(_) => return Err(self.startup_failure("printed no `listening on` line in time").await),
                },
                _ = exit.wait_for(|e| e.is_some()) => {
                    return Err(self.startup_failure("exited during startup").await);
                }
                _ = stop.stopped() => {
                    return Err(self.startup_failure("was stopped during startup (interrupted)").await);
                }
            };
            self.url = url;
        }
        let client = EngineClient::new(&self.url)?;
        self.url = client.base().to_string();
        loop {
            if self.exit_status().is_some() {
                return Err(self.startup_failure("exited during startup").await);
            }
            if client.health(Duration::from_secs(2)).await {
                break;
            }
            match super::engines::reach(client.base(), Duration::from_secs(2)).await {
                Ok(_) => break,
                // It answers, but refuses rigbench (401/403 on /health and /v1/models): no
                // wait will change that, and it is not "no answer from /health".
                Err((false, why)) if why.contains(super::client::API_KEY_FIX) => {
                    return Err(self.startup_failure(&why).await);
                }
                Err(_) => {}
            }
            if matches!(stop.cause(), Some(StopCause::Interrupted)) {
                return Err(self
                    .startup_failure("was stopped during startup (interrupted)")
                    .await);
            }
            if Instant::now() >= deadline {
                return Err(self
                    .startup_failure(&format!(
                        "did not answer GET {}/health within {:.0} s",
                        self.url,
                        startup_timeout.as_secs_f64()
                    ))
                    .await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The server answering at the engine's URL must be the engine rigbench started: the
    /// process holding the listening socket (`/proc/net/tcp` inode → `/proc/PID/fd`) is the
    /// engine or one of its descendants, or started after it (a container runtime's port
    /// proxy). A listener older than the engine that is not the engine's is another server:
    /// an error. Where `/proc` says nothing (another user's socket, no `/proc`), a note in the
    /// engine's log says the check could not be made.
    async fn check_listener(&self) -> Result<(), String> {
        let Some(leader) = self.pid else {
            return Ok(());
        };
        let Some((host, port)) = super::ownership::host_port(&self.url) else {
            return Ok(());
        };
        let loopback = super::ownership::is_local_host(&host);
        let owner = tokio::task::spawn_blocking(move || {
            let owner = super::ownership::port_owner(port);
            let all = super::ownership::all_processes().unwrap_or_default();
            (owner, all)
        })
        .await
        .map_err(|e| format!("checking the listener failed: {e}"))?;
        let (owner, all) = owner;
        let note = |m: String| {
            if let Ok(mut b) = self.log.lock() {
                b.push(format!("[rigbench: {m}]"));
            }
        };
        match owner {
            super::ownership::PortOwner::Pids(pids) => {
                let ours: Vec<u32> = super::ownership::descendants(leader, &all)
                    .iter()
                    .map(|p| p.pid)
                    .chain(self.tracked.lock().map(|m| m.keys().copied().collect::<Vec<_>>()).unwrap_or_default())
                    .collect();
                if pids.iter().any(|p| ours.contains(p)) {
                    return Ok(());
                }
                let start_of = |pid: u32| all.iter().find(|p| p.pid == pid).map(|p| p.start);
                let leader_start = start_of(leader).or_else(|| {
                    self.tracked.lock().ok().and_then(|m| m.get(&leader).map(|p| p.start))
                });
                let older = pids
                    .iter()
                    .filter_map(|p| start_of(*p))
                    .any(|s| leader_start.is_some_and(|l| s < l));
                if older && loopback {
                    return Err(format!(
                        "is not the server answering at {}: port {port} is held by process {}, which was running before the engine started (another server; its figures would be credited to the engine command)",
                        self.url,
                        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                    ));
                }
                note(format!(
                    "port {port} is held by process {} (not a descendant of the engine command; started after it, as a container runtime's port proxy is)",
                    pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                ));
            }
            super::ownership::PortOwner::Free if loopback => note(format!(
                "no listening socket on port {port} was found in /proc/net/tcp (a NAT rule of a container runtime?): who answers could not be checked"
            )),
            super::ownership::PortOwner::Unknown | super::ownership::PortOwner::Unreadable => {
                note(format!(
                    "the process listening on port {port} could not be found in /proc: who answers could not be checked"
                ))
            }
            super::ownership::PortOwner::Free => {}
        }
        Ok(())
    }

    async fn startup_failure(&mut self, what: &str) -> anyhow::Error {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let log = self.boot_log();
        let tail = self
            .log
            .lock()
            .map(|l| l.last_lines(15).join("\n    "))
            .unwrap_or_default();
        self.stop().await;
        let mut msg = format!("the engine ({}) {what}", describe(&self.choice));
        if !log.errors.is_empty() {
            msg.push_str("\n  startup errors found in its log:");
            for e in &log.errors {
                msg.push_str(&format!("\n    {}", startup_error_sentence(e)));
            }
        }
        if !tail.is_empty() {
            msg.push_str(&format!("\n  last log lines:\n    {tail}"));
        }
        anyhow::Error::new(EngineStartFailure {
            message: msg,
            log: self.log_text(),
        })
    }

    /// Stop the engine (one SIGTERM to its process group, SIGKILL to what is left 10 s later)
    /// and wait until no process of the group is left, also when its leader (the `sh -c` of
    /// `--engine-cmd`) has already exited and left its server shutting down; how it was stopped
    /// goes into [`EngineHandle::exit_status`].
    pub async fn stop(&mut self) {
        let start = Instant::now();
        // The watcher sends the one SIGTERM (and SIGKILL if the leader outlives the grace).
        let termed = self.kill_tx.is_some();
        // Only while the engine's group lives: a reaped leader's pid may be another process's.
        if let Some(pid) = self.pid.filter(|p| crate::signals::group_alive(*p)) {
            let t = self.tracked.clone();
            let _ = tokio::task::spawn_blocking(move || track_now(&t, pid)).await;
        }
        if let Some(tag) = self.tag.clone() {
            let t = self.tracked.clone();
            let _ = tokio::task::spawn_blocking(move || track_tagged(&t, &tag)).await;
        }
        if let Some(tx) = self.kill_tx.take() {
            let _ = tx.send(());
            if let Some(mut rx) = self.exit_rx.clone() {
                let _ = tokio::time::timeout(Duration::from_secs(15), rx.wait_for(|e| e.is_some()))
                    .await;
            }
        }
        if let Some(pid) = self.pid {
            let grace = Duration::from_secs(10).saturating_sub(start.elapsed());
            let killed = stop_group(pid, grace, termed).await;
            self.stop_note = Some(if killed {
                format!(
                    "; stopped by rigbench: one SIGTERM, then SIGKILL to its process group after {:.1} s without exit",
                    start.elapsed().as_secs_f64()
                )
            } else {
                format!(
                    "; stopped by rigbench: one SIGTERM, its process group gone after {:.1} s",
                    start.elapsed().as_secs_f64()
                )
            });
            // Processes that left the group (`setsid`): stopped the same way, and said so.
            let n = signal_strays(&self.tracked, pid, libc::SIGTERM);
            if n > 0 {
                if let Ok(mut b) = self.log.lock() {
                    b.push(format!(
                        "[rigbench: {n} engine process(es) had left the engine's process group (setsid); stopped by their own group]"
                    ));
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while !strays(&self.tracked, pid).is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                signal_strays(&self.tracked, pid, libc::SIGKILL);
            }
        }
        // Let the log readers reach the end of the pipes.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Kill the engine abruptly (SIGKILL to its process group), as a crash would.
    pub fn kill(&self) {
        if let Some(pid) = self.pid {
            if crate::signals::group_alive(pid) {
                track_now(&self.tracked, pid);
            }
            if let Some(tag) = &self.tag {
                track_tagged(&self.tracked, tag);
            }
            signal_group(pid, libc::SIGKILL);
            signal_strays(&self.tracked, pid, libc::SIGKILL);
        }
    }
}

/// `--engine-cmd` with a URL naming a port: a busy port would let another server answer for
/// this engine, so it is refused before the engine starts (docs/reliability.md).
async fn refuse_busy_port(url: &str) -> anyhow::Result<()> {
    if let Some((host, port)) = super::ownership::host_port(url) {
        let (h, u) = (host.clone(), url.to_string());
        let busy = tokio::task::spawn_blocking(move || super::ownership::port_in_use(&h, port))
            .await
            .ok()
            .flatten();
        if let Some(why) = busy {
            bail!(
                "--engine-cmd: {why}, before the engine was started; its figures would be credited to that server. Stop it, or start the engine on a free port and give that port in --url (now {u})"
            );
        }
    }
    Ok(())
}

/// The engine's process set-up: no stdin, output piped, NCCL's environment, its own process
/// group, and (Linux) killed when rigbench ends.
fn confine(cmd: &mut tokio::process::Command) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Multi-GPU engines: NVLink multicast stays off in every environment rigbench sets up.
    for (k, v) in crate::gpu::nccl::NCCL_ENV {
        cmd.env(k, v);
    }
    #[cfg(unix)]
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid, raise).
        unsafe {
            cmd.pre_exec(move || {
                // The engine gets SIGKILL when rigbench ends, however it ends (SIGKILL and
                // aborts included): prctl(2) PR_SET_PDEATHSIG. If rigbench died before this
                // line, the engine is already orphaned: it ends at once.
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
}

/// Note every descendant of process `p` in `tracked` while any is alive (a background task).
fn track_descendants(p: u32, tracked: Tracked) {
    let t = tracked;
    tokio::spawn(async move {
        // Every 250 ms for the first minute (start-up, when engines spawn their
        // workers), then every 2 s: a scan of /proc costs milliseconds of CPU.
        let began = Instant::now();
        loop {
            let all = tokio::task::spawn_blocking(super::ownership::all_processes)
                .await
                .ok()
                .flatten();
            let Some(all) = all else { break };
            let d = super::ownership::descendants(p, &all);
            if d.is_empty() {
                break;
            }
            if let Ok(mut m) = t.lock() {
                for x in d {
                    m.insert(x.pid, x);
                }
            }
            let every = if began.elapsed() < Duration::from_secs(60) {
                250
            } else {
                2000
            };
            tokio::time::sleep(Duration::from_millis(every)).await;
        }
    });
}

/// Read the child's stdout and stderr into `log` (background tasks); the receiver gets the
/// URL of the built-in engine's `rigbench serve ... listening on URL` line.
fn capture_output(
    child: &mut tokio::process::Child,
    log: &Arc<Mutex<LogBuffer>>,
) -> oneshot::Receiver<String> {
    let (url_tx, url_rx) = oneshot::channel::<String>();
    let mut url_tx = Some(url_tx);
    if let Some(out) = child.stdout.take() {
        let log = log.clone();
        tokio::spawn(async move {
            read_lines_lossy(out, |l| {
                if let Some(rest) = l.split("listening on ").nth(1) {
                    if l.contains("rigbench serve") {
                        if let Some(tx) = url_tx.take() {
                            let _ = tx.send(rest.trim().to_string());
                        }
                    }
                }
                if let Ok(mut b) = log.lock() {
                    b.push(l);
                }
            })
            .await;
        });
    }
    if let Some(err) = child.stderr.take() {
        let log = log.clone();
        tokio::spawn(async move {
            read_lines_lossy(err, |l| {
                if let Ok(mut b) = log.lock() {
                    b.push(l);
                }
            })
            .await;
        });
    }
    url_rx
}

/// Watcher: owns the child; reports its exit (an unexpected one stops the session with
/// [`StopCause::EngineFailed`] and the log tail); kills the group on request.
/// `via_shell`: the child is the `sh -c` running a compound command, so its status is the
/// shell's, and the description says so.
fn watch_child(
    mut child: tokio::process::Child,
    pid: Option<u32>,
    via_shell: bool,
    stop: &StopSignal,
    log: &Arc<Mutex<LogBuffer>>,
) -> (oneshot::Sender<()>, watch::Receiver<Option<String>>) {
    let (kill_tx, mut kill_rx) = oneshot::channel::<()>();
    let (exit_tx, exit_rx) = watch::channel::<Option<String>>(None);
    let stop_w = stop.clone();
    let log_w = log.clone();
    tokio::spawn(async move {
        let expected;
        let status = tokio::select! {
            s = child.wait() => { expected = false; s }
            _ = &mut kill_rx => {
                expected = true;
                if let Some(pid) = pid { signal_group(pid, libc::SIGTERM); } else { let _ = child.start_kill(); }
                match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                    Ok(s) => s,
                    Err(_) => {
                        if let Some(pid) = pid { signal_group(pid, libc::SIGKILL); }
                        let _ = child.start_kill();
                        child.wait().await
                    }
                }
            }
        };
        let mut desc = match status {
            Ok(s) => format!("exited with {s}"),
            Err(e) => format!("could not be waited for: {e}"),
        };
        if via_shell {
            desc.push_str(" (the status of the `sh -c` that ran the command, which may not be the engine's own: only one simple command is run with `exec`, giving the engine's)");
        }
        if !expected {
            // Give the log readers a moment to drain the last lines.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let tail = log_w
                .lock()
                .map(|l| l.last_lines(10).join(" | "))
                .unwrap_or_default();
            stop_w.trigger(StopCause::EngineFailed(format!(
                "the engine process {desc} (last log lines: {tail})"
            )));
        }
        let _ = exit_tx.send(Some(desc));
    });
    (kill_tx, exit_rx)
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // An error path that never called `stop`: leave no process of the group behind.
        if let Some(pid) = self.pid {
            if crate::signals::group_alive(pid) {
                track_now(&self.tracked, pid);
                signal_group(pid, libc::SIGKILL);
            }
            if let Some(tag) = &self.tag {
                track_tagged(&self.tracked, tag);
            }
            signal_strays(&self.tracked, pid, libc::SIGKILL);
            crate::signals::unregister_group(pid);
        }
    }
}

/// `exec COMMAND` when `command` is one simple command (words, quotes and `VAR=value`
/// prefixes; no `;`, `&`, `|`, redirection, subshell, substitution or newline), so that `sh -c`
/// becomes the engine instead of staying its parent: a shell that does not exec its last
/// command (dash, Debian's and Ubuntu's `sh`) otherwise dies of the SIGTERM meant for the
/// engine, and the engine's own exit status (llama-server: 0 after a graceful stop) is lost.
/// A command that already starts with `exec` is returned as it is. `None` for anything else
/// (a compound command, a builtin, a comment), which runs as given.
pub fn exec_form(command: &str) -> Option<String> {
    let blank = |ch: char| ch == ' ' || ch == '\t';
    let c = command.trim_matches(blank);
    // Another whitespace (a newline, a non-breaking space) is not a word separator to sh.
    if c.contains(|ch: char| ";&|<>()`$\\{}".contains(ch) || (ch.is_whitespace() && !blank(ch))) {
        return None;
    }
    let words: Vec<&str> = c.split(blank).filter(|w| !w.is_empty()).collect();
    // `VAR=value cmd`: the assignments go before `exec`, which keeps them for the command.
    let n = words
        .iter()
        .take_while(|w| w.split_once('=').is_some_and(|(k, _)| is_name(k)))
        .count();
    let first = *words.get(n)?; // assignments only: nothing to exec
    if first == "exec" {
        return Some(c.to_string()); // already the engine
    }
    const NOT_A_PROGRAM: &[&str] = &[
        "if", "for", "while", "until", "case", "!", "time", "[", ".", "source", "eval", "command",
        "cd", "ulimit", "set", "export", "trap", "wait", "umask", "builtin",
    ];
    if NOT_A_PROGRAM.contains(&first)
        || first.starts_with('#')
        || words[..n].iter().any(|w| w.contains(['\'', '"']))
    {
        // A keyword or builtin, a comment, or a quoted value that may hold spaces.
        return None;
    }
    // Byte offset of the first word after the assignments.
    let mut off = 0;
    let mut rest = c;
    for _ in 0..n {
        let t = rest.trim_start_matches(blank);
        let w = t.split(blank).next().unwrap_or("");
        off += rest.len() - t.len() + w.len();
        rest = &t[w.len()..];
    }
    let (assign, cmd) = c.split_at(off);
    let assign = assign.trim_matches(blank);
    let cmd = cmd.trim_start_matches(blank);
    Some(if assign.is_empty() {
        format!("exec {cmd}")
    } else {
        format!("{assign} exec {cmd}")
    })
}

fn is_name(k: &str) -> bool {
    let mut ch = k.chars();
    ch.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && ch.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One line describing the engine (for messages).
pub fn describe(choice: &EngineChoice) -> String {
    match choice {
        EngineChoice::Builtin { args, .. } => format!("rigbench serve {}", args.join(" ")),
        EngineChoice::Command { command, .. } => command.clone(),
        EngineChoice::Url { url } => url.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simple_engine_command_is_execed_and_a_compound_one_is_not() {
        assert_eq!(
            exec_form("llama-server -m 'a b.gguf' -c 8192 --port 8080").as_deref(),
            Some("exec llama-server -m 'a b.gguf' -c 8192 --port 8080")
        );
        assert_eq!(
            exec_form("CUDA_VISIBLE_DEVICES=0 HF_HOME=/x vllm serve m").as_deref(),
            Some("CUDA_VISIBLE_DEVICES=0 HF_HOME=/x exec vllm serve m")
        );
        for already in ["exec vllm serve m", "A=1 exec vllm serve m"] {
            assert_eq!(exec_form(already).as_deref(), Some(already));
        }
        assert_eq!(
            exec_form("\tA=1\tvllm serve m ").as_deref(),
            Some("A=1 exec vllm serve m")
        );
        for compound in [
            "cd /x && vllm serve m",
            "vllm serve m 2>&1 | tee log",
            "vllm serve $MODEL",
            "eval vllm serve m",
            ". ./env.sh",
            "vllm\u{a0}serve m",
            "A=1",
            "A='x y' vllm serve m",
            "vllm serve m; echo done",
            "",
        ] {
            assert_eq!(exec_form(compound), None, "{compound}");
        }
    }

    #[test]
    fn a_startup_error_is_a_sentence_not_a_struct() {
        // vLLM's argparse error (fixture 06 of vllm-0.32.0-cpu): one line.
        let log = super::super::bootlog::BootLog::parse(
            "usage: vllm serve [model_tag] [options]\nvllm: error: unrecognized arguments: --no-such-flag\n",
        );
        let e = log.errors.first().expect("an error group");
        let s = startup_error_sentence(e);
        assert!(s.starts_with("log line"), "{s}");
        assert!(s.contains("--no-such-flag"), "{s}");
        assert!(!s.contains('{') && !s.contains("\"line\""), "{s}");
    }

    #[test]
    fn an_abnormal_end_is_found_in_the_log_tail() {
        let log = "srv  operator(): operator(): cleaning up before exit...\nReceived second interrupt, terminating immediately.\n";
        assert_eq!(
            abnormal_end(log).as_deref(),
            Some("line 2: Received second interrupt, terminating immediately.")
        );
        let abort = "ok\n/src/ggml.c:1234: GGML_ASSERT(n > 0) failed\nAborted (core dumped)\n";
        assert!(abnormal_end(abort)
            .unwrap()
            .starts_with("line 2: /src/ggml.c:1234: GGML_ASSERT"));
        assert_eq!(
            abnormal_end("srv  operator(): cleaning up before exit...\n"),
            None
        );
    }

    #[test]
    fn log_buffer_keeps_head_and_tail() {
        let mut b = LogBuffer::default();
        for i in 0..(HEAD + TAIL + 10) {
            b.push(format!("l{i}"));
        }
        let t = b.text();
        assert!(t.starts_with("l0\n"));
        assert!(t.contains("10 log lines not kept"));
        assert!(t.trim_end().ends_with(&format!("l{}", HEAD + TAIL + 9)));
        assert_eq!(
            b.last_lines(2),
            vec![
                format!("l{}", HEAD + TAIL + 8),
                format!("l{}", HEAD + TAIL + 9)
            ]
        );
    }

    #[tokio::test]
    async fn command_that_exits_reports_its_log() {
        let stop = StopSignal::new();
        let choice = EngineChoice::Command {
            command: "echo 'ERROR 01-01 00:00:00 [x.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'; exit 3".into(),
            url: "http://127.0.0.1:9".into(),
        };
        let e = EngineHandle::start(&choice, Duration::from_secs(20), &stop)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("exited during startup"), "{e}");
        // The startup error as a sentence with its log line, not the finding's record.
        assert!(
            e.contains("log line 1: CUDA out of memory: tried to allocate 2.00 GiB"),
            "{e}"
        );
        assert!(!stop.is_stopped() || matches!(stop.cause(), Some(StopCause::EngineFailed(_))));
    }

    #[tokio::test]
    async fn url_without_engine_names_the_flag() {
        let stop = StopSignal::new();
        let e = EngineHandle::start(
            &EngineChoice::Url {
                url: "http://127.0.0.1:9".into(),
            },
            Duration::from_secs(5),
            &stop,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("--url"), "{e}");
    }
}
