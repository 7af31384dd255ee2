//! Mixture-of-experts operations of the GEMM layer: routing on the GPU and the grouped expert
//! GEMMs, one launch per layer and operation (docs/runtime.md, "Mixtures of experts").
//!
//! A sparse block of `t` tokens, `E` experts, top-`k` (`P = t·k` routed pairs, pair
//! `p = token·k + choice`):
//! 1. the router GEMM (a BF16 linear, outside this module) writes logits `[t, E]` in BF16;
//! 2. [`launch_route`] (`kernels/moe.cu` `moe_route`): softmax in FP32, top-k in `torch.topk`'s
//!    order, renormalised when asked: `ids [P]`, `weights [P]`. With [`RouteSpec::shared`] the
//!    shared expert is routed too, as expert `E` of every token with weight `sigmoid(gate)`
//!    (the router GEMM carries the gate's row: logits `[t, E + 1]`; `P = t·(k + 1)`), so the
//!    grouped GEMMs and the combine below run it with the routed experts, three launches fewer
//!    per layer (the same fusion as SGLang's shared-experts fusion);
//! 3. [`launch_sort`] (`moe_sort`): the pairs grouped by expert ([`group_by_expert`] is its CPU
//!    reference): `sorted [P]`, the active experts `active [j]` with their ranges `offsets`,
//!    and their count on the device (nothing returns to the host: a decode step with its
//!    routing is one CUDA graph);
//! 4. [`launch_grouped`]: the grouped GEMM `y[p, N] = x[row(p), K] · W_e[N, K]ᵀ` for every pair
//!    `p` of every active expert `e`, with `row(p) = p / x_div` (`x_div = k`: gate_up on the
//!    token's normed hidden state; `1`: down on the pair's own activation). BF16 and FP8 E4M3
//!    weights run `kernels/gemv.cu`'s `moe_gemv_*`, NVFP4 (W4A16) `kernels/w4a16.cu`'s
//!    `w4a16_moe_*`: the small-M kernels of the dense path with a gather, an expert's pairs in
//!    one pass of 8 when they are at most 8, else [`PAIRS_PER_WIDE_PASS`] per pass, so each
//!    touched expert's weights stream from HBM once per 32 pairs;
//! 5. [`launch_combine`] (`moe_combine`): each token's k outputs scaled by their weights, summed
//!    in ascending expert order (as transformers' expert loop accumulates), plus the shared
//!    expert scaled by `sigmoid(gate)`, rounded once to BF16.
//!
//! Expert weights are addressed through per-layer device tables of pointers
//! ([`ExpertTables`]), one entry per expert, so each expert keeps the buffers its format's
//! loader made. The grouped launches have a fixed grid (one CTA column per possible active
//! expert, [`max_active`]); the columns past the device's active count exit at once.

use crate::gpu::dim;
use crate::gpu::launch::{Bf16, DevPtr, U32x4};
use crate::gpu::{Gpu, Module};

/// The source of the routing and combine kernels, compiled by NVRTC at run time.
pub const SRC: &str = include_str!("../../kernels/moe.cu");

/// Most experts `moe_route` handles: 32 lanes × `MOE_MAX_PER_LANE` (32) probabilities in
/// registers.
pub const MAX_EXPERTS: usize = 1024;

/// Most experts per token `moe_combine` orders (it ranks up to 16 choices in registers).
pub const MAX_TOP_K: usize = 16;

/// Most tokens [`launch_routing`] routes and groups in one CTA (`moe_route_sort`); above it, the
/// two kernels (`moe_route` over many CTAs, then `moe_sort`).
pub const FUSED_MAX_TOKENS: usize = 64;

/// Pairs one pass of a grouped GEMM takes for an expert with at most this many (the mma's
/// N = 8).
pub const PAIRS_PER_PASS: usize = 8;

/// Pairs one pass takes for an expert with more than [`PAIRS_PER_PASS`] (4 token tiles of 8
/// per loaded weight fragment: `MOE_NT` in kernels/gemv.cu, `MOE_W4_NT` in kernels/w4a16.cu).
pub const PAIRS_PER_WIDE_PASS: usize = 32;

