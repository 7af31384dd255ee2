//! The kernel bench runner: for every shape of the suite and every M, each implementation is
//! prepared, checked against the CPU reference (poisoned output, non-finite scan, sampled
//! `rel_l2` under its named tolerance), and only then timed.
//!
//! Timing modes (`--timing`, [`TimingModes`]):
//! - cold (nvbench's method): CUDA events created with timing enabled around each launch; before
//!   each sample the L2 is flushed with a buffer of at least twice its size; warm-up launches
//!   first; sampling stops on the `stdrel` rule ([`StoppingRule`]) or its caps (the time cap
//!   never below the minimum sample count);
//! - graph: the implementation's weights copied until the copies exceed 4 × L2
//!   ([`graph_plan`]), back-to-back launches rotating over them captured in one CUDA graph
//!   ([`crate::gpu::graph`]), each sample one graph launch between events divided by its GEMM
//!   launches, under the same stopping rule; the output is checked again afterwards.
//!
//! A device-to-device copy is measured in the same run as the memory roofline. The SM clock and
//! throttle reasons are polled in the background while every case is sampled
//! ([`super::clocks`]). Results go to `on_update` after every case, so an interrupted run keeps
//! what it measured; the decode-step composite ([`super::composite`]) is filled at the end.

use crate::gpu::dim;

use anyhow::Context;

use super::clocks::{unix_now, ClockMonitor};
use super::impls;
use super::reference::sample_axes;
use super::schema::*;
use super::suite::Suite;
use super::{Env, GemmImpl, MInputs};
use crate::formats::GemmFormat;
use crate::gemm::check::rel_l2;
use crate::gpu::cublaslt::Lt;
use crate::gpu::{Gpu, L2Flusher};
use crate::rig::telemetry::TelemetryReader;
use crate::stats::{StoppingRule, Summary};

/// Kernels of kernels/util.cu.
pub use crate::gpu::util_kernels::KERNELS as UTIL_KERNELS;
/// Source of kernels/util.cu (owned by the GPU foundation, [`crate::gpu::util_kernels`]).
pub use crate::gpu::util_kernels::SRC as UTIL_SRC;

/// Options of a kernel bench run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The suite (already filtered by `--shapes` and `--m`).
    pub suite: Suite,
    /// Formats to run, in order.
    pub formats: Vec<GemmFormat>,
    /// Stopping rule per case.
    pub stopping: StoppingRule,
    /// Warm-up launches before sampling.
    pub warmup: usize,
    /// Flush L2 before each sample.
    pub cold_l2: bool,
    /// How L2 is flushed.
    pub flush: crate::gpu::FlushMethod,
    /// Timed samples per configuration when choosing among several.
    pub tune_samples: usize,
    /// Run the determinism check (R runs, bit-for-bit) at these M values (empty = off).
    pub determinism_m: Vec<usize>,
    /// Runs per determinism check.
    pub determinism_runs: usize,
    /// Run peer providers (`scripts/peer_kernels.py`).
    pub peers: super::peers::PeerMode,
    /// Which timing modes run (`--timing`).
    pub timing: TimingModes,
    /// Where the peer script keeps its progress (its output, saved after every case): a report
    /// folder's `peers-progress.json`, so that `report --resume` can continue the peers. `None`:
    /// a temporary file.
    pub peers_progress: Option<std::path::PathBuf>,
    /// Continue the peers from `peers_progress` (its cases and skips are kept, not run again).
    pub peers_resume: bool,
    /// Which peer providers run (`--peer-providers`; names as in [`super::peers::PROVIDERS`]);
    /// empty: all of them.
    pub peer_providers: Vec<String>,
}

impl BenchOptions {
    /// A bench of `suite` with the `kernels` command's defaults: every format (bf16, fp8, w4a16,
    /// w4a4); sampling until σ/mean ≤ 1% after ≥ 10 samples, at most 200 samples or 0.25 s;
    /// 3 warm-up launches; an L2 flush by reading before every sample; 5 tuning samples per
    /// configuration; no determinism check (5 runs when it is turned on); peers when available;
    /// cold timing only; peer progress in a temporary file.
    pub fn new(suite: Suite) -> Self {
        Self {
            suite,
            formats: vec![
                GemmFormat::Bf16,
                GemmFormat::Fp8,
                GemmFormat::W4a16,
                GemmFormat::W4a4,
            ],
            stopping: StoppingRule {
                min_samples: 10,
                max_samples: 200,
                target_rel_std: 0.01,
                max_time_s: 0.25,
            },
            warmup: 3,
            cold_l2: true,
            flush: crate::gpu::FlushMethod::Read,
            tune_samples: crate::gemm::tuner::TUNE_SAMPLES,
            determinism_m: Vec::new(),
            determinism_runs: 5,
            peers: super::peers::PeerMode::Auto,
            timing: TimingModes::Cold,
            peers_progress: None,
            peers_resume: false,
            peer_providers: Vec::new(),
        }
    }
}

/// Seeds of the case at shape index `si` and M index `mi` of a suite: the activations'
/// ([`super::data::bf16_uniform`] with scale 1) and the sampled check coordinates'
/// ([`super::reference::sample_axes`], 32 rows × 64 columns). The peers' NVFP4 references use the
/// same ([`super::peer_nvfp4`]).
pub fn case_seeds(si: usize, mi: usize) -> (u32, u32) {
    let s = (si * 1000 + mi) as u32;
    (s, 0xC0FFEE ^ s)
}

use super::device::{
    graph_copies, graph_output_check, time_graph_launches, time_launches, GpuTiming,
};
pub use super::device::{
    graph_plan, sample_loop, timing_of, GRAPH_L2_FACTOR, GRAPH_MAX_COPIES, GRAPH_MIN_LAUNCHES,
};

