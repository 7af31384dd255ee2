//! Gated-DeltaNet math (Yang, Kautz and Hatamizadeh, "Gated Delta Networks: Improving Mamba2
//! with Delta Rule", ICLR 2025), in the conventions of transformers' `Qwen3_5GatedDeltaNet`
//! (`modeling_qwen3_5.py`), shared by the CPU backend and the GPU parity checks:
//!
//! - the causal depthwise convolution over the concatenated `in_proj_qkv` output (`conv_dim`
//!   channels, kernel `K`, no bias), followed by SiLU; a rolling state keeps the last `K − 1`
//!   inputs of each sequence (`out[t] = Σ_j w[j] · x[t − K + 1 + j]`, inputs before the sequence
//!   start are zero, as `F.conv1d` with `padding = K − 1`);
//! - per token: `q`, `k` (key heads × `dk`) and `v` (value heads × `dv`) split from the
//!   convolution output; `q` and `k` L2-normalised per head (`x · rsqrt(Σx² + 1e-6)`) and `q`
//!   scaled by `1/sqrt(dk)`; `g = −exp(A_log) · softplus(a + dt_bias)` (log-space decay) and
//!   `β = sigmoid(b)` per value head; key head `j / (value_heads / key_heads)` serves value head
//!   `j` (`repeat_interleave`);
//! - the gated delta rule per value head over an FP32 state `S` of `dk × dv`:
//!   `S ← exp(g)·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq` — token by token (the recurrent form,
//!   decode) or chunk by chunk ([`delta_rule_chunked`], the WY/UT form of transformers'
//!   `torch_chunk_gated_delta_rule`, prefill). The two agree up to f32 rounding;
//! - the gated RMSNorm per value head: `y = w · norm(o) · silu(z)` (`Qwen3_5RMSNormGated`; its
//!   weight is used as stored, initialised to 1).
//!
//! Everything is f32 with fixed summation orders. With `round` set, values are rounded to BF16
//! where the CUDA backend stores them in BF16 (the convolution output and the mixer output):
//! the CPU reference of the GPU parity check.

use super::hybrid::HybridConfig;

/// Rows per chunk of the chunked form (transformers' and FLA's `chunk_size`).
pub const CHUNK: usize = 64;

/// Epsilon of the L2 normalisation of q and k (FLA's `l2norm`, transformers' `l2norm`).
pub const L2_EPS: f32 = 1e-6;

/// The dimensions of a Gated-DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Query/key heads.
    pub nk: usize,
    /// Value heads (a multiple of `nk`).
    pub nv: usize,
    /// Key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// Convolution width `K`.
    pub kernel: usize,
}

impl From<&HybridConfig> for GdnDims {
    fn from(h: &HybridConfig) -> Self {
        GdnDims {
            nk: h.num_key_heads,
            nv: h.num_value_heads,
            dk: h.key_head_dim,
            dv: h.value_head_dim,
            kernel: h.conv_kernel,
        }
    }
}

impl GdnDims {
    /// `nk · dk`.
    pub fn key_dim(&self) -> usize {
        self.nk * self.dk
    }
    /// `nv · dv`.
    pub fn value_dim(&self) -> usize {
        self.nv * self.dv
    }
    /// `2 · key_dim + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// `(K − 1) · conv_dim`.
    pub fn conv_state_len(&self) -> usize {
        self.kernel.saturating_sub(1) * self.conv_dim()
    }
    /// `nv · dk · dv`.
    pub fn ssm_state_len(&self) -> usize {
        self.nv * self.dk * self.dv
    }
}

/// One sequence's state in one Gated-DeltaNet layer.
#[derive(Debug, Clone, PartialEq)]
pub struct GdnLayerState {
    /// The last `K − 1` convolution inputs, `[K − 1][conv_dim]`, oldest first (zeros before the
    /// sequence start).
    pub conv: Vec<f32>,
    /// The recurrent state, `[nv][dk][dv]`.
    pub ssm: Vec<f32>,
}

impl GdnLayerState {
    /// The zero state of a new sequence.
    pub fn zeros(d: &GdnDims) -> Self {
        GdnLayerState {
            conv: vec![0.0; d.conv_state_len()],
            ssm: vec![0.0; d.ssm_state_len()],
        }
    }

    /// Back to the zero state.
    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }
}

