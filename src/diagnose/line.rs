//! One log line, read past whatever its collectors put in front of it.
//!
//! Engines print a header (vLLM: `LEVEL MM-DD hh:mm:ss [file.py:N] `, older
//! `LEVEL MM-DD hh:mm:ss file.py:N] `; torch/glog: `E0701 14:28:21.083000 911603 file.py:539] `;
//! SGLang: `[YYYY-MM-DD hh:mm:ss TP0] `; llama.cpp with `--log-prefix`: `0.00.035.099 I `
//! (optionally after its pid, `[44105] `; a timestamp that a redactor turned into `<ip>` is
//! accepted too); TensorRT-LLM's C++ `[TensorRT-LLM][INFO] ` and Python `[TRT-LLM] [I] `;
//! Python's default `ERROR:logger:`), and the tools in between put their own prefixes before it:
//! Docker Desktop (`YYYY-MM-DD hh:mm:ss.mmm | `), `docker compose` (`service-1  | `), journald
//! (`Mon DD hh:mm:ss host unit[pid]: `), `kubectl logs --timestamps` / `docker logs -t`
//! (RFC 3339), vLLM's process tags (`(EngineCore_DP0 pid=N) `, several nested under Ray) and
//! torch's `[rankN]:`. The header is found wherever it sits, so no prefix can hide a line's
//! level; lines without a header lose their known prefixes and keep the rest as the message.

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Severity as printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// DEBUG, glog/llama.cpp `D`.
    Debug,
    /// INFO, glog `I`.
    Info,
    /// WARNING / WARN, glog `W`.
    Warning,
    /// ERROR, glog `E`.
    Error,
    /// CRITICAL, glog `F` (fatal).
    Critical,
}

impl Level {
    /// ERROR or worse.
    pub fn is_error(self) -> bool {
        self >= Level::Error
    }
}

/// Which header form the line carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// vLLM's `LEVEL MM-DD hh:mm:ss [file.py:N]`.
    Vllm,
    /// torch/glog `[IWEF]MMDD hh:mm:ss.uuuuuu pid file:N]`.
    Glog,
    /// SGLang's `[YYYY-MM-DD hh:mm:ss TPn]` (no level).
    Sglang,
    /// llama.cpp's `--log-prefix` form `0.00.035.099 I`.
    Llamacpp,
    /// TensorRT-LLM: C++ `[TensorRT-LLM][INFO]`, Python `[TRT-LLM] [I]`.
    Trtllm,
    /// Python logging's default `LEVEL:logger:`, or uvicorn's `LEVEL:     `.
    Python,
    /// No header: the message is the line without its known prefixes.
    Plain,
}

/// A line split into its parts. `msg` keeps its leading whitespace (traceback indentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Line<'a> {
    /// 1-based line number in the file.
    pub no: usize,
    /// The level, when the line states one.
    pub level: Option<Level>,
    /// The header form.
    pub form: Form,
    /// The innermost process tag (`EngineCore_DP0`, `Worker_TP1`, SGLang's `TP0`).
    pub proc: Option<String>,
    /// Tensor-parallel or torch rank, when a tag names one.
    pub rank: Option<u32>,
    /// The process id, when a tag states one (`(EngineCore pid=N)`, journald's `unit[N]:`,
    /// llama.cpp's `[N] ` before its timestamp).
    pub pid: Option<u32>,
    /// `file.py:N` of the header.
    pub site: Option<String>,
    /// The message after the header (or after the prefixes), trailing whitespace removed.
    pub msg: &'a str,
}