/// A started bench: the GPU objects that stay for the whole run.
struct Rig {
    gpu: Gpu,
    lt: Option<Lt>,
    util: crate::gpu::Module,
    w4: Vec<crate::gemm::W4Module>,
    w4v2: Option<crate::gpu::Module>,
    fp8q: Option<crate::gpu::Module>,
    flusher: L2Flusher,
    clocks: ClockMonitor,
    /// The same device on a created stream, for graph capture (when graph timing runs).
    capture: Option<Gpu>,
}

/// Run the suite on GPU 0. Calls `on_update` after every case with everything so far.
///
/// # Errors
/// No GPU / driver problems ([`crate::gpu::GpuError::NoGpu`]), NVRTC failing on util.cu. Failures of
/// single implementations or cases are recorded as skips, not errors.
pub fn run(
    opts: &BenchOptions,
    on_update: impl FnMut(&KernelResults),
) -> anyhow::Result<KernelResults> {
    run_on_device(0, opts, on_update)
}

/// [`run`] on CUDA device `device`, with its own context and stream (several devices may run at
/// once, each on its own thread). Telemetry is read from the same GPU (matched by PCI bus id).
///
/// # Errors
/// As [`run`].
pub fn run_on_device(
    device: usize,
    opts: &BenchOptions,
    mut on_update: impl FnMut(&KernelResults),
) -> anyhow::Result<KernelResults> {
    let mut res = KernelResults {
        suite: SuiteInfo {
            name: opts.suite.name.clone(),
            file: opts.suite.file.display().to_string(),
            description: opts.suite.description.clone(),
            decode_step: opts.suite.decode_step(),
        },
        ..Default::default()
    };
    let rig = open_rig(device, opts, &mut res)?;
    let env = Env {
        gpu: &rig.gpu,
        lt: rig.lt.as_ref(),
        util: &rig.util,
        w4: &rig.w4,
        w4v2: rig.w4v2.as_ref(),
        fp8q: rig.fp8q.as_ref(),
    };
    res.timing_policy = Some(timing_policy(opts, &rig));
    res.copy_bandwidth = Some(copy_bandwidth(&rig.gpu)?);
    on_update(&res);

    let mut impls: Vec<Box<dyn GemmImpl>> = impls::make_for(&opts.formats);
    for im in &impls {
        res.kernel_facts.extend(im.kernel_facts(&env));
    }
    let total = (opts.suite.shapes.len() * opts.suite.m.len() * impls.len()) as u64;
    let log_lines = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (si, shape) in opts.suite.shapes.iter().enumerate() {
        if crate::signals::interrupted().is_some() {
            break;
        }
        let ready = prepare_shape(&env, rig.gpu.cc, shape, &mut impls, &mut res);
        for (mi, &m) in opts.suite.m.iter().enumerate() {
            // SIGINT/SIGTERM (src/signals.rs): stop after the case in flight; what ran is kept.
            if crate::signals::interrupted().is_some() {
                break;
            }
            let case_start = res.cases.len();
            let (act_seed, axes_seed) = case_seeds(si, mi);
            let inp = match make_inputs(&env, m, shape.n, shape.k, act_seed) {
                Ok(i) => i,
                Err(e) => {
                    for im in &impls {
                        skip(
                            &mut res,
                            im.id(),
                            &shape.name,
                            Some(m),
                            format!("could not allocate inputs: {e:#}"),
                        );
                    }
                    bar.inc(impls.len() as u64);
                    continue;
                }
            };
            let (rows, cols) = sample_axes(m, shape.n, 32, 64, axes_seed);
            for (ii, im) in impls.iter_mut().enumerate() {
                // SIGINT/SIGTERM (src/signals.rs): stop after the case in flight; what ran is kept.
                if crate::signals::interrupted().is_some() {
                    break;
                }
                bar.set_message(format!("{} M={m} {}", shape.name, im.id()));
                bar.inc(1);
                if !ready[ii] {
                    continue;
                }
                let case = CaseAt {
                    shape,
                    m,
                    inp: &inp,
                    rows: &rows,
                    cols: &cols,
                };
                time_case(&rig, &env, opts, im.as_mut(), &case, &mut res);
                on_update(&res);
            }
            // Derived figures; a note when a case of the group saw throttling.
            finish_group(&mut res, case_start, &shape.name, m);
            if log_lines {
                // No progress bar off a terminal (CI, a device call): one line per (shape, M).
                eprintln!(
                    "rigbench: kernels: GPU {device}: {} M={m}: {} timed ({} of {} cases done, {:.0} s, ETA {})",
                    shape.name,
                    crate::output::table::plural(
                        (res.cases.len() - case_start) as u64,
                        "case",
                        "cases"
                    ),
                    bar.position(),
                    total,
                    started.elapsed().as_secs_f64(),
                    eta_text(started.elapsed().as_secs_f64(), bar.position(), total)
                );
            }
            on_update(&res);
        }
        for im in impls.iter_mut() {
            im.release_shape();
        }
    }
    bar.finish_and_clear();
    if let Some(spec) = &opts.suite.moe {
        if crate::signals::interrupted().is_none() {
            run_grouped(&rig, opts, spec, &mut res);
            on_update(&res);
        }
    }
    super::composite::refresh(&mut res);
    Ok(res)
}

