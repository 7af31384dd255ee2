//! GEMM implementations behind one trait ([`GemmImpl`]), checked against a CPU reference before
//! they are timed ([`bench`]), with the stopping rule, roofline figures and the determinism
//! check; the CPU accuracy study of each format ([`accuracy`]); peers from other libraries run
//! in the same session ([`peers`]); and the report section ([`render`]).
//!
//! The GEMM operations themselves (the kernels' builder, their configurations and launches, the
//! tuner, FP8 quantization, the error metric and tolerances) are the GEMM layer's,
//! [`crate::gemm`], one room below this one, which the runtime runs too; an implementation here
//! keeps only the bench's life cycle (seeded weights, the CPU reference, graph copies) and, for
//! the wgmma kernel, the CPU emulation.
//!
//! Convention: `C[M, N] = A[M, K] · W[N, K]ᵀ`, all row-major with K contiguous; M tokens, N output
//! features, K input features (docs/architecture.md, "Terms").

pub mod accuracy;
pub mod anatomy;
pub mod bench;
pub mod clocks;
pub mod composite;
pub mod composite_chart;
pub mod data;
pub mod device;
pub mod fit;
pub mod goals;
pub mod impls;
pub mod moe_grouped;
pub mod peak;
pub mod peer_nvfp4;
pub mod peers;
pub mod reference;
pub mod render;
pub mod repeats;
pub mod schema;
pub mod suite;
pub mod timing_modes;
pub mod wording;

pub use schema::KernelResults;

use crate::formats::GemmFormat;
use crate::gemm::{W4Module, W4A16_FLAVORS};
use crate::gpu::cublaslt::Lt;
use crate::gpu::ComputeCapability;
use crate::gpu::{DevBuf, Gpu, Module};
use suite::Shape;

/// The GPU objects an implementation may use.
pub struct Env<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// cuBLASLt, when the library loads.
    pub lt: Option<&'a Lt>,
    /// `kernels/util.cu`.
    pub util: &'a Module,
    /// `kernels/w4a16.cu`, compiled once per flavour (load instruction, ring depth), and on sm_90
    /// `kernels/w4a16_wg.cu` as the flavour `wgmma` (see [`W4Module::is_wg`]); empty when
    /// nothing compiled.
    pub w4: &'a [W4Module],
    /// `kernels/w4a16_v2.cu`, when it compiled.
    pub w4v2: Option<&'a Module>,
    /// `kernels/fp8_quant.cu` (per-token FP8 quantization), when it compiled.
    pub fp8q: Option<&'a Module>,
}

