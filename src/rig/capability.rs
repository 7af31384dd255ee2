//! What a card executes for each GEMM format: native, a fallback (and through what), or
//! nothing, with the reason, for every NVIDIA compute capability from sm_75 to sm_121.
//!
//! Sources: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" (tensor-core data types per
//! architecture); PTX ISA 8.7–9.0 (`mma` with `e4m3` from sm_89, `tcgen05.mma` `kind::mxf4nvf4`
//! on sm_100a/sm_103a/sm_110a, `mma.sync` `block_scale` FP4 on sm_120a/sm_121a); vLLM's
//! `ModelOptNvFp4LinearMethod` / `Fp8LinearMethod` (Marlin weight-only fallbacks below those
//! capabilities; Marlin needs sm_80). CUDA 13 renamed Thor's sm_101 to sm_110.

use serde::{Deserialize, Serialize};

use crate::formats::GemmFormat;
use crate::gpu::ComputeCapability;

/// Parse a compute capability given for a card (`--cc`): one of [`KNOWN`], or one newer
/// than the newest of them (a card newer than this table, classified like the newest).
/// A value between or below the known ones names no card (`sm_42`, `sm_95`): refused with
/// the list, rather than classified from a guess.
///
/// # Errors
/// The value does not parse, or names no known card; the message lists the known ones.
pub fn parse_card(s: &str) -> Result<ComputeCapability, String> {
    let cc: ComputeCapability = s.parse()?;
    let newest = KNOWN.iter().map(|(c, _)| c.as_int()).max().unwrap_or(0);
    if cc.as_int() > newest || KNOWN.iter().any(|(c, _)| *c == cc) {
        return Ok(cc);
    }
    Err(format!(
        "'{s}' ({cc}) is no compute capability of a card rigbench knows; known: {} (a newer one than {} is classified like it)",
        KNOWN
            .iter()
            .map(|(c, _)| c.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        KNOWN.last().map(|(c, _)| c.to_string()).unwrap_or_default()
    ))
}

/// How a card runs a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Support {
    /// The format's arithmetic runs on the card's own units as the format defines it.
    Native,
    /// Engines run it through a different path (named in [`Capability::path`]).
    Fallback,
    /// Nothing in the common engines runs it on this card.
    Unsupported,
}

impl std::fmt::Display for Support {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Support::Native => "native",
            Support::Fallback => "fallback",
            Support::Unsupported => "unsupported",
        })
    }
}

/// One cell of the capability table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The format classified.
    pub format: GemmFormat,
    /// Native, fallback or unsupported.
    pub support: Support,
    /// What executes it (e.g. "W4A16 Marlin-style kernel: weights only").
    pub path: String,
    /// Why, in one sentence.
    pub reason: String,
}

/// The compute capabilities the table covers, with their architecture and example cards.
pub const KNOWN: &[(ComputeCapability, &str)] = &[
    (ComputeCapability::new(7, 5), "Turing (T4, RTX 20xx)"),
    (ComputeCapability::new(8, 0), "Ampere (A100, A30)"),
    (ComputeCapability::new(8, 6), "Ampere (RTX 30xx, A10, A40)"),
    (ComputeCapability::new(8, 7), "Ampere (Jetson Orin)"),
    (ComputeCapability::new(8, 9), "Ada (L4, L40S, RTX 40xx)"),
    (ComputeCapability::new(9, 0), "Hopper (H100, H200, GH200)"),
    (ComputeCapability::new(10, 0), "Blackwell (B200, GB200)"),
    (
        ComputeCapability::new(10, 1),
        "Blackwell (Jetson Thor, CUDA 12.x name; sm_110 from CUDA 13)",
    ),
    (
        ComputeCapability::new(10, 3),
        "Blackwell Ultra (B300, GB300)",
    ),
    (ComputeCapability::new(11, 0), "Blackwell (Jetson Thor)"),
    (
        ComputeCapability::new(12, 0),
        "Blackwell (RTX 50xx, RTX PRO 6000)",
    ),
    (ComputeCapability::new(12, 1), "Blackwell (DGX Spark GB10)"),
];

fn has_bf16_tensor_cores(cc: ComputeCapability) -> bool {
    cc.as_int() >= 80
}

fn has_fp8_tensor_cores(cc: ComputeCapability) -> bool {
    cc.as_int() >= 89
}

/// FP4 (E2M1 with block scales) tensor cores: sm_100, sm_101, sm_103, sm_110, sm_120, sm_121
/// and anything newer.
pub fn has_fp4_tensor_cores(cc: ComputeCapability) -> bool {
    cc.as_int() >= 100
}

/// The newest compute capability the table knows; newer cards are classified like it.
pub const NEWEST_KNOWN: ComputeCapability = ComputeCapability::new(12, 1);