/// Prepare every implementation's weights for `shape`; an implementation that does not
/// support it, or whose weights cannot be prepared, is a skip. Returns which are ready.
fn prepare_shape(
    env: &Env,
    cc: crate::gpu::ComputeCapability,
    shape: &super::suite::Shape,
    impls: &mut [Box<dyn GemmImpl>],
    res: &mut KernelResults,
) -> Vec<bool> {
    let mut ready = vec![false; impls.len()];
    for (ii, im) in impls.iter_mut().enumerate() {
        if let Some(reason) = im.unsupported(cc, shape) {
            skip(res, im.id(), &shape.name, None, reason);
            continue;
        }
        match im.prepare_shape(env, shape) {
            Ok(()) => ready[ii] = true,
            Err(e) => skip(
                res,
                im.id(),
                &shape.name,
                None,
                format!("could not prepare weights: {e:#}"),
            ),
        }
    }
    ready
}

/// One case of the sweep: a shape at one M, its inputs, and the output rows and columns its
/// check samples.
struct CaseAt<'a> {
    shape: &'a super::suite::Shape,
    m: usize,
    inp: &'a MInputs,
    rows: &'a [usize],
    cols: &'a [usize],
}

/// Time one implementation on one case, then its determinism check when the case's M is one
/// of those asked for. A case that fails is a skip.
fn time_case(
    rig: &Rig,
    env: &Env,
    opts: &BenchOptions,
    im: &mut dyn GemmImpl,
    case: &CaseAt,
    res: &mut KernelResults,
) {
    let CaseAt {
        shape,
        m,
        inp,
        rows,
        cols,
    } = *case;
    let wb = im.weight_stream_bytes(shape);
    match run_case(
        rig,
        env,
        opts,
        im,
        (inp, &shape.name),
        rows,
        cols,
        wb,
        &mut res.notes,
    ) {
        Ok(Outcome::Case(mut c)) => {
            c.shape = shape.name.clone();
            c.derived.weight_bytes = wb;
            res.cases.push(*c);
        }
        Ok(Outcome::Failed(reason)) => skip(res, im.id(), &shape.name, Some(m), reason),
        Err(e) => skip(res, im.id(), &shape.name, Some(m), format!("error: {e:#}")),
    }
    if opts.determinism_m.contains(&m) {
        match determinism(env, im, inp, opts.determinism_runs) {
            Ok((bit_exact, differing)) => res.determinism.push(DeterminismResult {
                provider: "rigbench".into(),
                implementation: im.id().into(),
                path: im.path(),
                shape: shape.name.clone(),
                m,
                runs: opts.determinism_runs,
                bit_exact,
                differing_elements: differing,
            }),
            Err(e) => res.notes.push(format!(
                "determinism check of {} {} M={m} failed to run: {e:#}",
                im.id(),
                shape.name
            )),
        }
    }
}

/// A group of cases (one shape at one M) done: its derived figures, and a note when a case of
/// the group saw throttling.
fn finish_group(res: &mut KernelResults, case_start: usize, shape: &str, m: usize) {
    let copy = res.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
    let bf16_median = res.cases[case_start..]
        .iter()
        .find(|c| c.implementation == "bf16")
        .map(|c| c.timing.median_s);
    for c in &mut res.cases[case_start..] {
        fill_derived(c, copy, bf16_median);
    }
    if let Some(note) = throttle_note(&res.cases[case_start..], shape, m) {
        res.notes.push(note);
    }
}

/// The suite's `[moe]` cases on the capture stream ([`super::moe_grouped::run`]); what fails is
/// a note.
fn run_grouped(
    rig: &Rig,
    opts: &BenchOptions,
    spec: &super::moe_grouped::MoeSpec,
    res: &mut KernelResults,
) {
    let Some(gpu) = rig.capture.as_ref() else {
        res.notes.push(
            "the [moe] grouped GEMM cases did not run: they are timed in CUDA graphs, and graph timing is off or has no capture stream"
                .into(),
        );
        return;
    };
    let copy = res.copy_bandwidth.as_ref().map_or(0.0, |c| c.bytes_per_s);
    match super::moe_grouped::run(gpu, spec, &opts.formats, &opts.stopping, copy, gpu.l2_bytes) {
        Ok(r) => res.moe_grouped = Some(r),
        Err(e) => res
            .notes
            .push(format!("the [moe] grouped GEMM cases failed: {e:#}")),
    }
}

/// Open device `device` and build what the bench runs on it: the utility kernels, cuBLASLt, the
/// GEMM layer's modules ([`crate::gemm::ops::GemmModules`]), the L2 flusher, the capture stream of graph
/// timing and the clock monitor. Notes and kernel-source hashes go into `res`.
///
/// # Errors
/// No device, or the utility kernels or the flush buffer cannot be built.
fn open_rig(device: usize, opts: &BenchOptions, res: &mut KernelResults) -> anyhow::Result<Rig> {
    let gpu = Gpu::open_device(device)?;
    let util = gpu.compile("util", UTIL_SRC, UTIL_KERNELS)?;
    res.kernel_sources
        .insert("kernels/util.cu".into(), util.source_sha256.clone());
    let lt = match Lt::new(&gpu) {
        Ok(l) => Some(l),
        Err(e) => {
            res.notes.push(format!(
                "cuBLASLt unavailable ({e}): bf16, fp8 and the W4A16 large-M path are skipped"
            ));
            None
        }
    };
    let mods = crate::gemm::ops::GemmModules::build(
        &gpu,
        &crate::gemm::ops::ModuleWants {
            w4: true,
            w4_flavors: super::w4a16_flavors(),
            fp8: opts.formats.contains(&GemmFormat::Fp8),
            device,
        },
    );
    res.notes.extend(mods.notes);
    res.kernel_sources.extend(mods.sources);
    let (w4, w4v2, fp8q) = (mods.w4, mods.w4v2, mods.fp8q);
    let flusher = L2Flusher::new(&gpu, opts.flush)?;
    let capture = if opts.timing.graph() {
        match gpu.on_new_stream() {
            Ok(g) => Some(g),
            Err(e) => {
                res.notes.push(format!(
                    "graph timing cannot run: no stream for CUDA graph capture ({e})"
                ));
                None
            }
        }
    } else {
        None
    };
    Ok(Rig {
        clocks: ClockMonitor::for_reader(TelemetryReader::for_pci_bus_id(
            crate::gpu::multi::pci_bus_id(device).as_deref(),
            device as u32,
        )),
        flusher,
        capture,
        gpu,
        lt,
        util,
        w4,
        w4v2,
        fp8q,
    })
}

