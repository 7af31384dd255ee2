//! The parallel layout of a multi-GPU engine (tensor, pipeline, data and expert parallelism, the
//! devices it uses) and the rig's topology, recorded with the e2e figures as conditions.
//!
//! Sources, each value with where it was read: the engine's boot log, where the engine prints
//! its resolved configuration (vLLM: `tensor_parallel_size=2, pipeline_parallel_size=1` in the
//! engine config line, `'tensor_parallel_size': 2` in `non-default args`, `rank 0 in world size
//! 2 is assigned as DP rank 0, PP rank 0, TP rank 0` from its workers; SGLang: `tp_size=2,
//! pp_size=1, dp_size=1, ep_size=1` in `server_args=ServerArgs(...)`; llama.cpp: `using device
//! CUDA0 (...)` per GPU), then the engine command line rigbench started (`--tensor-parallel-size`
//! / `-tp`, `--tp-size`, `--split-mode` / `-sm`, …). vLLM's `/version` carries only the version,
//! so the log is the source for vLLM.

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::conditions::Sourced;

/// How an engine spreads the model over GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParallelLayout {
    /// Tensor-parallel size.
    pub tensor_parallel: Option<Sourced<u32>>,
    /// Pipeline-parallel size.
    pub pipeline_parallel: Option<Sourced<u32>>,
    /// Data-parallel size.
    pub data_parallel: Option<Sourced<u32>>,
    /// Expert parallelism (`on`, or a size).
    pub expert_parallel: Option<Sourced<String>>,
    /// World size the engine's workers report.
    pub world_size: Option<Sourced<u32>>,
    /// llama.cpp's split mode (`layer`, `row`, `none`).
    pub split_mode: Option<Sourced<String>>,
    /// Devices the engine said it uses (llama.cpp: `CUDA0 (NVIDIA H200)`).
    pub devices: Vec<String>,
}

impl ParallelLayout {
    /// Whether anything was found.
    pub fn is_empty(&self) -> bool {
        self.tensor_parallel.is_none()
            && self.pipeline_parallel.is_none()
            && self.data_parallel.is_none()
            && self.expert_parallel.is_none()
            && self.world_size.is_none()
            && self.split_mode.is_none()
            && self.devices.is_empty()
    }

    /// One line: `TP 2 (boot log) · PP 1 (boot log) · world size 2 (boot log)`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let mut num = |name: &str, v: &Option<Sourced<u32>>| {
            if let Some(x) = v {
                parts.push(format!("{name} {} ({})", x.value, x.source));
            }
        };
        num("TP", &self.tensor_parallel);
        num("PP", &self.pipeline_parallel);
        num("DP", &self.data_parallel);
        num("world size", &self.world_size);
        if let Some(x) = &self.expert_parallel {
            parts.push(format!("EP {} ({})", x.value, x.source));
        }
        if let Some(x) = &self.split_mode {
            parts.push(format!("split mode {} ({})", x.value, x.source));
        }
        if !self.devices.is_empty() {
            parts.push(format!("devices {}", self.devices.join(", ")));
        }
        if parts.is_empty() {
            "not stated by the engine".into()
        } else {
            parts.join(" · ")
        }
    }
}

/// The multi-GPU conditions of an e2e session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineMultiGpu {
    /// The engine's parallel layout.
    pub layout: ParallelLayout,
    /// GPUs of the rig (`index: name`).
    pub gpus: Vec<String>,
    /// The rig's topology, one line (from `rig`).
    pub topology: Option<String>,
    /// NCCL environment rigbench gave a started engine (`NCCL_NVLS_ENABLE=0`).
    pub engine_env: Vec<String>,
}

