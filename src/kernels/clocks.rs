//! SM clock and throttle reasons polled while cases are sampled (docs/gate.md): a background thread
//! reads NVML (through [`crate::rig::telemetry::TelemetryReader`]) every few milliseconds for the
//! whole bench and keeps time-stamped readings; each case then takes the readings of its own
//! sampling window ([`ClockMonitor::window`]) as min / median / max SM clock and every harmful
//! throttle reason seen ([`ClockStats`]). Peer cases, timed by a Python process, carry their
//! own wall-clock windows and are matched the same way.
//!
//! The poller touches NVML only (never CUDA), so it does not disturb the timed stream; NVML
//! reads cost tens of microseconds of one host core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::schema::ClockStats;
use crate::rig::telemetry::Telemetry;

/// Poll interval with NVML.
pub const NVML_INTERVAL: Duration = Duration::from_millis(20);
/// Poll interval when only `nvidia-smi` answers (each read starts a process).
pub const SMI_INTERVAL: Duration = Duration::from_millis(500);

/// One poll: when (Unix seconds), SM clock and the harmful throttle reasons active.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockReading {
    /// Wall-clock time of the reading, seconds since the Unix epoch.
    pub at_unix_s: f64,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Harmful throttle reasons (see [`Telemetry::harmful_throttle_reasons`]).
    pub throttle: Vec<String>,
}

impl ClockReading {
    /// A reading from telemetry taken at `at_unix_s`.
    pub fn from_telemetry(t: &Telemetry, at_unix_s: f64) -> Self {
        Self {
            at_unix_s,
            sm_clock_mhz: t.sm_clock_mhz,
            throttle: t.harmful_throttle_reasons(),
        }
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Summarize readings (any order) into [`ClockStats`]; `source` says where they came from.
pub fn summarize(readings: &[&ClockReading], source: &str) -> ClockStats {
    let mut mhz: Vec<u32> = readings.iter().filter_map(|r| r.sm_clock_mhz).collect();
    mhz.sort_unstable();
    let mut seen: Vec<String> = readings
        .iter()
        .flat_map(|r| r.throttle.iter().cloned())
        .collect();
    seen.sort();
    seen.dedup();
    ClockStats {
        readings: readings.len(),
        min_mhz: mhz.first().copied(),
        // Lower median for an even count: a clock that was there, not an average.
        median_mhz: (!mhz.is_empty()).then(|| mhz[(mhz.len() - 1) / 2]),
        max_mhz: mhz.last().copied(),
        throttle_seen: seen,
        source: source.to_string(),
    }
}

/// The readings of the window `[t0, t1]` (Unix seconds), widened by `slack` seconds on each side
/// so that a case shorter than the poll interval still gets the readings around it.
pub fn in_window(readings: &[ClockReading], t0: f64, t1: f64, slack: f64) -> Vec<&ClockReading> {
    readings
        .iter()
        .filter(|r| r.at_unix_s >= t0 - slack && r.at_unix_s <= t1 + slack)
        .collect()
}

/// A background poller of the SM clock and throttle reasons; stops when dropped.
pub struct ClockMonitor {
    readings: Arc<Mutex<Vec<ClockReading>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    interval: Duration,
    source: String,
}

impl ClockMonitor {
    /// Start polling `read` every `interval` on a new thread (a first reading is taken at once).
    /// `source` names the reader for the report (e.g. `nvml`).
    pub fn start<F>(read: F, interval: Duration, source: &str) -> Self
    where
        F: Fn() -> Option<ClockReading> + Send + 'static,
    {
        let readings = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r2, s2) = (readings.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("rigbench-clocks".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    if let Some(r) = read() {
                        if let Ok(mut v) = r2.lock() {
                            v.push(r);
                        }
                    }
                    std::thread::sleep(interval);
                }
            })
            .ok();
        Self {
            readings,
            stop,
            handle,
            interval,
            source: format!("{source}, polled every {} ms", interval.as_millis()),
        }
    }

    /// A monitor over the telemetry of GPU `index` (NVML's numbering; see
    /// [`ClockMonitor::for_reader`]).
    pub fn for_gpu(index: u32) -> Self {
        Self::for_reader(crate::rig::telemetry::TelemetryReader::new(index))
    }

    /// A monitor over `reader`: NVML every [`NVML_INTERVAL`], or `nvidia-smi` every
    /// [`SMI_INTERVAL`] when NVML cannot be loaded.
    pub fn for_reader(reader: crate::rig::telemetry::TelemetryReader) -> Self {
        let (interval, source) = if reader.has_nvml() {
            (NVML_INTERVAL, "nvml")
        } else {
            (SMI_INTERVAL, "nvidia-smi")
        };
        Self::start(
            move || {
                reader
                    .read()
                    .map(|t| ClockReading::from_telemetry(&t, unix_now()))
            },
            interval,
            source,
        )
    }

    /// The clock statistics of the window `[t0, t1]` (Unix seconds, from [`unix_now`]); `None`
    /// when no reading fell in it (no NVML and no `nvidia-smi`).
    pub fn window(&self, t0: f64, t1: f64) -> Option<ClockStats> {
        let v = self.readings.lock().ok()?;
        let w = in_window(&v, t0, t1, self.interval.as_secs_f64());
        (!w.is_empty()).then(|| summarize(&w, &self.source))
    }
}

impl Drop for ClockMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(at: f64, mhz: u32, throttle: &[&str]) -> ClockReading {
        ClockReading {
            at_unix_s: at,
            sm_clock_mhz: Some(mhz),
            throttle: throttle.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn summary_of_a_window() {
        let v = vec![
            r(10.0, 1980, &[]),
            r(10.1, 1755, &["sw_power_cap"]),
            r(10.2, 1980, &[]),
            r(10.3, 1830, &["sw_power_cap", "hw_slowdown"]),
            r(20.0, 900, &["hw_thermal_slowdown"]),
        ];
        let w = in_window(&v, 10.05, 10.25, 0.0);
        assert_eq!(w.len(), 2);
        let s = summarize(&in_window(&v, 10.0, 10.3, 0.0), "test");
        assert_eq!(s.readings, 4);
        assert_eq!(
            (s.min_mhz, s.median_mhz, s.max_mhz),
            (Some(1755), Some(1830), Some(1980))
        );
        assert_eq!(s.throttle_seen, vec!["hw_slowdown", "sw_power_cap"]);
        // A short window widened by the slack gets its neighbours.
        assert_eq!(in_window(&v, 10.14, 10.16, 0.05).len(), 2);
        let empty = summarize(&[], "x");
        assert_eq!((empty.readings, empty.median_mhz), (0, None));
    }

    #[test]
    fn monitor_polls_during_a_window_and_stops() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c2 = calls.clone();
        let m = ClockMonitor::start(
            move || {
                let i = c2.fetch_add(1, Ordering::Relaxed);
                Some(r(unix_now(), 1000 + i as u32, &[]))
            },
            Duration::from_millis(1),
            "fake",
        );
        let t0 = unix_now();
        // Wait until a few readings exist (no dependence on this machine's speed beyond that).
        while calls.load(Ordering::Relaxed) < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t1 = unix_now();
        let s = m.window(t0, t1).expect("readings in the window");
        assert!(s.readings >= 1, "{s:?}");
        assert!(s.min_mhz.unwrap() >= 1000 && s.source.contains("fake"));
        drop(m);
        let after = calls.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(calls.load(Ordering::Relaxed), after, "stopped on drop");
    }
}