/// The timing policy recorded in the results: warm-up, stopping rule, L2 flush, timer, modes and
/// the graph policy (see the module docs).
fn timing_policy(opts: &BenchOptions, rig: &Rig) -> TimingPolicy {
    TimingPolicy {
        warmup_iters: opts.warmup,
        stopping: opts.stopping.clone(),
        l2_flush_bytes: if opts.cold_l2 && opts.timing.cold() {
            rig.flusher.bytes()
        } else {
            0
        },
        timer: format!(
            "CUDA events (CU_EVENT_DEFAULT) around each launch, one stream; L2 flush by {}",
            match opts.flush {
                crate::gpu::FlushMethod::Read =>
                    "reading a 2×L2 buffer (L2 left with clean lines only)",
                crate::gpu::FlushMethod::Write =>
                    "writing a 2×L2 buffer with memset, as nvbench (L2 left dirty)",
            }
        ),
        modes: opts.timing,
        graph: opts.timing.graph().then(|| GraphPolicy {
            min_total_weight_bytes: GRAPH_L2_FACTOR * rig.gpu.l2_bytes,
            min_launches: GRAPH_MIN_LAUNCHES,
            description: format!(
                "weight copies of each case together exceed {GRAPH_L2_FACTOR} × L2 ({}), at least 2 and at most {GRAPH_MAX_COPIES}; at least {GRAPH_MIN_LAUNCHES} launches per graph, a multiple of the copy count, rotating over the copies; activations and output stay the same buffers (as in a decode step, where they are hot); {} graph launches of warm-up, then the stopping rule on per-GEMM times; the output is checked against the reference again after timing",
                crate::output::table::human_bytes(GRAPH_L2_FACTOR * rig.gpu.l2_bytes),
                opts.warmup.max(1)
            ),
        }),
    }
}

/// A note naming the harmful throttle reasons the cases of one (shape, M) group saw while they
/// were sampled, with the lowest SM clock read; `None` when none saw any.
pub fn throttle_note(cases: &[KernelCase], shape: &str, m: usize) -> Option<String> {
    let mut seen: Vec<String> = cases.iter().flat_map(|c| c.throttle.clone()).collect();
    seen.sort();
    seen.dedup();
    if seen.is_empty() {
        return None;
    }
    let who: Vec<String> = cases
        .iter()
        .filter(|c| !c.throttle.is_empty())
        .map(|c| c.implementation.clone())
        .collect();
    let low = cases
        .iter()
        .filter_map(|c| c.clocks.as_ref().and_then(|k| k.min_mhz))
        .min();
    Some(format!(
        "throttling while sampling {shape} M={m} ({}): {} (lowest SM clock read {} MHz): these figures may be low",
        who.join(", "),
        seen.join(", "),
        low.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
    ))
}

fn skip(res: &mut KernelResults, id: &str, shape: &str, m: Option<usize>, reason: String) {
    res.skipped.push(SkippedCase {
        provider: "rigbench".into(),
        implementation: id.into(),
        shape: shape.into(),
        m,
        reason,
    });
}

enum Outcome {
    Case(Box<KernelCase>),
    Failed(String),
}

fn make_inputs(env: &Env, m: usize, n: usize, k: usize, seed: u32) -> anyhow::Result<MInputs> {
    let act = env.gpu.alloc(m * k * 2)?;
    crate::gpu::util_kernels::fill_uniform_bf16(
        env.util,
        env.gpu,
        crate::gemm::grid_for(env.gpu, m * k),
        (256, 1, 1),
        0,
        &act,
        m * k,
        seed,
        1.0,
    )?;
    let out = env.gpu.alloc(m * n * 2)?;
    env.gpu.sync()?;
    Ok(MInputs {
        m,
        n,
        k,
        act,
        out,
        seed_a: seed,
    })
}

/// Gather the sampled outputs (as f64) after a run.
fn gather(env: &Env, inp: &MInputs, rows: &[usize], cols: &[usize]) -> anyhow::Result<Vec<f64>> {
    let idx: Vec<u64> = rows
        .iter()
        .flat_map(|r| cols.iter().map(move |c| (*r * inp.n + *c) as u64))
        .collect();
    let idx_buf = env.gpu.upload(&idx)?;
    let dst = env.gpu.alloc(idx.len() * 2)?;
    crate::gpu::util_kernels::gather_u16(
        env.util,
        env.gpu,
        (
            dim("idx.len().div_ceil(256)", idx.len().div_ceil(256))?,
            1,
            1,
        ),
        (256, 1, 1),
        0,
        &inp.out,
        &idx_buf,
        idx.len(),
        &dst,
    )?;
    let bits: Vec<u16> = env.gpu.download(&dst, 0, idx.len())?;
    Ok(bits
        .iter()
        .map(|b| half::bf16::from_bits(*b).to_f64())
        .collect())
}

