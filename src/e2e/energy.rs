//! Energy per token: GPU power sampled across a sweep point's measured window, integrated to
//! joules (docs/energy.md).
//!
//! A [`PowerSource`] gives the board power of the GPUs the engine runs on, in watts (NVML's
//! `nvmlDeviceGetPowerUsage`, summed over the devices, in [`NvmlPower`]; a scripted one in
//! [`MockPower`]). A [`PowerSampler`] reads it on its own thread every `interval` from the start
//! of the window to its end. [`integrate`] applies the trapezoid rule between samples; the time
//! before the first and after the last sample is not covered, and `coverage` says which share
//! of the window the samples span (a window shorter than one interval covers little: then the
//! figure is flagged, not extrapolated). Per token: J / output token, J / total token (prompt +
//! output, as the engine reported them), and output tokens per joule.
//!
//! Limits: NVML's power reading is itself averaged by the driver over about a second on most
//! boards (instantaneous on some, see NVML's `nvmlDeviceGetPowerUsage` notes), so windows of a
//! few seconds are the shortest that mean much; the whole board is counted (idle power and
//! other processes on the same GPU included); the host's CPU and memory are not. Where no GPU
//! power can be read for the engine (no NVML, a CPU-only engine, an engine on another host) the
//! sweep point says `energy_unknown` with the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Something that reads power, watts.
pub trait PowerSource: Send {
    /// The power now, watts (summed over the devices read).
    ///
    /// # Errors
    /// Why no reading came back.
    fn watts(&mut self) -> Result<f64, String>;
    /// What is read (`NVML, GPUs 0,1`).
    fn describe(&self) -> String;
}

/// NVML board power of some GPUs (`nvmlDeviceGetPowerUsage`, milliwatts, summed).
pub struct NvmlPower {
    nvml: nvml_wrapper::Nvml,
    indices: Vec<u32>,
}

impl NvmlPower {
    /// Load NVML and check that every device in `indices` (all devices when empty) gives a power
    /// reading.
    ///
    /// # Errors
    /// Why not: no NVML library (no NVIDIA driver: a CPU-only host), no device, or a device
    /// without power readings.
    pub fn open(indices: &[u32]) -> Result<Self, String> {
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| nvml_wrapper::Nvml::init())
            .map_err(|e| format!("NVML cannot be loaded ({e}): no NVIDIA driver on this host"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML gives no device count: {e}"))?;
        if count == 0 {
            return Err("NVML sees no GPU on this host".into());
        }
        let indices: Vec<u32> = if indices.is_empty() {
            (0..count).collect()
        } else {
            indices.to_vec()
        };
        let mut me = Self { nvml, indices };
        me.watts()?;
        Ok(me)
    }
}

impl PowerSource for NvmlPower {
    fn watts(&mut self) -> Result<f64, String> {
        let mut total = 0.0;
        for &i in &self.indices {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(|e| format!("NVML device {i}: {e}"))?;
            let mw = d
                .power_usage()
                .map_err(|e| format!("NVML device {i} gives no power reading: {e}"))?;
            total += f64::from(mw) / 1e3;
        }
        Ok(total)
    }

    fn describe(&self) -> String {
        let ids: Vec<String> = self.indices.iter().map(u32::to_string).collect();
        format!(
            "NVML nvmlDeviceGetPowerUsage, GPU{} {}",
            if ids.len() == 1 { "" } else { "s" },
            ids.join(",")
        )
    }
}

/// A scripted power source for tests: watts as a function of the time since it was made.
pub struct MockPower {
    t0: Instant,
    f: Box<dyn Fn(f64) -> f64 + Send>,
}

impl MockPower {
    /// `f(seconds since now)` watts.
    pub fn new(f: impl Fn(f64) -> f64 + Send + 'static) -> Self {
        Self {
            t0: Instant::now(),
            f: Box::new(f),
        }
    }
}

impl PowerSource for MockPower {
    fn watts(&mut self) -> Result<f64, String> {
        Ok((self.f)(self.t0.elapsed().as_secs_f64()))
    }
    fn describe(&self) -> String {
        "mock".into()
    }
}

/// One power sample: seconds since the window started, watts.
pub type Sample = (f64, f64);

/// Energy of a sweep point (`energy` in results.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Energy {
    /// Joules over the covered part of the window (trapezoid rule).
    pub joules: f64,
    /// Joules per output token (Σ output tokens of completed requests).
    pub j_per_output_token: Option<f64>,
    /// Joules per total token (prompt + output, as the engine reported them).
    pub j_per_total_token: Option<f64>,
    /// Output tokens per joule.
    pub output_tokens_per_j: Option<f64>,
    /// Mean power over the covered span, watts.
    pub mean_w: f64,
    /// Share of the window the samples span (first to last sample / window).
    pub coverage: f64,
    /// Samples taken.
    pub samples: usize,
    /// Samples per second actually reached.
    pub sample_rate_hz: f64,
    /// The window, seconds.
    pub window_s: f64,
    /// What was read.
    pub source: String,
}

