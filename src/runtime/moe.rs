//! Mixture-of-experts math of the CPU backend (the reference): the router's softmax and top-k,
//! and one sparse MLP block over a batch of tokens. The block's definition (which layers,
//! which widths, renormalisation) is in `crate::model::moe`; docs/runtime.md describes the
//! design and its limits.
//!
//! Routing follows transformers' `Qwen3MoeTopKRouter` / `Qwen3_5MoeTopKRouter`:
//! `p = softmax(logits)` in FP32 over all E experts, the k largest of `p` (`torch.topk`), and,
//! when renormalising, `w = p_top / Σ p_top`. Ties: `torch.topk` promises no order among equal
//! values; [`top_k`] takes the lower expert index first (a stable descending sort), the order
//! torch's CPU kernel returns for the small k of these models, and treats NaN as larger than
//! every number, as `torch.topk` does. Exact ties of FP32 probabilities need equal router
//! logits, which trained weights practically never give.

pub use super::memory::decode_step_floor;
pub use crate::gemm::moe::{routed_counts, RoutingDistribution};
use crate::model::moe::MoeConfig;
use crate::runtime::model::silu;
use crate::runtime::weights::{Linear, MoeWeights};

/// One token's routing: the chosen experts in `torch.topk`'s order (descending probability)
/// and the weight each output is scaled by.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Expert indices, k of them.
    pub experts: Vec<usize>,
    /// Their weights (renormalised to sum to 1 when the config says so, else the raw softmax
    /// probabilities).
    pub weights: Vec<f32>,
    /// The k-th chosen probability minus the best one left out (infinity when every expert is
    /// chosen): under a small margin another backend's rounding may choose differently.
    pub margin: f32,
}

/// Softmax of `logits` (max subtracted, accumulated in f64, rounded to f32): the router's
/// probabilities, which transformers computes with `softmax(dtype=torch.float)`.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| (v / sum) as f32).collect()
}

/// The indices of the `k` largest values of `v`, largest first; equal values in ascending index
/// order, NaN above every number (see the module docs for how this relates to `torch.topk`).
/// `k` larger than `v.len()` returns every index.
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let key = |i: usize| -> (bool, f32) { (v[i].is_nan(), v[i]) };
    let mut idx: Vec<usize> = (0..v.len()).collect();
    // A stable sort keeps ascending indices among equal keys.
    idx.sort_by(|&a, &b| {
        let (na, va) = key(a);
        let (nb, vb) = key(b);
        nb.cmp(&na)
            .then_with(|| vb.partial_cmp(&va).unwrap_or(std::cmp::Ordering::Equal))
    });
    idx.truncate(k);
    idx
}

/// Route one token from its router logits (`E` of them).
pub fn route(logits: &[f32], top: usize, renormalize: bool) -> Route {
    let p = softmax(logits);
    let mut experts = top_k(&p, top + 1);
    let margin = if experts.len() > top {
        let out = experts.pop().map_or(0.0, |e| p[e]);
        experts.last().map_or(f32::INFINITY, |&e| p[e] - out)
    } else {
        f32::INFINITY
    };
    let mut weights: Vec<f32> = experts.iter().map(|&e| p[e]).collect();
    if renormalize {
        let sum: f32 = weights.iter().sum();
        if sum > 0.0 {
            weights.iter_mut().for_each(|w| *w /= sum);
        }
    }
    Route {
        experts,
        weights,
        margin,
    }
}

/// `mm(x, m, w)`: `[m, K] · [N, K]ᵀ → [m, N]`.
pub type MatMul<'a> = &'a dyn Fn(&[f32], usize, &Linear) -> Vec<f32>;

/// What one sparse block needs from the backend: a matmul `x · Wᵀ` over `m` rows and the
/// rounding it applies at its rounding points (identity on the f32 reference path).
pub struct Ops<'a> {
    /// `mm(x, m, w)`: `[m, K] · [N, K]ᵀ → [m, N]`.
    pub mm: MatMul<'a>,
    /// Rounding of an intermediate (BF16 at the CUDA backend's points, or none).
    pub round: &'a dyn Fn(&mut [f32]),
}