fn count_nonfinite(env: &Env, inp: &MInputs) -> anyhow::Result<u32> {
    let cnt = env.gpu.alloc(4)?;
    env.gpu.memset(&cnt, 0)?;
    let n = inp.m * inp.n;
    crate::gpu::util_kernels::count_nonfinite_bf16(
        env.util,
        env.gpu,
        crate::gemm::grid_for(env.gpu, n),
        (256, 1, 1),
        0,
        &inp.out,
        n,
        &cnt,
    )?;
    Ok(env.gpu.download::<u32>(&cnt, 0, 1)?[0])
}

/// Time `f` (one launch group per sample) under the stopping rule, cold (L2 flushed before
/// every sample unless `--warm-l2`).
fn time_it(
    rig: &Rig,
    opts: &BenchOptions,
    rule: &StoppingRule,
    f: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    let dev = GpuTiming::new(&rig.gpu, Some((&rig.flusher, &rig.util)))?;
    time_launches(&dev, opts.warmup, opts.cold_l2, rule, f)
}

/// Time a captured graph of `setup.launches` GEMMs on `gpu` (the capture stream): warm-up
/// launches, then one graph launch between events per sample, divided by the launches.
fn time_graph(
    gpu: &Gpu,
    opts: &BenchOptions,
    graph: &crate::gpu::Graph,
    setup: GraphSetup,
) -> anyhow::Result<Timing> {
    let dev = GpuTiming::new(gpu, None)?;
    time_graph_launches(
        &dev,
        opts.warmup,
        &opts.stopping,
        &|| Ok(graph.launch()?),
        setup,
    )
}

/// The graph timing of `im` at the selected configuration (see the module docs); `Err` holds
/// the reason it could not run (recorded beside the case, never fatal).
#[allow(clippy::too_many_arguments)]
fn graph_timing(
    rig: &Rig,
    env: &Env,
    opts: &BenchOptions,
    im: &mut dyn GemmImpl,
    inp: &MInputs,
    rows: &[usize],
    cols: &[usize],
    want: &[f64],
    weight_bytes: u64,
) -> Result<GraphTimings, String> {
    let Some(cap) = rig.capture.as_ref() else {
        return Err("no stream for CUDA graph capture (see the notes)".into());
    };
    let free = rig.gpu.mem_info().ok().map(|(free, _)| free);
    let (copies, launches, total) = graph_copies(weight_bytes, rig.gpu.l2_bytes, free)?;
    im.prepare_weight_copies(env, copies)
        .map_err(|e| format!("{e:#}"))?;
    let out = graph_timing_with_copies(
        rig,
        cap,
        env,
        opts,
        im,
        inp,
        rows,
        cols,
        want,
        (copies, launches, total),
    );
    im.release_weight_copies();
    out
}

#[allow(clippy::too_many_arguments)]
fn graph_timing_with_copies(
    rig: &Rig,
    cap: &Gpu,
    env: &Env,
    opts: &BenchOptions,
    im: &dyn GemmImpl,
    inp: &MInputs,
    rows: &[usize],
    cols: &[usize],
    want: &[f64],
    (copies, launches, total): (usize, usize, u64),
) -> Result<GraphTimings, String> {
    let cap_env = Env {
        gpu: cap,
        lt: env.lt,
        util: env.util,
        w4: env.w4,
        w4v2: env.w4v2,
        fp8q: env.fp8q,
    };
    let err = |what: &str, e: anyhow::Error| format!("{what}: {e:#}");
    rig.gpu.sync().map_err(|e| err("sync", e.into()))?;
    let graph = crate::gpu::graph::capture(cap, &mut || {
        for i in 0..launches {
            im.run_on_copy(&cap_env, inp, i % copies)?;
        }
        Ok(())
    })
    .map_err(|e| err("capture", e))?;
    rig.gpu
        .memset(&inp.out, 0xFF)
        .and_then(|_| rig.gpu.sync())
        .map_err(|e| err("poisoning the output", e.into()))?;
    let setup = GraphSetup {
        launches,
        weight_copies: copies,
        weight_bytes_total: total,
    };
    let timing = time_graph(cap, opts, &graph, setup).map_err(|e| err("timing", e))?;
    cap.sync().map_err(|e| err("sync", e.into()))?;
    // The graph's output must still match the reference.
    let nonfinite = count_nonfinite(env, inp).map_err(|e| err("check", e))?;
    let got = gather(env, inp, rows, cols).map_err(|e| err("check", e))?;
    graph_output_check(nonfinite, rel_l2(&got, want), im.tolerance())?;
    let mut extra = Vec::new();
    for part in im.extra_parts() {
        let g = crate::gpu::graph::capture(cap, &mut || {
            for _ in 0..launches {
                im.run_extra(&cap_env, inp, part)?;
            }
            Ok(())
        })
        .map_err(|e| err(&format!("capture of {part}"), e))?;
        let t = time_graph(
            cap,
            opts,
            &g,
            GraphSetup {
                launches,
                weight_copies: 0,
                weight_bytes_total: 0,
            },
        )
        .map_err(|e| err(&format!("timing {part}"), e))?;
        extra.push(NamedTiming {
            name: part.into(),
            timing: t,
        });
    }
    cap.sync().map_err(|e| err("sync", e.into()))?;
    Ok(GraphTimings { timing, extra })
}