/// The flavours of [`crate::gemm::W4A16_FLAVORS`] the kernel bench compiles in this run: `nc`
/// unless `RIGBENCH_W4A16_FLAVORS` is `all` or a comma-separated list of names (a kernel-bench
/// setting; the runtime compiles [`crate::gemm::W4A16_DEFAULT_FLAVOR`] only).
pub fn w4a16_flavors() -> Vec<(&'static str, &'static [&'static str])> {
    let want = std::env::var("RIGBENCH_W4A16_FLAVORS").unwrap_or_else(|_| "nc".into());
    W4A16_FLAVORS
        .iter()
        .filter(|(n, _)| want == "all" || want.split(',').any(|w| w.trim() == *n))
        .copied()
        .collect()
}

/// Inputs and output for one (shape, M): BF16 activations `[m, k]` generated from `seed_a`
/// (see [`data::bf16_uniform`] with scale 1), and the BF16 output `[m, n]`.
pub struct MInputs {
    /// Tokens.
    pub m: usize,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Activations, BF16 `[m, k]`.
    pub act: DevBuf,
    /// Output, BF16 `[m, n]`.
    pub out: DevBuf,
    /// Seed of the activations.
    pub seed_a: u32,
}

impl MInputs {
    /// Activation row `row` as exact f64 values (CPU mirror of the GPU data).
    pub fn act_row(&self, row: usize) -> Vec<f64> {
        (0..self.k)
            .map(|kk| data::bf16_uniform((row * self.k + kk) as u32, self.seed_a, 1.0) as f64)
            .collect()
    }
}

/// One GEMM implementation (rigbench's own or a library's).
///
/// Life cycle per shape: [`prepare_shape`](GemmImpl::prepare_shape) (weights to the GPU), then
/// per M: [`prepare_m`](GemmImpl::prepare_m) (plans, buffers; returns how many launch
/// configurations it offers), [`select`](GemmImpl::select), [`run`](GemmImpl::run) any number of
/// times, and finally [`release_shape`](GemmImpl::release_shape).
pub trait GemmImpl {
    /// Implementation id (`bf16`, `fp8`, `w4a16`, `w4a4`).
    fn id(&self) -> &'static str;
    /// The format it computes.
    fn format(&self) -> GemmFormat;
    /// Why it cannot run on this card or shape, if so (recorded as a skip).
    fn unsupported(&self, cc: ComputeCapability, shape: &Shape) -> Option<String>;
    /// Generate and upload the weights of `shape`.
    fn prepare_shape(&mut self, env: &Env, shape: &Shape) -> anyhow::Result<()>;
    /// Free the shape's GPU buffers.
    fn release_shape(&mut self);
    /// Prepare for one M; returns the number of launch configurations (≥ 1) to choose from.
    fn prepare_m(&mut self, env: &Env, inp: &MInputs) -> anyhow::Result<usize>;
    /// Use configuration `i` (< the count `prepare_m` returned).
    fn select(&mut self, i: usize);
    /// Queue one GEMM writing `inp.out`.
    fn run(&self, env: &Env, inp: &MInputs) -> anyhow::Result<()>;
    /// What runs now (library and algorithm, or kernel variant and launch shape).
    fn path(&self) -> String;
    /// Separately timed parts (e.g. FP8 activation quantization).
    fn extra_parts(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Queue one run of an extra part.
    fn run_extra(&self, _env: &Env, _inp: &MInputs, _part: &str) -> anyhow::Result<()> {
        Ok(())
    }
    /// CPU reference at the sampled (row, col) grid, row-major (see [`reference::sampled_gemm`]).
    fn reference(
        &self,
        env: &Env,
        inp: &MInputs,
        rows: &[usize],
        cols: &[usize],
    ) -> anyhow::Result<Vec<f64>>;
    /// Named tolerance on `rel_l2`.
    fn tolerance(&self) -> (&'static str, f64);
    /// Bytes of the weight stream for `shape` (elements plus scales).
    fn weight_stream_bytes(&self, shape: &Shape) -> u64 {
        self.format().weight_stream_bytes(shape.n, shape.k)
    }
    /// Kernel resource facts for the report (rigbench's own kernels only).
    fn kernel_facts(&self, _env: &Env) -> Vec<schema::KernelFacts> {
        Vec::new()
    }
    /// Graph timing (`--timing graph|both`): make the current shape's weights available as
    /// `count` copies with identical contents, so that back-to-back launches can rotate over
    /// more bytes than L2 holds. Copy 0 may be the weights [`prepare_shape`](GemmImpl::prepare_shape)
    /// uploaded; copies 1.. are new device buffers. Called after [`select`](GemmImpl::select);
    /// undone by [`release_weight_copies`](GemmImpl::release_weight_copies).
    ///
    /// # Errors
    /// The default implementation: graph timing is not supported by this implementation (the
    /// report says so beside its cold timing). Otherwise, allocation failures.
    fn prepare_weight_copies(&mut self, _env: &Env, _count: usize) -> anyhow::Result<()> {
        anyhow::bail!(
            "{} cannot run against rotating weight copies yet (GemmImpl::prepare_weight_copies not implemented)",
            self.id()
        )
    }
    /// Queue one GEMM writing `inp.out` that reads weight copy `copy` (< the count given to
    /// [`prepare_weight_copies`](GemmImpl::prepare_weight_copies)), with the selected
    /// configuration. It is captured into a CUDA graph: it must not allocate, copy to or from the
    /// host, or synchronize.
    ///
    /// # Errors
    /// The default implementation: not supported.
    fn run_on_copy(&self, _env: &Env, _inp: &MInputs, copy: usize) -> anyhow::Result<()> {
        anyhow::bail!(
            "{} cannot run against weight copy {copy} (GemmImpl::run_on_copy not implemented)",
            self.id()
        )
    }
    /// Free the copies made by [`prepare_weight_copies`](GemmImpl::prepare_weight_copies)
    /// (the shape's own weights stay).
    fn release_weight_copies(&mut self) {}
}
