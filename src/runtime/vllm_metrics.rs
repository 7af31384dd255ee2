//! Prometheus metrics with vLLM V1's names, so that the e2e driver reads rigbench and vLLM the
//! same way. Text exposition format 0.0.4, as Python's `prometheus_client` writes it: counters
//! carry the `_total` suffix (also on their HELP/TYPE lines), histograms have cumulative
//! `_bucket{le=...}` series with `+Inf`, then `_sum` and `_count`; every series carries
//! `model_name`. Bucket bounds are vLLM's (`vllm/v1/metrics/loggers.py`).
//!
//! Speculative-decoding series exist only when speculation is on (as in vLLM), so a scrape tells
//! "no data" from zero.

use std::fmt::Write as _;
use std::sync::Mutex;

use super::prefix_cache::PrefixCacheStats;
use super::spec::SpecStats;

/// vLLM's `vllm:time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (`vllm:e2e_request_latency_seconds`).
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, ... up to `max`.
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exp = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let v = m * exp;
            if v > max as f64 {
                return out;
            }
            out.push(v);
        }
        exp *= 10.0;
    }
}

/// A cumulative histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Empty, with upper bounds `bounds` (ascending; `+Inf` is implicit).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Record one value.
    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Why a request finished (vLLM's `finished_reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedLabel {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted (client gone) or failed.
    Abort,
}

/// The mutable state behind `/metrics`.
#[derive(Debug, Clone)]
pub struct MetricsState {
    /// Prompt tokens of requests that produced a first token.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub generation_tokens: u64,
    /// Prefix-cache counters (tokens).
    pub prefix: PrefixCacheStats,
    /// Preemptions.
    pub preemptions: u64,
    /// Speculative decoding counters (None when off).
    pub spec: Option<SpecStats>,
    /// Running requests.
    pub running: usize,
    /// Waiting requests.
    pub waiting: usize,
    /// Fraction of KV blocks in use, 0..1.
    pub kv_usage: f64,
    /// The largest `kv_usage` since start or the last [`MetricsState::reset_peaks`]: a
    /// high-water mark, exact where polling `kv_usage` misses short peaks.
    pub kv_usage_peak: f64,
    /// Finished requests by reason (stop, length, abort).
    pub finished: [u64; 3],
    /// TTFT (s).
    pub ttft: Histogram,
    /// ITL (s).
    pub itl: Histogram,
    /// E2E latency (s).
    pub e2e: Histogram,
    /// Prompt length per request.
    pub prompt_len: Histogram,
    /// Generated length per request.
    pub gen_len: Histogram,
}

impl MetricsState {
    /// Set the KV usage, raising the high-water mark.
    pub fn set_kv_usage(&mut self, usage: f64) {
        self.kv_usage = usage;
        self.kv_usage_peak = self.kv_usage_peak.max(usage);
    }

    /// Restart the high-water marks from the current values (`POST /rigbench/reset_peaks`,
    /// which the e2e driver sends before each run).
    pub fn reset_peaks(&mut self) {
        self.kv_usage_peak = self.kv_usage;
    }
}

/// Static facts shown in `vllm:cache_config_info`: vLLM's labels (`block_size`, `cache_dtype`,
/// `enable_prefix_caching`, `gpu_memory_utilization`, `num_gpu_blocks`) where they mean what
/// vLLM means, plus rigbench's `device` and `kv_cache_size_tokens`. The CPU backend's blocks
/// live in host memory: they are not reported as `num_gpu_blocks` (nor as vLLM's
/// `num_cpu_blocks`, which counts swap space), only as `kv_cache_size_tokens`.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheInfo {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks.
    pub num_blocks: usize,
    /// `cpu` or `cuda`.
    pub device_kind: String,
    /// `--gpu-memory-utilization` (GPU backends).
    pub gpu_memory_utilization: Option<f64>,
    /// `bfloat16` or `fp8_e4m3`.
    pub cache_dtype: String,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
}