/// One tuner line on stderr when `RIGBENCH_TUNE_LOG` is set: tab-separated `tune`, the
/// implementation, `N×K`, `M=…`, the shape, `ok` / `rejected` / `error`, the time in µs (or
/// `-`), and the configuration's path or what went wrong.
fn tune_log(
    im: &dyn GemmImpl,
    inp: &MInputs,
    shape: &str,
    status: &str,
    us: Option<f64>,
    what: &str,
) {
    if std::env::var_os("RIGBENCH_TUNE_LOG").is_some() {
        eprintln!(
            "tune\t{}\t{}x{}\tM={}\t{shape}\t{status}\t{}\t{what}",
            im.id(),
            inp.n,
            inp.k,
            inp.m,
            us.map(|u| format!("{u:.2}")).unwrap_or_else(|| "-".into())
        );
    }
}

/// Check, tune and time one case. Configurations that fail their check or whose launch fails
/// while tuning are skipped (never timed, never chosen); `notes` says so.
#[allow(clippy::too_many_arguments)]
fn run_case(
    rig: &Rig,
    env: &Env,
    opts: &BenchOptions,
    im: &mut dyn GemmImpl,
    (inp, shape): (&MInputs, &str),
    rows: &[usize],
    cols: &[usize],
    weight_bytes: u64,
    notes: &mut Vec<String>,
) -> anyhow::Result<Outcome> {
    let ncand = im.prepare_m(env, inp)?;
    let want = im.reference(env, inp, rows, cols)?;
    let (tol_name, tol) = im.tolerance();
    // Choose among configurations by measurement, each checked first (the one tuner of the
    // GEMM layer, kernels::tuner).
    let mut chosen = 0usize;
    if ncand > 1 {
        let quick = StoppingRule {
            min_samples: opts.tune_samples,
            max_samples: opts.tune_samples,
            target_rel_std: 0.0,
            max_time_s: 1.0,
        };
        let mut rejected: Vec<String> = Vec::new();
        // `check`, `time` and the log all need the implementation (the first two to select and
        // run it); they take turns, never overlapping, through a RefCell.
        let cell = std::cell::RefCell::new(&mut *im);
        let tuned = crate::gemm::tuner::choose(
            ncand,
            tol,
            |c| {
                let mut im = cell.borrow_mut();
                im.select(c);
                // Poisoned first, so a configuration that writes nothing cannot pass on the
                // previous one's output.
                rig.gpu.memset(&inp.out, 0xFF)?;
                im.run(env, inp)?;
                Ok(rel_l2(&gather(env, inp, rows, cols)?, &want))
            },
            |_| {
                let im = cell.borrow();
                let imr: &dyn GemmImpl = &**im;
                Ok(time_it(rig, opts, &quick, &|| imr.run(env, inp))?.median_s)
            },
            |_, trial| {
                let im = cell.borrow();
                log_trial(&**im, inp, shape, trial, &mut rejected);
            },
        );
        chosen = tuned.chosen.unwrap_or(0);
        if !rejected.is_empty() {
            let shown: Vec<&str> = rejected.iter().take(3).map(String::as_str).collect();
            notes.push(format!(
                "{} {shape} M={}: {} of {ncand} configurations failed their check or launch while tuning and were not used: {}{}",
                im.id(),
                inp.m,
                rejected.len(),
                shown.join("; "),
                if rejected.len() > 3 { "; …" } else { "" }
            ));
        }
    }
    im.select(chosen);
    let (check, nonfinite) = gating_check(rig, env, im, inp, (rows, cols), &want, (tol_name, tol))?;
    let (passed, err) = (check.passed, check.value);
    if !passed {
        return Ok(Outcome::Failed(format!(
            "failed its correctness check, not timed: rel_l2 = {err:.3e} (tolerance {tol_name} = {tol:.0e}), {nonfinite} non-finite outputs; path: {}",
            im.path()
        )));
    }
    let t0 = unix_now();
    let mut cold = None;
    if opts.timing.cold() {
        cold = Some(cold_timing(rig, env, opts, im, inp)?);
    }
    let mut graph = None;
    let mut graph_skip = None;
    if opts.timing.graph() {
        match graph_timing(rig, env, opts, im, inp, rows, cols, &want, weight_bytes) {
            Ok(g) => graph = Some(g),
            Err(why) => graph_skip = Some(why),
        }
    }
    let clocks = rig.clocks.window(t0, unix_now());
    let imr: &dyn GemmImpl = im;
    let (timing, extra, graph) = match (cold, graph) {
        (Some((t, e)), g) => (t, e, g),
        (None, Some(g)) => (g.timing, g.extra, None),
        (None, None) => {
            return Ok(Outcome::Failed(format!(
            "graph timing (--timing graph) could not run: {}; --timing both times it cold as well",
            graph_skip.unwrap_or_default()
        )))
        }
    };
    Ok(Outcome::Case(Box::new(KernelCase {
        provider: "rigbench".into(),
        implementation: imr.id().into(),
        format: imr.format(),
        shape: String::new(),
        m: inp.m,
        n: inp.n,
        k: inp.k,
        path: imr.path(),
        check: Some(check),
        timing,
        extra,
        derived: Derived::default(),
        sm_clock_mhz: clocks.as_ref().and_then(|c| c.median_mhz),
        throttle: clocks
            .as_ref()
            .map(|c| c.throttle_seen.clone())
            .unwrap_or_default(),
        graph,
        graph_skip,
        clocks,
    })))
}