/// The per-layer parameters other than the linear layers.
#[derive(Debug, Clone, Copy)]
pub struct GdnParams<'a> {
    /// `conv1d.weight` `[conv_dim, 1, K]` as `[conv_dim][K]`.
    pub conv_w: &'a [f32],
    /// `A_log`, one per value head.
    pub a_log: &'a [f32],
    /// `dt_bias`, one per value head.
    pub dt_bias: &'a [f32],
}

/// `torch.nn.functional.softplus` (β = 1, threshold 20: `x` itself above 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `1 / (1 + exp(−x))`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
fn bf16(x: f32) -> f32 {
    crate::formats::bf16_round(x)
}

/// The causal depthwise convolution with SiLU over `t` rows of `x` (`[t][C]`, pre-convolution
/// `in_proj_qkv` outputs), continuing from `state` (`[K − 1][C]`, updated to the last `K − 1`
/// inputs). Writes `[t][C]` to `out`; with `round`, each output rounded to BF16.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv_silu(
    x: &[f32],
    t: usize,
    c: usize,
    p: &GdnParams<'_>,
    kernel: usize,
    state: &mut [f32],
    out: &mut [f32],
    round: bool,
) {
    let hist = kernel - 1;
    // row(i) for i in -(K-1)..t: state rows first, then x.
    let row = |i: isize, ch: usize, state: &[f32]| -> f32 {
        if i < 0 {
            state[((hist as isize + i) as usize) * c + ch]
        } else {
            x[i as usize * c + ch]
        }
    };
    for ti in 0..t {
        for ch in 0..c {
            let w = &p.conv_w[ch * kernel..(ch + 1) * kernel];
            let mut s = 0f32;
            for (j, wj) in w.iter().enumerate() {
                let src = ti as isize - hist as isize + j as isize;
                s += wj * row(src, ch, state);
            }
            let y = s / (1.0 + (-s).exp());
            out[ti * c + ch] = if round { bf16(y) } else { y };
        }
    }
    // New state: the last K-1 rows of [state; x].
    if hist > 0 {
        let mut next = vec![0f32; hist * c];
        for r in 0..hist {
            let i = t as isize - hist as isize + r as isize;
            for ch in 0..c {
                next[r * c + ch] = row(i, ch, state);
            }
        }
        state.copy_from_slice(&next);
    }
}

/// `g` (log decay) and `β` per token and value head from the `in_proj_a` / `in_proj_b` outputs
/// (`[t][nv]` each): `g = −exp(A_log) · softplus(a + dt_bias)`, `β = sigmoid(b)`.
pub fn gates(a: &[f32], b: &[f32], t: usize, nv: usize, p: &GdnParams<'_>) -> (Vec<f32>, Vec<f32>) {
    let mut g = vec![0f32; t * nv];
    let mut beta = vec![0f32; t * nv];
    for ti in 0..t {
        for h in 0..nv {
            let i = ti * nv + h;
            g[i] = -p.a_log[h].exp() * softplus(a[i] + p.dt_bias[h]);
            beta[i] = sigmoid(b[i]);
        }
    }
    (g, beta)
}

/// `x · rsqrt(Σx² + eps)` in place.
#[inline]
pub fn l2norm(x: &mut [f32]) {
    let s = super::model::dot(x, x);
    let inv = 1.0 / (s + L2_EPS).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// q (normalised and scaled by `1/sqrt(dk)`), k (normalised) and v of token `ti` for value
/// head `h`, from the convolution output `mixed` (`[t][conv_dim]`).
fn qkv_of<'a>(
    mixed: &'a [f32],
    ti: usize,
    h: usize,
    d: &GdnDims,
) -> (Vec<f32>, Vec<f32>, &'a [f32]) {
    let c = d.conv_dim();
    let row = &mixed[ti * c..(ti + 1) * c];
    let kh = h / (d.nv / d.nk);
    let mut q = row[kh * d.dk..(kh + 1) * d.dk].to_vec();
    let mut k = row[d.key_dim() + kh * d.dk..d.key_dim() + (kh + 1) * d.dk].to_vec();
    let v = &row[2 * d.key_dim() + h * d.dv..2 * d.key_dim() + (h + 1) * d.dv];
    l2norm(&mut q);
    l2norm(&mut k);
    let scale = 1.0 / (d.dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    (q, k, v)
}

/// The recurrent form over `t` tokens for value head `h`: updates that head's state
/// `s` (`[dk][dv]`) and writes its output rows into `out` (`[t][nv · dv]`).
#[allow(clippy::too_many_arguments)]
fn recurrent_head(
    mixed: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    h: usize,
    d: &GdnDims,
    s: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv) = (d.dk, d.dv);
    let mut kv = vec![0f32; dv];
    for ti in 0..t {
        let (q, k, v) = qkv_of(mixed, ti, h, d);
        let decay = g[ti * d.nv + h].exp();
        let b = beta[ti * d.nv + h];
        s.iter_mut().for_each(|x| *x *= decay);
        kv.fill(0.0);
        for (i, ki) in k.iter().enumerate() {
            for (o, sv) in kv.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *o += sv * ki;
            }
        }
        for (o, vv) in kv.iter_mut().zip(v) {
            *o = (vv - *o) * b;
        }
        for (i, ki) in k.iter().enumerate() {
            for (sv, dl) in s[i * dv..(i + 1) * dv].iter_mut().zip(&kv) {
                *sv += ki * dl;
            }
        }
        let o = &mut out[ti * d.value_dim() + h * dv..ti * d.value_dim() + (h + 1) * dv];
        o.fill(0.0);
        for i in 0..dk {
            let qi = q[i];
            for (ov, sv) in o.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *ov += sv * qi;
            }
        }
    }
}

