//! cuBLASLt GEMMs for the `bf16` and `fp8` benches (and the BF16 GEMM of rigbench's large-M
//! W4A16 path).
//!
//! Layout: rigbench computes `C[M, N] = A[M, K] · W[N, K]ᵀ` with all matrices row-major.
//! cuBLASLt is column-major, so the call is `Dᶜ[N, M] = op(Wᶜ[K, N]) · Aᶜ[K, M]` with
//! `op = T` on W and `N` on A: the "TN" layout, which is also the one cuBLASLt requires for FP8
//! on Hopper (NVIDIA cuBLAS docs, "cublasLtMatmul regular FP8 ... A must be transposed").
//! FP8 uses E4M3 A and B, FP32 scales through `CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER`, BF16
//! output, FP32 compute, and the default (not fast) accumulation. The algorithm is cuBLASLt's
//! top heuristic with a 32 MiB workspace.

use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use super::context::{DevBuf, Gpu};
use crate::GpuError;

const WORKSPACE_BYTES: usize = 32 << 20;

/// A failed cuBLASLt call ([`GpuError::CublasLt`]; a string for a refusal of this crate's,
/// [`GpuError::Usage`]), with `cuBLASLt {context}`.
fn lt_err(context: &str, e: impl crate::error::Cause) -> GpuError {
    e.at(&format!("cuBLASLt {context}"))
}

/// A cuBLASLt handle and its workspace.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: DevBuf,
}

impl Lt {
    /// Create a handle. Checks that libcublasLt loads first.
    pub fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        if !super::probe::libraries().cublaslt {
            return Err(GpuError::NoGpu(
                "cuBLASLt (libcublasLt.so) not found".into(),
            ));
        }
        let handle = lt::create_handle().map_err(|e| lt_err("create handle", e))?;
        Ok(Self {
            handle,
            workspace: gpu.alloc(WORKSPACE_BYTES)?,
        })
    }
}

// SAFETY: a cuBLASLt handle may be used from any thread (cuBLAS docs, "Thread Safety": the
// library is thread safe and its functions can be called from multiple host threads); rigbench
// uses each handle from one thread at a time.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: handle created by create_handle and not used after drop.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Which GEMM.
#[derive(Debug, Clone, Copy)]
pub enum LtKind {
    /// BF16 × BF16 → BF16, FP32 compute.
    Bf16,
    /// E4M3 × E4M3 → BF16 with FP32 scale pointers (device addresses of one f32 each).
    Fp8 {
        /// Scale of W (cuBLASLt's A).
        w_scale_ptr: u64,
        /// Scale of the activations (cuBLASLt's B).
        a_scale_ptr: u64,
    },
    /// E4M3 × E4M3 → BF16 with FP32 vector scales along the outer dimensions
    /// (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`): one scale per weight row (N floats) and
    /// one per token (M floats), i.e. per-channel weights and per-token dynamic activations.
    Fp8RowWise {
        /// N scales of W (cuBLASLt's A, outer dimension N).
        w_scales_ptr: u64,
        /// M scales of the activations (cuBLASLt's B, outer dimension M).
        a_scales_ptr: u64,
    },
    /// NVFP4 × NVFP4 → BF16 (sm_100 and up): E2M1 operands packed two per byte (low nibble
    /// first, the ModelOpt layout), UE4M3 block scales per 16 elements in cuBLASLt's interleaved
    /// layout (rigbench's `formats::nvfp4::swizzle_block_scales`); the two FP32 per-tensor scales go
    /// into `alpha`.
    Nvfp4 {
        /// Swizzled block scales of W (cuBLASLt's A).
        w_block_scales_ptr: u64,
        /// Swizzled block scales of the activations (cuBLASLt's B).
        a_block_scales_ptr: u64,
    },
}

/// The descriptor values a [`LtKind`] sets, as plain data (so they can be checked without a GPU).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GemmSpec {
    /// Data type of W and the activations.
    pub ab_type: sys::cudaDataType,
    /// Name for reports.
    pub name: &'static str,
    /// `(attribute, value)` pairs set on the matmul descriptor, in order.
    pub desc_attrs: Vec<(sys::cublasLtMatmulDescAttributes_t, AttrValue)>,
}

/// A descriptor attribute value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttrValue {
    /// An `int32_t` (operations, scale modes).
    I32(i32),
    /// A device pointer.
    Ptr(u64),
}

