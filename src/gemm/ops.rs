//! The GEMM operations that the kernel bench times and the built-in runtime runs (the GEMM layer,
//! [`crate::gemm`]; docs/architecture.md, "GPU layer", step 3), so that a figure of the bench is
//! a figure of the code the runtime calls.
//!
//! - [`GemmModules`]: the one place the GEMM kernels are compiled (`kernels/w4a16.cu` in its
//!   flavours, `kernels/w4a16_v2.cu`, `kernels/w4a16_wg.cu` where the card runs it,
//!   `kernels/fp8_quant.cu`), with a note on how each was built and the SHA-256 of each source.
//! - [`GemmClass`], [`plan`] and [`PlanCache`]: the cuBLASLt GEMMs (BF16, and FP8 E4M3 with
//!   outer-vector or unit scales) and their plans per (class, M, N, K).
//! - [`Fp8Scaling`] and [`fp8_rowwise_gemm`]: FP8 W8A8 with per-token × per-channel scales, the
//!   scales applied inside cuBLASLt or after an FP32-output GEMM; its activations are quantized
//!   per token by [`crate::gemm::fp8_quant::launch_quant_rows`] (static scales included).
//! - W4A16 NVFP4: [`crate::gemm::w4a16::launch_view`] with a configuration from
//!   [`crate::gemm::w4a16::all_candidates`].
//!
//! The choice among configurations is [`crate::gemm::tuner`]'s, for the bench and the runtime
//! alike.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;

use super::{fp8_quant, grid_for, w4a16, w4a16_wg, W4Module};
use crate::gpu::cublaslt::{Lt, LtGemm, LtKind, OutType};
use crate::gpu::{DevPtr, Gpu, Module};