/// The chunked form over `t` tokens for value head `h` (chunks of [`CHUNK`] rows from the
/// segment start; the last may be shorter): per chunk with cumulative log decays `c_i`,
/// `A_ij = (β_i k_i·k_j) e^{c_i − c_j}` (j < i), `U = (I + A)⁻¹ βV`, `W = (I + A)⁻¹ (βK e^{c})`
/// by forward substitution, `V' = U − W S`, `o_i = e^{c_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{c_i −
/// c_j} v'_j`, `S ← e^{c_L} S + Σ_j e^{c_L − c_j} k_j ⊗ v'_j`.
#[allow(clippy::too_many_arguments)]
fn chunked_head(
    mixed: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    h: usize,
    d: &GdnDims,
    s: &mut [f32],
    out: &mut [f32],
    chunk: usize,
) {
    let (dk, dv) = (d.dk, d.dv);
    let mut c0 = 0;
    while c0 < t {
        let l = chunk.min(t - c0);
        let mut qs = Vec::with_capacity(l);
        let mut ks = Vec::with_capacity(l);
        let mut vs = Vec::with_capacity(l);
        let mut cum = vec![0f32; l];
        let mut bs = vec![0f32; l];
        let mut acc = 0f32;
        for i in 0..l {
            let ti = c0 + i;
            let (q, k, v) = qkv_of(mixed, ti, h, d);
            qs.push(q);
            ks.push(k);
            vs.push(v.to_vec());
            acc += g[ti * d.nv + h];
            cum[i] = acc;
            bs[i] = beta[ti * d.nv + h];
        }
        // A (strictly lower), U and W by forward substitution.
        let mut a = vec![0f32; l * l];
        for i in 0..l {
            for j in 0..i {
                a[i * l + j] = bs[i] * super::model::dot(&ks[i], &ks[j]) * (cum[i] - cum[j]).exp();
            }
        }
        let mut u = vec![0f32; l * dv];
        let mut w = vec![0f32; l * dk];
        for i in 0..l {
            for x in 0..dv {
                u[i * dv + x] = bs[i] * vs[i][x];
            }
            let e = cum[i].exp();
            for x in 0..dk {
                w[i * dk + x] = bs[i] * ks[i][x] * e;
            }
            for j in 0..i {
                let aij = a[i * l + j];
                if aij == 0.0 {
                    continue;
                }
                for x in 0..dv {
                    u[i * dv + x] -= aij * u[j * dv + x];
                }
                for x in 0..dk {
                    w[i * dk + x] -= aij * w[j * dk + x];
                }
            }
        }
        // V' = U − W S.
        let mut vn = u;
        for i in 0..l {
            for x in 0..dk {
                let wx = w[i * dk + x];
                for (o, sv) in vn[i * dv..(i + 1) * dv]
                    .iter_mut()
                    .zip(&s[x * dv..(x + 1) * dv])
                {
                    *o -= wx * sv;
                }
            }
        }
        // Outputs.
        for i in 0..l {
            let o = &mut out
                [(c0 + i) * d.value_dim() + h * dv..(c0 + i) * d.value_dim() + (h + 1) * dv];
            o.fill(0.0);
            let e = cum[i].exp();
            for x in 0..dk {
                let qx = qs[i][x] * e;
                for (ov, sv) in o.iter_mut().zip(&s[x * dv..(x + 1) * dv]) {
                    *ov += qx * sv;
                }
            }
            for j in 0..=i {
                let c = super::model::dot(&qs[i], &ks[j]) * (cum[i] - cum[j]).exp();
                for (ov, vv) in o.iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *ov += c * vv;
                }
            }
        }
        // State update.
        let last = cum[l - 1];
        let el = last.exp();
        s.iter_mut().for_each(|x| *x *= el);
        for j in 0..l {
            let f = (last - cum[j]).exp();
            for x in 0..dk {
                let kx = ks[j][x] * f;
                for (sv, vv) in s[x * dv..(x + 1) * dv]
                    .iter_mut()
                    .zip(&vn[j * dv..(j + 1) * dv])
                {
                    *sv += kx * vv;
                }
            }
        }
        c0 += l;
    }
}

