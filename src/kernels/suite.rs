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
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

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
    /// The model, when the suite names it (`[model]`).
    #[serde(default)]
    pub model: Option<ModelInfo>,
    /// Where it was read from (set by the loader).
    #[serde(skip)]
    pub file: PathBuf,
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
        self.shapes.retain(|s| names.contains(&s.name));
        Ok(())
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