struct Pats {
    vllm: Regex,
    glog: Regex,
    sglang: Regex,
    llamacpp: Regex,
    trtllm: Regex,
    python: Regex,
    proc: Regex,
    journald_pid: Regex,
    rank: Regex,
    prefixes: Vec<Regex>,
    rank_in_proc: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            vllm: r(
                r"\b(?P<lvl>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+\[?(?P<site>[\w./<>-]+:\d+)\]( ?)",
            ),
            glog: r(
                r"(?:^|[\s|:\]])(?P<lvl>[IWEF])\d{4}\s+\d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+(?P<site>[\w./<>-]+:\d+)\]( ?)",
            ),
            sglang: r(
                r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:,\d+)?(?: (?P<proc>(?:[A-Z]{2,4}\d+ ?)+))?\] ",
            ),
            llamacpp: r(
                r"^(?:\[(?P<pid>\d+)\] )?(?:\d+\.\d{2}\.\d{3}\.\d{3}|<ip>) (?P<lvl>[IWED]) ",
            ),
            trtllm: r(
                r"(?:^|\] )(?:\[TensorRT-LLM\](?:\[RANK (?P<r1>\d+)\])?\[(?P<lvl1>INFO|WARNING|ERROR|DEBUG|TRACE|VERBOSE|INTERNAL_ERROR)\]|\[TRT-LLM\] (?:\[RANK (?P<r2>\d+)\] )?\[(?P<lvl2>[IWEDVF])\]) ?",
            ),
            python: r(r"^(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:[\w.]+:| +)"),
            proc: r(r"\((?P<proc>[A-Za-z_][\w-]*) pid=(?P<pid>\d+)(?:, ip=[\w.:<>-]+)?\)"),
            journald_pid: r(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [\w.@/-]+\[(?P<pid>\d+)\]: "),
            rank: r(r"\[rank(?P<r>\d+)\]:?"),
            prefixes: vec![
                // Docker Desktop's viewer.
                r(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? \| ?"),
                // kubectl --timestamps, docker logs -t (RFC 3339).
                r(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s"),
                // journald (short).
                r(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [\w.@/-]+(?:\[\d+\])?: "),
                // docker compose.
                r(r"^[\w.-]+(?:[-_]\d+)?\s+\| "),
                r(r"^\((?:[A-Za-z_][\w-]*) pid=\d+(?:, ip=[\w.:<>-]+)?\) ?"),
                r(r"^\[rank\d+\]: ?"),
            ],
            rank_in_proc: r(r"(?:TP|rank)(\d+)|_(\d+)$"),
        }
    })
}

fn level_of(s: &str) -> Option<Level> {
    Some(match s {
        "DEBUG" | "D" | "TRACE" | "VERBOSE" | "V" => Level::Debug,
        "INFO" | "I" => Level::Info,
        "WARNING" | "WARN" | "W" => Level::Warning,
        "ERROR" | "E" => Level::Error,
        "CRITICAL" | "F" | "INTERNAL_ERROR" => Level::Critical,
        _ => return None,
    })
}

/// `Worker_TP1` → 1; `Worker_PP0_TP3` → 3; `Worker_2` → 2; `TP0` → 0.
pub fn rank_of(proc_name: &str) -> Option<u32> {
    let c = pats().rank_in_proc.captures(proc_name)?;
    c.get(1).or_else(|| c.get(2))?.as_str().parse().ok()
}

/// Strip the known collector prefixes from the start of `s`, repeatedly.
pub fn strip_prefixes(mut s: &str) -> &str {
    let p = pats();
    'outer: loop {
        for re in &p.prefixes {
            if let Some(m) = re.find(s) {
                if m.end() > 0 {
                    s = &s[m.end()..];
                    continue 'outer;
                }
            }
        }
        return s;
    }
}