/// The grouped BF16 / FP8 GEMV configuration: warps per CTA (they split K) and steps loaded
/// ahead (`moe_gemv_{bf16,fp8}_w{W}_u{U}`, one of [`super::gemv::GROUPED_VARIANTS`]).
pub const GEMV_CONFIG: (u32, u32) = super::gemv::GROUPED_VARIANTS[0];

/// The kernels of `kernels/moe.cu`.
pub fn kernel_names() -> Vec<String> {
    [
        "moe_route",
        "moe_sort",
        "moe_route_sort",
        "moe_combine",
        "moe_gemv_any",
    ]
    .map(String::from)
    .to_vec()
}

/// One sparse layer's routing: `experts` routed experts, `top_k` per token, renormalised or not,
/// and whether the shared expert routes as expert `experts` of every token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    /// Routed experts `E`.
    pub experts: usize,
    /// Routed experts per token `k`.
    pub top_k: usize,
    /// Renormalise the k weights to sum to 1 (`norm_topk_prob`).
    pub renormalize: bool,
    /// The shared expert is expert `E` of the grouped GEMMs: the router's logit rows are
    /// `E + 1` wide (column `E` its gate logit), each token has `k + 1` pairs, the last with
    /// weight `sigmoid(gate)`.
    pub shared: bool,
}

impl RouteSpec {
    /// Pairs per token: `k`, or `k + 1` with the shared expert.
    pub fn pairs_per_token(&self) -> usize {
        self.top_k + usize::from(self.shared)
    }

    /// Experts of the grouped GEMMs' tables and of the sort: `E`, or `E + 1`.
    pub fn table_experts(&self) -> usize {
        self.experts + usize::from(self.shared)
    }

    /// CTA columns of a grouped GEMM over `tokens` tokens ([`max_active`] of the tables).
    pub fn max_active(&self, tokens: usize) -> usize {
        max_active(self.table_experts(), self.pairs_per_token(), tokens)
    }

    /// Why the GPU routing cannot run this, or `None` ([`unsupported`], and with the shared
    /// expert one more expert and one more pair per token).
    pub fn unsupported(&self) -> Option<String> {
        if let Some(why) = unsupported(self.experts, self.top_k) {
            return Some(why);
        }
        if self.shared && (self.table_experts() > MAX_EXPERTS || self.pairs_per_token() > MAX_TOP_K)
        {
            return Some(format!(
                "top-{} of {} experts plus the shared expert: the GPU router takes at most {MAX_EXPERTS} experts and {MAX_TOP_K} pairs per token with it",
                self.top_k, self.experts
            ));
        }
        None
    }
}

/// Why the GPU routing cannot run `experts` experts with top-`top_k`, or `None`.
pub fn unsupported(experts: usize, top_k: usize) -> Option<String> {
    if experts == 0 || experts > MAX_EXPERTS {
        return Some(format!(
            "{experts} experts: the GPU router takes 1 to {MAX_EXPERTS}"
        ));
    }
    if top_k == 0 || top_k > MAX_TOP_K || top_k > experts {
        return Some(format!(
            "top-{top_k} of {experts} experts: the GPU router takes 1 to {} experts per token",
            MAX_TOP_K.min(experts)
        ));
    }
    None
}

/// CTA columns of a grouped GEMM over `tokens` tokens: the most experts they can route to,
/// `min(E, t·k)`.
pub fn max_active(experts: usize, top_k: usize, tokens: usize) -> usize {
    experts.min(tokens * top_k).max(1)
}

/// How the `B × k` routing choices of a decode step spread over the E experts: the cases of the
/// MoE kernel suite and of the decode-step floor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RoutingDistribution {
    /// Token `b`'s j-th choice is expert `(b·k + j) mod E`: as even as B × k allows.
    Balanced,
    /// Each token draws k distinct experts with probability ∝ `1 / rankˢ` (rank 1 the most
    /// popular), a fixed seed making the draw reproducible: the skew trained routers show.
    Zipf {
        /// The exponent s (> 0; 1.0 is the classic Zipf law).
        s: f64,
    },
    /// Every token routes among the same `few` experts (`few ≥ k`): the worst case for load
    /// balance and the best for the bytes touched.
    AllToFew {
        /// How many experts take every token.
        few: usize,
    },
}