/// The tensor-core instruction family of `cc` (of [`NEWEST_KNOWN`] for newer cards): `mma.sync`
/// up to sm_89 and on sm_120/sm_121 (consumer Blackwell has no wgmma or tcgen05), `wgmma` (and
/// `mma.sync`) on sm_90, `tcgen05.mma` on sm_100–sm_110. Source: PTX ISA 9.0, "Warpgroup MMA"
/// (sm_90a) and "TensorCore 5th Generation Family Instructions" (sm_100a/sm_101a/sm_103a/sm_110a).
pub fn mma_family(cc: ComputeCapability) -> &'static str {
    let cc = if cc > NEWEST_KNOWN { NEWEST_KNOWN } else { cc };
    match cc.as_int() {
        90 => "wgmma / mma.sync",
        100..=119 => "tcgen05.mma",
        _ => "mma.sync",
    }
}

/// Classify `format` on `cc`.
pub fn capability(cc: ComputeCapability, format: GemmFormat) -> Capability {
    let newer = if cc > NEWEST_KNOWN {
        " (newer than rigbench's table; classified like sm_121)"
    } else {
        ""
    };
    // Paths follow the card the classification uses (sm_121 for newer cards).
    let like = if cc > NEWEST_KNOWN { NEWEST_KNOWN } else { cc };
    let family = mma_family(cc);
    let bf16_path = format!("BF16 tensor cores ({family}), FP32 accumulate");
    let fp8_path = format!(
        "FP8 E4M3 tensor cores ({}), FP32 accumulate",
        if family == "mma.sync" {
            "mma.sync e4m3"
        } else {
            family
        }
    );
    let (support, path, reason): (Support, &str, String) = match format {
        GemmFormat::Bf16 if has_bf16_tensor_cores(cc) => (
            Support::Native,
            bf16_path.as_str(),
            format!("{cc} has BF16 tensor cores{newer}"),
        ),
        GemmFormat::Bf16 => (
            Support::Fallback,
            "FP16 tensor cores after casting BF16 weights to FP16 (engines refuse --dtype bfloat16)",
            format!("{cc} has FP16 but no BF16 tensor cores (BF16 mma needs sm_80)"),
        ),
        GemmFormat::Fp8 if has_fp8_tensor_cores(cc) => (
            Support::Native,
            fp8_path.as_str(),
            format!("{cc} has FP8 tensor cores (sm_89 and up){newer}"),
        ),
        GemmFormat::Fp8 if has_bf16_tensor_cores(cc) => (
            Support::Fallback,
            "W8A16 Marlin-style kernel: FP8 weights dequantized to BF16 in the kernel, activations stay BF16",
            format!("{cc} has no FP8 tensor cores (they start at sm_89)"),
        ),
        GemmFormat::Fp8 => (
            Support::Unsupported,
            "none",
            format!("{cc} has no FP8 tensor cores, and Marlin-style weight-only kernels need sm_80"),
        ),
        GemmFormat::W4a16 if has_bf16_tensor_cores(cc) => (
            Support::Native,
            "W4A16 Marlin-style kernel: E2M1 weights dequantized to BF16 in registers, BF16 tensor cores",
            format!("W4A16 is a weight-only format; {cc} runs its BF16 arithmetic natively{newer}"),
        ),
        GemmFormat::W4a16 => (
            Support::Unsupported,
            "none",
            format!("Marlin-style W4A16 kernels need BF16 tensor cores and cp.async (sm_80); {cc} has neither"),
        ),
        GemmFormat::W4a4 if has_fp4_tensor_cores(cc) => (
            Support::Native,
            if like.major == 12 {
                "FP4 tensor cores (mma.sync block_scale kind::mxf4nvf4, UE4M3 scales per 16)"
            } else {
                "FP4 tensor cores (tcgen05.mma kind::mxf4nvf4, UE4M3 scales per 16)"
            },
            format!("{cc} has FP4 tensor cores (sm_100 and up){newer}"),
        ),
        GemmFormat::W4a4 if has_bf16_tensor_cores(cc) => (
            Support::Fallback,
            "W4A16 Marlin-style path, weights only: E2M1 weights dequantized to BF16, activations stay BF16 (input_scale unused)",
            format!("{cc} has no FP4 tensor cores (they start at sm_100)"),
        ),
        GemmFormat::W4a4 => (
            Support::Unsupported,
            "none",
            format!("{cc} has no FP4 tensor cores, and the W4A16 fallback needs sm_80"),
        ),
    };
    Capability {
        format,
        support,
        path: path.to_string(),
        reason,
    }
}

