//! The roles of a decoder layer's linear layers: which module each is (`self_attn.q_proj`,
//! `linear_attn.in_proj_qkv`, `mlp.gate_proj`, ...), which a layer of a given config has, and
//! their `(N, K)` shapes. The runtime's loaders, its quantization recipes and its memory plan
//! name linears by these roles.

use super::config::ModelConfig;

/// A decoder layer's linear layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearRole {
    /// `self_attn.q_proj`, `[num_heads·head_dim, H]` (`[2·num_heads·head_dim, H]` when it also
    /// emits the output gate: the Qwen3.5 family).
    Q,
    /// `self_attn.k_proj`, `[num_kv_heads·head_dim, H]`.
    K,
    /// `self_attn.v_proj`, `[num_kv_heads·head_dim, H]`.
    V,
    /// `self_attn.o_proj`, `[H, num_heads·head_dim]`.
    O,
    /// `mlp.gate_proj`, `[I, H]`.
    Gate,
    /// `mlp.up_proj`, `[I, H]`.
    Up,
    /// `mlp.down_proj`, `[H, I]`.
    Down,
    /// Gated-DeltaNet `linear_attn.in_proj_qkv`, `[2·key_dim + value_dim, H]`.
    GdnQkv,
    /// Gated-DeltaNet `linear_attn.in_proj_z`, `[value_dim, H]`.
    GdnZ,
    /// Gated-DeltaNet `linear_attn.in_proj_a`, `[value_heads, H]`.
    GdnA,
    /// Gated-DeltaNet `linear_attn.in_proj_b`, `[value_heads, H]`.
    GdnB,
    /// Gated-DeltaNet `linear_attn.out_proj`, `[H, value_dim]`.
    GdnOut,
    /// The router of a sparse MLP, `mlp.gate`, `[E, H]`.
    Router,
    /// A routed expert's `mlp.experts.N.gate_proj`, `[I_e, H]` (one role for all E experts:
    /// the expert's index goes with it, see [`Self::expert_module`]).
    ExpertGate,
    /// A routed expert's `mlp.experts.N.up_proj`, `[I_e, H]`.
    ExpertUp,
    /// A routed expert's `mlp.experts.N.down_proj`, `[H, I_e]`.
    ExpertDown,
    /// The shared expert's `mlp.shared_expert.gate_proj`, `[I_s, H]`.
    SharedGate,
    /// The shared expert's `mlp.shared_expert.up_proj`, `[I_s, H]`.
    SharedUp,
    /// The shared expert's `mlp.shared_expert.down_proj`, `[H, I_s]`.
    SharedDown,
    /// The shared expert's scale, `mlp.shared_expert_gate`, `[1, H]`.
    SharedExpertGate,
}

impl LinearRole {
    /// The seven linears of a full-attention layer, in the order of its forward pass.
    pub const ALL: [LinearRole; 7] = [
        LinearRole::Q,
        LinearRole::K,
        LinearRole::V,
        LinearRole::O,
        LinearRole::Gate,
        LinearRole::Up,
        LinearRole::Down,
    ];

    /// The eight linears of a Gated-DeltaNet layer, in the order of its forward pass.
    pub const GDN: [LinearRole; 8] = [
        LinearRole::GdnQkv,
        LinearRole::GdnZ,
        LinearRole::GdnA,
        LinearRole::GdnB,
        LinearRole::GdnOut,
        LinearRole::Gate,
        LinearRole::Up,
        LinearRole::Down,
    ];

    /// The two-dimensional linears of a sparse layer's MLP beside the routed experts: the
    /// router, and the shared expert with its gate when the family has one.
    const SPARSE_SHARED: [LinearRole; 5] = [
        LinearRole::Router,
        LinearRole::SharedGate,
        LinearRole::SharedUp,
        LinearRole::SharedDown,
        LinearRole::SharedExpertGate,
    ];

    const ATTN_SPARSE: [LinearRole; 9] = [
        LinearRole::Q,
        LinearRole::K,
        LinearRole::V,
        LinearRole::O,
        LinearRole::Router,
        LinearRole::SharedGate,
        LinearRole::SharedUp,
        LinearRole::SharedDown,
        LinearRole::SharedExpertGate,
    ];

    const GDN_SPARSE: [LinearRole; 10] = [
        LinearRole::GdnQkv,
        LinearRole::GdnZ,
        LinearRole::GdnA,
        LinearRole::GdnB,
        LinearRole::GdnOut,
        LinearRole::Router,
        LinearRole::SharedGate,
        LinearRole::SharedUp,
        LinearRole::SharedDown,
        LinearRole::SharedExpertGate,
    ];