/// Which form of the delta rule to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Token by token.
    Recurrent,
    /// Chunks of this many rows.
    Chunked(usize),
}

/// The delta rule over `t` tokens of one sequence for every value head: `mixed` is the
/// convolution output (`[t][conv_dim]`), `g`, `beta` are `[t][nv]`, `ssm` the sequence's state
/// (`[nv][dk][dv]`, updated). Returns the mixer output `[t][nv · dv]` (before the gated norm).
/// Heads run on up to `threads` threads (the result does not depend on the count).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    mixed: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    d: &GdnDims,
    ssm: &mut [f32],
    form: Form,
    threads: usize,
) -> Vec<f32> {
    let vd = d.value_dim();
    let per_state = d.dk * d.dv;
    let run = |h: usize, s: &mut [f32], out: &mut [f32]| match form {
        Form::Recurrent => recurrent_head(mixed, g, beta, t, h, d, s, out),
        Form::Chunked(c) => chunked_head(mixed, g, beta, t, h, d, s, out, c.max(1)),
    };
    let work = t * d.nv * per_state;
    let nt = if work < (1 << 18) {
        1
    } else {
        threads.clamp(1, d.nv)
    };
    if nt == 1 {
        let mut out = vec![0f32; t * vd];
        for (h, s) in ssm.chunks_mut(per_state).enumerate() {
            run(h, s, &mut out);
        }
        return out;
    }
    // Each thread fills a full-size output for its heads; the heads' columns are then copied.
    let per = d.nv.div_ceil(nt);
    let parts: Vec<(usize, usize, Vec<f32>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = ssm
            .chunks_mut(per * per_state)
            .enumerate()
            .map(|(i, states)| {
                let run = &run;
                sc.spawn(move || {
                    let h0 = i * per;
                    let mut out = vec![0f32; t * vd];
                    for (j, s) in states.chunks_mut(per_state).enumerate() {
                        run(h0 + j, s, &mut out);
                    }
                    (h0, states.len() / per_state, out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut out = vec![0f32; t * vd];
    for (h0, n, part) in parts {
        for ti in 0..t {
            let r = ti * vd + h0 * d.dv..ti * vd + (h0 + n) * d.dv;
            out[r.clone()].copy_from_slice(&part[r]);
        }
    }
    out
}

/// The gated RMSNorm per value head in place: `o ← w · o · rsqrt(mean(o²) + eps) · silu(z)`
/// over each `dv`-long head of `o` and `z` (`[t][nv · dv]`).
pub fn gated_rms_norm(o: &mut [f32], z: &[f32], w: &[f32], dv: usize, eps: f32) {
    for (oh, zh) in o.chunks_mut(dv).zip(z.chunks(dv)) {
        let ms = super::model::dot(oh, oh) / dv as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((x, zv), wv) in oh.iter_mut().zip(zh).zip(w) {
            *x = wv * (*x * inv) * super::model::silu(*zv);
        }
    }
}

/// One sequence's segment through the mixer core: convolution (from and into `state.conv`),
/// gates, delta rule (from and into `state.ssm`). `qkv` is the pre-convolution `in_proj_qkv`
/// output `[t][conv_dim]`, `a` and `b` the `in_proj_a` / `in_proj_b` outputs `[t][nv]`.
/// Returns the mixer output `[t][nv · dv]` (rounded to BF16 with `round`).
#[allow(clippy::too_many_arguments)]
pub fn mixer_core(
    d: &GdnDims,
    p: &GdnParams<'_>,
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    t: usize,
    state: &mut GdnLayerState,
    form: Form,
    round: bool,
    threads: usize,
) -> Vec<f32> {
    let c = d.conv_dim();
    let mut mixed = vec![0f32; t * c];
    causal_conv_silu(qkv, t, c, p, d.kernel, &mut state.conv, &mut mixed, round);
    let (g, beta) = gates(a, b, t, d.nv, p);
    let mut o = delta_rule(&mixed, &g, &beta, t, d, &mut state.ssm, form, threads);
    if round {
        o.iter_mut().for_each(|x| *x = bf16(*x));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::weights::SplitMix64;

    fn dims() -> GdnDims {
        GdnDims {
            nk: 2,
            nv: 4,
            dk: 8,
            dv: 6,
            kernel: 4,
        }
    }

    fn normals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.normal_pair().0 * scale).collect()
    }

    struct Case {
        conv_w: Vec<f32>,
        a_log: Vec<f32>,
        dt_bias: Vec<f32>,
        qkv: Vec<f32>,
        a: Vec<f32>,
        b: Vec<f32>,
    }

    fn case(t: usize, seed: u64) -> Case {
        let d = dims();
        Case {
            conv_w: normals(d.conv_dim() * d.kernel, seed, 0.5),
            a_log: normals(d.nv, seed + 1, 1.0),
            dt_bias: normals(d.nv, seed + 2, 0.5),
            qkv: normals(t * d.conv_dim(), seed + 3, 1.0),
            a: normals(t * d.nv, seed + 4, 1.0),
            b: normals(t * d.nv, seed + 5, 1.0),
        }
    }

    fn params(c: &Case) -> GdnParams<'_> {
        GdnParams {
            conv_w: &c.conv_w,
            a_log: &c.a_log,
            dt_bias: &c.dt_bias,
        }
    }

    /// Independent f64 reference of the whole core: transformers' recurrent loop written out
    /// with zero-padded convolution over the whole sequence.
    fn reference(c: &Case, t: usize) -> Vec<f64> {
        let d = dims();
        let ch = d.conv_dim();
        let mut mixed = vec![0f64; t * ch];
        for ti in 0..t {
            for x in 0..ch {
                let mut s = 0f64;
                for j in 0..d.kernel {
                    let src = ti as isize - (d.kernel as isize - 1) + j as isize;
                    if src >= 0 {
                        s +=
                            c.conv_w[x * d.kernel + j] as f64 * c.qkv[src as usize * ch + x] as f64;
                    }
                }
                mixed[ti * ch + x] = s / (1.0 + (-s).exp());
            }
        }
        let mut out = vec![0f64; t * d.value_dim()];
        for h in 0..d.nv {
            let kh = h / (d.nv / d.nk);
            let mut s = vec![0f64; d.dk * d.dv];
            for ti in 0..t {
                let row = &mixed[ti * ch..(ti + 1) * ch];
                let norm = |v: &[f64]| {
                    let n = (v.iter().map(|x| x * x).sum::<f64>() + 1e-6).sqrt();
                    v.iter().map(|x| x / n).collect::<Vec<f64>>()
                };
                let q: Vec<f64> = norm(&row[kh * d.dk..(kh + 1) * d.dk])
                    .iter()
                    .map(|x| x / (d.dk as f64).sqrt())
                    .collect();
                let k = norm(&row[d.key_dim() + kh * d.dk..d.key_dim() + (kh + 1) * d.dk]);
                let v = &row[2 * d.key_dim() + h * d.dv..2 * d.key_dim() + (h + 1) * d.dv];
                let aa = c.a[ti * d.nv + h] as f64 + c.dt_bias[h] as f64;
                let sp = if aa > 20.0 { aa } else { aa.exp().ln_1p() };
                let g = -(c.a_log[h] as f64).exp() * sp;
                let beta = 1.0 / (1.0 + (-(c.b[ti * d.nv + h] as f64)).exp());
                s.iter_mut().for_each(|x| *x *= g.exp());
                for y in 0..d.dv {
                    let mem: f64 = (0..d.dk).map(|x| s[x * d.dv + y] * k[x]).sum();
                    let delta = (v[y] - mem) * beta;
                    for x in 0..d.dk {
                        s[x * d.dv + y] += k[x] * delta;
                    }
                }
                for y in 0..d.dv {
                    out[ti * d.value_dim() + h * d.dv + y] =
                        (0..d.dk).map(|x| s[x * d.dv + y] * q[x]).sum();
                }
            }
        }
        out
    }

    fn max_rel(a: &[f32], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        a.iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - y).abs())
            .fold(0f64, f64::max)
            / scale
    }

    /// Both forms against the f64 reference, and against each other, over 150 tokens (three
    /// chunks, the last partial): f32 rounding through 150 steps of a 48-element state is about
    /// 1e-6 relative; 1e-4 leaves margin and catches any algebra error (a wrong decay or a
    /// missing β moves outputs by more than 1e-2).
    #[test]
    fn chunked_and_recurrent_agree_with_the_reference_and_each_other() {
        let d = dims();
        let t = 150;
        let c = case(t, 7);
        let want = reference(&c, t);
        let mut outs = Vec::new();
        let mut states = Vec::new();
        for form in [Form::Recurrent, Form::Chunked(CHUNK), Form::Chunked(7)] {
            let mut st = GdnLayerState::zeros(&d);
            let o = mixer_core(
                &d,
                &params(&c),
                &c.qkv,
                &c.a,
                &c.b,
                t,
                &mut st,
                form,
                false,
                1,
            );
            let e = max_rel(&o, &want);
            assert!(e < 1e-4, "{form:?}: {e}");
            outs.push(o);
            states.push(st);
        }
        let s0: Vec<f64> = states[0].ssm.iter().map(|x| *x as f64).collect();
        for s in &states[1..] {
            assert!(max_rel(&s.ssm, &s0) < 1e-4);
            assert_eq!(
                s.conv, states[0].conv,
                "the conv state is exact in both forms"
            );
        }
        // Teeth: the reference differs clearly from another seed.
        let other = reference(&case(t, 8), t);
        assert!(max_rel(&outs[0], &other) > 0.1);
    }

    /// A segment split anywhere continues from the state exactly as one pass does (recurrent:
    /// bit-exact, the same operations in the same order); chunked splits agree to f32 rounding.
    #[test]
    fn state_carries_across_segments() {
        let d = dims();
        let t = 40;
        let c = case(t, 3);
        let p = params(&c);
        let mut whole = GdnLayerState::zeros(&d);
        let o_whole = mixer_core(
            &d,
            &p,
            &c.qkv,
            &c.a,
            &c.b,
            t,
            &mut whole,
            Form::Recurrent,
            false,
            1,
        );
        let mut st = GdnLayerState::zeros(&d);
        let mut o_split = Vec::new();
        let cd = d.conv_dim();
        for (s, e) in [(0, 1), (1, 2), (2, 17), (17, 40)] {
            let o = mixer_core(
                &d,
                &p,
                &c.qkv[s * cd..e * cd],
                &c.a[s * d.nv..e * d.nv],
                &c.b[s * d.nv..e * d.nv],
                e - s,
                &mut st,
                Form::Recurrent,
                false,
                1,
            );
            o_split.extend(o);
        }
        assert_eq!(o_split, o_whole);
        assert_eq!(st, whole);
        // Threads do not change anything.
        let mut st3 = GdnLayerState::zeros(&d);
        let o3 = delta_rule(
            &{
                let mut m = vec![0f32; t * cd];
                let mut cs = vec![0f32; d.conv_state_len()];
                causal_conv_silu(&c.qkv, t, cd, &p, d.kernel, &mut cs, &mut m, false);
                m
            },
            &gates(&c.a, &c.b, t, d.nv, &p).0,
            &gates(&c.a, &c.b, t, d.nv, &p).1,
            t,
            &d,
            &mut st3.ssm,
            Form::Chunked(CHUNK),
            4,
        );
        let mut st1 = GdnLayerState::zeros(&d);
        let o1 = mixer_core(
            &d,
            &p,
            &c.qkv,
            &c.a,
            &c.b,
            t,
            &mut st1,
            Form::Chunked(CHUNK),
            false,
            1,
        );
        assert_eq!(o3, o1);
    }

    #[test]
    fn small_pieces() {
        assert_eq!(softplus(30.0), 30.0);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        let mut v = vec![3.0f32, 4.0];
        l2norm(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        // Gated norm: unit RMS times w times silu(z).
        let mut o = vec![3.0f32, -4.0];
        gated_rms_norm(&mut o, &[0.0, 100.0], &[2.0, 1.0], 2, 0.0);
        let rms = (12.5f32).sqrt();
        assert_eq!(o[0], 0.0, "silu(0) = 0");
        assert!((o[1] - (-4.0 / rms) * 100.0).abs() < 1e-3);
    }
}