/// Integrate `samples` (time-ordered) over a window of `window_s` seconds: `(joules, covered
/// seconds)`. Trapezoid rule between successive samples; nothing outside the first and last.
pub fn integrate(samples: &[Sample]) -> (f64, f64) {
    let mut j = 0.0;
    for w in samples.windows(2) {
        let dt = (w[1].0 - w[0].0).max(0.0);
        j += dt * (w[0].1 + w[1].1) / 2.0;
    }
    let covered = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => (b.0 - a.0).max(0.0),
        _ => 0.0,
    };
    (j, covered)
}

impl Energy {
    /// From the samples of a window of `window_s` seconds and the tokens it produced.
    /// `None` with fewer than two samples.
    pub fn of(
        samples: &[Sample],
        window_s: f64,
        output_tokens: u64,
        total_tokens: Option<u64>,
        source: &str,
    ) -> Option<Self> {
        if samples.len() < 2 || window_s <= 0.0 {
            return None;
        }
        let (joules, covered) = integrate(samples);
        let per = |t: u64| (t > 0).then(|| joules / t as f64);
        Some(Self {
            joules,
            j_per_output_token: per(output_tokens),
            j_per_total_token: total_tokens.and_then(per),
            output_tokens_per_j: (joules > 0.0).then(|| output_tokens as f64 / joules),
            mean_w: if covered > 0.0 { joules / covered } else { 0.0 },
            coverage: (covered / window_s).clamp(0.0, 1.0),
            samples: samples.len(),
            sample_rate_hz: if covered > 0.0 {
                (samples.len() - 1) as f64 / covered
            } else {
                0.0
            },
            window_s,
            source: source.to_string(),
        })
    }
}

/// What [`PowerSampler::finish`] returns: the samples, the window's length in seconds, the first
/// reading error (if any), and the source for the next window.
pub type Finished = (
    Vec<Sample>,
    f64,
    Option<String>,
    Option<Box<dyn PowerSource>>,
);

/// Samples a [`PowerSource`] on its own thread until [`PowerSampler::finish`].
pub struct PowerSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    errors: Arc<Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<Box<dyn PowerSource>>>,
    t0: Instant,
    describe: String,
}

impl PowerSampler {
    /// Start sampling `source` every `interval` (the first sample at once).
    pub fn start(mut source: Box<dyn PowerSource>, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(None));
        let t0 = Instant::now();
        let describe = source.describe();
        let (s, v, e) = (stop.clone(), samples.clone(), errors.clone());
        let thread = std::thread::spawn(move || {
            let mut next = t0;
            loop {
                let now = Instant::now();
                match source.watts() {
                    Ok(w) => {
                        if let Ok(mut v) = v.lock() {
                            v.push((now.duration_since(t0).as_secs_f64(), w));
                        }
                    }
                    Err(m) => {
                        if let Ok(mut e) = e.lock() {
                            e.get_or_insert(m);
                        }
                    }
                }
                if s.load(Ordering::SeqCst) {
                    break;
                }
                next += interval;
                // Sleep in short steps so `finish` takes its last sample promptly.
                while Instant::now() < next && !s.load(Ordering::SeqCst) {
                    std::thread::sleep((next - Instant::now()).min(Duration::from_millis(5)));
                }
            }
            source
        });
        Self {
            stop,
            samples,
            errors,
            thread: Some(thread),
            t0,
            describe,
        }
    }

    /// Stop (one last sample is taken at once), returning the samples, the window's length in
    /// seconds, the first reading error (if any), and the source for the next window.
    pub fn finish(mut self) -> Finished {
        let window = self.t0.elapsed().as_secs_f64();
        self.stop.store(true, Ordering::SeqCst);
        let source = self.thread.take().and_then(|t| t.join().ok());
        let samples = self.samples.lock().map(|v| v.clone()).unwrap_or_default();
        let err = self.errors.lock().ok().and_then(|e| e.clone());
        (samples, window, err, source)
    }

    /// What is read.
    pub fn describe(&self) -> &str {
        &self.describe
    }
}

/// Makes a power source for a session.
pub type PowerFactory = std::sync::Arc<dyn Fn() -> Box<dyn PowerSource> + Send + Sync>;