/// Tokens routed to each of `experts` experts when `batch` tokens each choose `top_k` distinct
/// experts under `dist` (`seed` drives the Zipf draw). The counts sum to `batch · top_k`
/// (`top_k` capped at `experts`).
pub fn routed_counts(
    dist: RoutingDistribution,
    batch: usize,
    top_k: usize,
    experts: usize,
    seed: u64,
) -> Vec<usize> {
    let mut counts = vec![0usize; experts];
    for e in route_ids(dist, batch, top_k, experts, seed) {
        counts[e as usize] += 1;
    }
    counts
}

/// The experts each of `batch` tokens routes to under `dist`: `batch · k` ids, token by token
/// (`k = min(top_k, experts)` distinct ones per token; `seed` drives the Zipf draw), as
/// [`routed_counts`] counts them. The kernel bench's grouped cases route with these.
pub fn route_ids(
    dist: RoutingDistribution,
    batch: usize,
    top_k: usize,
    experts: usize,
    seed: u64,
) -> Vec<i32> {
    let k = top_k.min(experts);
    let mut ids = Vec::with_capacity(batch * k);
    if experts == 0 {
        return ids;
    }
    match dist {
        RoutingDistribution::Balanced => {
            // Consecutive choices of one token are distinct while k ≤ E.
            for b in 0..batch {
                for j in 0..k {
                    ids.push(((b * k + j) % experts) as i32);
                }
            }
        }
        RoutingDistribution::AllToFew { few } => {
            let few = few.clamp(k.max(1), experts);
            for b in 0..batch {
                for j in 0..k {
                    ids.push(((b * k + j) % few) as i32);
                }
            }
        }
        RoutingDistribution::Zipf { s } => {
            let weights: Vec<f64> = (1..=experts).map(|r| 1.0 / (r as f64).powf(s)).collect();
            let mut rng = crate::stats::rng::SplitMix64::new(seed);
            for _ in 0..batch {
                let mut chosen: Vec<usize> = Vec::with_capacity(k);
                while chosen.len() < k {
                    let free: f64 = (0..experts)
                        .filter(|e| !chosen.contains(e))
                        .map(|e| weights[e])
                        .sum();
                    let mut u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * free;
                    let mut pick = experts - 1;
                    for e in (0..experts).filter(|e| !chosen.contains(e)) {
                        if u < weights[e] {
                            pick = e;
                            break;
                        }
                        u -= weights[e];
                    }
                    if chosen.contains(&pick) {
                        // Rounding at the end of the walk: take the last free expert.
                        pick = (0..experts)
                            .rev()
                            .find(|e| !chosen.contains(e))
                            .unwrap_or(0);
                    }
                    chosen.push(pick);
                }
                ids.extend(chosen.into_iter().map(|e| e as i32));
            }
        }
    }
    ids
}

/// The routed pairs grouped by expert, as `moe_sort` writes them (the CPU reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouped {
    /// Pair indices, ascending expert, ascending pair within an expert.
    pub sorted: Vec<i32>,
    /// The experts with at least one pair, ascending.
    pub active: Vec<i32>,
    /// `offsets[j] .. offsets[j + 1]`: expert `active[j]`'s range of `sorted` (`active.len() + 1`
    /// entries).
    pub offsets: Vec<i32>,
}

/// Group the pairs `ids` (expert of pair p) by expert, as `moe_sort` does. Ids outside
/// `0..experts` are left out (the kernel never sees them: the router writes valid ones).
pub fn group_by_expert(ids: &[i32], experts: usize) -> Grouped {
    let mut per: Vec<Vec<i32>> = vec![Vec::new(); experts];
    for (p, &e) in ids.iter().enumerate() {
        if let Some(v) = usize::try_from(e).ok().and_then(|e| per.get_mut(e)) {
            v.push(p as i32);
        }
    }
    let mut g = Grouped {
        sorted: Vec::with_capacity(ids.len()),
        active: Vec::new(),
        offsets: Vec::new(),
    };
    for (e, v) in per.into_iter().enumerate() {
        if !v.is_empty() {
            g.active.push(e as i32);
            g.offsets.push(g.sorted.len() as i32);
            g.sorted.extend(v);
        }
    }
    g.offsets.push(g.sorted.len() as i32);
    g
}

