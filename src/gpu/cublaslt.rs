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
use crate::RigError;

const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_err(context: &str, e: impl std::fmt::Debug) -> RigError {
    RigError::Cuda {
        context: format!("cuBLASLt {context}"),
        message: format!("{e:?}"),
    }
}

/// A cuBLASLt handle and its workspace.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: DevBuf,
}

impl Lt {
    /// Create a handle. Checks that libcublasLt loads first.
    pub fn new(gpu: &Gpu) -> Result<Self, RigError> {
        if !super::probe::libraries().cublaslt {
            return Err(RigError::NoGpu(
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
}

/// A planned GEMM for fixed M, N, K.
pub struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    ld: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    ws_size: usize,
    /// What runs, for reports (e.g. "cuBLASLt BF16 TN, algo 66, ws 0 B").
    pub description: String,
}

impl LtGemm {
    /// Plan `C[M, N] = alpha · A[M, K] · W[N, K]ᵀ` for `kind`.
    ///
    /// # Errors
    /// cuBLASLt rejects the layout (e.g. FP8 with K not a multiple of 16) or has no algorithm.
    pub fn plan(handle: &Lt, kind: LtKind, m: usize, n: usize, k: usize) -> Result<Self, RigError> {
        let (ab_type, name) = match kind {
            LtKind::Bf16 => (sys::cudaDataType::CUDA_R_16BF, "BF16"),
            LtKind::Fp8 { .. } => (sys::cudaDataType::CUDA_R_8F_E4M3, "FP8 E4M3"),
        };
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
            description: String::new(),
        };
        let op_t: i32 = 1; // CUBLAS_OP_T
        let op_n: i32 = 0; // CUBLAS_OP_N
                           // SAFETY: attribute buffers are plain values of the documented types and sizes.
        unsafe {
            set_attr(
                me.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &op_t,
            )?;
            set_attr(
                me.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &op_n,
            )?;
            if let LtKind::Fp8 {
                w_scale_ptr,
                a_scale_ptr,
            } = kind
            {
                set_attr(
                    me.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    &w_scale_ptr,
                )?;
                set_attr(
                    me.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    &a_scale_ptr,
                )?;
            }
        }
        me.la = lt::create_matrix_layout(ab_type, k as u64, n as u64, k as i64)
            .map_err(|e| lt_err("layout W", e))?;
        me.lb = lt::create_matrix_layout(ab_type, k as u64, m as u64, k as i64)
            .map_err(|e| lt_err("layout A", e))?;
        me.ld =
            lt::create_matrix_layout(sys::cudaDataType::CUDA_R_16BF, n as u64, m as u64, n as i64)
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

    /// Queue `C = alpha · A · Wᵀ` on the GPU's stream.
    pub fn run(
        &self,
        handle: &Lt,
        gpu: &Gpu,
        alpha: f32,
        w: u64,
        a: u64,
        c: u64,
    ) -> Result<(), RigError> {
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
) -> Result<(), RigError> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| lt_err(&format!("set {attr:?}"), e))
}

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
