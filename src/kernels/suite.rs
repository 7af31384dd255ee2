//! Kernel suites: TOML files in `suites/kernels/` naming GEMM shapes (N × K) and the M sweep.
//!
//! ```toml
//! name = "qwen3.6-27b"
//! description = "..."
//! m = [1, 16, 64]
//! [[shapes]]
//! name = "qkv"
//! n = 14336
//! k = 5120
//! note = "optional"
//! per_step = 16          # optional: GEMMs of this shape in one decode step
//!
//! [decode_step]          # optional; when present every shape needs `per_step`
//! description = "one Qwen3.6-27B decode step"
//! complete = true        # the shapes cover every linear layer of the step
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::RigError;

/// One GEMM shape: weights `[n, k]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// Name (unique in the suite).
    pub name: String,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// What the shape is.
    #[serde(default)]
    pub note: String,
    /// How many GEMMs of this shape one decode step of the suite's model runs (e.g. 64 for an
    /// MLP projection present in 64 layers); required when the suite has `[decode_step]`.
    #[serde(default)]
    pub per_step: Option<u32>,
}

/// The suite's `[decode_step]` table: what one decode step of its model is, for the composite.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeStepSpec {
    /// What the step is, in words.
    pub description: String,
    /// Whether the suite's shapes cover every linear layer of the step (false for a subset).
    pub complete: bool,
}

/// The model the suite's shapes come from, for the parts that need more than GEMM shapes (the
/// multi-GPU all-reduce message sizes and the tensor-parallel prediction). Optional TOML table:
///
/// ```toml
/// [model]
/// name = "Qwen3.6-27B"
/// hidden_size = 5120
/// layers = 64
/// allreduces_per_layer = 2   # default: one after attention, one after the MLP
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// Model name.
    pub name: String,
    /// Hidden size (the width of the activations between layers).
    pub hidden_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Tensor-parallel all-reduces per layer.
    #[serde(default = "two")]
    pub allreduces_per_layer: usize,
}

fn two() -> usize {
    2
}

/// A parsed suite.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// Suite name.
    pub name: String,
    /// One line.
    #[serde(default)]
    pub description: String,
    /// M values (tokens).
    pub m: Vec<usize>,
    /// Shapes.
    pub shapes: Vec<Shape>,
    /// The decode step the shapes make up, with each shape's `per_step` count.
    #[serde(default)]
    pub decode_step: Option<DecodeStepSpec>,
    /// The model, when the suite names it (`[model]`).
    #[serde(default)]
    pub model: Option<ModelInfo>,
    /// A mixture of experts' grouped expert GEMMs (`[moe]`,
    /// [`crate::kernels::moe_grouped`]).
    #[serde(default)]
    pub moe: Option<MoeSpec>,
    /// Where it was read from (set by the loader).
    #[serde(skip)]
    pub file: PathBuf,
    /// Whether `--shapes` left some of the suite's shapes out.
    #[serde(skip)]
    pub filtered: bool,
}

/// The built-in suite files, so a binary run outside the source tree still finds them.
const BUILTIN: &[(&str, &str)] = &[
    (
        "qwen3.6-27b",
        include_str!("../../suites/kernels/qwen3.6-27b.toml"),
    ),
    ("smoke", include_str!("../../suites/kernels/smoke.toml")),
];

/// The default suite name.
pub const DEFAULT_SUITE: &str = "qwen3.6-27b";

/// Check an M list: non-empty, positive, no value twice.
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check_m(m: &[usize]) -> Result<(), String> {
    if m.is_empty() || m.contains(&0) {
        return Err("M must be a non-empty list of positive integers".into());
    }
    let mut sorted = m.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err("M lists a value twice".into());
    }
    Ok(())
}