/// One configuration tried while tuning, in the tuning log; a configuration that failed its
/// check or launch is added to `rejected`.
fn log_trial(
    im: &dyn GemmImpl,
    inp: &MInputs,
    shape: &str,
    trial: &crate::gemm::tuner::Trial,
    rejected: &mut Vec<String>,
) {
    let (status, us, why) = match trial {
        crate::gemm::tuner::Trial::Timed { seconds, .. } => ("ok", Some(seconds * 1e6), None),
        crate::gemm::tuner::Trial::Rejected { rel_l2 } => {
            ("rejected", None, Some(format!("rel_l2 {rel_l2:.3e}")))
        }
        crate::gemm::tuner::Trial::Failed { stage, why } => (
            "error",
            None,
            Some(if *stage == "check" {
                format!("launch failed: {why}")
            } else {
                format!("timing failed: {why}")
            }),
        ),
    };
    match why {
        None => tune_log(im, inp, shape, status, us, &im.path()),
        Some(why) => {
            tune_log(im, inp, shape, status, us, &format!("{why}; {}", im.path()));
            rejected.push(format!("{} ({why})", im.path()));
        }
    }
}

/// The gating check of the chosen configuration: poison the output, run, scan the whole output
/// for non-finite values, compare the sampled outputs with the reference `want`. Returns the
/// check and the count of non-finite outputs.
fn gating_check(
    rig: &Rig,
    env: &Env,
    im: &mut dyn GemmImpl,
    inp: &MInputs,
    (rows, cols): (&[usize], &[usize]),
    want: &[f64],
    (tol_name, tol): (&str, f64),
) -> anyhow::Result<(CheckResult, u32)> {
    rig.gpu.memset(&inp.out, 0xFF)?;
    im.run(env, inp)?;
    rig.gpu.sync()?;
    let nonfinite = count_nonfinite(env, inp)?;
    let got = gather(env, inp, rows, cols)?;
    let err = rel_l2(&got, want);
    let passed = nonfinite == 0 && err <= tol;
    let check = CheckResult {
        reference: format!(
            "CPU f64 on {}×{} sampled outputs of the exact operands; whole output scanned for NaN/unwritten ({nonfinite} found)",
            rows.len(),
            cols.len()
        ),
        metric: "rel_l2".into(),
        value: err,
        tolerance_name: tol_name.into(),
        tolerance: tol,
        passed,
    };
    Ok((check, nonfinite))
}

/// Cold timing (`--timing cold`): the case and each of its extra parts timed with a cold L2.
fn cold_timing(
    rig: &Rig,
    env: &Env,
    opts: &BenchOptions,
    im: &dyn GemmImpl,
    inp: &MInputs,
) -> anyhow::Result<(Timing, Vec<NamedTiming>)> {
    let timing = time_it(rig, opts, &opts.stopping, &|| im.run(env, inp))?;
    let mut extra = Vec::new();
    for part in im.extra_parts() {
        let t = time_it(rig, opts, &opts.stopping, &|| im.run_extra(env, inp, part))?;
        extra.push(NamedTiming {
            name: part.into(),
            timing: t,
        });
    }
    Ok((timing, extra))
}

/// Fill the derived figures of a case from its median time.
pub fn fill_derived(c: &mut KernelCase, copy_bytes_per_s: Option<f64>, bf16_median_s: Option<f64>) {
    let t = c.timing.median_s;
    if t > 0.0 {
        c.derived.tflops = 2.0 * c.m as f64 * c.n as f64 * c.k as f64 / t / 1e12;
        if c.derived.weight_bytes == 0 {
            c.derived.weight_bytes = c.format.weight_stream_bytes(c.n, c.k);
        }
        c.derived.weight_bytes_per_s = c.derived.weight_bytes as f64 / t;
        c.derived.pct_copy_bw = copy_bytes_per_s.map(|b| 100.0 * c.derived.weight_bytes_per_s / b);
        c.derived.speedup_vs_bf16 = bf16_median_s.map(|b| b / t);
    }
}

/// Device-to-device copy bandwidth (1 GiB, or a quarter of free memory when less is free, at
/// least 64 MiB; 3 warm-up and 20 timed copies; read + written bytes over the median time): the
/// memory roofline of a run. The stream-ordered memory pool is trimmed first
/// ([`Gpu::trim_memory_pool`]): after a runtime has run in the process, the pool still holds
/// its freed KV cache, and the copy would be sized from what little memory is left (best
/// effort: a failed trim leaves the size to the free memory).
///
/// # Errors
/// A device failure.
pub fn copy_bandwidth(gpu: &Gpu) -> anyhow::Result<CopyBandwidth> {
    // Best effort: a pool that cannot be trimmed only makes the copy smaller.
    let _ = gpu.trim_memory_pool();
    let (free, _) = gpu.mem_info()?;
    let bytes = (1usize << 30).min(free / 4).max(64 << 20);
    let a = gpu.alloc(bytes)?;
    let b = gpu.alloc(bytes)?;
    gpu.memset(&a, 0x5A)?;
    for _ in 0..3 {
        gpu.copy_d2d(&b, &a, bytes)?;
    }
    gpu.sync()?;
    let timer = gpu.timer()?;
    let mut s = Vec::new();
    for _ in 0..20 {
        timer.start(gpu)?;
        gpu.copy_d2d(&b, &a, bytes)?;
        s.push(timer.stop(gpu)?);
    }
    let sum = Summary::of(&s).context("no copy samples")?;
    Ok(CopyBandwidth {
        bytes: bytes as u64,
        median_s: sum.median,
        bytes_per_s: 2.0 * bytes as f64 / sum.median,
        samples: s.len(),
    })
}