/// Device addresses of one layer's routing buffers (sized for the largest batch).
#[derive(Debug, Clone, Copy)]
pub struct Routing {
    /// `i32 [P]`: expert of each pair.
    pub ids: u64,
    /// `f32 [P]`: weight of each pair.
    pub weights: u64,
    /// `i32 [P]`: pairs grouped by expert.
    pub sorted: u64,
    /// `i32 [min(E, P)]`: the active experts.
    pub active: u64,
    /// `i32 [min(E, P) + 1]`: their ranges of `sorted`.
    pub offsets: u64,
    /// `i32 [1]`: how many experts are active.
    pub n_active: u64,
}

impl Routing {
    /// The grouping every grouped GEMM kernel takes, in its parameter order: `sorted`,
    /// `active`, `offsets`, `n_active` (typed device pointers).
    pub fn grouped_args(&self) -> (DevPtr<i32>, DevPtr<i32>, DevPtr<i32>, DevPtr<i32>) {
        (
            DevPtr::at(self.sorted),
            DevPtr::at(self.active),
            DevPtr::at(self.offsets),
            DevPtr::at(self.n_active),
        )
    }
}

/// `moe_route`: `logits` BF16 `[t, E]` → `r.ids`, `r.weights` `[t, k]`.
///
/// # Errors
/// [`RouteSpec::unsupported`] routing, or a launch failure.
pub fn launch_route(
    gpu: &Gpu,
    module: &Module,
    logits: u64,
    t: usize,
    spec: &RouteSpec,
    r: &Routing,
) -> anyhow::Result<()> {
    if let Some(why) = spec.unsupported() {
        anyhow::bail!("{why}");
    }
    const WARPS: usize = 4;
    super::launchers::moe::moe_route(
        module,
        gpu,
        (dim("t / 4 warps", t.div_ceil(WARPS))?, 1, 1),
        (32 * WARPS as u32, 1, 1),
        0,
        DevPtr::<u16>::at(logits),
        t as i32,
        spec.experts as i32,
        spec.top_k as i32,
        i32::from(spec.renormalize),
        i32::from(spec.shared),
        DevPtr::<i32>::at(r.ids),
        DevPtr::<f32>::at(r.weights),
    )?;
    Ok(())
}

/// `moe_sort` over `pairs` pairs of `experts` experts into `r`'s grouped buffers; `log`, when
/// non-zero, also receives the active count (one `i32`, e.g. a per-layer slot of a step's log).
///
/// # Errors
/// A launch failure.
pub fn launch_sort(
    gpu: &Gpu,
    module: &Module,
    pairs: usize,
    experts: usize,
    r: &Routing,
    log: u64,
) -> anyhow::Result<()> {
    super::launchers::moe::moe_sort(
        module,
        gpu,
        (1, 1, 1),
        (experts.clamp(32, 1024).div_ceil(32) as u32 * 32, 1, 1),
        (2 * experts * 4) as u32,
        DevPtr::<i32>::at(r.ids),
        pairs as i32,
        experts as i32,
        DevPtr::<i32>::at(r.sorted),
        DevPtr::<i32>::at(r.active),
        DevPtr::<i32>::at(r.offsets),
        DevPtr::<i32>::at(r.n_active),
        DevPtr::<i32>::at(log),
    )?;
    Ok(())
}

/// Route `t` tokens and group their pairs by expert: `moe_route_sort` in one CTA up to
/// [`FUSED_MAX_TOKENS`] tokens (one launch instead of two at decode), else [`launch_route`]
/// then [`launch_sort`]; `log` as for [`launch_sort`].
///
/// # Errors
/// [`RouteSpec::unsupported`] routing, or a launch failure.
pub fn launch_routing(
    gpu: &Gpu,
    module: &Module,
    logits: u64,
    t: usize,
    spec: &RouteSpec,
    r: &Routing,
    log: u64,
) -> anyhow::Result<()> {
    if t > FUSED_MAX_TOKENS {
        launch_route(gpu, module, logits, t, spec, r)?;
        return launch_sort(
            gpu,
            module,
            t * spec.pairs_per_token(),
            spec.table_experts(),
            r,
            log,
        );
    }
    if let Some(why) = spec.unsupported() {
        anyhow::bail!("{why}");
    }
    super::launchers::moe::moe_route_sort(
        module,
        gpu,
        (1, 1, 1),
        (
            spec.table_experts().div_ceil(32).clamp(8, 32) as u32 * 32,
            1,
            1,
        ),
        ((64 + t * spec.pairs_per_token()) * 4) as u32,
        DevPtr::<u16>::at(logits),
        t as i32,
        spec.experts as i32,
        spec.top_k as i32,
        i32::from(spec.renormalize),
        i32::from(spec.shared),
        DevPtr::<i32>::at(r.ids),
        DevPtr::<f32>::at(r.weights),
        DevPtr::<i32>::at(r.sorted),
        DevPtr::<i32>::at(r.active),
        DevPtr::<i32>::at(r.offsets),
        DevPtr::<i32>::at(r.n_active),
        DevPtr::<i32>::at(log),
    )?;
    Ok(())
}