/// The metrics registry.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    cache: CacheInfo,
    state: Mutex<MetricsState>,
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Float as Python's `repr` writes it in prometheus_client output (`12.0`, `0.25`).
fn num(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

impl Metrics {
    /// A registry for `model_name`; `spec_k` is Some(k) when speculation is on.
    pub fn new(
        model_name: &str,
        cache: CacheInfo,
        max_model_len: usize,
        spec_k: Option<usize>,
    ) -> Self {
        let lens = buckets_1_2_5(max_model_len);
        Metrics {
            model_name: model_name.to_string(),
            cache,
            state: Mutex::new(MetricsState {
                prompt_tokens: 0,
                generation_tokens: 0,
                prefix: PrefixCacheStats::default(),
                preemptions: 0,
                spec: spec_k.map(SpecStats::new),
                running: 0,
                waiting: 0,
                kv_usage: 0.0,
                kv_usage_peak: 0.0,
                finished: [0; 3],
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                prompt_len: Histogram::new(&lens),
                gen_len: Histogram::new(&lens),
            }),
        }
    }

    /// Update the state under the lock.
    pub fn update<R>(&self, f: impl FnOnce(&mut MetricsState) -> R) -> R {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A copy of the state.
    pub fn snapshot(&self) -> MetricsState {
        self.update(|s| s.clone())
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let m = format!("model_name=\"{}\"", esc(&self.model_name));
        let mut w = Exposition {
            o: String::new(),
            m: &m,
        };
        w.gauges(&s);
        w.cache_config_info(&self.cache);
        w.counters(&s);
        w.histograms(&s);
        w.o
    }
}

/// The exposition text being written; every sample carries the model label `m`.
struct Exposition<'a> {
    o: String,
    m: &'a str,
}

impl Exposition<'_> {
    /// The `# HELP` and `# TYPE` lines of a metric.
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let o = &mut self.o;
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
    }

    /// A gauge and its one sample.
    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.head(name, "gauge", help);
        let (o, m) = (&mut self.o, self.m);
        let _ = writeln!(o, "{name}{{{m}}} {}", num(v));
    }

    /// A counter and its one sample.
    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.head(name, "counter", help);
        let (o, m) = (&mut self.o, self.m);
        let _ = writeln!(o, "{name}{{{m}}} {}", num(v as f64));
    }

    /// A histogram: its buckets, count and sum.
    fn hist(&mut self, name: &str, help: &str, h: &Histogram) {
        self.head(name, "histogram", help);
        let (o, m) = (&mut self.o, self.m);
        for (b, c) in h.bounds.iter().zip(&h.counts) {
            let _ = writeln!(
                o,
                "{name}_bucket{{le=\"{}\",{m}}} {}",
                num(*b),
                num(*c as f64)
            );
        }
        let _ = writeln!(
            o,
            "{name}_bucket{{le=\"+Inf\",{m}}} {}",
            num(h.count as f64)
        );
        let _ = writeln!(o, "{name}_count{{{m}}} {}", num(h.count as f64));
        let _ = writeln!(o, "{name}_sum{{{m}}} {}", num(h.sum));
    }

    /// The gauges: running and waiting requests, KV-cache usage and its peak.
    fn gauges(&mut self, s: &MetricsState) {
        self.gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            s.running as f64,
        );
        self.gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            s.waiting as f64,
        );
        self.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_usage,
        );
        self.gauge(
            "rigbench:kv_cache_usage_peak_perc",
            "Largest KV-cache usage since start or the last POST /rigbench/reset_peaks (a high-water mark). 1 means 100 percent usage.",
            s.kv_usage_peak,
        );
    }

    /// `vllm:cache_config_info`, the cache configuration as labels.
    fn cache_config_info(&mut self, c: &CacheInfo) {
        self.head(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
        );
        let (o, m) = (&mut self.o, self.m);
        let gpu = c.device_kind != "cpu";
        let _ = writeln!(
            o,
            "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"{}\",device=\"{}\",enable_prefix_caching=\"{}\",{}kv_cache_size_tokens=\"{}\",{m}{}}} 1.0",
            c.block_size,
            esc(&c.cache_dtype),
            esc(&c.device_kind),
            if c.enable_prefix_caching { "True" } else { "False" },
            match (gpu, c.gpu_memory_utilization) {
                (true, Some(u)) => format!("gpu_memory_utilization=\"{u}\","),
                _ => String::new(),
            },
            c.num_blocks * c.block_size,
            if gpu {
                format!(",num_gpu_blocks=\"{}\"", c.num_blocks)
            } else {
                String::new()
            }
        );
    }

    /// The counters: preemptions, tokens, prefix-cache queries and hits, finished requests and
    /// the speculative-decoding counters when speculation is on.
    fn counters(&mut self, s: &MetricsState) {
        self.counter(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            s.preemptions,
        );
        self.counter(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            s.prompt_tokens,
        );
        self.counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            s.generation_tokens,
        );
        self.counter(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix.queries,
        );
        self.counter(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix.hits,
        );
        self.head(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
        );
        for (i, label) in ["stop", "length", "abort"].iter().enumerate() {
            let (o, m) = (&mut self.o, self.m);
            let _ = writeln!(
                o,
                "vllm:request_success_total{{finished_reason=\"{label}\",{m}}} {}",
                num(s.finished[i] as f64)
            );
        }
        if let Some(sp) = &s.spec {
            self.counter(
                "vllm:spec_decode_num_drafts_total",
                "Number of spec decoding drafts.",
                sp.num_drafts,
            );
            self.counter(
                "vllm:spec_decode_num_draft_tokens_total",
                "Number of draft tokens.",
                sp.num_draft_tokens,
            );
            self.counter(
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
                sp.num_accepted_tokens,
            );
            self.head(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                "counter",
                "Accepted tokens per draft position.",
            );
            for (i, v) in sp.accepted_per_pos.iter().enumerate() {
                let (o, m) = (&mut self.o, self.m);
                let _ = writeln!(
                    o,
                    "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{m},position=\"{i}\"}} {}",
                    num(*v as f64)
                );
            }
        }
    }

    /// The histograms: TTFT, ITL, e2e latency, prompt and generation lengths.
    fn histograms(&mut self, s: &MetricsState) {
        self.hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &s.ttft,
        );
        self.hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &s.itl,
        );
        self.hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &s.e2e,
        );
        self.hist(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &s.prompt_len,
        );
        self.hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &s.gen_len,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(spec: Option<usize>) -> Metrics {
        Metrics::new(
            "m\"x",
            CacheInfo {
                block_size: 16,
                num_blocks: 100,
                device_kind: "cuda".into(),
                gpu_memory_utilization: Some(0.9),
                cache_dtype: "bfloat16".into(),
                enable_prefix_caching: true,
            },
            100,
            spec,
        )
    }

    #[test]
    fn kv_peak_is_a_high_water_mark() {
        let m = metrics(None);
        m.update(|s| {
            s.set_kv_usage(0.5);
            s.set_kv_usage(0.1);
        });
        let t = m.render();
        assert!(
            t.contains("rigbench:kv_cache_usage_peak_perc{model_name=\"m\\\"x\"} 0.5\n"),
            "{t}"
        );
        assert!(t.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.1\n"));
        m.update(|s| s.reset_peaks());
        assert_eq!(m.snapshot().kv_usage_peak, 0.1);
    }

    #[test]
    fn buckets() {
        assert_eq!(
            buckets_1_2_5(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(0.5);
        h.observe(1.5);
        h.observe(9.0);
        assert_eq!(h.counts, vec![1, 2]);
        assert_eq!(h.count, 3);
    }

    #[test]
    fn exposition_names_labels_and_values() {
        let m = metrics(None);
        m.update(|s| {
            s.prompt_tokens = 12;
            s.kv_usage = 0.25;
            s.ttft.observe(0.003);
        });
        let t = m.render();
        assert!(t.contains("# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\\\"x\"} 12.0\n"), "{t}");
        assert!(t.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25\n"));
        assert!(t.contains("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"bfloat16\",device=\"cuda\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",kv_cache_size_tokens=\"1600\",model_name=\"m\\\"x\",num_gpu_blocks=\"100\"} 1.0"), "{t}");
        // The CPU backend's host-memory blocks are not GPU blocks.
        let cpu = Metrics::new(
            "c",
            CacheInfo {
                block_size: 16,
                num_blocks: 10,
                device_kind: "cpu".into(),
                gpu_memory_utilization: None,
                cache_dtype: "bfloat16".into(),
                enable_prefix_caching: false,
            },
            100,
            None,
        )
        .render();
        assert!(cpu.contains("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"bfloat16\",device=\"cpu\",enable_prefix_caching=\"False\",kv_cache_size_tokens=\"160\",model_name=\"c\"} 1.0"), "{cpu}");
        assert!(!cpu.contains("gpu"));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"0.001\",model_name=\"m\\\"x\"} 0.0\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"0.005\",model_name=\"m\\\"x\"} 1.0\n"
        ));
        assert!(t.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 1.0\n"));
        assert!(
            !t.contains("spec_decode"),
            "no spec series when speculation is off"
        );
        // Every sample line carries model_name.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains("model_name="), "{line}");
        }
        let t = metrics(Some(3)).render();
        assert!(t.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\\\"x\",position=\"2\"} 0.0"));
        assert!(t.contains("# TYPE vllm:spec_decode_num_drafts_total counter"));
    }
}
