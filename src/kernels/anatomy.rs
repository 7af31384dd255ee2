//! Where the W4A16 kernel's time goes at small M: the same configuration timed whole, without
//! its cross-CTA reduction (`MODE=1`), without its MMAs (`MODE=2`), and an empty kernel of the
//! same launch shape, next to cuBLASLt BF16 and the weight bytes (cold L2, CUDA events,
//! medians). The differences are the cost of each part; docs/w4a16-notes.md reads them.

use crate::gpu::dim;
use anyhow::Context;

use crate::formats::w4a16_pack::repack;
use crate::gemm::w4a16::{self as w4, Config, W4a16Device};
use crate::gpu::cublaslt::{Lt, LtGemm, LtKind};
use crate::gpu::{FlushMethod, Gpu, L2Flusher, Module};
use crate::kernels::data::{host_threads, nvfp4_weight};

/// One shape's timings, seconds (medians).
#[derive(Debug, Clone, PartialEq)]
pub struct Anatomy {
    /// N.
    pub n: usize,
    /// K.
    pub k: usize,
    /// M.
    pub m: usize,
    /// NVFP4 weight bytes streamed (codes and scales, padded layout).
    pub bytes: u64,
    /// cuBLASLt BF16 GEMM.
    pub bf16: f64,
    /// The fastest version-2 configuration (its description).
    pub v2_config: String,
    /// It, whole.
    pub v2: f64,
    /// It without the cross-CTA reduction.
    pub v2_no_reduce: f64,
    /// It without MMAs (streaming and dequantization only).
    pub v2_no_mma: f64,
    /// An empty kernel with its grid.
    pub empty: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Time `f` `reps` times with an L2 flush before each, return the median.
fn cold(
    gpu: &Gpu,
    util: &Module,
    fl: &L2Flusher,
    reps: usize,
    f: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let t = gpu.timer()?;
    f()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        fl.flush(gpu, util)?;
        t.start(gpu)?;
        f()?;
        v.push(t.stop(gpu)?);
    }
    Ok(median(v))
}

/// Measure [`Anatomy`] for each `(n, k)` at `m` tokens on device `device`.
///
/// # Errors
/// A device or compile failure.
pub fn run(device: usize, shapes: &[(usize, usize)], m: usize) -> anyhow::Result<Vec<Anatomy>> {
    let gpu = Gpu::open_device(device)?;
    let util = gpu.compile(
        "util",
        crate::kernels::bench::UTIL_SRC,
        crate::kernels::bench::UTIL_KERNELS,
    )?;
    let names = w4::v2_kernel_names();
    let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
    refs.push("w4v2_empty");
    let build = |mode: u32| -> anyhow::Result<Module> {
        Ok(gpu.compile_with("w4a16_v2", w4::V2_SRC, &refs, &[format!("-DMODE={mode}")])?)
    };
    let (m0, m1, m2) = (build(0)?, build(1)?, build(2)?);
    let lt = Lt::new(&gpu)?;
    let fl = L2Flusher::new(&gpu, FlushMethod::Read)?;
    let mut out = Vec::new();
    for &(n, k) in shapes {
        let w = nvfp4_weight(n, k, 0xA11A, host_threads());
        let p = repack(&w)?;
        let dev = W4a16Device::upload(&gpu, &p)?;
        let view = dev.view();
        let act = gpu.alloc(m * k * 2)?;
        gpu.memset(&act, 0x3C)?;
        let outb = gpu.alloc(m * n * 2)?;
        let wbf = gpu.alloc(n * k * 2)?;
        gpu.memset(&wbf, 0x3C)?;
        let g = LtGemm::plan(&lt, LtKind::Bf16, m, n, k)?;
        let bf16 = cold(&gpu, &util, &fl, 15, &|| {
            Ok(g.run(&lt, &gpu, 1.0, wbf.ptr(), act.ptr(), outb.ptr())?)
        })?;
        let cands = w4::v2_candidates(&gpu, &m0, dev.strips, dev.kt_n, m)?;
        anyhow::ensure!(!cands.is_empty(), "no v2 configuration for M = {m}");
        let mut ws_f = 0;
        let mut ctr = 0;
        for c in &cands {
            let (a, b, _) = w4::scratch_needs(c, n, k);
            ws_f = ws_f.max(a);
            ctr = ctr.max(b);
        }
        let ws = gpu.alloc(ws_f.max(1) * 4)?;
        let counters = gpu.alloc(ctr.max(1) * 4)?;
        gpu.memset(&counters, 0)?;
        let launch = |module: &Module, c: &Config| -> anyhow::Result<()> {
            w4::launch_view(
                &gpu,
                &[],
                Some(module),
                None,
                &view,
                c,
                act.ptr(),
                outb.ptr(),
                m,
                ws.ptr(),
                counters.ptr(),
                0,
                None,
            )
        };
        // A configuration whose launch fails (CUDA_ERROR_INVALID_VALUE for some M = 16 shapes:
        // more shared memory than the card gives one block) is not used, as in the bench's and
        // the runtime's tuning; the error is not sticky, so the others still run.
        let mut best: Option<(f64, Config)> = None;
        let mut failed: Vec<String> = Vec::new();
        for c in &cands {
            match cold(&gpu, &util, &fl, 7, &|| launch(&m0, c)) {
                Ok(t) if best.as_ref().is_none_or(|(b, _)| t < *b) => best = Some((t, c.clone())),
                Ok(_) => {}
                Err(e) => failed.push(format!("{c:?}: {e:#}")),
            }
        }
        let (_, cfg) = best.with_context(|| {
            format!(
                "no v2 configuration for {n}×{k} at M = {m} launched ({})",
                failed.join("; ")
            )
        })?;
        if let Config::V2 {
            nt,
            warps,
            wn,
            smem,
            ..
        } = &cfg
        {
            // The MODE builds are separate modules: raise their shared-memory limit too.
            let name = w4::v2_name(*nt, *warps, *wn);
            for m in [&m1, &m2] {
                m.occupancy_smem(&name, (*warps * 32) as u32, *smem as u32)?;
            }
        }
        let v2 = cold(&gpu, &util, &fl, 15, &|| launch(&m0, &cfg))?;
        // MODE=1 leaves the counters untouched by design; reset them after.
        let v2_no_reduce = cold(&gpu, &util, &fl, 15, &|| launch(&m1, &cfg))?;
        gpu.memset(&counters, 0)?;
        let v2_no_mma = cold(&gpu, &util, &fl, 15, &|| launch(&m2, &cfg))?;
        let Config::V2 { ctas, warps, .. } = cfg else {
            anyhow::bail!("not a v2 configuration")
        };
        let sink = gpu.alloc(ctas * 4)?;
        let empty = cold(&gpu, &util, &fl, 15, &|| {
            Ok(crate::gemm::launchers::w4a16_v2::w4v2_empty(
                &m0,
                &gpu,
                (dim("ctas", ctas)?, 1, 1),
                (dim("warps * 32", warps * 32)?, 1, 1),
                0,
                &sink,
                0,
            )?)
        })?;
        out.push(Anatomy {
            n,
            k,
            m,
            bytes: dev.bytes() as u64,
            bf16,
            v2_config: format!("{cfg:?}"),
            v2,
            v2_no_reduce,
            v2_no_mma,
            empty,
        });
    }
    Ok(out)
}