/// Which GEMM modules to build, for [`GemmModules::build`].
#[derive(Debug, Clone)]
pub struct ModuleWants {
    /// Build the W4A16 modules: `kernels/w4a16.cu` in each of [`ModuleWants::w4_flavors`],
    /// `kernels/w4a16_v2.cu`, and `kernels/w4a16_wg.cu` where the card runs it.
    pub w4: bool,
    /// `kernels/w4a16.cu` flavours (name, NVRTC defines), each one module (none: only the v2
    /// and wgmma modules, when [`ModuleWants::w4`]).
    pub w4_flavors: Vec<(&'static str, &'static [&'static str])>,
    /// Build `kernels/fp8_quant.cu` (per-token quantization and the row-wise scale epilogue).
    pub fp8: bool,
    /// CUDA device ordinal (the wgmma kernel's probe runs on it).
    pub device: usize,
}

/// The compiled GEMM kernels of one device. A module that failed to build is absent, and
/// [`GemmModules::notes`] says why.
pub struct GemmModules {
    /// `kernels/w4a16.cu` per flavour, then `kernels/w4a16_wg.cu` as flavour `wgmma` when the
    /// card runs it and its probe passes.
    pub w4: Vec<W4Module>,
    /// `kernels/w4a16_v2.cu`.
    pub w4v2: Option<Module>,
    /// `kernels/fp8_quant.cu`.
    pub fp8q: Option<Module>,
    /// One line per module: how it was built (NVRTC time, or loaded from the compiled-kernel
    /// cache), or why it failed to build or is not offered.
    pub notes: Vec<String>,
    /// Lines of [`GemmModules::notes`] that are failures to build (a subset, same text).
    pub failures: Vec<String>,
    /// SHA-256 of every source built, by its path (`kernels/w4a16.cu`, …).
    pub sources: BTreeMap<String, String>,
}

impl GemmModules {
    /// Build the modules `want` asks for on `gpu`. Never fails: each failure is a note (and a
    /// line of [`GemmModules::failures`]); the caller decides whether it can go on without
    /// that module.
    pub fn build(gpu: &Gpu, want: &ModuleWants) -> GemmModules {
        let mut me = GemmModules {
            w4: Vec::new(),
            w4v2: None,
            fp8q: None,
            notes: Vec::new(),
            failures: Vec::new(),
            sources: BTreeMap::new(),
        };
        // The kernel bench's order of notes: w4a16.cu, w4a16_v2.cu, fp8_quant.cu, w4a16_wg.cu.
        if want.w4 {
            me.build_w4(gpu, want);
        }
        if want.fp8 {
            match compile_fp8_quant(gpu) {
                Ok(m) => {
                    me.built("kernels/fp8_quant.cu", &m);
                    me.fp8q = Some(m);
                }
                Err(e) => me.fail(format!(
                    "kernels/fp8_quant.cu failed to build: {e}; fp8-rowwise is skipped"
                )),
            }
        }
        if want.w4 {
            me.build_wg(gpu, want.device);
        }
        me
    }

    /// Record a module built from `path`: the note on how (`{path} for {arch}: {how}`) and its
    /// source's SHA-256.
    fn built(&mut self, path: &str, m: &Module) {
        self.notes
            .push(format!("{path} for {}: {}", m.arch, m.how_built()));
        self.sources.insert(path.into(), m.source_sha256.clone());
    }

    fn fail(&mut self, line: String) {
        self.failures.push(line.clone());
        self.notes.push(line);
    }

    /// The W4A16 modules: every flavour of `w4a16.cu`, then `w4a16_v2.cu`.
    fn build_w4(&mut self, gpu: &Gpu, want: &ModuleWants) {
        let names = w4a16::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        for (flavor, defines) in &want.w4_flavors {
            let defines: Vec<String> = defines.iter().map(|d| d.to_string()).collect();
            match gpu.compile_with("w4a16", w4a16::SRC, &refs, &defines) {
                Ok(m) => {
                    self.notes.push(format!(
                        "kernels/w4a16.cu flavour '{flavor}' ({}) for {}: {}",
                        defines.join(" "),
                        m.arch,
                        m.how_built()
                    ));
                    self.sources
                        .insert("kernels/w4a16.cu".into(), m.source_sha256.clone());
                    self.w4.push(W4Module {
                        flavor: flavor.to_string(),
                        defines,
                        module: m,
                    });
                }
                Err(e) => self.fail(format!(
                    "kernels/w4a16.cu flavour '{flavor}' failed to build: {e}"
                )),
            }
        }
        let v2_names = w4a16::v2_kernel_names();
        let v2_refs: Vec<&str> = v2_names.iter().map(String::as_str).collect();
        match gpu.compile("w4a16_v2", w4a16::V2_SRC, &v2_refs) {
            Ok(m) => {
                self.built("kernels/w4a16_v2.cu", &m);
                self.w4v2 = Some(m);
            }
            Err(e) => self.fail(format!("kernels/w4a16_v2.cu failed to build: {e}")),
        }
    }

    /// The Hopper wgmma W4A16 kernel, as flavour `wgmma`, when the card runs it and its probe
    /// passes ([`w4a16_wg::module_for`]); otherwise a note says why (not a failure).
    fn build_wg(&mut self, gpu: &Gpu, device: usize) {
        match w4a16_wg::module_for(gpu, device) {
            Ok((m, how)) => {
                self.notes.push(how);
                if !m.module.source_sha256.is_empty() {
                    self.sources
                        .insert("kernels/w4a16_wg.cu".into(), m.module.source_sha256.clone());
                }
                self.w4.push(m);
            }
            Err(why) => self.notes.push(format!(
                "the W4A16 wgmma kernel (kernels/w4a16_wg.cu) is not offered: {why}"
            )),
        }
    }
}

/// Compile `kernels/fp8_quant.cu` (every kernel of [`fp8_quant::kernel_names`]) for `gpu`,
/// through the compiled-kernel cache.
///
/// # Errors
/// NVRTC or the module load fails.
pub fn compile_fp8_quant(gpu: &Gpu) -> anyhow::Result<Module> {
    let names = fp8_quant::kernel_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(gpu.compile("fp8_quant", fp8_quant::SRC, &refs)?)
}

/// The kinds of cuBLASLt GEMM of the GEMM layer (weights N×K, activations M×K, output M×N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmClass {
    /// BF16 × BF16 → BF16 (BF16 linears; W4A16's dequantize + GEMM path).
    Bf16,
    /// BF16 × BF16 → FP32 (the runtime's lm_head, whose logits stay FP32).
    Bf16ToF32,
    /// FP8 E4M3 with outer-vector (per-channel × per-token) scales → BF16.
    Fp8Scaled,
    /// FP8 E4M3 with per-tensor scale pointers (set to 1.0 by [`fp8_rowwise_gemm`]) → FP32.
    Fp8ToF32,
}

impl GemmClass {
    /// The cuBLASLt kind and output type of this class, with `w_scales` / `a_scales` as the
    /// FP8 scale pointers (device addresses; ignored by the BF16 classes).
    pub fn lt_kind(self, w_scales: u64, a_scales: u64) -> (LtKind, OutType) {
        match self {
            GemmClass::Bf16 => (LtKind::Bf16, OutType::Bf16),
            GemmClass::Bf16ToF32 => (LtKind::Bf16, OutType::F32),
            GemmClass::Fp8Scaled => (
                LtKind::Fp8RowWise {
                    w_scales_ptr: w_scales,
                    a_scales_ptr: a_scales,
                },
                OutType::Bf16,
            ),
            GemmClass::Fp8ToF32 => (
                LtKind::Fp8 {
                    w_scale_ptr: w_scales,
                    a_scale_ptr: a_scales,
                },
                OutType::F32,
            ),
        }
    }
}

/// Plan one cuBLASLt GEMM of `class` at M×N×K with the given FP8 scale pointers.
///
/// # Errors
/// cuBLASLt has no algorithm for it (e.g. no outer-vector FP8 scaling on this card or version).
pub fn plan(
    lt: &Lt,
    class: GemmClass,
    (m, n, k): (usize, usize, usize),
    w_scales: u64,
    a_scales: u64,
) -> anyhow::Result<LtGemm> {
    let (kind, out) = class.lt_kind(w_scales, a_scales);
    Ok(LtGemm::plan_out(lt, kind, m, n, k, out)?)
}

/// Plan-cache key: (class, M, N, K).
pub type PlanKey = (GemmClass, usize, usize, usize);

/// cuBLASLt plans per [`PlanKey`], planned on first use. FP8 plans are made with placeholder
/// scale pointers; [`fp8_rowwise_gemm`] sets the real ones before each run.
#[derive(Default)]
pub struct PlanCache {
    plans: HashMap<PlanKey, LtGemm>,
}

impl PlanCache {
    /// The plan for `key`, planned on first use with `placeholder` (a device address of one
    /// FP32 1.0) as both FP8 scale pointers.
    ///
    /// # Errors
    /// Planning fails ([`plan`]).
    pub fn get(&mut self, lt: &Lt, placeholder: u64, key: PlanKey) -> anyhow::Result<&LtGemm> {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.plans.entry(key) {
            let (class, m, n, k) = key;
            slot.insert(plan(lt, class, (m, n, k), placeholder, placeholder)?);
        }
        Ok(&self.plans[&key])
    }

