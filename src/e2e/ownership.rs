//! Which processes an engine that rigbench started consists of, and whether the server that
//! answers on its port is one of them (docs/reliability.md, "Engines rigbench starts").
//!
//! Linux only, read from `/proc`: `/proc/PID/stat` (parent, process group, start time),
//! `/proc/net/tcp` and `/proc/net/tcp6` (listening sockets: state `0A`, local port in hex, the
//! socket's inode) and `/proc/PID/fd/*` (links `socket:[INODE]`). Where `/proc` cannot be read
//! the answers are `None` and the callers say that the check could not be made.

use std::collections::{BTreeMap, BTreeSet};

/// One process as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Process group id.
    pub pgrp: u32,
    /// Session id.
    pub session: u32,
    /// Start time after boot, clock ticks (field 22): with the pid, names one process even
    /// after the pid is reused.
    pub start: u64,
    /// Exited, not reaped (state `Z` or `X`).
    pub zombie: bool,
}

/// Parse `/proc/PID/stat` (`pid (comm) state ppid pgrp session … starttime …`; comm may hold
/// spaces and parentheses, so fields are counted after the last `)`).
pub fn parse_stat(pid: u32, stat: &str) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After comm: state(0) ppid(1) pgrp(2) session(3) … starttime is field 22 overall, 19 here.
    Some(ProcStat {
        pid,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
        zombie: matches!(*f.first()?, "Z" | "X"),
    })
}

/// Every process of this machine, from `/proc`; `None` without `/proc`.
pub fn all_processes() -> Option<Vec<ProcStat>> {
    let rd = std::fs::read_dir("/proc").ok()?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(s) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|t| parse_stat(pid, &t))
        {
            out.push(s);
        }
    }
    Some(out)
}

/// The live descendants of `root` (children, their children, …), `root` included when alive.
pub fn descendants(root: u32, all: &[ProcStat]) -> Vec<ProcStat> {
    let mut children: BTreeMap<u32, Vec<&ProcStat>> = BTreeMap::new();
    for p in all {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out: Vec<ProcStat> = all
        .iter()
        .filter(|p| p.pid == root && !p.zombie)
        .copied()
        .collect();
    let mut todo = vec![root];
    let mut seen = BTreeSet::new();
    while let Some(p) = todo.pop() {
        if !seen.insert(p) {
            continue;
        }
        for c in children.get(&p).into_iter().flatten() {
            if !c.zombie {
                out.push(**c);
            }
            todo.push(c.pid);
        }
    }
    out
}

/// The live processes among `all` whose environment holds `entry` (`NAME=value`, read from
/// `/proc/PID/environ`; another user's processes cannot be read and are left out). An engine
/// rigbench starts carries a tag of its own in its environment ([`ENGINE_TAG_ENV`]), which
/// every process it starts inherits: so one that detached and whose parent exited before any
/// scan saw it as a descendant (`setsid -f`, a daemon's double fork) is still found.
pub fn with_env(all: &[ProcStat], entry: &str) -> Vec<ProcStat> {
    let needle = entry.as_bytes();
    all.iter()
        .filter(|p| !p.zombie)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle))
        })
        .copied()
        .collect()
}

/// The environment variable that tags an engine's processes (see [`with_env`]).
pub const ENGINE_TAG_ENV: &str = "RIGBENCH_ENGINE_TAG";

/// Whether the process `pid` started at `start` is still alive (not a zombie, pid not reused).
pub fn same_process_alive(pid: u32, start: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| parse_stat(pid, &t))
        .is_some_and(|s| s.start == start && !s.zombie)
}

/// The inodes of the sockets listening on TCP `port` (IPv4 and IPv6), from the text of
/// `/proc/net/tcp` and `/proc/net/tcp6` (`sl local_address rem_address st … inode`; the address
/// is `HEXIP:HEXPORT`, state `0A` is LISTEN).
pub fn listening_inodes(tables: &[&str], port: u16) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for t in tables {
        for line in t.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let p = f[1]
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if p == Some(port) {
                if let Ok(inode) = f[9].parse::<u64>() {
                    if inode != 0 {
                        out.insert(inode);
                    }
                }
            }
        }
    }
    out
}

/// Who listens on TCP `port` on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortOwner {
    /// Nothing listens there.
    Free,
    /// These processes hold a listening socket on the port.
    Pids(Vec<u32>),
    /// Something listens, but its process could not be found (another user's, or another
    /// network namespace's).
    Unknown,
    /// `/proc/net/tcp` cannot be read: no answer.
    Unreadable,
}

