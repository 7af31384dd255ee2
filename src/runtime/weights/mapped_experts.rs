//! The routed experts of a mapped checkpoint's sparse layers, in either of transformers'
//! layouts:
//! - per expert, `mlp.experts.N.{gate,up,down}_proj` (as transformers 5.24 saves them, and as
//!   ModelOpt exports them), each linear in any format the runtime loads;
//! - fused, `mlp.experts.gate_up_proj` `[E, 2·I, H]` (gate rows first, then up:
//!   `Qwen3MoeExperts.forward` splits the product with `chunk(2, dim=-1)`) and
//!   `mlp.experts.down_proj` `[E, H, I]`, unquantized (BF16, F16 or F32), as transformers'
//!   in-memory modules and some exports hold them. Quantized fused experts are refused by name.

use std::collections::HashMap;

use safetensors::Dtype;

use super::super::{ExpertWeights, LayerWeights, Linear, MoeWeights, SharedExpertWeights};
use super::{linear_tensors, LinearRole, LinearTensors, MappedCheckpoint};
use crate::runtime::config::WeightFormat;
use crate::RigError;

/// How one sparse layer's routed experts are stored.
#[derive(Debug, Clone)]
pub(super) enum ExpertLayout {
    /// One `[gate, up, down]` per expert.
    PerExpert(Vec<[LinearTensors; 3]>),
    /// The fused 3-D tensors, by full name.
    Fused {
        /// `mlp.experts.gate_up_proj`, `[E, 2·I, H]`.
        gate_up: String,
        /// `mlp.experts.down_proj`, `[E, H, I]`.
        down: String,
    },
}

