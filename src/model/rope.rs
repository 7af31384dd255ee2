//! RoPE base and scaling from `config.json` (`rope_parameters` of transformers 5, or
//! `rope_theta` + `rope_scaling` before), shared by the dense and the hybrid readers.

use super::config::RopeScaling;

/// RoPE types the built-in runtime implements (`rope_parameters.rope_type` /
/// `rope_scaling.rope_type`).
pub const SUPPORTED_ROPE_TYPES: [&str; 3] = ["default", "linear", "llama3"];

/// Reads an optional number field of a JSON object (object, key, path prefix for messages).
pub(crate) type FloatField =
    dyn Fn(&serde_json::Map<String, serde_json::Value>, &str, &str) -> anyhow::Result<Option<f64>>;

/// RoPE base and scaling from `rope_parameters` (transformers 5) or `rope_theta` +
/// `rope_scaling` (older). Both forms present and disagreeing is an error; neither giving a base
/// takes transformers' default 10,000 with a warning.
///
/// `partial_ok`: the caller reads `partial_rotary_factor` and the `mrope_*` fields itself (the
/// Qwen3.5 family), so they are not refused here.
pub(crate) fn parse_rope(
    root: &serde_json::Map<String, serde_json::Value>,
    family: &str,
    warnings: &mut Vec<String>,
    float: &FloatField,
    partial_ok: bool,
) -> anyhow::Result<(f32, RopeScaling)> {
    use serde_json::Value;
    let obj = |key: &str| -> anyhow::Result<Option<&serde_json::Map<String, Value>>> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(other) => anyhow::bail!("field {key}: expected an object, found {other}"),
        }
    };
    let mut params = obj("rope_parameters")?;
    let mut params_at = "rope_parameters.".to_string();
    // Per-layer-type parameters ({"full_attention": {...}, ...}): every layer here is full
    // attention.
    if let Some(p) = params {
        if !p.is_empty() && p.values().all(Value::is_object) {
            match p.get("full_attention") {
                Some(Value::Object(f)) => {
                    params = Some(f);
                    params_at = "rope_parameters.full_attention.".into();
                }
                _ => anyhow::bail!(
                    "rope_parameters has per-layer-type entries but none for full_attention"
                ),
            }
        }
    }
    let scaling = obj("rope_scaling")?;
    let top_theta = float(root, "rope_theta", "")?;
    let p_theta = match params {
        Some(p) => float(p, "rope_theta", &params_at)?,
        None => None,
    };
    let theta = match (p_theta, top_theta) {
        (Some(a), Some(b)) if (a - b).abs() > 1e-6 * a.abs().max(b.abs()) => anyhow::bail!(
            "{params_at}rope_theta = {a} and rope_theta = {b} disagree; fix config.json so that one RoPE base remains"
        ),
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            warnings.push(format!(
                "rope_theta absent (neither rope_parameters.rope_theta nor rope_theta): using 10000 ({family}'s default)"
            ));
            10_000.0
        }
    };
    if !(theta > 0.0 && theta.is_finite()) {
        anyhow::bail!("rope_theta = {theta}; expected a positive number");
    }
    if let Some(f) = float(root, "partial_rotary_factor", "")?.filter(|_| !partial_ok) {
        if f != 1.0 {
            anyhow::bail!("partial_rotary_factor = {f}: only full rotary embeddings are supported");
        }
    }
    let kind_of = |m: &serde_json::Map<String, Value>| -> Option<String> {
        m.get("rope_type")
            .or_else(|| m.get("type"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    // The scaling description: rope_parameters in transformers 5, rope_scaling before.
    let (desc, at) = match (params, scaling) {
        (Some(p), Some(s)) => {
            let (a, b) = (
                kind_of(p).unwrap_or_else(|| "default".into()),
                kind_of(s).unwrap_or_else(|| "default".into()),
            );
            if a != b {
                anyhow::bail!(
                    "{params_at}rope_type = {a} and rope_scaling type = {b} disagree; fix config.json so that one RoPE description remains"
                );
            }
            (Some(p), params_at.clone())
        }
        (Some(p), None) => (Some(p), params_at.clone()),
        (None, Some(s)) => (Some(s), "rope_scaling.".to_string()),
        (None, None) => (None, String::new()),
    };
    let Some(d) = desc else {
        return Ok((theta as f32, RopeScaling::None));
    };
    let kind = kind_of(d).unwrap_or_else(|| "default".into());
    let allowed: &[&str] = match kind.as_str() {
        "default" => &[],
        "linear" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => anyhow::bail!(
            "{at}rope_type '{other}' is not supported by the built-in runtime (supported: {})",
            SUPPORTED_ROPE_TYPES.join(", ")
        ),
    };
    for (k, v) in d {
        if matches!(k.as_str(), "rope_type" | "type" | "rope_theta")
            || allowed.contains(&k.as_str())
        {
            continue;
        }
        if k == "partial_rotary_factor" && v.as_f64() == Some(1.0) {
            continue;
        }
        if partial_ok
            && matches!(
                k.as_str(),
                "partial_rotary_factor" | "mrope_section" | "mrope_interleaved"
            )
        {
            continue;
        }
        anyhow::bail!(
            "{at}{k} = {v} is not understood by the built-in runtime for rope_type '{kind}' (it reads {})",
            if allowed.is_empty() { "only rope_theta".to_string() } else { format!("rope_theta, {}", allowed.join(", ")) }
        );
    }
    let req = |k: &str| -> anyhow::Result<f32> {
        match float(d, k, &at)? {
            Some(v) if v > 0.0 && v.is_finite() => Ok(v as f32),
            Some(v) => anyhow::bail!("{at}{k} = {v}; expected a positive number"),
            None => anyhow::bail!("{at}{k} is required for rope_type '{kind}'"),
        }
    };
    let scaling = match kind.as_str() {
        "linear" => RopeScaling::Linear {
            factor: req("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: req("factor")?,
            low_freq_factor: req("low_freq_factor")?,
            high_freq_factor: req("high_freq_factor")?,
            original_max_position_embeddings: req("original_max_position_embeddings")?,
        },
        _ => RopeScaling::None,
    };
    if let RopeScaling::Llama3 {
        low_freq_factor,
        high_freq_factor,
        ..
    } = scaling
    {
        if high_freq_factor <= low_freq_factor {
            anyhow::bail!(
                "{at}high_freq_factor ({high_freq_factor}) must exceed low_freq_factor ({low_freq_factor})"
            );
        }
    }
    Ok((theta as f32, scaling))
}
