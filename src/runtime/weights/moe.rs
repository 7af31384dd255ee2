//! The weights of a sparse MLP block (see `crate::model::moe`): router, routed experts and the
//! optional shared expert with its sigmoid gate, each a [`Linear`] in its stored format.

use super::synth::synth_linear;
use super::{Linear, LinearRole};
use crate::model::moe::MoeConfig;

/// One SwiGLU MLP: `gate_proj` and `up_proj` `[I, H]`, `down_proj` `[H, I]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertWeights {
    /// `gate_proj`, `[I, H]`.
    pub gate: Linear,
    /// `up_proj`, `[I, H]`.
    pub up: Linear,
    /// `down_proj`, `[H, I]`.
    pub down: Linear,
}

/// The shared expert of Qwen3.5 / 3.6-MoE and its gate.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpertWeights {
    /// `mlp.shared_expert.{gate,up,down}_proj`, width `shared_expert_intermediate_size`.
    pub mlp: ExpertWeights,
    /// `mlp.shared_expert_gate`, `[1, H]`: the token's scale is `sigmoid(gate · x)`.
    pub gate: Linear,
}

/// A sparse block's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeWeights {
    /// `mlp.gate` (the router), `[E, H]`.
    pub router: Linear,
    /// The E routed experts (`mlp.experts.N.*`, or the fused 3-D `mlp.experts.gate_up_proj` /
    /// `down_proj` split per expert at load).
    pub experts: Vec<ExpertWeights>,
    /// The shared expert, when the family has one.
    pub shared: Option<SharedExpertWeights>,
}

impl MoeWeights {
    /// Every linear with its role: the router, each expert's three, then the shared expert's
    /// three and its gate.
    pub fn linears(&self) -> Vec<(LinearRole, &Linear)> {
        let mut v = vec![(LinearRole::Router, &self.router)];
        for e in &self.experts {
            v.extend([
                (LinearRole::ExpertGate, &e.gate),
                (LinearRole::ExpertUp, &e.up),
                (LinearRole::ExpertDown, &e.down),
            ]);
        }
        if let Some(s) = &self.shared {
            v.extend([
                (LinearRole::SharedGate, &s.mlp.gate),
                (LinearRole::SharedUp, &s.mlp.up),
                (LinearRole::SharedDown, &s.mlp.down),
                (LinearRole::SharedExpertGate, &s.gate),
            ]);
        }
        v
    }

    /// Every linear, mutable, with its role and the group whose members share one per-tensor
    /// quantization scale (each expert's gate/up, as engines fuse them into one GEMM; every
    /// other linear alone).
    pub fn linears_mut(&mut self) -> Vec<(LinearRole, &mut Linear, usize)> {
        let mut v = vec![(LinearRole::Router, &mut self.router, 0)];
        let mut g = 1;
        for e in &mut self.experts {
            v.push((LinearRole::ExpertGate, &mut e.gate, g));
            v.push((LinearRole::ExpertUp, &mut e.up, g));
            v.push((LinearRole::ExpertDown, &mut e.down, g + 1));
            g += 2;
        }
        if let Some(s) = &mut self.shared {
            v.push((LinearRole::SharedGate, &mut s.mlp.gate, g));
            v.push((LinearRole::SharedUp, &mut s.mlp.up, g));
            v.push((LinearRole::SharedDown, &mut s.mlp.down, g + 1));
            v.push((LinearRole::SharedExpertGate, &mut s.gate, g + 2));
        }
        v
    }
}

/// Tensor id of a synthesized sparse-block tensor of layer `layer`: `2⁴⁰ + 2²⁰·layer + j`
/// with `j` = 0 router, 1–3 the shared expert's gate/up/down, 4 its gate, and
/// `16 + 3·e + r` expert `e`'s gate (`r` = 0), up (1) and down (2); apart from the dense ids
/// of `super::synth_tensor_id`.
pub fn synth_moe_tensor_id(layer: usize, j: u64) -> u64 {
    (1u64 << 40) + ((layer as u64) << 20) + j
}

/// A synthesized sparse block (every linear `~ N(0, 1/fan_in)`, as the dense ones).
pub(super) fn synthesize(seed: u64, layer: usize, h: usize, m: &MoeConfig) -> MoeWeights {
    let id = |j: u64| synth_moe_tensor_id(layer, j);
    let inv = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let mlp = |j: u64, i: usize| ExpertWeights {
        gate: synth_linear(seed, id(j), i, h, inv(h)),
        up: synth_linear(seed, id(j + 1), i, h, inv(h)),
        down: synth_linear(seed, id(j + 2), h, i, inv(i)),
    };
    let ie = m.expert_intermediate_size;
    MoeWeights {
        router: synth_linear(seed, id(0), m.num_experts, h, inv(h)),
        experts: (0..m.num_experts)
            .map(|e| mlp(16 + 3 * e as u64, ie))
            .collect(),
        shared: m.has_shared_expert().then(|| SharedExpertWeights {
            mlp: mlp(1, m.shared_expert_intermediate_size),
            gate: synth_linear(seed, id(4), 1, h, inv(h)),
        }),
    }
}