impl<'a> Line<'a> {
    /// Split one raw line (without its newline).
    pub fn parse(no: usize, raw: &'a str) -> Line<'a> {
        let p = pats();
        let raw = raw.trim_end_matches(['\r', '\n']);
        let mut line = Line {
            no,
            level: None,
            form: Form::Plain,
            proc: None,
            rank: None,
            pid: None,
            site: None,
            msg: "",
        };
        let mut header_start = raw.len();
        let mut msg_start = None;
        if let Some(c) = p.vllm.captures(raw) {
            let m = c.get(0).expect("match");
            line.level = level_of(&c["lvl"]);
            line.site = Some(c["site"].to_string());
            line.form = Form::Vllm;
            header_start = m.start();
            msg_start = Some(m.end());
        } else if let Some(c) = p.glog.captures(raw) {
            let m = c.get(0).expect("match");
            line.level = level_of(&c["lvl"]);
            line.site = Some(c["site"].to_string());
            line.form = Form::Glog;
            header_start = m.start();
            msg_start = Some(m.end());
        } else if let Some(c) = p.sglang.captures(raw) {
            let m = c.get(0).expect("match");
            if strip_prefixes(&raw[..m.start()]).trim().is_empty() {
                line.form = Form::Sglang;
                line.proc = c
                    .name("proc")
                    .map(|x| x.as_str().trim().to_string())
                    .filter(|x| !x.is_empty());
                header_start = m.start();
                msg_start = Some(m.end());
            }
        }
        if msg_start.is_none() {
            let rest = strip_prefixes(raw);
            let off = raw.len() - rest.len();
            header_start = off;
            if let Some(c) = p.llamacpp.captures(rest) {
                line.level = level_of(&c["lvl"]);
                line.form = Form::Llamacpp;
                line.pid = c.name("pid").and_then(|m| m.as_str().parse().ok());
                msg_start = Some(off + c.get(0).expect("match").end());
            } else if let Some(c) = p.trtllm.captures(rest) {
                let lvl = c
                    .name("lvl1")
                    .or_else(|| c.name("lvl2"))
                    .map(|m| m.as_str());
                line.level = lvl.and_then(level_of);
                line.form = Form::Trtllm;
                line.rank = c
                    .name("r1")
                    .or_else(|| c.name("r2"))
                    .and_then(|m| m.as_str().parse().ok());
                msg_start = Some(off + c.get(0).expect("match").end());
            } else if let Some(c) = p.python.captures(rest) {
                line.level = level_of(&c["lvl"]);
                line.form = Form::Python;
                msg_start = Some(off + c.get(0).expect("match").end());
            } else {
                msg_start = Some(off);
            }
        }
        let before = &raw[..header_start.min(raw.len())];
        if line.proc.is_none() {
            if let Some(c) = p.proc.captures_iter(before).last() {
                line.proc = Some(c["proc"].to_string());
                line.pid = c["pid"].parse().ok();
            }
        }
        if line.pid.is_none() {
            line.pid = p
                .journald_pid
                .captures(raw)
                .and_then(|c| c["pid"].parse().ok());
        }
        if let Some(c) = p.rank.captures(before) {
            line.rank = c["r"].parse().ok();
        } else if line.rank.is_none() {
            if let Some(pr) = &line.proc {
                line.rank = rank_of(pr);
            }
        }
        line.msg = raw[msg_start.unwrap_or(0).min(raw.len())..].trim_end();
        line
    }

    /// The message without leading whitespace.
    pub fn text(&self) -> &'a str {
        self.msg.trim_start()
    }

    /// Whether the message is part of a Python traceback: its first line, a `File "..."` frame,
    /// indented source, caret markers, or chained-exception glue.
    pub fn is_traceback_piece(&self) -> bool {
        let t = self.text();
        let indented = self.msg.len() - t.len() >= 2;
        t.starts_with("Traceback (most recent call last)")
            || t.starts_with("File \"")
            || indented
            || (!t.is_empty() && t.chars().all(|c| matches!(c, '^' | '~' | ' ')))
            || t.starts_with("During handling of the above exception")
            || t.starts_with("The above exception was the direct cause")
    }
}

