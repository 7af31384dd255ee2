//! The kernel bench runner: for every shape of the suite and every M, each implementation is
//! prepared, checked against the CPU reference (poisoned output, non-finite scan, sampled
//! `rel_l2` under its named tolerance), and only then timed.
//!
//! Timing (nvbench's method): CUDA events created with timing enabled around each launch; before
//! each sample the L2 is flushed by writing a buffer of at least twice its size; warm-up launches
//! first; sampling stops on the `stdrel` rule ([`StoppingRule`]) or its caps. A device-to-device
//! copy is measured in the same run as the memory roofline. SM clock and throttle reasons are
//! read after every (shape, M). Results go to `on_update` after every case, so an interrupted run
//! keeps what it measured.

use std::time::Instant;

use anyhow::Context;

use super::impls;
use super::reference::{rel_l2, sample_axes};
use super::schema::*;
use super::suite::Suite;
use super::{Env, GemmImpl, MInputs};
use crate::formats::GemmFormat;
use crate::gpu::cublaslt::Lt;
use crate::gpu::{Gpu, KArg, L2Flusher};
use crate::rig::telemetry::TelemetryReader;
use crate::stats::{StoppingRule, Summary};

/// Source of the kernels, compiled at run time by NVRTC.
pub const UTIL_SRC: &str = include_str!("../../kernels/util.cu");
/// Source of rigbench's W4A16 kernels.
pub const W4A16_SRC: &str = include_str!("../../kernels/w4a16.cu");
const UTIL_KERNELS: &[&str] = &[
    "fill_uniform_bf16",
    "fill_fp8_codes",
    "fp8_amax_bf16",
    "fp8_quant_bf16",
    "count_nonfinite_bf16",
    "count_diff_u16",
    "gather_u16",
    "l2_flush_read",
];

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
}

/// A started bench: the GPU objects that stay for the whole run.
struct Rig {
    gpu: Gpu,
    lt: Option<Lt>,
    util: crate::gpu::Module,
    w4: Vec<super::W4Module>,
    flusher: L2Flusher,
    telem: TelemetryReader,
}