/// Load a suite by path (`suites/kernels/x.toml`) or by built-in name (`qwen3.6-27b`).
///
/// # Errors
/// [`RigError::BadFile`] for an unreadable or malformed file (the message says what is wrong),
/// [`RigError::BadFlag`] for an unknown name.
pub fn load(spec: &str) -> Result<Suite, RigError> {
    let p = Path::new(spec);
    if spec.ends_with(".toml") || p.components().count() > 1 {
        let text = std::fs::read_to_string(p)
            .map_err(|e| RigError::file(p, format!("cannot read suite file: {e}")))?;
        return parse(&text, p);
    }
    let local = Path::new("suites/kernels").join(format!("{spec}.toml"));
    if local.is_file() {
        let text = std::fs::read_to_string(&local)
            .map_err(|e| RigError::file(&local, format!("cannot read suite file: {e}")))?;
        return parse(&text, &local);
    }
    match BUILTIN.iter().find(|(n, _)| *n == spec) {
        Some((_, text)) => parse(text, Path::new(&format!("suites/kernels/{spec}.toml"))),
        None => Err(RigError::flag(
            "--suite",
            format!(
                "no suite named '{spec}'; built-in suites: {}; or pass a path to a .toml file",
                BUILTIN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Parse and validate suite TOML.
///
/// # Errors
/// [`RigError::BadFile`] naming `path` for malformed TOML, an empty M list or shape list, a zero
/// dimension, or duplicate shape names.
pub fn parse(text: &str, path: &Path) -> Result<Suite, RigError> {
    let mut s: Suite = toml::from_str(text)
        .map_err(|e| RigError::file(path, format!("malformed suite TOML: {e}")))?;
    s.file = path.to_path_buf();
    check_m(&s.m).map_err(|e| RigError::file(path, format!("`m`: {e}")))?;
    if s.name.trim().is_empty() || s.name.contains(['/', '\\']) {
        return Err(RigError::file(
            path,
            "`name` must be a non-empty name without slashes",
        ));
    }
    if s.shapes.is_empty() {
        return Err(RigError::file(path, "no [[shapes]] entries"));
    }
    if let Some(m) = &s.moe {
        m.check().map_err(|e| RigError::file(path, e))?;
    }
    if let Some(m) = &s.model {
        if m.hidden_size == 0 || m.layers == 0 || m.allreduces_per_layer == 0 {
            return Err(RigError::file(
                path,
                "[model]: hidden_size, layers and allreduces_per_layer must be positive",
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for sh in &s.shapes {
        if sh.n == 0 || sh.k == 0 {
            return Err(RigError::file(
                path,
                format!("shape '{}' has a zero dimension", sh.name),
            ));
        }
        if (sh.n as u64) * (sh.k as u64) >= 1 << 32 {
            return Err(RigError::file(
                path,
                format!("shape '{}' has N·K ≥ 2^32 elements; rigbench's data generator indexes with 32 bits", sh.name),
            ));
        }
        if !seen.insert(sh.name.clone()) {
            return Err(RigError::file(
                path,
                format!("shape name '{}' appears twice", sh.name),
            ));
        }
        match (&s.decode_step, sh.per_step) {
            (_, Some(0)) => {
                return Err(RigError::file(
                    path,
                    format!("shape '{}' has per_step = 0; give a positive count or remove the shape", sh.name),
                ))
            }
            (Some(_), None) => {
                return Err(RigError::file(
                    path,
                    format!("shape '{}' has no per_step, but the suite has [decode_step]: give every shape its count per decode step", sh.name),
                ))
            }
            (None, Some(_)) => {
                return Err(RigError::file(
                    path,
                    format!("shape '{}' has per_step, but the suite has no [decode_step] table (description, complete)", sh.name),
                ))
            }
            _ => {}
        }
    }
    Ok(s)
}

impl Suite {
    /// Keep only the named shapes (`--shapes a,b`).
    ///
    /// # Errors
    /// [`RigError::BadFlag`] naming an unknown shape and listing the suite's shapes.
    pub fn select_shapes(&mut self, names: &[String]) -> Result<(), RigError> {
        for n in names {
            if !self.shapes.iter().any(|s| &s.name == n) {
                return Err(RigError::flag(
                    "--shapes",
                    format!(
                        "suite '{}' has no shape '{n}'; it has: {}",
                        self.name,
                        self.shapes
                            .iter()
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        let before = self.shapes.len();
        self.shapes.retain(|s| names.contains(&s.name));
        self.filtered |= self.shapes.len() < before;
        Ok(())
    }

    /// The decode step of the (possibly `--shapes`-filtered) suite, for the results: `None`
    /// when the suite has no `[decode_step]`; `complete` only when the suite says so and no
    /// shape was left out.
    pub fn decode_step(&self) -> Option<crate::kernels::schema::DecodeStep> {
        let spec = self.decode_step.as_ref()?;
        Some(crate::kernels::schema::DecodeStep {
            description: spec.description.clone(),
            complete: spec.complete && !self.filtered,
            shapes: self
                .shapes
                .iter()
                .map(|s| crate::kernels::schema::StepShape {
                    shape: s.name.clone(),
                    n: s.n,
                    k: s.k,
                    count: s.per_step.unwrap_or(0),
                })
                .collect(),
        })
    }
}

/// A suite's `[moe]` table: the experts, the batches and routings to time, the linears
/// (timed by [`crate::kernels::moe_grouped`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per sparse layer (E).
    pub experts: usize,
    /// Experts per token (k).
    pub top_k: usize,
    /// Decode batches B (tokens of the step).
    pub batches: Vec<usize>,
    /// Routings: `balanced`, `zipf:S` (S > 0), `few:N` (N ≥ k).
    pub distributions: Vec<String>,
    /// The grouped linears of one sparse layer.
    pub linears: Vec<GroupedLinear>,
    /// Sparse layers per decode step (each runs every linear of `linears` once): the MoE
    /// decode-step composite's count.
    pub sparse_layers: usize,
}

/// One grouped linear of the experts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupedLinear {
    /// Name (`expert_gate_up`, `expert_down`).
    pub name: String,
    /// Rows N of one expert's weight.
    pub n: usize,
    /// Columns K.
    pub k: usize,
    /// `true`: the input is the token's hidden state (gate_up: row = pair / k); `false`: the
    /// pair's own row (down).
    pub per_token: bool,
}

impl MoeSpec {
    /// Check the table (`path` names the suite file in errors).
    ///
    /// # Errors
    /// The first problem, in words naming the key.
    pub fn check(&self) -> Result<(), String> {
        if let Some(why) = crate::gemm::moe::unsupported(self.experts, self.top_k) {
            return Err(format!("[moe] experts / top_k: {why}"));
        }
        if self.batches.is_empty() || self.batches.contains(&0) {
            return Err("[moe] batches: give one or more positive batch sizes".into());
        }
        if self.linears.is_empty() {
            return Err("[moe] has no [[moe.linears]]".into());
        }
        if self.sparse_layers == 0 {
            return Err("[moe] sparse_layers: give the sparse layers of one decode step".into());
        }
        for d in &self.distributions {
            parse_distribution(d, self.top_k)?;
        }
        for l in &self.linears {
            if l.n == 0 || l.k == 0 || l.k % 128 != 0 {
                return Err(format!(
                    "[[moe.linears]] '{}': N = {}, K = {}; N must be positive and K a positive multiple of 128 (the grouped kernels' K steps)",
                    l.name, l.n, l.k
                ));
            }
        }
        Ok(())
    }
}

/// Parse a routing name: `balanced`, `zipf:S` or `few:N` (`N ≥ top_k`).
///
/// # Errors
/// An unknown name or a bad parameter, in words.
pub fn parse_distribution(
    s: &str,
    top_k: usize,
) -> Result<crate::gemm::moe::RoutingDistribution, String> {
    let bad = || format!("routing '{s}': expected balanced, zipf:S (S > 0) or few:N (N ≥ top_k)");
    match s.split_once(':') {
        None if s == "balanced" => Ok(crate::gemm::moe::RoutingDistribution::Balanced),
        Some(("zipf", v)) => match v.parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => {
                Ok(crate::gemm::moe::RoutingDistribution::Zipf { s: x })
            }
            _ => Err(bad()),
        },
        Some(("few", v)) => match v.parse::<usize>() {
            Ok(n) if n >= top_k => Ok(crate::gemm::moe::RoutingDistribution::AllToFew { few: n }),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_suites_parse() {
        let s = load("qwen3.6-27b").unwrap();
        assert_eq!(s.shapes.len(), 8);
        assert_eq!(s.m.len(), 14);
        let ba = s.shapes.iter().find(|x| x.name == "in_proj_ba").unwrap();
        assert_eq!((ba.n, ba.k), (96, 5120));
        let m = s.model.as_ref().expect("the default suite names its model");
        assert_eq!(
            (m.hidden_size, m.layers, m.allreduces_per_layer),
            (5120, 64, 2)
        );
        assert_eq!(load("smoke").unwrap().model, s.model);
    }

    #[test]
    fn model_table_is_checked() {
        let p = Path::new("x.toml");
        let base = "name='a'\nm=[1]\n[[shapes]]\nname='q'\nn=1\nk=16\n";
        let s = parse(base, p).unwrap();
        assert_eq!(s.model, None);
        let s = parse(
            &format!("{base}[model]\nname='x'\nhidden_size=8\nlayers=2\n"),
            p,
        )
        .unwrap();
        assert_eq!(s.model.unwrap().allreduces_per_layer, 2);
        let e = parse(
            &format!("{base}[model]\nname='x'\nhidden_size=0\nlayers=2\n"),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[model]") && e.contains("x.toml"), "{e}");
        let e = parse(&format!("{base}[model]\nname='x'\nhidden=8\nlayers=2\n"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden"), "{e}");
    }

    #[test]
    fn bad_suites_name_the_problem() {
        let p = Path::new("x.toml");
        let e = parse("name = 1", p).unwrap_err().to_string();
        assert!(e.contains("x.toml") && e.contains("malformed"), "{e}");
        let e = parse("name='a'\nm=[]\n[[shapes]]\nname='q'\nn=1\nk=16", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`m`"), "{e}");
        let e = parse(
            "name='a'\nm=[1]\n[[shapes]]\nname='q'\nn=1\nk=16\n[[shapes]]\nname='q'\nn=2\nk=16",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = parse(
            "name='a'\nm=[1]\nbogus=3\n[[shapes]]\nname='q'\nn=1\nk=16",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bogus"), "{e}");
        assert!(load("no-such-suite")
            .unwrap_err()
            .to_string()
            .contains("--suite"));
        assert!(load("/nonexistent/s.toml")
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
    }

    #[test]
    fn duplicate_m_and_empty_names_are_rejected() {
        let p = Path::new("x.toml");
        let e = parse("name='x'\nm=[1,1]\n[[shapes]]\nname='q'\nn=1\nk=16", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = parse("name=''\nm=[1]\n[[shapes]]\nname='q'\nn=1\nk=16", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`name`"), "{e}");
    }

    #[test]
    fn decode_step_counts() {
        let s = load("qwen3.6-27b").unwrap();
        let step = s.decode_step().unwrap();
        assert!(step.complete);
        let count = |n: &str| step.shapes.iter().find(|x| x.shape == n).unwrap().count;
        // 16 full-attention layers, 48 Gated-DeltaNet layers, 64 MLPs, one LM head.
        assert_eq!((count("qkv"), count("o_proj")), (16, 16));
        assert_eq!(
            (
                count("in_proj_qkvz"),
                count("in_proj_ba"),
                count("out_proj")
            ),
            (48, 48, 48)
        );
        assert_eq!(
            (count("gate_up"), count("down"), count("lm_head")),
            (64, 64, 1)
        );
        let smoke = load("smoke").unwrap().decode_step().unwrap();
        assert!(!smoke.complete, "the smoke suite is a part of the step");
        assert_eq!(smoke.shapes.len(), 3);
        let mut f = load("qwen3.6-27b").unwrap();
        f.select_shapes(&["qkv".into()]).unwrap();
        assert!(
            !f.decode_step().unwrap().complete,
            "--shapes makes it partial"
        );

        let p = Path::new("x.toml");
        let e = parse(
            "name='a'\nm=[1]\n[decode_step]\ndescription='d'\ncomplete=true\n[[shapes]]\nname='q'\nn=1\nk=16",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no per_step") && e.contains("x.toml"), "{e}");
        let e = parse(
            "name='a'\nm=[1]\n[[shapes]]\nname='q'\nn=1\nk=16\nper_step=2",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[decode_step]"), "{e}");
        let e = parse(
            "name='a'\nm=[1]\n[decode_step]\ndescription='d'\ncomplete=true\n[[shapes]]\nname='q'\nn=1\nk=16\nper_step=0",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("per_step = 0"), "{e}");
    }

    #[test]
    fn select_shapes() {
        let mut s = load("smoke").unwrap();
        assert!(s
            .select_shapes(&["nope".into()])
            .unwrap_err()
            .to_string()
            .contains("o_proj"));
        s.select_shapes(&["gate_up".into()]).unwrap();
        assert_eq!(s.shapes.len(), 1);
    }
}