impl LtKind {
    /// The descriptor values of this kind: TN operations, then scale pointers and modes.
    pub(crate) fn spec(&self) -> GemmSpec {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let op_t = 1; // CUBLAS_OP_T
        let op_n = 0; // CUBLAS_OP_N
        let mut desc_attrs = vec![
            (D::CUBLASLT_MATMUL_DESC_TRANSA, AttrValue::I32(op_t)),
            (D::CUBLASLT_MATMUL_DESC_TRANSB, AttrValue::I32(op_n)),
        ];
        let (ab_type, name) = match *self {
            LtKind::Bf16 => (sys::cudaDataType::CUDA_R_16BF, "BF16"),
            LtKind::Fp8 {
                w_scale_ptr,
                a_scale_ptr,
            } => {
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    AttrValue::Ptr(w_scale_ptr),
                ));
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    AttrValue::Ptr(a_scale_ptr),
                ));
                (sys::cudaDataType::CUDA_R_8F_E4M3, "FP8 E4M3")
            }
            LtKind::Fp8RowWise {
                w_scales_ptr,
                a_scales_ptr,
            } => {
                let outer =
                    sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                        as i32;
                desc_attrs.push((D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, AttrValue::I32(outer)));
                desc_attrs.push((D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, AttrValue::I32(outer)));
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    AttrValue::Ptr(w_scales_ptr),
                ));
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    AttrValue::Ptr(a_scales_ptr),
                ));
                (
                    sys::cudaDataType::CUDA_R_8F_E4M3,
                    "FP8 E4M3 (per-channel × per-token scales)",
                )
            }
            LtKind::Nvfp4 {
                w_block_scales_ptr,
                a_block_scales_ptr,
            } => {
                let vec16 =
                    sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                        as i32;
                desc_attrs.push((D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, AttrValue::I32(vec16)));
                desc_attrs.push((D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, AttrValue::I32(vec16)));
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    AttrValue::Ptr(w_block_scales_ptr),
                ));
                desc_attrs.push((
                    D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    AttrValue::Ptr(a_block_scales_ptr),
                ));
                (
                    sys::cudaDataType::CUDA_R_4F_E2M1,
                    "NVFP4 (E2M1, UE4M3 scales per 16)",
                )
            }
        };
        GemmSpec {
            ab_type,
            name,
            desc_attrs,
        }
    }
}

/// Element type of a GEMM's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// BF16 (the default).
    Bf16,
    /// FP32 (logits; FP8 GEMMs whose scales are applied afterwards).
    F32,
}

/// A planned GEMM for fixed M, N, K.
pub struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    ld: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    ws_size: usize,
    /// The scale pointers last set by [`LtGemm::set_scale_pointers`] (`u64::MAX`: none yet), so
    /// that setting the same ones again costs no cuBLASLt call inside a timed window.
    scale_ptrs: [std::sync::atomic::AtomicU64; 2],
    /// What runs, for reports (e.g. "cuBLASLt BF16 TN, algo 66, ws 0 B").
    pub description: String,
}

impl LtGemm {
    /// Plan `C[M, N] = alpha · A[M, K] · W[N, K]ᵀ` for `kind`.
    ///
    /// # Errors
    /// cuBLASLt rejects the layout (e.g. FP8 with K not a multiple of 16) or has no algorithm.
    pub fn plan(handle: &Lt, kind: LtKind, m: usize, n: usize, k: usize) -> Result<Self, GpuError> {
        Self::plan_out(handle, kind, m, n, k, OutType::Bf16)
    }

