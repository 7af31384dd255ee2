//! Bisecting an FP8 parity gap by linear group: the parity check ([`super::cuda_check::
//! greedy_parity`]) quantizes one set of host weights and uploads it to both backends, so keeping
//! a group of linears in BF16 there changes the CPU reference and the CUDA backend alike. A group
//! whose BF16 copy closes most of the GPU-vs-CPU gap is where the FP8 path differs (or where the
//! model is most sensitive: compare with [`super::cuda_check::cpu_rounding_parity`] under the
//! same setting, which needs no GPU).
//!
//! The groups are read from [`KEEP_BF16_ENV`], a comma-separated list (docs/runtime.md,
//! "Hybrids", names the linears).

use crate::runtime::weights::ModelWeights;

/// Environment variable naming the linear groups the parity check keeps in BF16
/// (`qkvz,out,attn,mlp,ab`; empty or unset: none).
pub const KEEP_BF16_ENV: &str = "RIGBENCH_HYBRID_FP8_KEEP_BF16";

/// Linear groups kept in BF16 by the parity check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeepBf16 {
    /// Gated-DeltaNet `in_proj_qkv` and `in_proj_z` (one fused GEMM on the GPU).
    pub qkvz: bool,
    /// Gated-DeltaNet `out_proj`.
    pub out: bool,
    /// The attention layers' `q_proj` (query and output gate), `k_proj`, `v_proj`, `o_proj`.
    pub attn: bool,
    /// Every layer's `gate_proj`, `up_proj`, `down_proj`.
    pub mlp: bool,
    /// Gated-DeltaNet `in_proj_a` / `in_proj_b`: accepted for completeness; every recipe
    /// already keeps them in BF16 (`QuantRecipe::format_for`), so it changes nothing.
    pub ab: bool,
}

impl KeepBf16 {
    /// Whether no group is kept.
    pub fn is_empty(&self) -> bool {
        *self == KeepBf16::default()
    }

    /// The groups as a comma-separated list, in the order of the fields.
    pub fn names(&self) -> String {
        [
            ("qkvz", self.qkvz),
            ("out", self.out),
            ("attn", self.attn),
            ("mlp", self.mlp),
            ("ab", self.ab),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
    }

    /// The groups named in [`KEEP_BF16_ENV`] (none when unset).
    ///
    /// # Errors
    /// An unknown group name (the message names the variable and the valid names).
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var(KEEP_BF16_ENV) {
            Ok(v) => v.parse().map_err(|e: String| anyhow::anyhow!(e)),
            Err(_) => Ok(KeepBf16::default()),
        }
    }

    /// Put back, in `quantized`, the BF16 linears of `original` (the same model before
    /// quantization) for every kept group. Layers are matched by index.
    ///
    /// # Errors
    /// The two models differ in their number of layers or in which layers are Gated-DeltaNet.
    pub fn apply(
        &self,
        quantized: &mut ModelWeights,
        original: &ModelWeights,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            quantized.layers.len() == original.layers.len(),
            "{KEEP_BF16_ENV}: the quantized model has {} layers, the original {}",
            quantized.layers.len(),
            original.layers.len()
        );
        for (i, (q, o)) in quantized
            .layers
            .iter_mut()
            .zip(&original.layers)
            .enumerate()
        {
            match (&mut q.gdn, &o.gdn) {
                (Some(qg), Some(og)) => {
                    if self.qkvz {
                        qg.qkv = og.qkv.clone();
                        qg.z = og.z.clone();
                    }
                    if self.out {
                        qg.out = og.out.clone();
                    }
                    if self.ab {
                        qg.a = og.a.clone();
                        qg.b = og.b.clone();
                    }
                }
                (None, None) => {
                    if self.attn {
                        q.q = o.q.clone();
                        q.k = o.k.clone();
                        q.v = o.v.clone();
                        q.o = o.o.clone();
                    }
                }
                _ => anyhow::bail!(
                    "{KEEP_BF16_ENV}: layer {i} is Gated-DeltaNet in one model and attention in the other"
                ),
            }
            if self.mlp {
                q.gate = o.gate.clone();
                q.up = o.up.clone();
                q.down = o.down.clone();
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for KeepBf16 {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut k = KeepBf16::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name.to_ascii_lowercase().as_str() {
                "qkvz" => k.qkvz = true,
                "out" => k.out = true,
                "attn" => k.attn = true,
                "mlp" => k.mlp = true,
                "ab" => k.ab = true,
                "gdn" => {
                    k.qkvz = true;
                    k.out = true;
                }
                other => {
                    return Err(format!(
                        "{KEEP_BF16_ENV}: unknown linear group '{other}'; expected a comma-separated list of qkvz, out, gdn (qkvz and out), attn, mlp, ab"
                    ))
                }
            }
        }
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::config::WeightFormat;
    use crate::runtime::weights::{synthesize, Linear};

    #[test]
    fn groups_parse_and_bad_names_are_errors_naming_the_variable() {
        assert_eq!("".parse::<KeepBf16>().unwrap(), KeepBf16::default());
        let k: KeepBf16 = " qkvz, MLP ,".parse().unwrap();
        assert!(k.qkvz && k.mlp && !k.out && !k.attn && !k.ab);
        assert_eq!(k.names(), "qkvz,mlp");
        let g: KeepBf16 = "gdn".parse().unwrap();
        assert!(g.qkvz && g.out && !g.attn);
        let e = "qkvz,norm".parse::<KeepBf16>().unwrap_err();
        assert!(e.contains(KEEP_BF16_ENV) && e.contains("'norm'"), "{e}");
    }

    #[test]
    fn kept_groups_are_the_original_bf16_and_the_rest_stays_fp8() {
        let orig = synthesize(&crate::runtime::hybrid::tiny_hybrid(), 0);
        let mut q = orig.clone();
        q.quantize(WeightFormat::Fp8).unwrap();
        let keep: KeepBf16 = "qkvz,attn".parse().unwrap();
        keep.apply(&mut q, &orig).unwrap();
        let is_bf16 = |l: &Linear| l.format() == WeightFormat::Bf16;
        let mut seen = (0, 0);
        for (ql, ol) in q.layers.iter().zip(&orig.layers) {
            match (&ql.gdn, &ol.gdn) {
                (Some(g), Some(og)) => {
                    seen.0 += 1;
                    assert!(is_bf16(&g.qkv) && is_bf16(&g.z));
                    assert_eq!(g.qkv.shape(), og.qkv.shape());
                    assert!(!is_bf16(&g.out), "out_proj was not asked for");
                    assert!(is_bf16(&g.a) && is_bf16(&g.b), "in_proj_a/b stay BF16");
                }
                _ => {
                    seen.1 += 1;
                    assert!(is_bf16(&ql.q) && is_bf16(&ql.k) && is_bf16(&ql.v) && is_bf16(&ql.o));
                }
            }
            assert!(!is_bf16(&ql.gate) && !is_bf16(&ql.up) && !is_bf16(&ql.down));
        }
        assert_eq!(seen, (3, 1));
        let mut dense = synthesize(&crate::runtime::config::ModelConfig::tiny(), 0);
        assert!(keep.apply(&mut dense, &orig).is_err(), "layer kinds differ");
    }
}
