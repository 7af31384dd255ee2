//! The device layers of a hybrid, built by the CUDA backend's [`Loader`]: from host weights,
//! from a checkpoint (the fused groups in the recipe's formats) or synthesized from a seed as
//! the CPU's `weights::synthesize` does.

use anyhow::Context;

use super::GdnDevLayer;
use crate::gpu::DevBuf;
use crate::runtime::backend::cuda::load::Loader;
use crate::runtime::backend::cuda::{grid1, launchers, DLayer, DLinear};
use crate::runtime::config::{ModelConfig, QuantRecipe, WeightFormat};
use crate::runtime::hybrid::LayerType;
use crate::runtime::weights::{self, LinearRole as R, NormRole as N};

/// The per-role format of a recipe (none: as stored).
fn fmt_of(recipe: Option<QuantRecipe>, role: R) -> Option<WeightFormat> {
    recipe.map(|r| r.format_for(role))
}

impl Loader<'_> {
    fn gdn_small(
        &self,
        conv_w: &[f32],
        a_log: &[f32],
        dt_bias: &[f32],
        norm: &[f32],
        ab: DLinear,
    ) -> anyhow::Result<GdnDevLayer> {
        Ok(GdnDevLayer {
            ab,
            conv_w: self.f32s(conv_w)?,
            a_log: self.f32s(a_log)?,
            dt_bias: self.f32s(dt_bias)?,
            norm: self.f32s(norm)?,
        })
    }

    /// A hybrid layer from host weights (already quantized by the caller).
    pub(in crate::runtime::backend::cuda) fn hybrid_host_layer(
        &self,
        l: &weights::LayerWeights,
    ) -> anyhow::Result<DLayer> {
        let (qkv, o, gdn) = match &l.gdn {
            Some(g) => (
                self.fuse_host(&[&g.qkv, &g.z])?,
                self.fuse_host(&[&g.out])?,
                Some(self.gdn_small(
                    &g.conv_w,
                    &g.a_log,
                    &g.dt_bias,
                    &g.norm,
                    self.fuse_host(&[&g.a, &g.b])?,
                )?),
            ),
            None => (
                self.fuse_host(&[&l.q, &l.k, &l.v])?,
                self.fuse_host(&[&l.o])?,
                None,
            ),
        };
        let (gate_up, down, moe) = self.host_mlp(l)?;
        Ok(DLayer {
            input_norm: self.f32s(&l.input_norm)?,
            post_norm: self.f32s(&l.post_norm)?,
            q_norm: l.q_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
            k_norm: l.k_norm.as_ref().map(|v| self.f32s(v)).transpose()?,
            qkv,
            o,
            gate_up,
            down,
            k_scale: l.k_scale.unwrap_or(1.0),
            v_scale: l.v_scale.unwrap_or(1.0),
            gdn,
            moe,
        })
    }

    /// Layer `i` of a hybrid checkpoint (BF16 linears quantized on the GPU by `recipe`).
    pub(in crate::runtime::backend::cuda) fn hybrid_checkpoint_layer(
        &self,
        m: &weights::MappedCheckpoint,
        i: usize,
        recipe: Option<QuantRecipe>,
    ) -> anyhow::Result<DLayer> {
        let c = m.config();
        let mlp = match m.moe_weights(i)? {
            Some(mw) => self.moe_from_host(&mw, recipe)?,
            None => (
                self.fuse_views(
                    &[m.linear(i, R::Gate)?, m.linear(i, R::Up)?],
                    fmt_of(recipe, R::Gate),
                )?,
                self.fuse_views(&[m.linear(i, R::Down)?], fmt_of(recipe, R::Down))?,
                None,
            ),
        };
        if c.layer_type(i) == LayerType::Gdn {
            let (conv_w, a_log, dt_bias) = m.gdn_params(i)?;
            let ab = self.fuse_views(
                &[m.linear(i, R::GdnA)?, m.linear(i, R::GdnB)?],
                fmt_of(recipe, R::GdnA),
            )?;
            return Ok(DLayer {
                input_norm: self.f32s(&m.norm(N::Input(i))?)?,
                post_norm: self.f32s(&m.norm(N::Post(i))?)?,
                q_norm: None,
                k_norm: None,
                qkv: self.fuse_views(
                    &[m.linear(i, R::GdnQkv)?, m.linear(i, R::GdnZ)?],
                    fmt_of(recipe, R::GdnQkv),
                )?,
                o: self.fuse_views(&[m.linear(i, R::GdnOut)?], fmt_of(recipe, R::GdnOut))?,
                gate_up: mlp.0,
                down: mlp.1,
                moe: mlp.2,
                k_scale: 1.0,
                v_scale: 1.0,
                gdn: Some(self.gdn_small(
                    &conv_w,
                    &a_log,
                    &dt_bias,
                    &m.norm(N::GdnNorm(i))?,
                    ab,
                )?),
            });
        }
        let (ks, vs) = m.kv_scales(i);
        Ok(DLayer {
            input_norm: self.f32s(&m.norm(N::Input(i))?)?,
            post_norm: self.f32s(&m.norm(N::Post(i))?)?,
            q_norm: Some(self.f32s(&m.norm(N::Q(i))?)?),
            k_norm: Some(self.f32s(&m.norm(N::K(i))?)?),
            qkv: self.fuse_views(
                &[m.linear(i, R::Q)?, m.linear(i, R::K)?, m.linear(i, R::V)?],
                fmt_of(recipe, R::Q),
            )?,
            o: self.fuse_views(&[m.linear(i, R::O)?], fmt_of(recipe, R::O))?,
            gate_up: mlp.0,
            down: mlp.1,
            moe: mlp.2,
            k_scale: ks.unwrap_or(1.0),
            v_scale: vs.unwrap_or(1.0),
            gdn: None,
        })
    }

    /// Synthesized f32 parameters (BF16 normals converted, as the CPU's `synth_gdn`).
    fn synth_f32(
        &self,
        seed: u64,
        id: u64,
        len: usize,
        mean: f32,
        std: f32,
    ) -> anyhow::Result<DevBuf> {
        let tmp = self.gpu.alloc(len * 2)?;
        self.synth_into(&tmp, 0, seed, id, len, mean, std)?;
        let out = self.gpu.alloc(len * 4)?;
        launchers::rt::rt_bf16_to_f32(
            self.rt,
            self.gpu,
            grid1(len, 256),
            (256, 1, 1),
            0,
            &tmp,
            len,
            &out,
        )?;
        self.gpu.sync()?;
        Ok(out)
    }

    /// Layer `i` of a synthesized hybrid, bit-identical to
    /// [`crate::runtime::weights::synthesize`] (tensor ids of
    /// [`crate::runtime::weights::synth_tensor_id`]) and quantized as `recipe` quantizes the
    /// CPU's (fused groups sharing one per-tensor scale; in_proj_a / in_proj_b BF16).
    pub(in crate::runtime::backend::cuda) fn hybrid_synth_layer(
        &self,
        c: &ModelConfig,
        seed: u64,
        i: usize,
        recipe: QuantRecipe,
    ) -> anyhow::Result<DLayer> {
        let h = c.hidden_size;
        let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let id = |j: u64| weights::synth_tensor_id(Some(i), j);
        let f = |r: R| recipe.format_for(r);
        let (gate_up, down, moe) = if c.is_sparse_layer(i) {
            self.synth_moe(c, seed, i, recipe)?
        } else {
            (
                self.synth_linear(
                    seed,
                    &[(id(8), c.intermediate_size), (id(9), c.intermediate_size)],
                    h,
                    inv(h),
                    f(R::Gate),
                )?,
                self.synth_linear(
                    seed,
                    &[(id(10), h)],
                    c.intermediate_size,
                    inv(c.intermediate_size),
                    f(R::Down),
                )?,
                None,
            )
        };
        let hy = c.hybrid.as_ref().context("not a hybrid")?;
        if c.layer_type(i) == LayerType::Gdn {
            let (cd, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.num_value_heads);
            let ab =
                self.synth_linear(seed, &[(id(13), nv), (id(14), nv)], h, inv(h), f(R::GdnA))?;
            let (am, asd) = weights::SYNTH_GDN_A_LOG;
            let (dm, dsd) = weights::SYNTH_GDN_DT_BIAS;
            let gdn = GdnDevLayer {
                ab,
                conv_w: self.synth_f32(
                    seed,
                    id(16),
                    cd * hy.conv_kernel,
                    0.0,
                    inv(hy.conv_kernel),
                )?,
                a_log: self.synth_f32(seed, id(17), nv, am, asd)?,
                dt_bias: self.synth_f32(seed, id(18), nv, dm, dsd)?,
                norm: self.synth_f32(
                    seed,
                    id(19),
                    hy.value_head_dim,
                    1.0,
                    weights::SYNTH_NORM_JITTER,
                )?,
            };
            return Ok(DLayer {
                input_norm: self.synth_norm(seed, id(0), h)?,
                post_norm: self.synth_norm(seed, id(7), h)?,
                q_norm: None,
                k_norm: None,
                qkv: self.synth_linear(
                    seed,
                    &[(id(11), cd), (id(12), vd)],
                    h,
                    inv(h),
                    f(R::GdnQkv),
                )?,
                o: self.synth_linear(seed, &[(id(15), h)], vd, inv(vd), f(R::GdnOut))?,
                gate_up,
                down,
                k_scale: 1.0,
                v_scale: 1.0,
                gdn: Some(gdn),
                moe,
            });
        }
        Ok(DLayer {
            input_norm: self.synth_norm(seed, id(0), h)?,
            post_norm: self.synth_norm(seed, id(7), h)?,
            q_norm: Some(self.synth_norm(seed, id(5), c.head_dim)?),
            k_norm: Some(self.synth_norm(seed, id(6), c.head_dim)?),
            qkv: self.synth_linear(
                seed,
                &[
                    (id(1), c.q_proj_rows()),
                    (id(2), c.kv_dim()),
                    (id(3), c.kv_dim()),
                ],
                h,
                inv(h),
                f(R::Q),
            )?,
            o: self.synth_linear(seed, &[(id(4), h)], c.q_dim(), inv(c.q_dim()), f(R::O))?,
            gate_up,
            down,
            k_scale: 1.0,
            v_scale: 1.0,
            gdn: None,
            moe,
        })
    }
}
