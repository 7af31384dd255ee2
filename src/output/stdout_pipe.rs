//! A standard output whose reader may go away (`rigbench compare … | head -1`).
//!
//! Rust ignores SIGPIPE, so a write to a pipe nobody reads any more fails with `EPIPE`, and
//! `println!` panics on that failure ("failed printing to stdout"): the command ended with
//! status 101 in the middle of its work, and `compare`'s verdict code (0, 2, 3) was lost.
//!
//! [`guard`] puts a pipe of rigbench's own in front of file descriptor 1 when it is a pipe or a
//! socket (a terminal or a file cannot lose its reader), and a thread copies that pipe to the
//! real output. When the real output's reader is gone, the thread reads on and drops what it
//! reads, so every write of the command (and of a child that inherited descriptor 1) succeeds,
//! the command runs to its end and exits with the status it would have had.
//! [`StdoutGuard::finish`] flushes, closes rigbench's end and waits until the copy is done.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The copy thread of [`guard`]; [`Self::finish`] ends it.
#[derive(Debug)]
pub struct StdoutGuard {
    thread: Option<std::thread::JoinHandle<()>>,
    done: std::sync::mpsc::Receiver<()>,
    reader_gone: Arc<AtomicBool>,
}

fn is_pipe_or_socket(fd: i32) -> bool {
    // SAFETY: `libc::stat` is a plain C struct of integers, for which all-zero bytes are a
    // valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat(2) only writes the struct behind the pointer, which is valid for writes;
    // a bad descriptor is an error return, not undefined behaviour.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    let kind = st.st_mode & libc::S_IFMT;
    kind == libc::S_IFIFO || kind == libc::S_IFSOCK
}

/// Put the copy pipe in front of standard output when it is a pipe or a socket; `None` (nothing
/// changed) otherwise, or when a pipe or thread cannot be made (then output goes straight out
/// as before).
pub fn guard() -> Option<StdoutGuard> {
    if !is_pipe_or_socket(1) {
        return None;
    }
    let mut fds = [0i32; 2];
    // SAFETY: pipe2(2) writes two descriptors into `fds`; O_CLOEXEC keeps both ends out of
    // children (descriptor 1, set below with dup2, is inherited as a standard output must be).
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: dup(2) of descriptor 1; the new descriptor is owned below.
    let real = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if real < 0 {
        // SAFETY: closing the two fresh pipe ends we own.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return None;
    }
    // SAFETY: each descriptor is fresh and owned by exactly one OwnedFd.
    let (read_end, real) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(real)) };
    let _ = std::io::stdout().flush();
    // SAFETY: dup2(2) makes descriptor 1 the pipe's write end; then the original write end is
    // closed (descriptor 1 keeps the pipe open).
    unsafe {
        if libc::dup2(fds[1], 1) < 0 {
            libc::close(fds[1]);
            let _ = libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&real), 1);
            return None;
        }
        libc::close(fds[1]);
    }
    let reader_gone = Arc::new(AtomicBool::new(false));
    let gone = reader_gone.clone();
    let (tx, done) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("rigbench-stdout".into())
        .spawn(move || {
            let mut from = std::fs::File::from(read_end);
            let mut to = std::fs::File::from(real);
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if !gone.load(Ordering::Relaxed) && to.write_all(&buf[..n]).is_err() {
                    // The reader went away (EPIPE) or the output failed: drop the rest.
                    gone.store(true, Ordering::Relaxed);
                }
            }
            let _ = tx.send(());
        });
    match thread {
        Ok(t) => Some(StdoutGuard {
            thread: Some(t),
            done,
            reader_gone,
        }),
        Err(_) => None,
    }
}

impl StdoutGuard {
    /// Whether the real output's reader went away (what was written after that was dropped).
    pub fn reader_gone(&self) -> bool {
        self.reader_gone.load(Ordering::Relaxed)
    }

    /// Flush standard output, close rigbench's end of the copy pipe (descriptor 1 then points to
    /// `/dev/null`) and wait until everything written was copied, at most `wait`: a child that
    /// inherited descriptor 1 and still runs keeps the pipe open, and is not waited for.
    pub fn finish(mut self, wait: Duration) {
        let _ = std::io::stdout().flush();
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            // SAFETY: dup2(2) replaces descriptor 1 (our pipe's write end) with /dev/null.
            unsafe {
                libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1);
            }
        }
        if self.done.recv_timeout(wait).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}