impl MappedCheckpoint {
    /// Layer `i`'s expert layout (`None` for a dense MLP).
    pub(super) fn resolve_experts(&self, i: usize) -> anyhow::Result<Option<ExpertLayout>> {
        let Some(m) = self.config.moe.as_ref().filter(|m| m.is_sparse(i)) else {
            return Ok(None);
        };
        let base = format!("{}layers.{i}.mlp.experts", self.prefix);
        let (gate_up, down) = (format!("{base}.gate_up_proj"), format!("{base}.down_proj"));
        if self.tensors.contains_key(&gate_up) {
            let (e, ie, h) = (
                m.num_experts,
                m.expert_intermediate_size,
                self.config.hidden_size,
            );
            for (name, want) in [(&gate_up, [e, 2 * ie, h]), (&down, [e, h, ie])] {
                let t = self.loc(name)?;
                if !matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
                    return Err(self.bad(
                        t,
                        name,
                        format!(
                            "fused experts stored as {}: the runtime loads fused expert tensors unquantized (BF16, F16, F32) only; quantized experts load per expert (mlp.experts.N.*_proj)",
                            t.dtype
                        ),
                    ));
                }
                if t.shape != want {
                    return Err(self.bad(
                        t,
                        name,
                        format!("shape {:?}; expected {want:?}", t.shape),
                    ));
                }
            }
            return Ok(Some(ExpertLayout::Fused { gate_up, down }));
        }
        let dtype_of = |name: &str| self.tensors.get(name).map(|t| t.dtype.to_string());
        let mut v = Vec::with_capacity(m.num_experts);
        for e in 0..m.num_experts {
            let t = |r: LinearRole| {
                let name = format!("{}layers.{i}.{}", self.prefix, r.expert_module(e));
                linear_tensors(&name, &dtype_of).map_err(|msg| RigError::file(&self.dir, msg))
            };
            v.push([
                t(LinearRole::ExpertGate)?,
                t(LinearRole::ExpertUp)?,
                t(LinearRole::ExpertDown)?,
            ]);
        }
        Ok(Some(ExpertLayout::PerExpert(v)))
    }

    /// Check layer `i`'s experts (shapes, dtypes, scales) and count their formats.
    pub(super) fn count_expert_formats(
        &self,
        i: usize,
        counts: &mut HashMap<WeightFormat, usize>,
    ) -> anyhow::Result<()> {
        match self.experts.get(i) {
            Some(Some(ExpertLayout::PerExpert(v))) => {
                for ts in v {
                    for (t, r) in ts.iter().zip(LinearRole::EXPERT) {
                        let (n, k) = r.shape(&self.config);
                        let f = match t {
                            LinearTensors::Plain { weight } => {
                                self.nk_tensor(weight, n, k, "")?;
                                WeightFormat::Bf16
                            }
                            _ => self.view(t, n, k)?.format(),
                        };
                        *counts.entry(f).or_insert(0) += 1;
                    }
                }
            }
            Some(Some(ExpertLayout::Fused { .. })) => {
                let e = self.config.moe.as_ref().map_or(0, |m| m.num_experts);
                *counts.entry(WeightFormat::Bf16).or_insert(0) += 3 * e;
            }
            _ => {}
        }
        Ok(())
    }

    /// Layer `i`'s dense MLP `[gate, up, down]` (empty for a sparse layer).
    pub(super) fn dense_mlp(&self, i: usize) -> anyhow::Result<[Linear; 3]> {
        if self.config.is_sparse_layer(i) {
            return Ok([
                LayerWeights::empty_linear(),
                LayerWeights::empty_linear(),
                LayerWeights::empty_linear(),
            ]);
        }
        Ok([
            self.linear_owned(i, LinearRole::Gate)?,
            self.linear_owned(i, LinearRole::Up)?,
            self.linear_owned(i, LinearRole::Down)?,
        ])
    }

    /// `layer` with its sparse block loaded when layer `i` is sparse.
    pub(super) fn with_experts(
        &self,
        i: usize,
        layer: LayerWeights,
    ) -> anyhow::Result<LayerWeights> {
        Ok(match self.moe_weights(i)? {
            Some(m) => layer.with_moe(m),
            None => layer,
        })
    }

    /// Layer `i`'s sparse block (router, experts in either layout, shared expert), each linear
    /// owned in its stored format; `None` for a dense layer.
    ///
    /// # Errors
    /// A tensor missing, of the wrong shape or dtype (named).
    pub fn moe_weights(&self, i: usize) -> anyhow::Result<Option<MoeWeights>> {
        let Some(Some(layout)) = self.experts.get(i) else {
            return Ok(None);
        };
        let m = self
            .config
            .moe
            .as_ref()
            .expect("a sparse layer has a MoE config");
        let experts = match layout {
            ExpertLayout::PerExpert(v) => v
                .iter()
                .map(|ts| {
                    let own = |j: usize| {
                        let (n, k) = LinearRole::EXPERT[j].shape(&self.config);
                        self.owned(&ts[j], n, k)
                    };
                    Ok(ExpertWeights {
                        gate: own(0)?,
                        up: own(1)?,
                        down: own(2)?,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
            ExpertLayout::Fused { gate_up, down } => {
                let (e, ie, h) = (
                    m.num_experts,
                    m.expert_intermediate_size,
                    self.config.hidden_size,
                );
                let gu = self.floats(gate_up, e * 2 * ie * h)?;
                let dn = self.floats(down, e * h * ie)?;
                (0..e)
                    .map(|x| {
                        let g0 = x * 2 * ie * h;
                        let d0 = x * h * ie;
                        ExpertWeights {
                            gate: Linear::bf16_from_f32(ie, h, &gu[g0..g0 + ie * h]),
                            up: Linear::bf16_from_f32(ie, h, &gu[g0 + ie * h..g0 + 2 * ie * h]),
                            down: Linear::bf16_from_f32(h, ie, &dn[d0..d0 + h * ie]),
                        }
                    })
                    .collect()
            }
        };
        let shared = if m.has_shared_expert() {
            Some(SharedExpertWeights {
                mlp: ExpertWeights {
                    gate: self.linear_owned(i, LinearRole::SharedGate)?,
                    up: self.linear_owned(i, LinearRole::SharedUp)?,
                    down: self.linear_owned(i, LinearRole::SharedDown)?,
                },
                gate: self.linear_owned(i, LinearRole::SharedExpertGate)?,
            })
        } else {
            None
        };
        Ok(Some(MoeWeights {
            router: self.linear_owned(i, LinearRole::Router)?,
            experts,
            shared,
        }))
    }
}