    /// [`LtGemm::plan`] with a chosen output element type.
    ///
    /// # Errors
    /// As [`LtGemm::plan`].
    pub fn plan_out(
        handle: &Lt,
        kind: LtKind,
        m: usize,
        n: usize,
        k: usize,
        out: OutType,
    ) -> Result<Self, GpuError> {
        let spec = kind.spec();
        let (ab_type, name) = (spec.ab_type, spec.name);
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| lt_err("create matmul desc", e))?;
        let mut me = Self {
            desc,
            la: std::ptr::null_mut(),
            lb: std::ptr::null_mut(),
            ld: std::ptr::null_mut(),
            // SAFETY: plain C struct; overwritten by the heuristic before use.
            algo: unsafe { std::mem::zeroed() },
            ws_size: 0,
            scale_ptrs: [
                std::sync::atomic::AtomicU64::new(u64::MAX),
                std::sync::atomic::AtomicU64::new(u64::MAX),
            ],
            description: String::new(),
        };
        for (attr, value) in &spec.desc_attrs {
            // SAFETY: attribute buffers are plain values of the documented types and sizes
            // (int32 for operations and scale modes, a device pointer for scale pointers).
            unsafe {
                match value {
                    AttrValue::I32(v) => set_attr(me.desc, *attr, v)?,
                    AttrValue::Ptr(p) => set_attr(me.desc, *attr, p)?,
                }
            }
        }
        me.la = lt::create_matrix_layout(ab_type, k as u64, n as u64, k as i64)
            .map_err(|e| lt_err("layout W", e))?;
        me.lb = lt::create_matrix_layout(ab_type, k as u64, m as u64, k as i64)
            .map_err(|e| lt_err("layout A", e))?;
        let out_type = match out {
            OutType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            OutType::F32 => sys::cudaDataType::CUDA_R_32F,
        };
        me.ld = lt::create_matrix_layout(out_type, n as u64, m as u64, n as i64)
            .map_err(|e| lt_err("layout C", e))?;
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("create preference", e))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: valid preference handle; value is a u64 as documented.
        let heur = unsafe {
            let r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let h = r.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    handle.handle,
                    me.desc,
                    me.la,
                    me.lb,
                    me.ld,
                    me.ld,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            h
        }
        .map_err(|e| lt_err(&format!("no algorithm for {name} M={m} N={n} K={k}"), e))?;
        me.algo = heur.algo;
        me.ws_size = heur.workspaceSize;
        let mut algo_id: i32 = -1;
        let mut written = 0usize;
        // SAFETY: reading one int attribute of a valid algo struct.
        unsafe {
            let _ = sys::cublasLtMatmulAlgoConfigGetAttribute(
                &me.algo,
                sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_ID,
                &mut algo_id as *mut i32 as *mut c_void,
                std::mem::size_of::<i32>(),
                &mut written,
            );
        }
        me.description = format!(
            "cuBLASLt {name} TN (algo {algo_id}, workspace {} B)",
            me.ws_size
        );
        Ok(me)
    }

    /// Point the plan's scale attributes at new device buffers (`A` = the weights' scales, `B` =
    /// the activations'), for FP8 kinds; the heuristic's algorithm stays valid (it depends on the
    /// scale modes, not the addresses). The same pointers as the last call's set nothing.
    ///
    /// # Errors
    /// cuBLASLt rejecting the attribute.
    pub fn set_scale_pointers(&self, a_scales: u64, b_scales: u64) -> Result<(), GpuError> {
        use std::sync::atomic::Ordering::Relaxed;
        use sys::cublasLtMatmulDescAttributes_t as D;
        if self.scale_ptrs[0].load(Relaxed) == a_scales
            && self.scale_ptrs[1].load(Relaxed) == b_scales
        {
            return Ok(());
        }
        // SAFETY: the descriptor is live; the values are device pointers (u64) as documented.
        unsafe {
            set_attr(
                self.desc,
                D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &a_scales,
            )?;
            set_attr(
                self.desc,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &b_scales,
            )?;
        }
        self.scale_ptrs[0].store(a_scales, Relaxed);
        self.scale_ptrs[1].store(b_scales, Relaxed);
        Ok(())
    }

    /// Queue `C = alpha · A · Wᵀ` on the GPU's stream.
    pub fn run(
        &self,
        handle: &Lt,
        gpu: &Gpu,
        alpha: f32,
        w: u64,
        a: u64,
        c: u64,
    ) -> Result<(), GpuError> {
        let beta = 0.0f32;
        // SAFETY: descriptors/layouts were created for these shapes; pointers come from live
        // DevBufs of the planned sizes; the workspace holds at least ws_size bytes.
        unsafe {
            lt::matmul(
                handle.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                self.la,
                a as *const c_void,
                self.lb,
                c as *const c_void,
                self.ld,
                c as *mut c_void,
                self.ld,
                &self.algo,
                handle.workspace.ptr() as *mut c_void,
                self.ws_size,
                gpu.stream().cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("matmul", e))
    }
}

unsafe fn set_attr<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<(), GpuError> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| lt_err(&format!("set {attr:?}"), e))
}

// SAFETY: the descriptors are plain host objects that cuBLASLt only reads during a matmul;
// rigbench uses each plan from one thread at a time.
unsafe impl Send for LtGemm {}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: each handle was created in plan() (or is null and skipped).
        unsafe {
            for l in [self.la, self.lb, self.ld] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cublasLtMatmulDescAttributes_t as D;

    #[test]
    fn specs_set_tn_and_the_right_scale_attributes() {
        let bf = LtKind::Bf16.spec();
        assert_eq!(bf.ab_type, sys::cudaDataType::CUDA_R_16BF);
        assert_eq!(
            bf.desc_attrs,
            vec![
                (D::CUBLASLT_MATMUL_DESC_TRANSA, AttrValue::I32(1)),
                (D::CUBLASLT_MATMUL_DESC_TRANSB, AttrValue::I32(0))
            ]
        );
        let f8 = LtKind::Fp8 {
            w_scale_ptr: 16,
            a_scale_ptr: 32,
        }
        .spec();
        assert_eq!(f8.ab_type, sys::cudaDataType::CUDA_R_8F_E4M3);
        assert!(f8
            .desc_attrs
            .contains(&(D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, AttrValue::Ptr(16))));
        assert!(f8
            .desc_attrs
            .contains(&(D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, AttrValue::Ptr(32))));
        let f4 = LtKind::Nvfp4 {
            w_block_scales_ptr: 48,
            a_block_scales_ptr: 64,
        }
        .spec();
        assert_eq!(f4.ab_type, sys::cudaDataType::CUDA_R_4F_E2M1);
        // Scale modes are set before the pointers, and both operands use 16-element UE4M3 blocks.
        let pos = |a| f4.desc_attrs.iter().position(|(x, _)| *x == a).unwrap();
        assert!(
            pos(D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE)
                < pos(D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER)
        );
        assert_eq!(
            f4.desc_attrs[pos(D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE)].1,
            AttrValue::I32(1)
        );
        assert_eq!(
            f4.desc_attrs[pos(D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE)].1,
            AttrValue::I32(1)
        );
        assert_eq!(
            f4.desc_attrs[pos(D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER)].1,
            AttrValue::Ptr(64)
        );
    }
}