/// The four formats on one card.
pub fn table(cc: ComputeCapability) -> Vec<Capability> {
    GemmFormat::ALL.iter().map(|f| capability(cc, *f)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sup(cc: &str, f: GemmFormat) -> Support {
        capability(cc.parse().unwrap(), f).support
    }

    #[test]
    fn parse_forms() {
        for s in ["sm_90", "sm90", "9.0", "90", " SM_90 "] {
            assert_eq!(
                s.parse::<ComputeCapability>().unwrap(),
                ComputeCapability::new(9, 0)
            );
        }
        assert_eq!(
            "12.1".parse::<ComputeCapability>().unwrap().to_string(),
            "sm_121"
        );
        assert!("hopper".parse::<ComputeCapability>().is_err());
        // A card's capability: a known one or a newer one, never one between or below them.
        for ok in ["sm_75", "sm_90", "9.0", "sm_121", "sm_999", "13.0"] {
            assert!(parse_card(ok).is_ok(), "{ok}");
        }
        for bad in ["sm_42", "sm_70", "sm_95", "11.5", "sm_11"] {
            let e = parse_card(bad).unwrap_err();
            assert!(
                e.contains("known: sm_75, sm_80") && e.contains("sm_121"),
                "{bad}: {e}"
            );
        }
        assert!("sm_".parse::<ComputeCapability>().is_err());
    }

    #[test]
    fn fp4_tensor_cores_only_from_sm100() {
        for cc in ["sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90"] {
            assert_ne!(sup(cc, GemmFormat::W4a4), Support::Native, "{cc}");
        }
        for cc in ["sm_100", "sm_103", "sm_110", "sm_120", "sm_121"] {
            assert_eq!(sup(cc, GemmFormat::W4a4), Support::Native, "{cc}");
        }
    }

    #[test]
    fn hopper_row() {
        let t = table("sm_90".parse().unwrap());
        assert_eq!(t[0].support, Support::Native);
        assert_eq!(t[1].support, Support::Native);
        assert_eq!(t[2].support, Support::Native);
        assert_eq!(t[3].support, Support::Fallback);
        assert!(t[3].path.contains("W4A16 Marlin-style"));
        assert!(t[3].reason.contains("no FP4 tensor cores"));
    }

    #[test]
    fn ampere_and_turing() {
        assert_eq!(sup("sm_86", GemmFormat::Fp8), Support::Fallback);
        assert_eq!(sup("sm_89", GemmFormat::Fp8), Support::Native);
        assert_eq!(sup("sm_75", GemmFormat::Fp8), Support::Unsupported);
        assert_eq!(sup("sm_75", GemmFormat::W4a16), Support::Unsupported);
        assert_eq!(sup("sm_75", GemmFormat::Bf16), Support::Fallback);
    }

    #[test]
    fn paths_name_only_instructions_the_card_has() {
        let path = |cc: &str, f| capability(cc.parse().unwrap(), f).path;
        for cc in ["sm_80", "sm_86", "sm_89", "sm_120", "sm_121"] {
            let p = path(cc, GemmFormat::Bf16);
            assert!(
                p.contains("mma.sync") && !p.contains("wgmma") && !p.contains("tcgen05"),
                "{cc}: {p}"
            );
        }
        assert!(path("sm_90", GemmFormat::Bf16).contains("wgmma"));
        assert!(!path("sm_90", GemmFormat::Bf16).contains("tcgen05"));
        for cc in ["sm_100", "sm_103", "sm_110"] {
            let p = path(cc, GemmFormat::Fp8);
            assert!(p.contains("tcgen05") && !p.contains("wgmma"), "{cc}: {p}");
        }
        assert!(path("sm_89", GemmFormat::Fp8).contains("mma.sync e4m3"));
    }

    #[test]
    fn newer_cards_take_sm121_paths_not_sm100_ones() {
        let c = capability("sm_999".parse().unwrap(), GemmFormat::W4a4);
        assert!(c.reason.contains("classified like sm_121"), "{}", c.reason);
        assert_eq!(
            c.path,
            capability("sm_121".parse().unwrap(), GemmFormat::W4a4).path
        );
        assert!(c.path.contains("mma.sync block_scale") && !c.path.contains("tcgen05"));
        let b = capability("sm_130".parse().unwrap(), GemmFormat::Bf16);
        assert_eq!(
            b.path,
            capability("sm_121".parse().unwrap(), GemmFormat::Bf16).path
        );
    }

    #[test]
    fn every_known_cc_has_a_reason_for_every_format() {
        for (cc, _) in KNOWN {
            for c in table(*cc) {
                assert!(!c.reason.is_empty() && !c.path.is_empty());
                assert!(c.reason.contains(&cc.to_string()), "{:?}", c);
            }
        }
    }
}