/// Run the suite on GPU 0. Calls `on_update` after every case with everything so far.
///
/// # Errors
/// No GPU / driver problems ([`crate::RigError::NoGpu`]), NVRTC failing on util.cu. Failures of
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
    let gpu = Gpu::open_device(device)?;
    let mut res = KernelResults {
        suite: SuiteInfo {
            name: opts.suite.name.clone(),
            file: opts.suite.file.display().to_string(),
            description: opts.suite.description.clone(),
        },
        ..Default::default()
    };
    let util = gpu.compile("util", UTIL_SRC, UTIL_KERNELS)?;
    let lt = match Lt::new(&gpu) {
        Ok(l) => Some(l),
        Err(e) => {
            res.notes.push(format!(
                "cuBLASLt unavailable ({e}): bf16, fp8 and the W4A16 large-M path are skipped"
            ));
            None
        }
    };
    let names = impls::w4a16::kernel_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut w4 = Vec::new();
    for (flavor, defines) in super::w4a16_flavors() {
        let defines: Vec<String> = defines.iter().map(|d| d.to_string()).collect();
        match gpu.compile_with("w4a16", W4A16_SRC, &refs, &defines) {
            Ok(m) => {
                res.notes.push(format!(
                    "kernels/w4a16.cu flavour '{flavor}' ({}) compiled by NVRTC for {} in {:.2} s",
                    defines.join(" "),
                    m.arch,
                    m.compile_s
                ));
                w4.push(super::W4Module {
                    flavor: flavor.to_string(),
                    defines,
                    module: m,
                });
            }
            Err(e) => res.notes.push(format!(
                "kernels/w4a16.cu flavour '{flavor}' failed to build: {e}"
            )),
        }
    }
    let flusher = L2Flusher::new(&gpu, opts.flush)?;
    let rig = Rig {
        telem: TelemetryReader::for_pci_bus_id(
            crate::gpu::multi::pci_bus_id(device).as_deref(),
            device as u32,
        ),
        flusher,
        gpu,
        lt,
        util,
        w4,
    };
    let env = Env {
        gpu: &rig.gpu,
        lt: rig.lt.as_ref(),
        util: &rig.util,
        w4: &rig.w4,
    };
    res.timing_policy = Some(TimingPolicy {
        warmup_iters: opts.warmup,
        stopping: opts.stopping.clone(),
        l2_flush_bytes: if opts.cold_l2 { rig.flusher.bytes() } else { 0 },
        timer: format!(
            "CUDA events (CU_EVENT_DEFAULT) around each launch, one stream; L2 flush by {}",
            match opts.flush {
                crate::gpu::FlushMethod::Read =>
                    "reading a 2×L2 buffer (L2 left with clean lines only)",
                crate::gpu::FlushMethod::Write =>
                    "writing a 2×L2 buffer with memset, as nvbench (L2 left dirty)",
            }
        ),
    });
    res.copy_bandwidth = Some(copy_bandwidth(&rig.gpu)?);
    on_update(&res);

    let mut impls: Vec<Box<dyn GemmImpl>> = opts.formats.iter().map(|f| impls::make(*f)).collect();
    for im in &impls {
        res.kernel_facts.extend(im.kernel_facts(&env));
    }
    let total = (opts.suite.shapes.len() * opts.suite.m.len() * impls.len()) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (si, shape) in opts.suite.shapes.iter().enumerate() {
        if crate::signals::interrupted().is_some() {
            break;
        }
        let mut ready = vec![false; impls.len()];
        for (ii, im) in impls.iter_mut().enumerate() {
            if let Some(reason) = im.unsupported(rig.gpu.cc, shape) {
                skip(&mut res, im.id(), &shape.name, None, reason);
                continue;
            }
            match im.prepare_shape(&env, shape) {
                Ok(()) => ready[ii] = true,
                Err(e) => skip(
                    &mut res,
                    im.id(),
                    &shape.name,
                    None,
                    format!("could not prepare weights: {e:#}"),
                ),
            }
        }
        for (mi, &m) in opts.suite.m.iter().enumerate() {
            // SIGINT/SIGTERM (src/signals.rs): stop after the case in flight; what ran is kept.
            if crate::signals::interrupted().is_some() {
                break;
            }
            let case_start = res.cases.len();
            let inp = match make_inputs(&env, m, shape.n, shape.k, (si * 1000 + mi) as u32) {
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
            let (rows, cols) = sample_axes(m, shape.n, 32, 64, 0xC0FFEE ^ (si * 1000 + mi) as u32);
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
                match run_case(&rig, &env, opts, im.as_mut(), &inp, &rows, &cols) {
                    Ok(Outcome::Case(mut c)) => {
                        c.shape = shape.name.clone();
                        c.derived.weight_bytes = im.weight_stream_bytes(shape);
                        res.cases.push(*c);
                    }
                    Ok(Outcome::Failed(reason)) => {
                        skip(&mut res, im.id(), &shape.name, Some(m), reason)
                    }
                    Err(e) => skip(
                        &mut res,
                        im.id(),
                        &shape.name,
                        Some(m),
                        format!("error: {e:#}"),
                    ),
                }
                if opts.determinism_m.contains(&m) && ready[ii] {
                    match determinism(&env, im.as_ref(), &inp, opts.determinism_runs) {
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
                on_update(&res);
            }
            // Telemetry after the (shape, M) group; derived figures.
            let t = rig.telem.read();
            let copy = res.copy_bandwidth.as_ref().map(|c| c.bytes_per_s);
            let bf16_median = res.cases[case_start..]
                .iter()
                .find(|c| c.implementation == "bf16")
                .map(|c| c.timing.median_s);
            for c in &mut res.cases[case_start..] {
                fill_derived(c, copy, bf16_median);
                if let Some(t) = &t {
                    c.sm_clock_mhz = t.sm_clock_mhz;
                    c.throttle = t.harmful_throttle_reasons();
                }
            }
            if let Some(t) = &t {
                if !t.harmful_throttle_reasons().is_empty() {
                    res.notes.push(format!(
                        "throttling after {} M={m}: {} (SM clock {} MHz): figures of this group may be low",
                        shape.name,
                        t.harmful_throttle_reasons().join(", "),
                        t.sm_clock_mhz.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
                    ));
                }
            }
            on_update(&res);
        }
        for im in impls.iter_mut() {
            im.release_shape();
        }
    }
    bar.finish_and_clear();
    Ok(res)
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
    env.util.launch(
        env.gpu,
        "fill_uniform_bf16",
        super::grid_for(env.gpu, m * k),
        (256, 1, 1),
        0,
        &[
            KArg::Ptr(act.ptr()),
            KArg::U64((m * k) as u64),
            KArg::U32(seed),
            KArg::F32(1.0),
        ],
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
    env.util.launch(
        env.gpu,
        "gather_u16",
        ((idx.len().div_ceil(256)) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            KArg::Ptr(inp.out.ptr()),
            KArg::Ptr(idx_buf.ptr()),
            KArg::I32(idx.len() as i32),
            KArg::Ptr(dst.ptr()),
        ],
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
    env.util.launch(
        env.gpu,
        "count_nonfinite_bf16",
        super::grid_for(env.gpu, n),
        (256, 1, 1),
        0,
        &[
            KArg::Ptr(inp.out.ptr()),
            KArg::U64(n as u64),
            KArg::Ptr(cnt.ptr()),
        ],
    )?;
    Ok(env.gpu.download::<u32>(&cnt, 0, 1)?[0])
}

/// Time `f` (one launch group per sample) under the stopping rule.
fn time_it(
    rig: &Rig,
    opts: &BenchOptions,
    rule: &StoppingRule,
    f: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    for _ in 0..opts.warmup {
        f()?;
    }
    rig.gpu.sync()?;
    let timer = rig.gpu.timer()?;
    let mut samples = Vec::new();
    let started = Instant::now();
    let reason = loop {
        if opts.cold_l2 {
            rig.flusher.flush(&rig.gpu, &rig.util)?;
        }
        timer.start(&rig.gpu)?;
        f()?;
        samples.push(timer.stop(&rig.gpu)?);
        if let Some(r) = rule.check(&samples, started.elapsed().as_secs_f64()) {
            break r;
        }
    };
    let s = Summary::of(&samples).context("no timing samples")?;
    Ok(Timing {
        median_s: s.median,
        p10_s: s.p10,
        p90_s: s.p90,
        rel_std: s.rel_std(),
        stop_reason: Some(reason),
        cold_l2: opts.cold_l2,
        samples_s: samples,
    })
}

fn run_case(
    rig: &Rig,
    env: &Env,
    opts: &BenchOptions,
    im: &mut dyn GemmImpl,
    inp: &MInputs,
    rows: &[usize],
    cols: &[usize],
) -> anyhow::Result<Outcome> {
    let ncand = im.prepare_m(env, inp)?;
    let want = im.reference(env, inp, rows, cols)?;
    let (tol_name, tol) = im.tolerance();
    // Choose among configurations by measurement, each checked first.
    let mut chosen = 0usize;
    if ncand > 1 {
        let quick = StoppingRule {
            min_samples: opts.tune_samples,
            max_samples: opts.tune_samples,
            target_rel_std: 0.0,
            max_time_s: 1.0,
        };
        let mut best = f64::INFINITY;
        for c in 0..ncand {
            im.select(c);
            im.run(env, inp)?;
            let err = rel_l2(&gather(env, inp, rows, cols)?, &want);
            if err.is_nan() || err > tol {
                continue;
            }
            let imr: &dyn GemmImpl = im;
            let t = time_it(rig, opts, &quick, &|| imr.run(env, inp))?;
            if std::env::var_os("RIGBENCH_TUNE_LOG").is_some() {
                eprintln!(
                    "tune {} M={} {:.1} us  {}",
                    imr.id(),
                    inp.m,
                    t.median_s * 1e6,
                    imr.path()
                );
            }
            if t.median_s < best {
                best = t.median_s;
                chosen = c;
            }
        }
    }
    im.select(chosen);
    // The gating check: poison, run, scan, compare.
    rig.gpu.memset(&inp.out, 0xFF)?;
    im.run(env, inp)?;
    rig.gpu.sync()?;
    let nonfinite = count_nonfinite(env, inp)?;
    let got = gather(env, inp, rows, cols)?;
    let err = rel_l2(&got, &want);
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
    if !passed {
        return Ok(Outcome::Failed(format!(
            "failed its correctness check, not timed: rel_l2 = {err:.3e} (tolerance {tol_name} = {tol:.0e}), {nonfinite} non-finite outputs; path: {}",
            im.path()
        )));
    }
    let imr: &dyn GemmImpl = im;
    let timing = time_it(rig, opts, &opts.stopping, &|| imr.run(env, inp))?;
    let mut extra = Vec::new();
    for part in imr.extra_parts() {
        let t = time_it(rig, opts, &opts.stopping, &|| imr.run_extra(env, inp, part))?;
        extra.push(NamedTiming {
            name: part.into(),
            timing: t,
        });
    }
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
        sm_clock_mhz: None,
        throttle: Vec::new(),
    })))
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