struct Patterns {
    vllm_tp: Regex,
    vllm_pp: Regex,
    vllm_dp: Regex,
    vllm_ep: Regex,
    world: Regex,
    sg_tp: Regex,
    sg_pp: Regex,
    sg_dp: Regex,
    sg_ep: Regex,
    llama_dev: Regex,
    cmd_tp: Regex,
    cmd_pp: Regex,
    cmd_dp: Regex,
    cmd_ep: Regex,
    cmd_sm: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Patterns {
            vllm_tp: r(r#"['"]?\btensor_parallel_size['"]?\s*[:=]\s*(\d+)"#),
            vllm_pp: r(r#"['"]?\bpipeline_parallel_size['"]?\s*[:=]\s*(\d+)"#),
            vllm_dp: r(r#"['"]?\bdata_parallel_size['"]?\s*[:=]\s*(\d+)"#),
            vllm_ep: r(r#"['"]?\benable_expert_parallel['"]?\s*[:=]\s*(True|true|1)\b"#),
            world: r(r"(?:\bin world size (\d+)\b|\bworld_size=(\d+))"),
            sg_tp: r(r"(?:^|[\s,(])tp_size=(\d+)"),
            sg_pp: r(r"(?:^|[\s,(])pp_size=(\d+)"),
            sg_dp: r(r"(?:^|[\s,(])dp_size=(\d+)"),
            sg_ep: r(r"(?:^|[\s,(])ep_size=(\d+)"),
            llama_dev: r(r"using device (CUDA\d+) \(([^)]*)\)"),
            cmd_tp: r(r"(?:^|\s)(?:--tensor-parallel-size|-tp|--tp-size|--tp)(?:=|\s+)(\d+)"),
            cmd_pp: r(r"(?:^|\s)(?:--pipeline-parallel-size|-pp|--pp-size)(?:=|\s+)(\d+)"),
            cmd_dp: r(r"(?:^|\s)(?:--data-parallel-size|-dp|--dp-size|--dp)(?:=|\s+)(\d+)"),
            cmd_ep: r(r"(?:^|\s)(?:--enable-expert-parallel\b|--ep-size(?:=|\s+)(\d+))"),
            cmd_sm: r(r"(?:^|\s)(?:--split-mode|-sm)(?:=|\s+)(\w+)"),
        }
    })
}

fn first_u32(re: &Regex, text: &str) -> Option<u32> {
    re.captures_iter(text).find_map(|c| {
        c.iter()
            .skip(1)
            .flatten()
            .next()
            .and_then(|m| m.as_str().parse().ok())
    })
}

/// Read the layout from an engine's log text and the command rigbench started it with (either
/// may be empty). Log values win over command-line ones (they are what the engine resolved).
pub fn layout(log: &str, command: Option<&str>) -> ParallelLayout {
    let p = patterns();
    let mut l = ParallelLayout::default();
    let from_log = |v: Option<u32>| v.map(|x| Sourced::new(x, "boot log"));
    l.tensor_parallel = from_log(first_u32(&p.vllm_tp, log).or_else(|| first_u32(&p.sg_tp, log)));
    l.pipeline_parallel = from_log(first_u32(&p.vllm_pp, log).or_else(|| first_u32(&p.sg_pp, log)));
    l.data_parallel = from_log(first_u32(&p.vllm_dp, log).or_else(|| first_u32(&p.sg_dp, log)));
    l.world_size = from_log(first_u32(&p.world, log));
    l.expert_parallel = if p.vllm_ep.is_match(log) {
        Some(Sourced::new("on".to_string(), "boot log"))
    } else {
        first_u32(&p.sg_ep, log).map(|n| Sourced::new(n.to_string(), "boot log"))
    };
    for c in p.llama_dev.captures_iter(log) {
        let d = format!("{} ({})", &c[1], c[2].trim());
        if !l.devices.contains(&d) {
            l.devices.push(d);
        }
    }
    if let Some(cmd) = command {
        let from_cmd = |v: Option<u32>| v.map(|x| Sourced::new(x, "engine command"));
        if l.tensor_parallel.is_none() {
            l.tensor_parallel = from_cmd(first_u32(&p.cmd_tp, cmd));
        }
        if l.pipeline_parallel.is_none() {
            l.pipeline_parallel = from_cmd(first_u32(&p.cmd_pp, cmd));
        }
        if l.data_parallel.is_none() {
            l.data_parallel = from_cmd(first_u32(&p.cmd_dp, cmd));
        }
        if l.expert_parallel.is_none() {
            if let Some(c) = p.cmd_ep.captures(cmd) {
                let v = c
                    .get(1)
                    .map(|m| m.as_str().to_string())
                    .unwrap_or_else(|| "on".into());
                l.expert_parallel = Some(Sourced::new(v, "engine command"));
            }
        }
        if let Some(c) = p.cmd_sm.captures(cmd) {
            l.split_mode = Some(Sourced::new(c[1].to_string(), "engine command"));
        }
    }
    l
}

/// Record the layout and the rig's GPUs and topology in `e2e`, when the engine states a layout
/// or the rig has two or more GPUs (`extra_log`: the text of `--engine-log`, if given).
pub fn annotate(e2e: &mut super::E2eResults, rig: &crate::rig::RigFacts, extra_log: Option<&str>) {
    let mut text = e2e.engine_log.clone().unwrap_or_default();
    if let Some(x) = extra_log {
        text.push('\n');
        text.push_str(x);
    }
    let l = layout(&text, e2e.engine.command.as_deref());
    if l.is_empty() && rig.gpus.len() < 2 {
        return;
    }
    e2e.multi_gpu = Some(EngineMultiGpu {
        layout: l,
        gpus: rig
            .gpus
            .iter()
            .map(|g| format!("{}: {}", g.index, g.name))
            .collect(),
        topology: rig.topology.as_ref().map(|t| t.summary()),
        engine_env: if e2e.engine.kind == "url" {
            Vec::new()
        } else {
            crate::gpu::nccl::NCCL_ENV
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        },
    });
}

/// The conditions paragraph for the e2e section.
pub fn render(m: &EngineMultiGpu) -> String {
    let mut o = String::from("### Multi-GPU conditions\n\n");
    o.push_str(&format!("- parallel layout: {}\n", m.layout.summary()));
    if !m.gpus.is_empty() {
        o.push_str(&format!("- GPUs on the rig: {}\n", m.gpus.join("; ")));
    }
    if let Some(t) = &m.topology {
        o.push_str(&format!("- topology: {t}\n"));
    }
    if !m.engine_env.is_empty() {
        o.push_str(&format!(
            "- environment rigbench gave the engine: {}\n",
            m.engine_env.join(" ")
        ));
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines in the form vLLM prints them (engine config line, non-default args, worker rank
    /// assignment), abridged; synthetic.
    const VLLM: &str = "INFO 11-30 10:00:01 [api_server.py:1] non-default args: {'model': 'Qwen/Qwen3.6-27B', 'tensor_parallel_size': 2}\n\
INFO 11-30 10:00:05 [core.py:74] Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3.6-27B', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=False, quantization=modelopt_fp4\n\
(Worker_TP0 pid=123) INFO 11-30 10:00:09 [parallel_state.py:1208] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0\n";

    /// SGLang's `server_args=ServerArgs(...)` line, abridged; synthetic.
    const SGLANG: &str = "[2026-11-30 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3.6-27B', tp_size=4, pp_size=1, dp_size=2, ep_size=1, attn_tp_size=8, enable_dp_attention=False)\n";

    /// llama.cpp's device lines, abridged; synthetic.
    const LLAMA: &str = "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3090) - 23871 MiB free\nllama_model_load_from_file_impl: using device CUDA1 (NVIDIA GeForce RTX 3090) - 23871 MiB free\n";

    #[test]
    fn vllm_layout_from_the_boot_log() {
        let l = layout(VLLM, None);
        assert_eq!(l.tensor_parallel.as_ref().map(|x| x.value), Some(2));
        assert_eq!(l.tensor_parallel.as_ref().unwrap().source, "boot log");
        assert_eq!(l.pipeline_parallel.as_ref().map(|x| x.value), Some(1));
        assert_eq!(l.data_parallel.as_ref().map(|x| x.value), Some(1));
        assert_eq!(l.world_size.as_ref().map(|x| x.value), Some(2));
        assert!(l.expert_parallel.is_none());
        let s = l.summary();
        assert!(s.starts_with("TP 2 (boot log) · PP 1"), "{s}");
    }

    #[test]
    fn sglang_layout_ignores_attention_tp() {
        let l = layout(SGLANG, None);
        assert_eq!(l.tensor_parallel.unwrap().value, 4, "not attn_tp_size=8");
        assert_eq!(l.data_parallel.unwrap().value, 2);
        assert_eq!(l.expert_parallel.unwrap().value, "1");
    }

    #[test]
    fn llama_cpp_devices_and_split_mode_from_the_command() {
        let l = layout(
            LLAMA,
            Some("llama-server -m q.gguf -ngl 99 --split-mode row --port 8080"),
        );
        assert_eq!(
            l.devices,
            vec![
                "CUDA0 (NVIDIA GeForce RTX 3090)",
                "CUDA1 (NVIDIA GeForce RTX 3090)"
            ]
        );
        let sm = l.split_mode.unwrap();
        assert_eq!(
            (sm.value.as_str(), sm.source.as_str()),
            ("row", "engine command")
        );
        assert!(l.tensor_parallel.is_none());
    }

    #[test]
    fn the_command_fills_in_when_the_log_is_silent() {
        let l = layout(
            "",
            Some("vllm serve Qwen/Qwen3.6-27B -tp 2 --enable-expert-parallel"),
        );
        assert_eq!(l.tensor_parallel.as_ref().unwrap().value, 2);
        assert_eq!(l.tensor_parallel.unwrap().source, "engine command");
        assert_eq!(l.expert_parallel.unwrap().value, "on");
        // The log wins over the command.
        let l = layout(VLLM, Some("vllm serve x --tensor-parallel-size 8"));
        assert_eq!(l.tensor_parallel.unwrap().value, 2);
        assert!(layout("nothing here", Some("rigbench serve")).is_empty());
    }

    #[test]
    fn annotate_records_layout_and_topology() {
        let mut e = crate::e2e::E2eResults {
            engine_log: Some(VLLM.into()),
            ..Default::default()
        };
        e.engine.kind = "command".into();
        let mut rig = crate::rig::RigFacts::default();
        annotate(&mut e, &rig, None);
        let m = e.multi_gpu.clone().expect("the engine states a layout");
        assert_eq!(m.engine_env, vec!["NCCL_NVLS_ENABLE=0"]);
        assert!(render(&m).contains("TP 2 (boot log)"));
        // One GPU, a single-GPU engine: nothing recorded.
        let mut e = crate::e2e::E2eResults::default();
        annotate(&mut e, &rig, Some("INFO ready"));
        assert!(e.multi_gpu.is_none());
        // Two GPUs: the topology is recorded even when the engine says nothing.
        rig.gpus = vec![Default::default(), Default::default()];
        rig.topology = Some(crate::rig::topology::Topology {
            links: vec![crate::rig::topology::TopoLink {
                a: 0,
                b: 1,
                connection: "NV18".into(),
                nvlinks: 18,
                p2p_access: Some(true),
                ..Default::default()
            }],
            ..Default::default()
        });
        e.engine.kind = "url".into();
        annotate(&mut e, &rig, None);
        let m = e.multi_gpu.unwrap();
        assert_eq!(m.topology.as_deref(), Some("GPU0–GPU1 NV18, P2P on"));
        assert!(
            m.engine_env.is_empty(),
            "rigbench did not start that engine"
        );
        assert!(render(&m).contains("not stated by the engine"));
    }
}
