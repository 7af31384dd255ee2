//! The formulas behind TTFT, TPOT and ITL: rigbench's (carried in results.json, see
//! [`Definitions`]) and, from the same request records, vLLM's and guidellm's, which differ
//! (docs/goodput.md, "Metric definitions").
//!
//! - vLLM (`vllm bench serve`; `vllm/benchmarks/serve.py`, `calculate_metrics`, with the
//!   timestamps of `vllm/benchmarks/lib/endpoint_request_func.py`,
//!   `async_request_openai_completions` / `async_request_openai_chat_completions`): TTFT is the
//!   first chunk with a `choices` entry (a role chunk counts); TPOT = (latency − TTFT) /
//!   (output tokens − 1) per request with more than one output token; ITL is the list of gaps
//!   between successive chunks, one per chunk whatever the tokens it carries.
//! - guidellm (`src/guidellm/schemas/request_stats.py`, `GenerativeRequestStats`,
//!   `time_per_output_token_ms` and `inter_token_latency_ms`): TPOT = (last token − request
//!   start) / output tokens, TTFT included; ITL = (last token − first token) / (output tokens − 1)
//!   per request.
//!
//! rigbench's own definitions are in [`super::metrics`]: TTFT the first token-bearing chunk,
//! TPOT = (E2E − TTFT) / (output tokens − 1), ITL per token (a chunk of n tokens gives n gaps of
//! 1/n of its gap). Here rigbench's chunk gaps stand for vLLM's: they are the gaps between
//! token-bearing chunks, where vLLM also counts a role chunk and an empty finish chunk.

use serde::{Deserialize, Serialize};

use super::metrics::{Percentiles, RequestRecord};

/// The formulas one tool uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Definition {
    /// The tool.
    pub tool: String,
    /// TTFT.
    pub ttft: String,
    /// TPOT.
    pub tpot: String,
    /// ITL.
    pub itl: String,
    /// Where the formulas are written.
    pub source: String,
}

/// The definitions carried by results.json (`e2e.definitions`): rigbench's, then vLLM's and
/// guidellm's as this module computes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Definitions {
    /// One per tool, rigbench first.
    pub tools: Vec<Definition>,
}

impl Default for Definitions {
    fn default() -> Self {
        let d = |tool: &str, ttft: &str, tpot: &str, itl: &str, source: &str| Definition {
            tool: tool.into(),
            ttft: ttft.into(),
            tpot: tpot.into(),
            itl: itl.into(),
            source: source.into(),
        };
        Self {
            tools: vec![
                d(
                    "rigbench",
                    "send → first chunk carrying a generated token (reasoning included)",
                    "(E2E − TTFT) / (output tokens − 1), requests with ≥ 2 tokens in ≥ 2 chunks",
                    "gaps between token chunks, a chunk of n tokens giving n gaps of 1/n of its gap (pooled per token)",
                    "src/e2e/metrics.rs (module docs)",
                ),
                d(
                    "vllm",
                    "send → first chunk with a choices entry (role chunk included)",
                    "(E2E − TTFT) / (output tokens − 1), requests with > 1 output token",
                    "gaps between successive chunks, one per chunk (pooled per chunk)",
                    "vllm/benchmarks/serve.py calculate_metrics; vllm/benchmarks/lib/endpoint_request_func.py async_request_openai_completions",
                ),
                d(
                    "guidellm",
                    "request start → first token",
                    "(last token − request start) / output tokens (TTFT included)",
                    "(last token − first token) / (output tokens − 1), one value per request",
                    "src/guidellm/schemas/request_stats.py GenerativeRequestStats.time_per_output_token_ms, inter_token_latency_ms",
                ),
            ],
        }
    }
}

/// TPOT and ITL of one run under one tool's definitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolMetrics {
    /// The tool.
    pub tool: String,
    /// TPOT percentiles, seconds.
    pub tpot: Option<Percentiles>,
    /// ITL percentiles, seconds.
    pub itl: Option<Percentiles>,
}

/// vLLM's and guidellm's TPOT and ITL of the completed requests among `records` (opening wave
/// left out as in [`super::metrics::LatencySummary`]).
pub fn other_tools(records: &[RequestRecord]) -> Vec<ToolMetrics> {
    let steady = records.iter().any(|r| r.ok && !r.opening_wave);
    let ok: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.ok && (!r.opening_wave || !steady))
        .collect();
    let vllm_tpot: Vec<f64> = ok
        .iter()
        .filter_map(|r| {
            let n = r.output_tokens?;
            let t = r.first_chunk_s.or(r.ttft_s)?;
            let e2e = r.e2e_s?;
            (n > 1).then(|| (e2e - t) / (n - 1) as f64)
        })
        .collect();
    let vllm_itl: Vec<f64> = ok
        .iter()
        .flat_map(|r| r.chunk_gaps_s.iter().copied())
        .collect();
    let g_tpot: Vec<f64> = ok
        .iter()
        .filter_map(|r| {
            let n = r.output_tokens.filter(|n| *n > 0)?;
            Some(r.last_token_s.or(r.e2e_s)? / n as f64)
        })
        .collect();
    let g_itl: Vec<f64> = ok
        .iter()
        .filter_map(|r| {
            let n = r.output_tokens.filter(|n| *n > 1)?;
            Some((r.last_token_s? - r.ttft_s?) / (n - 1) as f64)
        })
        .collect();
    vec![
        ToolMetrics {
            tool: "vllm".into(),
            tpot: Percentiles::of(&vllm_tpot),
            itl: Percentiles::of(&vllm_itl),
        },
        ToolMetrics {
            tool: "guidellm".into(),
            tpot: Percentiles::of(&g_tpot),
            itl: Percentiles::of(&g_itl),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_definitions_differ_as_their_sources_say() {
        // 5 tokens: first at 0.1 s, then chunks at 0.2, 0.3 (2 tokens), 0.5; stream ends at 0.6.
        let r = RequestRecord {
            ok: true,
            ttft_s: Some(0.1),
            first_chunk_s: Some(0.05),
            e2e_s: Some(0.6),
            last_token_s: Some(0.5),
            output_tokens: Some(5),
            chunk_gaps_s: vec![0.1, 0.1, 0.2],
            ..Default::default()
        };
        let t = other_tools(&[r]);
        let v = &t[0];
        assert!((v.tpot.as_ref().unwrap().p50 - (0.6 - 0.05) / 4.0).abs() < 1e-12);
        assert_eq!(v.itl.as_ref().unwrap().n, 3);
        let g = &t[1];
        assert!((g.tpot.as_ref().unwrap().p50 - 0.5 / 5.0).abs() < 1e-12);
        assert!((g.itl.as_ref().unwrap().p50 - 0.4 / 4.0).abs() < 1e-12);
        assert_eq!(Definitions::default().tools.len(), 3);
    }
}