/// Whether `text` is the last line of a Python traceback (`pkg.SomeError: message`, or a bare
/// exception name).
pub fn is_exception_line(text: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(
            r"^(?:[A-Za-z_][\w]*\.)*[A-Z][\w]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)(?::|$)",
        )
        .expect("static regex")
    });
    re.is_match(text.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_keeps_the_level() {
        let body = "ERROR 06-01 04:42:29 [engine.py:457] Error Internal";
        for prefix in [
            "",
            "2025-06-01 06:42:29.680 | ",
            "2025-06-01T06:42:29.680123456Z ",
            "2025-06-01T06:42:29+02:00 ",
            "Jun 01 06:42:29 gpu-host vllm[1234]: ",
            "vllm-1  | ",
            "(EngineCore_DP0 pid=512) ",
            "(VllmWorker pid=1, ip=10.0.0.1) (EngineCore_DP0 pid=2) ",
            "[rank0]: ",
            "[rank1]:",
            "Jun 01 06:42:29 host vllm[9]: (EngineCore pid=77) ",
        ] {
            let raw = format!("{prefix}{body}");
            let l = Line::parse(7, &raw);
            assert_eq!(l.level, Some(Level::Error), "{prefix:?}");
            assert_eq!(l.msg, "Error Internal", "{prefix:?}");
            assert_eq!(l.site.as_deref(), Some("engine.py:457"));
            assert_eq!(l.no, 7);
        }
        let l = Line::parse(
            1,
            "(Worker_TP1 pid=646936) WARNING 03-17 17:06:53 [nvfp4_utils.py:144] x",
        );
        assert_eq!((l.proc.as_deref(), l.rank), (Some("Worker_TP1"), Some(1)));
        // Old vLLM header without the bracket.
        let l = Line::parse(
            1,
            "INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: a",
        );
        assert_eq!(
            (l.level, l.msg),
            (Some(Level::Info), "Speculative metrics: a")
        );
    }

    #[test]
    fn glog_sglang_llamacpp_python_and_plain() {
        let l = Line::parse(
            1,
            "[rank0]:E0701 14:28:21.083000 911603 torch/_inductor/runtime/triton_heuristics.py:539] [0/0] ptxas fatal   : x",
        );
        assert_eq!(
            (l.level, l.form, l.rank),
            (Some(Level::Error), Form::Glog, Some(0))
        );
        assert_eq!(l.msg, "[0/0] ptxas fatal   : x");
        let l = Line::parse(1, "W0701 14:28:21.083000 911603 a.py:5] careful");
        assert_eq!(l.level, Some(Level::Warning));
        let l = Line::parse(
            1,
            "[2025-03-08 12:29:21 TP3] KV Cache is allocated. #tokens: 46611",
        );
        assert_eq!(
            (l.form, l.proc.as_deref(), l.rank),
            (Form::Sglang, Some("TP3"), Some(3))
        );
        assert_eq!(l.msg, "KV Cache is allocated. #tokens: 46611");
        let l = Line::parse(1, "[2025-03-08 12:29:21] Decode batch. #running-req: 1");
        assert_eq!((l.form, l.proc), (Form::Sglang, None));
        let l = Line::parse(1, "0.00.035.099 E llama_model_load: error loading model");
        assert_eq!((l.level, l.form), (Some(Level::Error), Form::Llamacpp));
        let l = Line::parse(1, "ERROR:root:something broke");
        assert_eq!((l.level, l.msg), (Some(Level::Error), "something broke"));
        let l = Line::parse(1, "INFO:     Uvicorn running on http://0.0.0.0:8000");
        assert_eq!(l.level, Some(Level::Info));
        let l = Line::parse(
            1,
            "2025-06-01 06:42:29.680 | (EngineCore_DP0 pid=1094) ValueError: boom",
        );
        assert_eq!(
            (l.level, l.msg, l.proc.as_deref()),
            (None, "ValueError: boom", Some("EngineCore_DP0"))
        );
        let l = Line::parse(1, "");
        assert_eq!((l.level, l.msg), (None, ""));
        // Traceback pieces keep their indentation.
        let l = Line::parse(
            1,
            "ERROR 06-01 04:42:29 [engine.py:457]   File \"/x.py\", line 4, in f",
        );
        assert!(l.is_traceback_piece());
        assert!(is_exception_line(
            "torch.OutOfMemoryError: CUDA out of memory."
        ));
        assert!(is_exception_line("ValueError: To serve"));
        assert!(!is_exception_line("Error Internal"));
    }
}
