//! What the built-in runtime (`rigbench serve`) states about itself in `GET /version`: backend,
//! device, model provenance, weight format and KV-cache dtype. Each is recorded with its source
//! (`/version`), never inferred from the served model name; other engines do not state them, so
//! for them these conditions stay unknown.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::conditions::Sourced;

/// The runtime conditions of a session's engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeFacts {
    /// `cpu` or `cuda`.
    pub backend: Option<Sourced<String>>,
    /// The device (`cpu`, `cuda:0 (NVIDIA H200, sm_90)`).
    pub device: Option<Sourced<String>>,
    /// Where the weights came from (synthetic preset and seed, or checkpoint path and hash).
    pub model_provenance: Option<Sourced<String>>,
    /// Format of the decoder linears (`bf16`, `fp8`, `nvfp4`).
    pub weight_format: Option<Sourced<String>>,
    /// KV-cache dtype (`bfloat16`, `fp8_e4m3`).
    pub kv_cache_dtype: Option<Sourced<String>>,
}

impl RuntimeFacts {
    /// True when the engine ran on the CPU backend.
    pub fn is_cpu(&self) -> bool {
        self.backend.as_ref().is_some_and(|b| b.value == "cpu")
    }
}

/// Read the runtime facts from a `/version` body; `None` when it states none of them (not the
/// built-in runtime).
pub fn from_version(v: &Value) -> Option<RuntimeFacts> {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(|x| Sourced::new(x.to_string(), format!("/version {k}")))
    };
    let provenance = v.get("model_provenance").and_then(|p| {
        let kind = p.get("kind").and_then(Value::as_str)?;
        let text = match kind {
            "synthetic" => format!(
                "synthetic:{} seed {} ({} layers)",
                p.get("preset").and_then(Value::as_str).unwrap_or("?"),
                p.get("seed")
                    .and_then(Value::as_u64)
                    .map_or("?".into(), |x| x.to_string()),
                p.get("num_layers")
                    .and_then(Value::as_u64)
                    .map_or("?".into(), |x| x.to_string()),
            ),
            "checkpoint" => format!(
                "checkpoint {} ({})",
                p.get("path").and_then(Value::as_str).unwrap_or("?"),
                p.get("content_hash")
                    .and_then(Value::as_str)
                    .unwrap_or("no hash")
            ),
            other => other.to_string(),
        };
        Some(Sourced::new(text, "/version model_provenance"))
    });
    let f = RuntimeFacts {
        backend: s("backend"),
        device: s("device"),
        model_provenance: provenance,
        weight_format: s("weight_format"),
        kv_cache_dtype: s("kv_cache_dtype"),
    };
    (f.backend.is_some() || f.device.is_some() || f.model_provenance.is_some()).then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_rigbench_serve_states() {
        let v = serde_json::json!({"engine": "rigbench", "backend": "cuda",
            "device": "cuda:0 (NVIDIA H200, sm_90)", "weight_format": "nvfp4",
            "kv_cache_dtype": "bfloat16", "model": "synthetic:qwen3-8b",
            "model_provenance": {"kind": "synthetic", "preset": "qwen3-8b", "seed": 0, "num_layers": 36}});
        let f = from_version(&v).unwrap();
        assert_eq!(f.backend.as_ref().unwrap().value, "cuda");
        assert_eq!(f.backend.as_ref().unwrap().source, "/version backend");
        assert_eq!(
            f.model_provenance.unwrap().value,
            "synthetic:qwen3-8b seed 0 (36 layers)"
        );
        assert_eq!(f.weight_format.unwrap().value, "nvfp4");
        assert!(!serde_json::from_value::<RuntimeFacts>(
            serde_json::to_value(from_version(&v).unwrap()).unwrap()
        )
        .unwrap()
        .is_cpu());
        let c = serde_json::json!({"backend": "cpu", "model_provenance": {"kind": "checkpoint", "path": "/m", "content_hash": "fnv1a64:00"}});
        let f = from_version(&c).unwrap();
        assert!(f.is_cpu());
        assert_eq!(
            f.model_provenance.unwrap().value,
            "checkpoint /m (fnv1a64:00)"
        );
        // vLLM's /version states none of it: unknown, not guessed from the model name.
        assert!(from_version(&serde_json::json!({"version": "0.10.1"})).is_none());
    }
}
