//! The implementations: `bf16`, `fp8` (per-tensor scales) and `fp8-rowwise` (per-token × per-channel
//! scales, the runtime's path) through cuBLASLt, `w4a16` (rigbench's NVRTC kernels; the Hopper
//! wgmma one's host side in [`w4a16_wg`]), `w4a4`
//! (native NVFP4 through cuBLASLt's block-scaled FP4 path, sm_100 and up).

pub mod bf16;
pub mod fp8;
pub mod fp8_rowwise;
pub mod w4a16;
pub mod w4a16_wg;
pub mod w4a4;

use super::{Env, GemmImpl};
use crate::formats::GemmFormat;
use crate::gpu::DevBuf;

/// The implementations that run for `formats`, in order: each format's, and for FP8 also the
/// runtime's row-wise path ([`fp8_rowwise`]) after the per-tensor one.
pub fn make_for(formats: &[GemmFormat]) -> Vec<Box<dyn GemmImpl>> {
    let mut v: Vec<Box<dyn GemmImpl>> = Vec::new();
    for f in formats {
        v.push(make(*f));
        if *f == GemmFormat::Fp8 {
            v.push(Box::new(fp8_rowwise::Fp8RowWise::default()));
        }
    }
    v
}

/// A fresh implementation for `format`.
pub fn make(format: GemmFormat) -> Box<dyn GemmImpl> {
    match format {
        GemmFormat::Bf16 => Box::new(bf16::Bf16::default()),
        GemmFormat::Fp8 => Box::new(fp8::Fp8::default()),
        GemmFormat::W4a16 => Box::new(w4a16::W4a16::default()),
        GemmFormat::W4a4 => Box::new(w4a4::W4a4::default()),
    }
}

/// `count − 1` device copies of the weights `w` (copy 0 is `w` itself), for graph timing over
/// rotating weight copies ([`GemmImpl::prepare_weight_copies`]).
///
/// # Errors
/// Allocation or copy failures (e.g. out of device memory).
pub fn weight_copies(env: &Env, w: &DevBuf, count: usize) -> anyhow::Result<Vec<DevBuf>> {
    let mut copies = Vec::with_capacity(count.saturating_sub(1));
    for _ in 1..count {
        let c = env.gpu.alloc(w.bytes())?;
        env.gpu.copy_d2d(&c, w, w.bytes())?;
        copies.push(c);
    }
    env.gpu.sync()?;
    Ok(copies)
}

/// Weight copy `copy` of implementation `id`: `w` for 0, else `copies[copy − 1]`.
///
/// # Errors
/// The weights were not prepared, or that copy was not made.
pub fn pick_copy<'a>(
    id: &str,
    w: Option<&'a DevBuf>,
    copies: &'a [DevBuf],
    copy: usize,
) -> anyhow::Result<&'a DevBuf> {
    if copy == 0 {
        w.ok_or_else(|| anyhow::anyhow!("{id}: prepare_shape not called"))
    } else {
        copies
            .get(copy - 1)
            .ok_or_else(|| anyhow::anyhow!("{id}: weight copy {copy} was not made"))
    }
}