/// One grouped linear of a layer's experts (all experts in one format and shape `[n, k]`): the
/// device tables of per-expert addresses.
#[derive(Debug, Clone, Copy)]
pub enum ExpertTables {
    /// BF16 weights: `u64 [E]` addresses of `[n, k]` BF16.
    Bf16 {
        /// The weight table.
        w: u64,
    },
    /// FP8 E4M3 weights with one FP32 scale per row: `u64 [E]` weight and scale addresses.
    Fp8 {
        /// The weight table.
        w: u64,
        /// The row-scale table.
        s: u64,
    },
    /// NVFP4 in the W4A16 kernel layout: `u64 [E]` code and scale addresses, `f32 [E]`
    /// epilogue factors, and the (shared) layout sizes.
    W4 {
        /// The code table.
        wq: u64,
        /// The block-scale table.
        sc: u64,
        /// The epilogue factors (`weight_scale_2 · 2⁷` per expert).
        out_scales: u64,
        /// 16-row strips.
        strips: usize,
        /// 64-wide k tiles.
        kt_n: usize,
    },
}

/// The activations of a grouped GEMM: BF16 rows, or (FP8 weights) E4M3 rows with one FP32
/// scale per row; `x_div` maps a pair to its row (`p / x_div`).
#[derive(Debug, Clone, Copy)]
pub struct GroupedInput {
    /// BF16 rows (BF16, W4A16) or E4M3 codes (FP8), K contiguous, 16-byte aligned.
    pub x: u64,
    /// FP32 row scales (FP8 only).
    pub scales: u64,
    /// Pair → row divisor.
    pub x_div: usize,
    /// Tokens of the batch. An expert gets at most one pair per token, so at most
    /// [`PAIRS_PER_PASS`] tokens let the launch take the one-tile (`_t8`) kernels.
    pub tokens: usize,
}

