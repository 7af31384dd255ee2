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

    /// The linears of layer `layer` of `c` ([`Self::ALL`] or [`Self::GDN`]).
    pub fn of_layer(c: &ModelConfig, layer: usize) -> &'static [LinearRole] {
        match c.layer_type(layer) {
            super::hybrid::LayerType::Attention => &Self::ALL,
            super::hybrid::LayerType::Gdn => &Self::GDN,
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
        }
    }

    /// `(N, K)` of this layer for `c` (Gated-DeltaNet roles of a dense config are `(0, H)`).
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let h = c.hidden_size;
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
        }
    }
}
