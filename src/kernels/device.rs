//! The kernel bench's device seam: the few things its timing loops ask of a GPU (wait, flush L2,
//! record the two events around a sample, read a clock), as the trait [`TimingDevice`], so that
//! the loops themselves (warm-up, the stopping rule, the cold-L2 flush before every sample, the
//! per-launch division of a graph's time, the graph's plan of weight copies and its check) are
//! tested on the CPU with a mock device, as the tuner is ([`crate::gemm::tuner`]).
//!
//! [`GpuTiming`] is the real device: CUDA events on one stream ([`crate::gpu::Timer`]) and the
//! L2 flush of `kernels/util.cu` ([`crate::gpu::L2Flusher`]).

use std::time::Instant;

use anyhow::Context;

use super::schema::{GraphSetup, Timing};
use crate::gpu::{Gpu, L2Flusher, Module, Timer};
use crate::stats::{StopReason, StoppingRule, Summary};

/// What the timing loops ask of a device.
pub trait TimingDevice {
    /// Wait until the work queued so far has finished.
    ///
    /// # Errors
    /// The device reports a failure (of this call or of queued work).
    fn sync(&self) -> anyhow::Result<()>;
    /// Evict L2 (queued before the next sample's start event), for cold timing.
    ///
    /// # Errors
    /// The flush could not be queued.
    fn flush_l2(&self) -> anyhow::Result<()>;
    /// Record the start event of a sample.
    ///
    /// # Errors
    /// The event could not be recorded.
    fn start(&self) -> anyhow::Result<()>;
    /// Record the stop event, wait for it and return the seconds between start and stop.
    ///
    /// # Errors
    /// The event could not be recorded or read (a kernel between them failed).
    fn stop(&self) -> anyhow::Result<f64>;
    /// Wall-clock seconds since some fixed origin (the stopping rule's time cap reads the
    /// difference of two calls).
    fn clock_s(&self) -> f64;
}

/// The real device: CUDA events on `gpu`'s stream, and the L2 flush when `flush` is given.
pub struct GpuTiming<'a> {
    gpu: &'a Gpu,
    timer: Timer,
    flush: Option<(&'a L2Flusher, &'a Module)>,
    origin: Instant,
}

impl<'a> GpuTiming<'a> {
    /// Events on `gpu`; `flush` is the flusher and the `kernels/util.cu` module it launches
    /// (`None` where no sample is taken cold, as in graph timing).
    ///
    /// # Errors
    /// The timing events cannot be created.
    pub fn new(gpu: &'a Gpu, flush: Option<(&'a L2Flusher, &'a Module)>) -> anyhow::Result<Self> {
        Ok(Self {
            gpu,
            timer: gpu.timer()?,
            flush,
            origin: Instant::now(),
        })
    }
}

impl TimingDevice for GpuTiming<'_> {
    fn sync(&self) -> anyhow::Result<()> {
        Ok(self.gpu.sync()?)
    }
    fn flush_l2(&self) -> anyhow::Result<()> {
        let (flusher, util) = self
            .flush
            .context("cold timing asked for an L2 flush, but no flusher was given")?;
        Ok(flusher.flush(self.gpu, util)?)
    }
    fn start(&self) -> anyhow::Result<()> {
        Ok(self.timer.start(self.gpu)?)
    }
    fn stop(&self) -> anyhow::Result<f64> {
        Ok(self.timer.stop(self.gpu)?)
    }
    fn clock_s(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
}

/// Collect samples from `take` until `rule` says stop, with `elapsed()` giving the seconds since
/// sampling began. The time cap never stops it below `rule.min_samples`.
///
/// # Errors
/// The first error of `take`.
pub fn sample_loop(
    rule: &StoppingRule,
    elapsed: &dyn Fn() -> f64,
    take: &mut dyn FnMut() -> anyhow::Result<f64>,
) -> anyhow::Result<(Vec<f64>, StopReason)> {
    let mut samples = Vec::new();
    loop {
        samples.push(take()?);
        if let Some(r) = rule.check(&samples, elapsed()) {
            return Ok((samples, r));
        }
    }
}

/// A [`Timing`] from samples and the reason sampling stopped.
///
/// # Errors
/// No samples, or a NaN among them.
pub fn timing_of(
    samples: Vec<f64>,
    reason: StopReason,
    cold_l2: bool,
    graph: Option<GraphSetup>,
) -> anyhow::Result<Timing> {
    let s = Summary::of(&samples).context("no timing samples")?;
    Ok(Timing {
        median_s: s.median,
        p10_s: s.p10,
        p90_s: s.p90,
        rel_std: s.rel_std(),
        stop_reason: Some(reason),
        cold_l2,
        samples_s: samples,
        graph,
    })
}