    /// The linears of layer `layer` of `c` stored as one `[N, K]` matrix each: [`Self::ALL`] or
    /// [`Self::GDN`] for a dense MLP; for a sparse layer the mixer's, the router and (when the
    /// family has one) the shared expert and its gate. The routed experts
    /// ([`Self::EXPERT`], E of each) are not in the list: they may be stored per expert or as
    /// fused 3-D tensors.
    pub fn of_layer(c: &ModelConfig, layer: usize) -> &'static [LinearRole] {
        let attn = c.layer_type(layer) == super::hybrid::LayerType::Attention;
        match (&c.moe, attn) {
            (Some(m), _) if m.is_sparse(layer) => {
                let all: &'static [LinearRole] = if attn {
                    &Self::ATTN_SPARSE
                } else {
                    &Self::GDN_SPARSE
                };
                // Without a shared expert only the router follows the mixer.
                let keep = all.len() - Self::SPARSE_SHARED.len() + 1;
                if m.has_shared_expert() {
                    all
                } else {
                    &all[..keep]
                }
            }
            (_, true) => &Self::ALL,
            (_, false) => &Self::GDN,
        }
    }

    /// The three linears of each routed expert, in the order of its forward pass.
    pub const EXPERT: [LinearRole; 3] = [
        LinearRole::ExpertGate,
        LinearRole::ExpertUp,
        LinearRole::ExpertDown,
    ];

    /// The module name of routed expert `e`'s linear of this role (`mlp.experts.7.up_proj`),
    /// or [`Self::module`] for the other roles.
    pub fn expert_module(self, e: usize) -> String {
        match self {
            LinearRole::ExpertGate => format!("mlp.experts.{e}.gate_proj"),
            LinearRole::ExpertUp => format!("mlp.experts.{e}.up_proj"),
            LinearRole::ExpertDown => format!("mlp.experts.{e}.down_proj"),
            other => other.module().to_string(),
        }
    }

    /// The module name inside a layer (`self_attn.q_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            LinearRole::Q => "self_attn.q_proj",
            LinearRole::K => "self_attn.k_proj",
            LinearRole::V => "self_attn.v_proj",
            LinearRole::O => "self_attn.o_proj",
            LinearRole::Gate => "mlp.gate_proj",
            LinearRole::Up => "mlp.up_proj",
            LinearRole::Down => "mlp.down_proj",
            LinearRole::GdnQkv => "linear_attn.in_proj_qkv",
            LinearRole::GdnZ => "linear_attn.in_proj_z",
            LinearRole::GdnA => "linear_attn.in_proj_a",
            LinearRole::GdnB => "linear_attn.in_proj_b",
            LinearRole::GdnOut => "linear_attn.out_proj",
            LinearRole::Router => "mlp.gate",
            LinearRole::ExpertGate => "mlp.experts.N.gate_proj",
            LinearRole::ExpertUp => "mlp.experts.N.up_proj",
            LinearRole::ExpertDown => "mlp.experts.N.down_proj",
            LinearRole::SharedGate => "mlp.shared_expert.gate_proj",
            LinearRole::SharedUp => "mlp.shared_expert.up_proj",
            LinearRole::SharedDown => "mlp.shared_expert.down_proj",
            LinearRole::SharedExpertGate => "mlp.shared_expert_gate",
        }
    }

    /// `(N, K)` of this layer for `c` (Gated-DeltaNet roles of a dense config are `(0, H)`, the
    /// sparse roles of a config without experts `(0, H)` or `(H, 0)`).
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let h = c.hidden_size;
        let (ne, ie, is) = c.moe.as_ref().map_or((0, 0, 0), |m| {
            (
                m.num_experts,
                m.expert_intermediate_size,
                m.shared_expert_intermediate_size,
            )
        });
        let (kd, vd, nv) = c.hybrid.as_ref().map_or((0, 0, 0), |hy| {
            (hy.key_dim(), hy.value_dim(), hy.num_value_heads)
        });
        match self {
            LinearRole::Q => (c.q_proj_rows(), h),
            LinearRole::K | LinearRole::V => (c.kv_dim(), h),
            LinearRole::O => (h, c.q_dim()),
            LinearRole::Gate | LinearRole::Up => (c.intermediate_size, h),
            LinearRole::Down => (h, c.intermediate_size),
            LinearRole::GdnQkv => (2 * kd + vd, h),
            LinearRole::GdnZ => (vd, h),
            LinearRole::GdnA | LinearRole::GdnB => (nv, h),
            LinearRole::GdnOut => (h, vd),
            LinearRole::Router => (ne, h),
            LinearRole::ExpertGate | LinearRole::ExpertUp => (ie, h),
            LinearRole::ExpertDown => (h, ie),
            LinearRole::SharedGate | LinearRole::SharedUp => (is, h),
            LinearRole::SharedDown => (h, is),
            LinearRole::SharedExpertGate => (1, h),
        }
    }
}