/// Who listens on TCP `port` (see [`PortOwner`]).
pub fn port_owner(port: u16) -> PortOwner {
    let v4 = std::fs::read_to_string("/proc/net/tcp");
    let v6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let Ok(v4) = v4 else {
        return PortOwner::Unreadable;
    };
    let inodes = listening_inodes(&[&v4, &v6], port);
    if inodes.is_empty() {
        return PortOwner::Free;
    }
    let mut pids = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
                continue;
            };
            let holds = fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .ok()
                    .and_then(|l| {
                        l.to_str()
                            .and_then(|s| s.strip_prefix("socket:["))
                            .and_then(|s| s.strip_suffix(']'))
                            .and_then(|s| s.parse::<u64>().ok())
                    })
                    .is_some_and(|i| inodes.contains(&i))
            });
            if holds {
                pids.push(pid);
            }
        }
    }
    if pids.is_empty() {
        PortOwner::Unknown
    } else {
        PortOwner::Pids(pids)
    }
}

/// The host and port of an `http://host:port/...` URL (port 80 / 443 by scheme when absent).
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let u = reqwest::Url::parse(url).ok()?;
    Some((u.host_str()?.to_string(), u.port_or_known_default()?))
}

/// Whether a connection to `host` stays on this machine, so that the listener answering it is
/// in this machine's `/proc`: `localhost` and `*.localhost` (RFC 6761 §6.3), any address of
/// 127.0.0.0/8 or `::1` (RFC 1122 §3.2.1.3, RFC 4291 §2.5.3), also IPv4-mapped
/// (`::ffff:127.0.0.1`), and the unspecified `0.0.0.0` / `::`, which connect locally. IPv6
/// literals may keep their URL brackets. The machine's own non-loopback addresses are not
/// recognised.
pub fn is_local_host(host: &str) -> bool {
    let h = host.trim_matches(['[', ']']).to_ascii_lowercase();
    h == "localhost"
        || h.ends_with(".localhost")
        || h.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            let ip = ip.to_canonical();
            ip.is_loopback() || ip.is_unspecified()
        })
}

/// Whether a server already accepts connections at `host:port` (tried for at most 1 s), or
/// `/proc/net/tcp` shows a listener on `port` when `host` is local ([`is_local_host`]: a server
/// bound to 0.0.0.0 answers there too).
pub fn port_in_use(host: &str, port: u16) -> Option<String> {
    use std::net::ToSocketAddrs;
    if is_local_host(host) {
        if let PortOwner::Pids(p) = port_owner(port) {
            return Some(format!(
                "a server is already listening on port {port} (process {})",
                p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let addrs = (host.trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .ok()?;
    for a in addrs {
        if std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok() {
            return Some(format!(
                "a server already accepts connections at {host}:{port}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_tcp_tables_parse() {
        let s = parse_stat(
            42,
            "42 (my (odd) name) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0",
        )
        .unwrap();
        assert_eq!(
            (s.ppid, s.pgrp, s.session, s.start, s.zombie),
            (7, 42, 42, 123456, false)
        );
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555 1 0\n\
   1: 0100007F:1F91 00000000:0000 01 00000000:00000000 00:00000000 00000000  1000        0 556 1 0\n\
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 557 1 0\n";
        assert_eq!(
            listening_inodes(&[tcp], 8080),
            [555, 557].into_iter().collect()
        );
        assert!(
            listening_inodes(&[tcp], 8081).is_empty(),
            "8081 is not listening"
        );
    }

    #[test]
    fn every_loopback_address_is_local() {
        for h in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.0.0.2",
            "127.255.255.254",
            "::1",
            "[::1]",
            "0.0.0.0",
            "[::]",
            "[::ffff:127.0.0.1]",
            "app.localhost",
        ] {
            assert!(is_local_host(h), "{h}");
        }
        for h in [
            "10.0.0.1",
            "128.0.0.1",
            "example.com",
            "[2001:db8::1]",
            "",
            "localhost.example",
        ] {
            assert!(!is_local_host(h), "{h}");
        }
    }

    #[test]
    fn this_process_is_its_own_descendant_and_owns_its_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        assert_eq!(port_owner(port), PortOwner::Pids(vec![me]));
        assert!(port_in_use("127.0.0.1", port).is_some());
        let all = all_processes().expect("/proc");
        assert!(descendants(me, &all).iter().any(|p| p.pid == me));
        drop(l);
        assert_eq!(port_owner(port), PortOwner::Free);
    }
}