/// Time `f` (one launch group per sample) under `rule`: `warmup` unmeasured calls, a sync, then
/// per sample an L2 flush when `cold_l2`, the start event, `f`, the stop event. The stopping
/// rule's clock starts after the warm-up.
///
/// # Errors
/// The first failure of the device or of `f`; no samples.
pub fn time_launches(
    dev: &dyn TimingDevice,
    warmup: usize,
    cold_l2: bool,
    rule: &StoppingRule,
    f: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    for _ in 0..warmup {
        f()?;
    }
    dev.sync()?;
    let t0 = dev.clock_s();
    let (samples, reason) = sample_loop(rule, &|| dev.clock_s() - t0, &mut || {
        if cold_l2 {
            dev.flush_l2()?;
        }
        dev.start()?;
        f()?;
        dev.stop()
    })?;
    timing_of(samples, reason, cold_l2, None)
}

/// Time a captured graph of `setup.launches` GEMMs: `max(warmup, 1)` unmeasured launches of
/// it, a sync, then one graph launch between events per sample, divided by the launches (a
/// sample is the time of one GEMM). Never cold: the weight copies are what keeps L2 from
/// holding the weights.
///
/// # Errors
/// The first failure of the device or of `launch`; no samples.
pub fn time_graph_launches(
    dev: &dyn TimingDevice,
    warmup: usize,
    rule: &StoppingRule,
    launch: &dyn Fn() -> anyhow::Result<()>,
    setup: GraphSetup,
) -> anyhow::Result<Timing> {
    for _ in 0..warmup.max(1) {
        launch()?;
    }
    dev.sync()?;
    let t0 = dev.clock_s();
    let per = setup.launches.max(1) as f64;
    let (samples, reason) = sample_loop(rule, &|| dev.clock_s() - t0, &mut || {
        dev.start()?;
        launch()?;
        Ok(dev.stop()? / per)
    })?;
    timing_of(samples, reason, false, Some(setup))
}

/// Graph timing: the weight copies of one case together exceed this many L2 sizes.
pub const GRAPH_L2_FACTOR: u64 = 4;
/// Graph timing: at least this many GEMM launches per graph.
pub const GRAPH_MIN_LAUNCHES: usize = 8;
/// Graph timing: at most this many weight copies (a tiny shape that would need more is not
/// graph-timed, and the reason is recorded).
pub const GRAPH_MAX_COPIES: usize = 4096;
/// Device memory a graph timing leaves free beyond its weight copies, bytes.
pub const GRAPH_FREE_MARGIN: u64 = 256 << 20;

/// Weight copies and launches for a graph timing of a GEMM streaming `bytes` of weights:
/// the fewest copies (at least 2) whose total exceeds `min_total` bytes, and the smallest
/// multiple of that count that is at least `min_launches`. Returns `(copies, launches)`.
pub fn graph_plan(bytes: u64, min_total: u64, min_launches: usize) -> (usize, usize) {
    let copies = ((min_total / bytes.max(1)) as usize + 1).max(2);
    let launches = copies * min_launches.div_ceil(copies).max(1);
    (copies, launches)
}

/// The graph timing plan of one case on a card with `l2_bytes` of L2 and `free` bytes of free
/// device memory (`None`: unknown): `(copies, launches, total copy bytes)` per [`graph_plan`]
/// with [`GRAPH_L2_FACTOR`] × L2 and [`GRAPH_MIN_LAUNCHES`], or why it cannot run (more than
/// [`GRAPH_MAX_COPIES`] copies, or the copies and [`GRAPH_FREE_MARGIN`] do not fit).
///
/// # Errors
/// The sentence recorded beside the case instead of a graph timing.
pub fn graph_copies(
    weight_bytes: u64,
    l2_bytes: u64,
    free: Option<usize>,
) -> Result<(usize, usize, u64), String> {
    let min_total = GRAPH_L2_FACTOR * l2_bytes;
    let (copies, launches) = graph_plan(weight_bytes, min_total, GRAPH_MIN_LAUNCHES);
    if copies > GRAPH_MAX_COPIES {
        return Err(format!(
            "its {weight_bytes} weight bytes would need {copies} copies to exceed {GRAPH_L2_FACTOR} × L2 (more than {GRAPH_MAX_COPIES})"
        ));
    }
    let total = copies as u64 * weight_bytes;
    if let Some(free) = free {
        if total.saturating_add(GRAPH_FREE_MARGIN) > free as u64 {
            return Err(format!(
                "{copies} weight copies ({}) do not fit in the {} of free device memory",
                crate::output::table::human_bytes(total),
                crate::output::table::human_bytes(free as u64)
            ));
        }
    }
    Ok((copies, launches, total))
}