    /// Plans held.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether no plan is held.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

/// How an FP8 row-wise GEMM applies its per-token × per-channel scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Scaling {
    /// Inside cuBLASLt: outer-vector scales (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`),
    /// BF16 output ([`GemmClass::Fp8Scaled`]).
    OuterVec,
    /// cuBLASLt with unit scales into an FP32 buffer ([`GemmClass::Fp8ToF32`]), then
    /// `fp8_rowwise_scale_out` (`kernels/fp8_quant.cu`): `out = bf16(acc · s_tok · s_chan)`.
    Fp32ThenScale,
}

impl Fp8Scaling {
    /// Both, in the tuner's order: outer-vector first (the one that needs no FP32 buffer; a tie
    /// keeps it).
    pub const ALL: [Fp8Scaling; 2] = [Fp8Scaling::OuterVec, Fp8Scaling::Fp32ThenScale];

    /// The cuBLASLt class this way plans.
    pub fn class(self) -> GemmClass {
        match self {
            Fp8Scaling::OuterVec => GemmClass::Fp8Scaled,
            Fp8Scaling::Fp32ThenScale => GemmClass::Fp8ToF32,
        }
    }

    /// Short name for notes (`outer-vec`, `fp32+scale`).
    pub fn short(self) -> &'static str {
        match self {
            Fp8Scaling::OuterVec => "outer-vec",
            Fp8Scaling::Fp32ThenScale => "fp32+scale",
        }
    }
}