/// Where a session's power readings come from.
#[derive(Clone, Default)]
pub enum PowerChoice {
    /// NVML on this host, when the engine runs here on a GPU (see [`choose`]).
    #[default]
    Auto,
    /// No energy figures (stated as unknown: "not asked for").
    Off,
    /// A given source (tests: [`MockPower`]).
    Source(PowerFactory),
}

impl std::fmt::Debug for PowerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PowerChoice::Auto => "PowerChoice::Auto",
            PowerChoice::Off => "PowerChoice::Off",
            PowerChoice::Source(_) => "PowerChoice::Source",
        })
    }
}

/// Whether `url`'s host is this machine (loopback or `localhost`).
pub fn is_local_url(url: &str) -> bool {
    match reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    {
        Some(h) => {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
        }
        None => false,
    }
}

/// The power source for an engine at `url` (`cpu_backend`: the built-in runtime said it runs on
/// the CPU), or why there is none: the reason `energy_unknown` states.
///
/// # Errors
/// The reason: not asked for, a remote engine, a CPU-only engine, or NVML unavailable.
pub fn choose(
    choice: &PowerChoice,
    url: &str,
    cpu_backend: bool,
) -> Result<Box<dyn PowerSource>, String> {
    match choice {
        PowerChoice::Off => Err("energy not measured (turned off)".into()),
        PowerChoice::Source(f) => Ok(f()),
        PowerChoice::Auto if !is_local_url(url) => Err(format!(
            "the engine at {} runs on another host: NVML here reads only this host's GPUs",
            crate::output::redact::Redactor::for_this_host(true).secrets_only(url)
        )),
        PowerChoice::Auto if cpu_backend => Err(
            "the engine runs on the CPU backend: NVML reads GPU power only (no CPU energy counter is read)"
                .into(),
        ),
        PowerChoice::Auto => {
            let p = NvmlPower::open(&[]).map_err(|e| format!("no GPU power reading: {e}"))?;
            Ok(Box::new(p))
        }
    }
}

/// The default sampling interval: 100 ms (10 Hz).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trapezoid_is_exact_for_a_ramp() {
        let s: Vec<Sample> = (0..=10)
            .map(|i| (i as f64 * 0.1, 100.0 + 50.0 * i as f64 * 0.1))
            .collect();
        let (j, c) = integrate(&s);
        assert!((j - 125.0 * 1.0).abs() < 1e-9, "{j}");
        assert!((c - 1.0).abs() < 1e-12);
        let e = Energy::of(&s, 2.0, 100, Some(300), "x").unwrap();
        assert!((e.coverage - 0.5).abs() < 1e-12);
        assert!((e.j_per_output_token.unwrap() - 1.25).abs() < 1e-9);
        assert!((e.j_per_total_token.unwrap() - 125.0 / 300.0).abs() < 1e-9);
        assert!(Energy::of(&s[..1], 1.0, 1, None, "x").is_none());
    }

    #[test]
    fn no_power_for_a_remote_engine_or_when_turned_off() {
        let e = choose(&PowerChoice::Auto, "http://10.1.2.3:8000", false)
            .err()
            .unwrap();
        assert!(e.contains("another host"), "{e}");
        let e = choose(&PowerChoice::Auto, "http://127.0.0.1:8000", true)
            .err()
            .unwrap();
        assert!(e.contains("CPU backend"), "{e}");
        assert!(choose(&PowerChoice::Off, "http://127.0.0.1:1", false).is_err());
        assert!(is_local_url("http://localhost:8000") && is_local_url("http://[::1]:8000"));
        assert!(!is_local_url("https://api.example.com"));
    }

    #[test]
    fn a_mock_source_integrates_to_the_known_joules_within_one_percent() {
        // 200 W + 100 W·sin(2πt), over 1.5 s: ∫ = 300 J + 100/(2π)·(1 − cos 3π) = 300 + 31.83 J.
        let src = MockPower::new(|t| 200.0 + 100.0 * (2.0 * std::f64::consts::PI * t).sin());
        let sampler = PowerSampler::start(Box::new(src), Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(1500));
        let (samples, window, err, _) = sampler.finish();
        assert!(err.is_none());
        let e = Energy::of(&samples, window, 1000, None, "mock").unwrap();
        // The known energy over the span the samples cover.
        let (a, b) = (samples[0].0, samples.last().unwrap().0);
        let exact = |t: f64| {
            200.0 * t
                - 100.0 / (2.0 * std::f64::consts::PI) * (2.0 * std::f64::consts::PI * t).cos()
        };
        let known = exact(b) - exact(a);
        assert!(
            (e.joules - known).abs() / known < 0.01,
            "{} vs {known}",
            e.joules
        );
        assert!(e.coverage > 0.95, "{}", e.coverage);
        assert!(e.sample_rate_hz > 20.0, "{}", e.sample_rate_hz);
    }
}