/// Run `im` `runs` times on the same inputs; compare each output with the first, bit for bit.
fn determinism(
    env: &Env,
    im: &dyn GemmImpl,
    inp: &MInputs,
    runs: usize,
) -> anyhow::Result<(bool, usize)> {
    let bytes = inp.m * inp.n * 2;
    let first = env.gpu.alloc(bytes)?;
    im.run(env, inp)?;
    env.gpu.copy_d2d(&first, &inp.out, bytes)?;
    let cnt = env.gpu.alloc(4)?;
    let mut worst = 0u32;
    for _ in 1..runs.max(2) {
        env.gpu.memset(&inp.out, 0xFF)?;
        im.run(env, inp)?;
        env.gpu.memset(&cnt, 0)?;
        let n = inp.m * inp.n;
        crate::gpu::util_kernels::count_diff_u16(
            env.util,
            env.gpu,
            crate::gemm::grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &first,
            &inp.out,
            n,
            &cnt,
        )?;
        worst = worst.max(env.gpu.download::<u32>(&cnt, 0, 1)?[0]);
    }
    Ok((worst == 0, worst as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StopReason;

    #[test]
    fn graph_plans_exceed_four_l2_sizes() {
        let l2 = 60 << 20; // H200: 60 MiB
        let min_total = GRAPH_L2_FACTOR * l2;
        // in_proj_ba in NVFP4: 96 × 5120 weights, 276,484 stream bytes.
        let ba = crate::formats::GemmFormat::W4a16.weight_stream_bytes(96, 5120);
        let (c, l) = graph_plan(ba, min_total, GRAPH_MIN_LAUNCHES);
        assert!(c as u64 * ba > min_total && (c - 1) as u64 * ba <= min_total);
        assert_eq!(
            l, c,
            "more copies than the minimum launches: one launch per copy"
        );
        // lm_head in BF16 (2.5 GB) is larger than 4 × L2 alone: still two copies, 8 launches.
        let lm = crate::formats::GemmFormat::Bf16.weight_stream_bytes(248320, 5120);
        assert_eq!(graph_plan(lm, min_total, GRAPH_MIN_LAUNCHES), (2, 8));
        // o_proj in BF16 is exactly 60 MiB: four copies only equal 4 × L2, so five, and ten
        // launches (the first multiple of five ≥ 8).
        let o = crate::formats::GemmFormat::Bf16.weight_stream_bytes(5120, 6144);
        assert_eq!(o, 60 << 20);
        assert_eq!(graph_plan(o, min_total, GRAPH_MIN_LAUNCHES), (5, 10));
    }

    #[test]
    fn time_cap_never_stops_below_min_samples() {
        let rule = StoppingRule {
            min_samples: 10,
            max_samples: 200,
            target_rel_std: 0.01,
            max_time_s: 0.25,
        };
        // Noisy samples and a clock that is always past the cap: stops at exactly min_samples.
        let mut i = 0;
        let (s, r) = sample_loop(&rule, &|| 99.0, &mut || {
            i += 1;
            Ok(if i % 2 == 0 { 1.0 } else { 2.0 })
        })
        .unwrap();
        assert_eq!((s.len(), r), (10, StopReason::TimeCap));
        // Steady samples converge at min_samples; the sample cap still holds.
        let (s, r) = sample_loop(&rule, &|| 0.0, &mut || Ok(5e-6)).unwrap();
        assert_eq!((s.len(), r), (10, StopReason::Converged));
        let mut j = 0;
        let (s, r) = sample_loop(&rule, &|| 0.0, &mut || {
            j += 1;
            Ok(if j % 2 == 0 { 1.0 } else { 3.0 })
        })
        .unwrap();
        assert_eq!((s.len(), r), (200, StopReason::SampleCap));
        let t = timing_of(s, r, true, None).unwrap();
        assert_eq!(t.stop_reason, Some(StopReason::SampleCap));
        assert!(sample_loop(&rule, &|| 0.0, &mut || anyhow::bail!("launch failed")).is_err());
    }

    #[test]
    fn throttle_note_names_cases_and_the_lowest_clock() {
        let mut a = crate::kernels::composite::tests::case_for_tests("bf16", 1e-5);
        a.throttle = vec!["sw_power_cap".into()];
        a.clocks = Some(ClockStats {
            readings: 3,
            min_mhz: Some(1410),
            median_mhz: Some(1755),
            max_mhz: Some(1980),
            throttle_seen: vec!["sw_power_cap".into()],
            source: "nvml".into(),
        });
        let b = crate::kernels::composite::tests::case_for_tests("fp8", 1e-5);
        let n = throttle_note(&[a, b.clone()], "qkv", 16).unwrap();
        assert!(
            n.contains("qkv M=16 (bf16)") && n.contains("sw_power_cap") && n.contains("1410 MHz"),
            "{n}"
        );
        assert!(throttle_note(&[b], "qkv", 16).is_none());
    }
}

/// The time left of the kernel suite at the mean rate so far, `~N s` (`?` before the first
/// case): the ETA of the progress lines off a terminal (indicatif's `{eta}` on one).
fn eta_text(elapsed_s: f64, done: u64, total: u64) -> String {
    if done == 0 || total < done {
        return "?".into();
    }
    format!("~{:.0} s", elapsed_s / done as f64 * (total - done) as f64)
}

#[cfg(test)]
mod dump {
    /// Writes the PTX of both kernel files to $RIGBENCH_DUMP_PTX (developer aid; no-op when unset).
    #[test]
    fn dump_ptx_when_asked() {
        let Ok(dir) = std::env::var("RIGBENCH_DUMP_PTX") else {
            return;
        };
        let inc = crate::gpu::probe::cuda_include_dir().expect("CUDA headers");
        for (name, src) in [
            ("util", super::UTIL_SRC),
            ("w4a16", crate::gemm::w4a16::SRC),
        ] {
            let (ptx, _) =
                crate::gpu::context::nvrtc_compile(name, src, "sm_90", &inc).expect("compiles");
            std::fs::write(format!("{dir}/{name}.ptx"), ptx).expect("write");
        }
    }
}