/// Operands of one FP8 row-wise GEMM `out[M, N] = (qa · s_tok) · (w · s_chan)ᵀ`, as device
/// addresses.
#[derive(Debug, Clone, Copy)]
pub struct Fp8RowWiseArgs {
    /// M (tokens).
    pub m: usize,
    /// N (output channels).
    pub n: usize,
    /// K.
    pub k: usize,
    /// E4M3 weights `[N, K]`.
    pub w: u64,
    /// FP32 per-channel weight scales `[N]`.
    pub w_scales: u64,
    /// E4M3 activations `[M, K]` (from [`fp8_quant::launch_quant_rows`] or a fused kernel).
    pub qa: u64,
    /// FP32 per-token activation scales `[M]`.
    pub a_scales: u64,
    /// BF16 output `[M, N]`.
    pub out: u64,
    /// FP32 scratch `[M, N]` and its size in bytes, for [`Fp8Scaling::Fp32ThenScale`].
    pub acc: Option<(u64, usize)>,
    /// One FP32 1.0 (the unit scales of [`Fp8Scaling::Fp32ThenScale`]).
    pub one: u64,
}

/// Queue one FP8 row-wise GEMM on `gpu`'s stream with the plan `g` (of class
/// `scaling.class()` at the args' M×N×K): its scale pointers are set to the args' first.
/// `fq` is `kernels/fp8_quant.cu` ([`compile_fp8_quant`]) for the epilogue of
/// [`Fp8Scaling::Fp32ThenScale`].
///
/// # Errors
/// No FP32 buffer (or too small a one) for [`Fp8Scaling::Fp32ThenScale`], no `fq` module for it,
/// or a cuBLASLt / launch failure.
pub fn fp8_rowwise_gemm(
    gpu: &Gpu,
    lt: &Lt,
    fq: Option<&Module>,
    g: &LtGemm,
    scaling: Fp8Scaling,
    a: &Fp8RowWiseArgs,
) -> anyhow::Result<()> {
    match scaling {
        Fp8Scaling::OuterVec => {
            g.set_scale_pointers(a.w_scales, a.a_scales)?;
            g.run(lt, gpu, 1.0, a.w, a.qa, a.out)?;
        }
        Fp8Scaling::Fp32ThenScale => {
            let (acc, bytes) = a
                .acc
                .context("the FP8 GEMM with FP32 output has no FP32 buffer")?;
            let need = a.m * a.n * 4;
            anyhow::ensure!(
                bytes >= need,
                "the FP32 buffer holds {bytes} B, the FP8 GEMM {}×{} needs {need} B",
                a.m,
                a.n
            );
            let fq = fq.context("kernels/fp8_quant.cu is not built (its epilogue is needed)")?;
            g.set_scale_pointers(a.one, a.one)?;
            g.run(lt, gpu, 1.0, a.w, a.qa, acc)?;
            crate::gemm::launchers::fp8_quant::fp8_rowwise_scale_out(
                fq,
                gpu,
                grid_for(gpu, a.m * a.n),
                (256, 1, 1),
                0,
                DevPtr::at(acc),
                a.m,
                a.n,
                DevPtr::at(a.a_scales),
                DevPtr::at(a.w_scales),
                DevPtr::at(a.out),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_their_cublaslt_kinds() {
        assert!(matches!(
            GemmClass::Bf16.lt_kind(1, 2),
            (LtKind::Bf16, OutType::Bf16)
        ));
        assert!(matches!(
            GemmClass::Bf16ToF32.lt_kind(1, 2),
            (LtKind::Bf16, OutType::F32)
        ));
        assert!(matches!(
            GemmClass::Fp8Scaled.lt_kind(1, 2),
            (
                LtKind::Fp8RowWise {
                    w_scales_ptr: 1,
                    a_scales_ptr: 2
                },
                OutType::Bf16
            )
        ));
        assert!(matches!(
            GemmClass::Fp8ToF32.lt_kind(1, 2),
            (
                LtKind::Fp8 {
                    w_scale_ptr: 1,
                    a_scale_ptr: 2
                },
                OutType::F32
            )
        ));
        assert_eq!(Fp8Scaling::ALL[0], Fp8Scaling::OuterVec);
        assert_eq!(Fp8Scaling::OuterVec.class(), GemmClass::Fp8Scaled);
        assert_eq!(Fp8Scaling::Fp32ThenScale.class(), GemmClass::Fp8ToF32);
    }
}
