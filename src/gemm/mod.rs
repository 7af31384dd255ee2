//! The GEMM layer: the GEMM operations that the kernel bench times and the built-in runtime runs,
//! one room below both (docs/architecture.md, "What each folder is for"), so that a figure of
//! the bench is a figure of the code the runtime calls. It knows the gpu crate and the number
//! formats, nothing of the bench's suites or the runtime's models.
//!
//! Entry points, by what a caller wants:
//! - build the kernels of one device: [`ops::GemmModules::build`] (what to build:
//!   [`ops::ModuleWants`]; the W4A16 flavours: [`W4A16_FLAVORS`], [`W4A16_DEFAULT_FLAVOR`]);
//! - run a cuBLASLt GEMM: [`ops::GemmClass`], [`ops::plan`], [`ops::PlanCache`]; FP8 W8A8 with
//!   per-token × per-channel scales: [`ops::fp8_rowwise_gemm`] ([`ops::Fp8Scaling`]), its
//!   activations quantized by [`fp8_quant::launch_quant_rows`];
//! - run rigbench's W4A16 NVFP4 kernels: [`w4a16::W4a16Device`] (the weight on the device),
//!   [`w4a16::all_candidates`] (the configurations for one M), [`w4a16::launch_view`];
//!   the Hopper wgmma kernel's host side is [`w4a16_wg`];
//! - choose among configurations, correct before fast: [`tuner::choose`] (the M buckets the
//!   runtime tunes at: [`tuner::M_BUCKETS`]);
//! - check an output: [`check::rel_l2`] and the named tolerances of [`check`];
//! - the typed launchers of `kernels/fp8_quant.cu` and `kernels/w4a16*.cu`: [`launchers`].
//!
//! A new GEMM operation (the MoE expert GEMMs, the small-M GEMVs) goes here, as a module beside
//! [`w4a16`] with its own candidates and launch, built by [`ops::GemmModules`]; the kernel bench
//! gains a `GemmImpl` for it in `kernels::impls` (its life cycle and CPU reference only) and the
//! runtime calls it from `runtime::backend::cuda::gemm`.
//!
//! Convention: `C[M, N] = A[M, K] · W[N, K]ᵀ`, all row-major with K contiguous; M tokens, N output
//! features, K input features (docs/architecture.md, "Terms").

pub mod check;
pub mod fp8_quant;
pub mod gemv;
pub mod launchers;
pub mod moe;
pub mod ops;
pub mod tuner;
pub mod w4a16;
pub mod w4a16_wg;

use crate::gpu::{Gpu, Module};

/// One compiled flavour of kernels/w4a16.cu (or the wgmma kernel, flavour
/// [`w4a16_wg::WG_FLAVOR`]).
pub struct W4Module {
    /// Flavour name (e.g. `nc`, `nc-l2p256`).
    pub flavor: String,
    /// The NVRTC defines that make it.
    pub defines: Vec<String>,
    /// The module.
    pub module: Module,
}

impl W4Module {
    /// Whether this is the Hopper wgmma kernel (kernels/w4a16_wg.cu) rather than a flavour of
    /// kernels/w4a16.cu.
    pub fn is_wg(&self) -> bool {
        self.flavor == w4a16_wg::WG_FLAVOR
    }
}

/// The W4A16 kernel flavours rigbench can compile: name and NVRTC defines (see kernels/w4a16.cu).
/// Each flavour multiplies the configurations the tuner times; docs/w4a16-notes.md records why
/// only `nc` is compiled by default (the load hints measured equal on the H200, a ring of 8
/// slower at M = 64). The kernel bench picks among them with `RIGBENCH_W4A16_FLAVORS`
/// (`kernels::w4a16_flavors`).
pub const W4A16_FLAVORS: &[(&str, &[&str])] = &[
    ("nc", &["-DW4_LOAD=0", "-DW4_RING=4"]),
    ("nc-l2p256", &["-DW4_LOAD=1", "-DW4_RING=4"]),
    ("cs", &["-DW4_LOAD=2", "-DW4_RING=4"]),
    ("nc-ring8", &["-DW4_LOAD=0", "-DW4_RING=8"]),
];

/// The flavour rigbench compiles by default (the kernel bench without `RIGBENCH_W4A16_FLAVORS`),
/// and the only one the built-in runtime compiles: `RIGBENCH_W4A16_FLAVORS` is a kernel-bench
/// setting, which the runtime does not follow.
pub const W4A16_DEFAULT_FLAVOR: (&str, &[&str]) = W4A16_FLAVORS[0];

/// Launch geometry for a grid-stride kernel over `n` elements: ⌈n / 256⌉ blocks, at least 1 and
/// at most 8 per SM.
pub fn grid_for(gpu: &Gpu, n: usize) -> (u32, u32, u32) {
    let blocks = n.div_ceil(256).clamp(1, gpu.sm_count.max(1) as usize * 8);
    (blocks as u32, 1, 1)
}