/// A SwiGLU MLP on `m` rows: `down(silu(gate(x)) ⊙ up(x))`.
fn swiglu(ops: &Ops, x: &[f32], m: usize, gate: &Linear, up: &Linear, down: &Linear) -> Vec<f32> {
    let mut g = (ops.mm)(x, m, gate);
    let u = (ops.mm)(x, m, up);
    for (a, b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    (ops.round)(&mut g);
    (ops.mm)(&g, m, down)
}

/// One sparse MLP block on `t` tokens (`x`: the post-attention-normed hidden states, `[t, H]`):
/// the block's output `[t, H]` (to be added to the residual) and each token's route.
///
/// As transformers: the routed experts are run in ascending expert index, each on the tokens
/// routed to it, its output scaled by the token's weight and accumulated; the shared expert
/// (when present) on every token, scaled by `sigmoid(shared_expert_gate · x)`, is added last.
pub fn moe_block(
    ops: &Ops,
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    t: usize,
    h: usize,
) -> (Vec<f32>, Vec<Route>) {
    let logits = (ops.mm)(x, t, &w.router);
    let e = cfg.num_experts;
    let routes: Vec<Route> = (0..t)
        .map(|i| route(&logits[i * e..(i + 1) * e], cfg.top_k, cfg.norm_topk_prob))
        .collect();
    // Tokens (and weights) per expert, tokens ascending.
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    for (ti, r) in routes.iter().enumerate() {
        for (&ex, &wt) in r.experts.iter().zip(&r.weights) {
            per_expert[ex].push((ti, wt));
        }
    }
    let mut out = vec![0f32; t * h];
    for (ex, toks) in per_expert.iter().enumerate() {
        if toks.is_empty() {
            continue;
        }
        let mut xe = Vec::with_capacity(toks.len() * h);
        for &(ti, _) in toks {
            xe.extend_from_slice(&x[ti * h..(ti + 1) * h]);
        }
        let m = &w.experts[ex];
        let y = swiglu(ops, &xe, toks.len(), &m.gate, &m.up, &m.down);
        for (r, &(ti, wt)) in toks.iter().enumerate() {
            for (o, v) in out[ti * h..(ti + 1) * h]
                .iter_mut()
                .zip(&y[r * h..(r + 1) * h])
            {
                *o += wt * v;
            }
        }
    }
    if let Some(s) = &w.shared {
        let y = swiglu(ops, x, t, &s.mlp.gate, &s.mlp.up, &s.mlp.down);
        let g = (ops.mm)(x, t, &s.gate);
        for ti in 0..t {
            let scale = 1.0 / (1.0 + (-g[ti]).exp());
            for (o, v) in out[ti * h..(ti + 1) * h]
                .iter_mut()
                .zip(&y[ti * h..(ti + 1) * h])
            {
                *o += scale * v;
            }
        }
    }
    (ops.round)(&mut out);
    (out, routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_by_value_then_lower_index_and_puts_nan_first() {
        assert_eq!(top_k(&[0.1, 0.5, 0.2, 0.5, 0.0], 3), vec![1, 3, 2]);
        assert_eq!(top_k(&[0.25; 4], 2), vec![0, 1]);
        assert_eq!(top_k(&[0.1, f32::NAN, 0.9], 2), vec![1, 2]);
        assert_eq!(top_k(&[0.3, 0.7], 5), vec![1, 0]);
    }

    #[test]
    fn routing_distributions_route_every_choice_and_differ_in_spread() {
        let (b, k, e) = (32, 8, 256);
        let bal = routed_counts(RoutingDistribution::Balanced, b, k, e, 0);
        let zipf = routed_counts(RoutingDistribution::Zipf { s: 1.2 }, b, k, e, 7);
        let few = routed_counts(RoutingDistribution::AllToFew { few: 8 }, b, k, e, 0);
        let touched = |c: &[usize]| c.iter().filter(|x| **x > 0).count();
        for c in [&bal, &zipf, &few] {
            assert_eq!(c.iter().sum::<usize>(), b * k);
        }
        assert_eq!(touched(&bal), 256);
        assert_eq!(touched(&few), 8);
        let z = touched(&zipf);
        assert!(z > 8 && z < 256, "{z}");
        assert!(zipf[0] > zipf[200], "{zipf:?}");
        // Batch 1: k experts touched whatever the spread.
        for d in [
            RoutingDistribution::Balanced,
            RoutingDistribution::Zipf { s: 1.0 },
        ] {
            assert_eq!(touched(&routed_counts(d, 1, k, e, 3)), 8);
        }
    }

    #[test]
    fn the_decode_floor_counts_only_the_touched_experts() {
        use crate::runtime::config::{KvCacheDtype, ModelConfig, QuantRecipe, WeightFormat};
        let c = ModelConfig::preset("qwen3.6-35b-a3b").unwrap();
        let r = QuantRecipe::Uniform(WeightFormat::Bf16);
        let one = decode_step_floor(&c, r, KvCacheDtype::Bf16, 0, 1, &[8; 40]);
        let all = decode_step_floor(&c, r, KvCacheDtype::Bf16, 0, 1, &[]);
        // 40 layers × 248 untouched experts × 3 × 2048 × 512 × 2 bytes.
        assert_eq!(all.weights - one.weights, 40 * 248 * 3 * 2048 * 512 * 2);
        // About 3e9 active parameters: about 6 GB of BF16 per batch-1 step (lm_head included).
        let gb = one.weights as f64 / 1e9;
        assert!((5.0..7.5).contains(&gb), "{gb}");
        assert_eq!(one.state, 2 * c.gdn_state_bytes(2));
        let ctx = decode_step_floor(&c, r, KvCacheDtype::Bf16, 1000, 4, &[8; 40]);
        assert_eq!(ctx.kv, 2 * 4 * 10 * 512 * 1000 * 2);
    }

    #[test]
    fn routing_renormalises_only_when_asked() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let p = softmax(&logits);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let r = route(&logits, 2, true);
        assert_eq!(r.experts, vec![1, 2]);
        assert!((r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6);
        // e^3 / (e^3 + e^2) = 1 / (1 + e^-1).
        assert!((r.weights[0] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        let raw = route(&logits, 2, false);
        assert_eq!(raw.weights, vec![p[1], p[2]]);
        assert!(raw.weights[0] + raw.weights[1] < 0.99);
    }
}