/// The grouped GEMM `y[p, n] = x[p / x_div, :] · W_e[n, :]ᵀ` over every routed pair `p` of
/// every active expert `e` (BF16 out, `y` row stride `n`), on `gpu`'s stream without
/// synchronizing. `gemv` must hold [`super::gemv::grouped_kernel_names`] (BF16, FP8 tables
/// whose K is a multiple of 32 / 64 values), `moe` the kernels of [`SRC`] (BF16 and FP8 at any
/// other K: `moe_gemv_any`, one warp per row), `w4` the [`super::w4a16::grouped_kernel_names`]
/// (W4 tables, K a multiple of 16). `cols` fixes the grid ([`max_active`] of the batch).
///
/// # Errors
/// A missing module, misaligned activations, or a launch failure.
#[allow(clippy::too_many_arguments)]
pub fn launch_grouped(
    gpu: &Gpu,
    (gemv, moe, w4): (Option<&Module>, Option<&Module>, Option<&Module>),
    tables: &ExpertTables,
    input: &GroupedInput,
    r: &Routing,
    y: u64,
    (n, k): (usize, usize),
    cols: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        input.x % 16 == 0,
        "the grouped GEMM reads 16-byte vectors: activations at {:#x}",
        input.x
    );
    anyhow::ensure!(n > 0 && k > 0, "N = {n}, K = {k}: an empty expert");
    let x_div = input.x_div.max(1) as i32;
    let cols = dim("active expert columns", cols)?;
    let (ni, ki) = (n as i32, k as i32);
    let (sorted, active, offsets, n_active) = r.grouped_args();
    let one_tile = input.tokens <= PAIRS_PER_PASS;
    match *tables {
        ExpertTables::Bf16 { w } | ExpertTables::Fp8 { w, .. } => {
            let fp8 = matches!(tables, ExpertTables::Fp8 { .. });
            // The FP8 row-scale table (BF16: none, the kernels ignore it).
            let s = match *tables {
                ExpertTables::Fp8 { s, .. } => s,
                _ => 0,
            };
            let step = if fp8 { 64 } else { 32 };
            if k % step != 0 {
                let m = moe.ok_or_else(|| {
                    anyhow::anyhow!(
                        "kernels/moe.cu is not built: the grouped GEMV for K = {k} needs it"
                    )
                })?;
                super::launchers::moe::moe_gemv_any(
                    m,
                    gpu,
                    (dim("N / 8", n.div_ceil(8))?, cols, 1),
                    (256, 1, 1),
                    0,
                    DevPtr::<u64>::at(w),
                    DevPtr::<u64>::at(s),
                    i32::from(fp8),
                    DevPtr::<crate::gpu::launch::Void>::at(input.x),
                    DevPtr::<f32>::at(input.scales),
                    x_div,
                    sorted,
                    active,
                    offsets,
                    n_active,
                    DevPtr::<u16>::at(y),
                    ni,
                    ki,
                )?;
                return Ok(());
            }
            let m = gemv.ok_or_else(|| {
                anyhow::anyhow!("kernels/gemv.cu is not built: the grouped expert GEMV needs it")
            })?;
            let (wn, un) = GEMV_CONFIG;
            super::launchers::gemv::moe(
                m,
                gpu,
                &super::gemv::grouped_kernel_name(fp8, (wn, un), one_tile),
                (dim("N / 16", n.div_ceil(16))?, cols, 1),
                (32 * wn, 1, 1),
                0,
                DevPtr::<u64>::at(w),
                DevPtr::<u64>::at(s),
                DevPtr::<U32x4>::at(input.x),
                DevPtr::<f32>::at(input.scales),
                x_div,
                sorted,
                active,
                offsets,
                n_active,
                DevPtr::<u16>::at(y),
                ni,
                ki,
            )?;
        }
        ExpertTables::W4 {
            wq,
            sc,
            out_scales,
            strips,
            kt_n,
        } => {
            let m = w4.ok_or_else(|| {
                anyhow::anyhow!("kernels/w4a16.cu is not built: the grouped W4A16 GEMM needs it")
            })?;
            let kernel = super::w4a16::grouped_for(kt_n);
            super::launchers::w4a16::moe(
                m,
                gpu,
                &kernel.kernel(one_tile),
                (
                    dim(
                        "strips per CTA",
                        strips.div_ceil(kernel.strips_per_cta() as usize),
                    )?,
                    1,
                    cols,
                ),
                (32 * kernel.warps, 1, 1),
                0,
                DevPtr::<u64>::at(wq),
                DevPtr::<u64>::at(sc),
                DevPtr::<f32>::at(out_scales),
                DevPtr::<Bf16>::at(input.x),
                x_div,
                sorted,
                active,
                offsets,
                n_active,
                DevPtr::<Bf16>::at(y),
                ni,
                ki,
                strips as i32,
                kt_n as i32,
            )?;
        }
    }
    Ok(())
}