/// Device-to-device copy of 1 GiB (or a quarter of free memory), warm, 20 samples: the bytes
/// read plus written over the median time.
/// Device-to-device copy bandwidth (1 GiB or a quarter of free memory; 20 timed copies;
/// read + written bytes over the median time): the memory roofline of a run.
///
/// # Errors
/// A device failure.
pub fn copy_bandwidth(gpu: &Gpu) -> anyhow::Result<CopyBandwidth> {
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
        env.util.launch(
            env.gpu,
            "count_diff_u16",
            super::grid_for(env.gpu, n),
            (256, 1, 1),
            0,
            &[
                KArg::Ptr(first.ptr()),
                KArg::Ptr(inp.out.ptr()),
                KArg::U64(n as u64),
                KArg::Ptr(cnt.ptr()),
            ],
        )?;
        worst = worst.max(env.gpu.download::<u32>(&cnt, 0, 1)?[0]);
    }
    Ok((worst == 0, worst as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles both kernel files with NVRTC for sm_90 when libnvrtc and the CUDA headers are
    /// present (no GPU needed); skips with a reason otherwise.
    #[test]
    fn kernels_compile_with_nvrtc_when_available() {
        if !crate::gpu::libraries().nvrtc {
            eprintln!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 lib folder to run this test)");
            return;
        }
        let Some(inc) = crate::gpu::probe::cuda_include_dir() else {
            eprintln!("skipped: CUDA headers not found (set CUDA_HOME)");
            return;
        };
        let (ptx, _) = crate::gpu::context::nvrtc_compile("util", UTIL_SRC, "sm_90", &inc)
            .expect("util.cu compiles");
        let text = ptx.to_src();
        for k in UTIL_KERNELS {
            assert!(text.contains(k), "{k} missing from PTX");
        }
        let (ptx, _) = crate::gpu::context::nvrtc_compile("w4a16", W4A16_SRC, "sm_90", &inc)
            .expect("w4a16.cu compiles");
        let text = ptx.to_src();
        assert!(text.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        assert!(text.contains("ld.global.nc.L1::no_allocate.v4.u32"));
        for k in impls::w4a16::kernel_names() {
            assert!(text.contains(&k), "{k} missing from PTX");
        }
    }
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
        for (name, src) in [("util", super::UTIL_SRC), ("w4a16", super::W4A16_SRC)] {
            let (ptx, _) =
                crate::gpu::context::nvrtc_compile(name, src, "sm_90", &inc).expect("compiles");
            std::fs::write(format!("{dir}/{name}.ptx"), ptx.to_src()).expect("write");
        }
    }
}