/// The check of a graph's output after its timing: `Err` (the timing is discarded) when any
/// output is non-finite or its `rel_l2` is NaN or over the tolerance `tol_name` = `tol`.
///
/// # Errors
/// The sentence recorded beside the case.
pub fn graph_output_check(
    nonfinite: u32,
    rel_l2: f64,
    (tol_name, tol): (&str, f64),
) -> Result<(), String> {
    if nonfinite > 0 || rel_l2.is_nan() || rel_l2 > tol {
        return Err(format!(
            "the graph's output failed the correctness check (rel_l2 = {rel_l2:.3e}, tolerance {tol_name} = {tol:.0e}, {nonfinite} non-finite): graph timing discarded"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// A device whose events return the scripted times, and whose clock advances by each
    /// sample's time plus `overhead_s`; every call is logged.
    struct Mock {
        log: RefCell<Vec<&'static str>>,
        times: RefCell<VecDeque<f64>>,
        clock: Cell<f64>,
        overhead_s: f64,
        fail_stop_at: Option<usize>,
    }

    impl Mock {
        fn new(times: &[f64], overhead_s: f64) -> Self {
            Self {
                log: RefCell::new(Vec::new()),
                times: RefCell::new(times.iter().copied().collect()),
                clock: Cell::new(100.0),
                overhead_s,
                fail_stop_at: None,
            }
        }
        fn count(&self, what: &str) -> usize {
            self.log.borrow().iter().filter(|e| **e == what).count()
        }
    }

    impl TimingDevice for Mock {
        fn sync(&self) -> anyhow::Result<()> {
            self.log.borrow_mut().push("sync");
            Ok(())
        }
        fn flush_l2(&self) -> anyhow::Result<()> {
            self.log.borrow_mut().push("flush");
            Ok(())
        }
        fn start(&self) -> anyhow::Result<()> {
            self.log.borrow_mut().push("start");
            Ok(())
        }
        fn stop(&self) -> anyhow::Result<f64> {
            self.log.borrow_mut().push("stop");
            if self.fail_stop_at == Some(self.count("stop")) {
                anyhow::bail!("event elapsed time (a kernel may have failed)");
            }
            let t = self.times.borrow_mut().pop_front().unwrap_or(1e-5);
            self.clock.set(self.clock.get() + t + self.overhead_s);
            Ok(t)
        }
        fn clock_s(&self) -> f64 {
            self.clock.get()
        }
    }

    fn rule(min: usize, max: usize, rel: f64, time: f64) -> StoppingRule {
        StoppingRule {
            min_samples: min,
            max_samples: max,
            target_rel_std: rel,
            max_time_s: time,
        }
    }

    #[test]
    fn cold_samples_flush_before_every_start_after_the_warm_up() {
        let dev = Mock::new(&[], 0.0);
        let f = || -> anyhow::Result<()> {
            dev.log.borrow_mut().push("launch");
            Ok(())
        };
        // Identical times converge at the minimum sample count.
        let t = time_launches(&dev, 3, true, &rule(5, 100, 0.01, 10.0), &f).unwrap();
        assert_eq!(t.samples_s.len(), 5);
        assert_eq!(t.stop_reason, Some(StopReason::Converged));
        assert!(t.cold_l2 && t.graph.is_none());
        let log = dev.log.borrow();
        assert_eq!(&log[..4], ["launch", "launch", "launch", "sync"]);
        for s in log[4..].chunks(4) {
            assert_eq!(s, ["flush", "start", "launch", "stop"]);
        }
    }

    #[test]
    fn warm_samples_never_flush_and_the_caps_stop_the_loop() {
        // Spread samples never converge: the sample cap stops them.
        let times: Vec<f64> = (0..50).map(|i| 1e-5 * (1 + i % 2) as f64).collect();
        let dev = Mock::new(&times, 0.0);
        let t = time_launches(&dev, 0, false, &rule(3, 7, 0.001, 10.0), &|| Ok(())).unwrap();
        assert_eq!(
            (t.samples_s.len(), t.stop_reason),
            (7, Some(StopReason::SampleCap))
        );
        assert_eq!(dev.count("flush"), 0);
        assert!(!t.cold_l2);
        // The time cap: each sample takes 0.4 s of wall time, the cap is 1 s, never below min.
        let dev = Mock::new(&times, 0.4);
        let t = time_launches(&dev, 0, false, &rule(4, 100, 0.001, 1.0), &|| Ok(())).unwrap();
        assert_eq!(
            (t.samples_s.len(), t.stop_reason),
            (4, Some(StopReason::TimeCap))
        );
        let dev = Mock::new(&times, 0.4);
        let t = time_launches(&dev, 0, false, &rule(2, 100, 0.001, 1.0), &|| Ok(())).unwrap();
        assert_eq!(
            (t.samples_s.len(), t.stop_reason),
            (3, Some(StopReason::TimeCap))
        );
        // The median is of the samples the device returned.
        assert!((t.median_s - 1e-5).abs() < 1e-12 || (t.median_s - 2e-5).abs() < 1e-12);
    }

    #[test]
    fn a_failure_stops_the_loop_with_its_error() {
        let mut dev = Mock::new(&[], 0.0);
        dev.fail_stop_at = Some(3);
        let e = time_launches(&dev, 0, true, &rule(10, 100, 0.01, 10.0), &|| Ok(())).unwrap_err();
        assert!(
            format!("{e:#}").contains("a kernel may have failed"),
            "{e:#}"
        );
        let dev = Mock::new(&[], 0.0);
        let e = time_launches(&dev, 1, true, &rule(10, 100, 0.01, 10.0), &|| {
            anyhow::bail!("launch refused")
        })
        .unwrap_err();
        assert!(format!("{e}").contains("launch refused"));
        assert_eq!(
            dev.count("start"),
            0,
            "nothing is timed after a failed warm-up"
        );
    }

    #[test]
    fn graph_samples_are_per_launch_and_never_cold() {
        let dev = Mock::new(&[8e-5, 8e-5, 8e-5], 0.0);
        let launches = Cell::new(0usize);
        let setup = GraphSetup {
            launches: 16,
            weight_copies: 4,
            weight_bytes_total: 1 << 30,
        };
        let t = time_graph_launches(
            &dev,
            0,
            &rule(3, 10, 0.01, 10.0),
            &|| {
                launches.set(launches.get() + 1);
                Ok(())
            },
            setup.clone(),
        )
        .unwrap();
        // One warm-up launch even when warmup is 0, then one per sample.
        assert_eq!(launches.get(), 1 + 3);
        assert_eq!(t.samples_s, vec![5e-6; 3]);
        assert_eq!(t.graph, Some(setup));
        assert!(!t.cold_l2);
        assert_eq!(dev.count("flush"), 0);
    }

    #[test]
    fn graph_plans_cover_l2_and_refuse_what_cannot_run() {
        // H200: 60 MiB of L2; a 25 MiB weight needs 10 copies for 4 × L2, 10 launches.
        let l2 = 60u64 << 20;
        let (c, l, total) = graph_copies(25 << 20, l2, None).unwrap();
        assert_eq!((c, l), (10, 10));
        assert!(total > GRAPH_L2_FACTOR * l2);
        // A big weight: 2 copies, 8 launches.
        assert_eq!(graph_plan(1 << 30, 4 * l2, GRAPH_MIN_LAUNCHES), (2, 8));
        // Too tiny: more than GRAPH_MAX_COPIES copies.
        let e = graph_copies(1024, l2, None).unwrap_err();
        assert!(e.contains("more than 4096"), "{e}");
        // Not enough free memory for the copies and the margin.
        let e = graph_copies(25 << 20, l2, Some(200 << 20)).unwrap_err();
        assert!(e.contains("do not fit"), "{e}");
        assert!(graph_copies(25 << 20, l2, Some(1 << 30)).is_ok());
    }

    #[test]
    fn the_graph_check_never_passes_nan_or_non_finite_outputs() {
        let tol = ("W4A16_GEMM_REL_L2", 5e-3);
        assert!(graph_output_check(0, 1e-3, tol).is_ok());
        assert!(graph_output_check(0, 6e-3, tol).is_err());
        assert!(graph_output_check(0, f64::NAN, tol).is_err());
        assert!(graph_output_check(0, f64::INFINITY, tol).is_err());
        let e = graph_output_check(3, 0.0, tol).unwrap_err();
        assert!(e.contains("3 non-finite"), "{e}");
    }
}