/// `moe_combine`: `out[t, h]` (BF16) from the routed outputs `y [t·k, h]`, the routing's ids and
/// weights, and the shared expert's output `[t, h]` with its gate logit `[t]` (both BF16; `0`
/// for none).
///
/// # Errors
/// `top_k` above [`MAX_TOP_K`], or a launch failure.
#[allow(clippy::too_many_arguments)]
pub fn launch_combine(
    gpu: &Gpu,
    module: &Module,
    y: u64,
    r: &Routing,
    (t, top_k, h): (usize, usize, usize),
    shared: (u64, u64),
    out: u64,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        top_k <= MAX_TOP_K,
        "top-{top_k}: the combine takes at most {MAX_TOP_K}"
    );
    super::launchers::moe::moe_combine(
        module,
        gpu,
        (dim("t", t)?, dim("h / 256", h.div_ceil(256))?, 1),
        (256, 1, 1),
        0,
        DevPtr::<u16>::at(y),
        DevPtr::<i32>::at(r.ids),
        DevPtr::<f32>::at(r.weights),
        top_k as i32,
        h as i32,
        DevPtr::<u16>::at(shared.0),
        DevPtr::<u16>::at(shared.1),
        DevPtr::<u16>::at(out),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_group_by_ascending_expert_then_pair() {
        // 3 tokens, top-2: pairs 0..6.
        let ids = [5, 1, 1, 3, 5, 1];
        let g = group_by_expert(&ids, 8);
        assert_eq!(g.active, vec![1, 3, 5]);
        assert_eq!(g.sorted, vec![1, 2, 5, 3, 0, 4]);
        assert_eq!(g.offsets, vec![0, 3, 4, 6]);
        let empty = group_by_expert(&[], 4);
        assert!(empty.active.is_empty() && empty.sorted.is_empty());
        assert_eq!(empty.offsets, vec![0]);
    }

    #[test]
    fn routing_limits_are_stated() {
        assert!(unsupported(256, 8).is_none());
        assert!(unsupported(8, 2).is_none());
        assert!(unsupported(MAX_EXPERTS + 1, 8).unwrap().contains("1024"));
        assert!(unsupported(4, 5).is_some());
        assert!(unsupported(256, 17).is_some());
        assert!(unsupported(0, 1).is_some());
        assert_eq!(max_active(256, 8, 1), 8);
        assert_eq!(max_active(256, 8, 32), 256);
        assert_eq!(max_active(8, 2, 0), 1);
    }

    #[test]
    fn the_shared_expert_routes_as_one_more_expert() {
        let plain = RouteSpec {
            experts: 256,
            top_k: 8,
            renormalize: true,
            shared: false,
        };
        let fused = RouteSpec {
            shared: true,
            ..plain
        };
        assert_eq!((plain.pairs_per_token(), plain.table_experts()), (8, 256));
        assert_eq!((fused.pairs_per_token(), fused.table_experts()), (9, 257));
        assert_eq!(plain.max_active(1), 8);
        assert_eq!(fused.max_active(1), 9);
        assert_eq!(fused.max_active(64), 257);
        assert!(fused.unsupported().is_none());
        // One more expert or pair than the kernels hold is refused with the shared expert only.
        let wide = RouteSpec {
            experts: MAX_EXPERTS,
            ..fused
        };
        assert!(wide.unsupported().unwrap().contains("shared expert"));
        assert!(RouteSpec {
            shared: false,
            ..wide
        }
        .unsupported()
        .is_none());
        let deep = RouteSpec {
            top_k: MAX_TOP_K,
            ..fused
        };
        assert!(deep.unsupported().is_some());
        assert!(RouteSpec {
            shared: false,
            ..deep
        }
        .unsupported()
        .is_none());
    }

    #[test]
    fn wide_passes_match_the_kernels_tiles() {
        let tiles = PAIRS_PER_WIDE_PASS / PAIRS_PER_PASS;
        assert!(super::super::gemv::SRC.contains(&format!("#define MOE_NT {tiles}\n")));
        assert!(super::super::w4a16::SRC.contains(&format!("#define MOE_W4_NT {tiles}\n")));
    }

    #[test]
    fn grouped_w4_kernel_follows_k() {
        use super::super::w4a16::{grouped_for, grouped_kernel_names, GROUPED_VARIANTS};
        // The 35B's down projection (K = 512: 8 k-tiles) runs a warp per strip, its gate_up
        // (K = 2,048: 32 k-tiles) splits K over 4 warps.
        let down = grouped_for(8);
        assert!(!down.k_split);
        assert_eq!(down.name(), "w4a16_moe_ns_w4_n1");
        assert_eq!(down.strips_per_cta(), 4);
        let gate_up = grouped_for(32);
        assert!(gate_up.k_split);
        assert_eq!(gate_up.strips_per_cta(), 1);
        // Each variant in its general form and its one-tile `_t8` form.
        assert_eq!(grouped_kernel_names().len(), 2 * GROUPED_VARIANTS.len());
        assert_eq!(down.kernel(true), "w4a16_moe_ns_w4_n1_t8");
        assert_eq!(gate_up.kernel(false), "w4a16_moe_w4_n1");
        for k in grouped_kernel_names() {
            assert!(super::super::w4a16::SRC.contains(&format!("({k}, ")), "{k}");
        }
    }

    #[test]
    fn kernel_names_are_in_the_sources() {
        for k in kernel_names() {
            assert!(SRC.contains(&format!(" {k}(")), "{k}");
        }
    }
}
