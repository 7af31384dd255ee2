//! `rigbench board`: one table of many rigs' reports, as a community's benchmarks page would keep
//! it from the reports its users attach.
//!
//! It reads every `results.json` under the folders given (the results schema of
//! [`crate::report::Results`]; a file of another schema version, or not a results file, is
//! skipped with the reason) and gives one row per report and format with:
//! - the decode-step composite at M = 1, 16 and 64: rigbench's own kernels, summed over one decode
//!   step of the suite's model (FP8 including its activation quantization), with the tok/s bound
//!   `M ÷ time` (see [`crate::kernels::composite`]);
//! - the end-to-end output tok/s of each valid sweep point, from `e2e` / `report --url` runs and
//!   from the built-in runtime on the GPU (never a CPU self-test's figures: those are not the
//!   card's);
//! - beside each of those points, its SLO attainment (`--slo`, docs/goodput.md) and its joules
//!   per output token (docs/energy.md), where they were measured;
//! - the KV capacity the engine reported (or, without an engine, the capacity predicted for the
//!   inspected checkpoint, marked as a prediction), and the checkpoint or model.
//!
//! Conditions: each row carries a tag for its kernel conditions (`K1`, …: suite and decode step,
//! timing mode, rigbench version) and one for its end-to-end conditions (`E1`, …: engine and
//! version, device, model, suite, lengths, cache temperature). Ranks compare only rows of the
//! same kernel tag; end-to-end figures are not ranked. The legend under the table states every
//! tag, so that rows of different conditions are never ranked against each other unsaid.
//!
//! Outputs ([`Board::markdown`], [`Board::csv`], [`sqlite::write`]): `BOARD.md`, `board.csv` and
//! `board.sqlite`.

pub mod quality;
pub mod sqlite;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::formats::GemmFormat;
use crate::kernels::composite::StepTiming;
use crate::output::table::{human_seconds, thousands};
use crate::report::Results;

/// The M values of the composite columns.
pub const BOARD_M: [usize; 3] = [1, 16, 64];

/// One results file read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportEntry {
    /// Its folder, as found under the folder given (`reports/nvidia-h200-sm90/20261201T021503Z`).
    pub path: String,
    /// Rig label.
    pub rig_label: String,
    /// GPU name and compute capability (`NVIDIA H200 (sm_90)`), or `no GPU`.
    pub gpu: String,
    /// GPUs in the rig.
    pub gpus: usize,
    /// Driver version, when known.
    pub driver: Option<String>,
    /// rigbench version that wrote it.
    pub rigbench_version: String,
    /// Its schema version.
    pub schema_version: u32,
    /// When the run started (UTC).
    pub created_utc: String,
    /// Whether the run finished.
    pub complete: bool,
    /// Whether it gave a row to the board.
    pub on_board: bool,
    /// What of it is not on the board, and why.
    pub notes: Vec<String>,
}

/// A set of conditions rows are measured under: rows with the same tag are comparable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions {
    /// `K1`, `K2`, … (kernels) or `E1`, … (end to end).
    pub tag: String,
    /// The conditions in words.
    pub text: String,
    /// Rows under them.
    pub rows: usize,
}

/// One end-to-end figure: a valid sweep point's output throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct E2ePoint {
    /// The sweep point (`c=4`, `2.00 req/s`).
    pub label: String,
    /// Output tokens per second.
    pub tok_per_s: f64,
    /// SLO attainment (share of requests meeting every target), when an SLO was set.
    pub goodput: Option<f64>,
    /// Joules per output token, when the energy was measured.
    pub j_per_output_token: Option<f64>,
}

/// One row of the board: one report and one format.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Index into [`Board::reports`].
    pub report: usize,
    /// `BF16`, `FP8 W8A8`, `W4A16 NVFP4`, `W4A4 NVFP4`, or the engine's own (`as served`).
    pub format: String,
    /// The composite at [`BOARD_M`], seconds per step.
    pub composite_s: [Option<f64>; 3],
    /// Tag of the kernel conditions.
    pub kernels: Option<String>,
    /// Rank by the composite at M = 1 among the rows of the same kernel conditions (1 fastest).
    pub rank: Option<usize>,
    /// Valid end-to-end sweep points.
    pub e2e: Vec<E2ePoint>,
    /// Tag of the end-to-end conditions.
    pub e2e_conditions: Option<String>,
    /// KV capacity in tokens and where it came from.
    pub kv_capacity: Option<(u64, String)>,
    /// The checkpoint inspected, or the model served.
    pub checkpoint: Option<String>,
    /// What qualifies the figures (throttling, an incomplete run).
    pub notes: Vec<String>,
    /// The quality comparison's figures, for a candidate of `rigbench quality`.
    pub quality: Option<quality::QualityCell>,
}

/// The board: reports read, rows, their conditions, and the files skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Board {
    /// The folders given.
    pub roots: Vec<String>,
    /// Every results file read, in path order.
    pub reports: Vec<ReportEntry>,
    /// Rows: by kernel conditions and rank, then by end-to-end conditions.
    pub rows: Vec<Row>,
    /// The kernel conditions (`K…`).
    pub kernel_conditions: Vec<Conditions>,
    /// The end-to-end conditions (`E…`).
    pub e2e_conditions: Vec<Conditions>,
    /// Files named `results.json` that could not be read: (path, why).
    pub skipped: Vec<(String, String)>,
}

/// Every `results.json` under `dir` (itself, when it is one), sorted by path.
///
/// # Errors
/// `dir` cannot be read (missing, unreadable).
fn find_results(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| crate::RigError::file(dir, format!("cannot read: {e}")))?;
    if meta.is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d)
            .map_err(|e| crate::RigError::file(&d, format!("cannot read the folder: {e}")))?;
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() && e.file_name() == "results.json" => out.push(p),
                _ => {}
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The display name of a format on the board.
fn format_name(f: GemmFormat) -> &'static str {
    f.display_name()
}

/// `nvfp4` (the built-in runtime's `--quantize` value) and the other runtime names as formats.
fn runtime_format(f: &str) -> String {
    match f {
        "bf16" => "BF16".into(),
        "fp8" => "FP8 W8A8".into(),
        "nvfp4" => "W4A16 NVFP4".into(),
        other => other.to_string(),
    }
}

/// Interns condition texts as tags `{prefix}1`, `{prefix}2`, … in order of first use.
#[derive(Default)]
struct Tags {
    list: Vec<Conditions>,
}

impl Tags {
    fn tag(&mut self, prefix: &str, text: String) -> String {
        if let Some(c) = self.list.iter_mut().find(|c| c.text == text) {
            c.rows += 1;
            return c.tag.clone();
        }
        let tag = format!("{prefix}{}", self.list.len() + 1);
        self.list.push(Conditions {
            tag: tag.clone(),
            text,
            rows: 1,
        });
        tag
    }
}

/// The kernel rows of one results file: rigbench's own composite per format.
fn kernel_rows(r: &Results, report: usize, tags: &mut Tags, notes: &mut Vec<String>) -> Vec<Row> {
    let Some(k) = r.kernels.as_ref().filter(|k| !k.cases.is_empty()) else {
        return Vec::new();
    };
    let Some(c) = k
        .composite
        .clone()
        .or_else(|| crate::kernels::composite::compute(k))
    else {
        notes.push(format!(
            "kernels: {} cases timed, but no decode-step composite (these results carry no per-step count of each shape: written before the composite)",
            thousands(k.cases.len() as u64)
        ));
        return Vec::new();
    };
    let own = |t: StepTiming| {
        c.rows
            .iter()
            .any(|x| x.provider == "rigbench" && x.timing == t)
    };
    let timing = if own(StepTiming::Cold) {
        StepTiming::Cold
    } else {
        StepTiming::Graph
    };
    let suite = &k.suite;
    let step = suite
        .decode_step
        .as_ref()
        .map(|d| d.description.clone())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "its decode step".into());
    let text = format!(
        "kernel suite {}, {}{}; {}; rigbench {}",
        crate::output::table::code(&suite.name),
        step,
        if c.step.complete {
            ""
        } else {
            " (only part of the step: the sums are a part of its linear-layer time)"
        },
        match timing {
            StepTiming::Cold => "cold L2 (flushed before every sample)",
            StepTiming::Graph => "CUDA-graph timing (back-to-back launches)",
        },
        r.rigbench_version
    );
    let mut throttled: Vec<(&str, usize)> = k
        .cases
        .iter()
        .filter(|x| x.provider == "rigbench" && !x.throttle.is_empty())
        .map(|x| (x.shape.as_str(), x.m))
        .collect();
    throttled.sort_unstable();
    throttled.dedup();
    let mut row_notes = Vec::new();
    if !throttled.is_empty() {
        row_notes.push(format!(
            "throttling in {} (shape, M) groups",
            throttled.len()
        ));
    }
    if !r.complete {
        row_notes.push("incomplete run".into());
    }
    let mut rows = Vec::new();
    for f in GemmFormat::ALL {
        let at = |m: usize| {
            c.rows
                .iter()
                .find(|x| {
                    x.provider == "rigbench" && x.format == f && x.timing == timing && x.m == m
                })
                .map(|x| x.median_s)
                .filter(|s| s.is_finite() && *s > 0.0)
        };
        let composite_s = [at(BOARD_M[0]), at(BOARD_M[1]), at(BOARD_M[2])];
        if composite_s.iter().all(Option::is_none) {
            continue;
        }
        rows.push(Row {
            report,
            format: format_name(f).to_string(),
            composite_s,
            kernels: Some(tags.tag("K", text.clone())),
            rank: None,
            e2e: Vec::new(),
            e2e_conditions: None,
            kv_capacity: None,
            checkpoint: None,
            notes: row_notes.clone(),
            quality: None,
        });
    }
    if rows.is_empty() {
        notes.push(format!(
            "kernels: the composite has no row of rigbench's kernels at M = {}",
            BOARD_M.map(|m| m.to_string()).join(", ")
        ));
    }
    rows
}

/// The end-to-end figures of one session, for the board.
struct E2eFigures {
    /// Valid sweep points.
    points: Vec<E2ePoint>,
    /// The conditions in words.
    conditions: String,
    /// KV capacity and its source.
    kv: Option<(u64, String)>,
    /// The model served.
    model: Option<String>,
    /// The weight format, when the engine states it, else `as served`.
    format: String,
}

/// The end-to-end figures of one session: its valid sweep points, conditions, KV capacity and
/// format; `Err(why)` when they are not the card's (a CPU self-test) or there are none.
fn e2e_figures(e: &crate::e2e::E2eResults, gpu_rig: bool) -> Result<E2eFigures, String> {
    let f = &e.engine.facts;
    let rt = f.runtime.as_ref();
    let backend = rt.and_then(|r| r.backend.as_ref()).map(|b| b.value.clone());
    let builtin = e.engine.kind == "builtin";
    if e.self_test.is_some()
        || backend.as_deref() == Some("cpu")
        || (builtin && backend.is_none() && gpu_rig)
    {
        return Err(
            "end to end: the built-in runtime on the CPU backend (a harness self-test, not a figure of this card)"
                .into(),
        );
    }
    let points: Vec<E2ePoint> = e
        .runs
        .iter()
        .filter_map(|r| {
            r.presented_throughput().map(|t| E2ePoint {
                label: r.label.clone(),
                tok_per_s: t.output_tok_per_s,
                goodput: r.goodput.as_ref().map(|g| g.attainment),
                j_per_output_token: r.energy.as_ref().and_then(|e| e.j_per_output_token),
            })
        })
        .collect();
    if points.is_empty() {
        return Err(format!("end to end: no valid run of {}", e.runs.len()));
    }
    let first = e
        .runs
        .iter()
        .find(|r| r.validity.valid)
        .unwrap_or(&e.runs[0]);
    let c = &first.conditions;
    let engine = match (&c.engine, &c.engine_version) {
        (Some(n), Some(v)) => format!("{} {}", n.value, v.value),
        (Some(n), None) => format!("{} (version unknown)", n.value),
        (None, _) => "an engine that does not name itself".into(),
    };
    let device = rt
        .and_then(|r| r.device.as_ref())
        .map(|d| d.value.clone())
        .unwrap_or_else(|| "its own device (not reported)".into());
    let model = c.model.as_ref().map(|m| m.value.clone()).or_else(|| {
        rt.and_then(|r| r.model_provenance.as_ref())
            .map(|m| m.value.clone())
    });
    let provenance = rt
        .and_then(|r| r.model_provenance.as_ref())
        .map(|m| format!(" ({})", m.value))
        .unwrap_or_default();
    let suite = e
        .suite
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_else(|| "unknown".into());
    let l = &c.lengths;
    let input = l
        .input_requested
        .map(|n| format!("{n}-token prompts"))
        .unwrap_or_else(|| "the suite's prompts".into());
    let kv_dtype = rt
        .and_then(|r| r.kv_cache_dtype.as_ref())
        .map(|d| format!(", KV {}", d.value))
        .unwrap_or_default();
    let text = format!(
        "{engine} on {device}{kv_dtype}; model {}{provenance}; e2e suite {}: {input}, {} output tokens{}; {} prefix cache; temperature {}",
        crate::output::table::code(&model.clone().unwrap_or_else(|| "unknown".into())),
        crate::output::table::code(&suite),
        l.output_requested,
        if l.output_fixed { " (ignore_eos)" } else { "" },
        format!("{:?}", c.cache.temperature).to_lowercase(),
        c.temperature
    );
    let kv =
        c.kv.capacity_tokens
            .as_ref()
            .map(|k| (k.value, k.source.clone()));
    let format = rt
        .and_then(|r| r.weight_format.as_ref())
        .map(|w| runtime_format(&w.value))
        .unwrap_or_else(|| "as served".into());
    Ok(E2eFigures {
        points,
        conditions: text,
        kv,
        model,
        format,
    })
}

impl Board {
    /// Read every `results.json` under `dirs` (paths shown as found under them).
    ///
    /// # Errors
    /// A folder given cannot be read (missing, unreadable). Files that cannot be read as results
    /// are not errors: they are in [`Board::skipped`].
    pub fn read(dirs: &[PathBuf]) -> anyhow::Result<Self> {
        let mut b = Board {
            roots: dirs.iter().map(|d| d.display().to_string()).collect(),
            ..Default::default()
        };
        let mut ktags = Tags::default();
        let mut etags = Tags::default();
        let mut files = Vec::new();
        for d in dirs {
            files.extend(find_results(d)?);
        }
        files.sort();
        files.dedup();
        for file in files {
            let folder = file
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let r = match Results::load(&file) {
                Ok(r) => r,
                Err(e) => {
                    let why = match e {
                        crate::RigError::BadFile { message, .. } => message,
                        other => other.to_string(),
                    };
                    b.skipped.push((file.display().to_string(), why));
                    continue;
                }
            };
            let idx = b.reports.len();
            let gpu = r
                .rig
                .gpu
                .as_ref()
                .map(|g| match g.compute_capability {
                    Some(cc) => format!("{} ({cc})", g.name),
                    None => g.name.clone(),
                })
                .unwrap_or_else(|| "no GPU".into());
            let mut entry = ReportEntry {
                path: folder,
                rig_label: r.rig_label.clone(),
                gpu,
                gpus: r.rig.gpus.len().max(usize::from(r.rig.gpu.is_some())),
                driver: r.rig.stack.driver_version.clone(),
                rigbench_version: r.rigbench_version.clone(),
                schema_version: r.schema_version,
                created_utc: r.created_utc.clone(),
                complete: r.complete,
                on_board: false,
                notes: Vec::new(),
            };
            let mut rows = kernel_rows(&r, idx, &mut ktags, &mut entry.notes);
            let checkpoint = r.checkpoint.as_ref().map(|c| {
                Path::new(&c.checkpoint)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| c.checkpoint.clone())
            });
            let predicted = r
                .checkpoint
                .as_ref()
                .and_then(|c| c.capacity.kv_tokens)
                .map(|t| (t, "predicted from the checkpoint's metadata".to_string()));
            for row in &mut rows {
                row.checkpoint.clone_from(&checkpoint);
                row.kv_capacity.clone_from(&predicted);
            }
            // End to end: `e2e` / `report --url` sessions, and the built-in runtime on the GPU.
            let mut sessions: Vec<(Option<String>, &crate::e2e::E2eResults)> = Vec::new();
            if let Some(e) = &r.e2e {
                sessions.push((None, e));
            }
            if let Some(rt) = &r.runtime {
                for f in &rt.formats {
                    match (&f.e2e, &f.error) {
                        (Some(e), _) => sessions.push((Some(runtime_format(&f.format)), e)),
                        (None, Some(err)) => entry.notes.push(format!(
                            "built-in runtime {}: failed ({})",
                            runtime_format(&f.format),
                            err.lines().next().unwrap_or("")
                        )),
                        (None, None) => {}
                    }
                }
            }
            for (fmt, e) in sessions {
                match e2e_figures(e, r.rig.gpu.is_some()) {
                    Err(why) => entry.notes.push(why),
                    Ok(E2eFigures {
                        points,
                        conditions,
                        kv,
                        model,
                        format: engine_fmt,
                    }) => {
                        let format = fmt.unwrap_or(engine_fmt);
                        let tag = etags.tag("E", conditions);
                        match rows
                            .iter_mut()
                            .find(|x| x.format == format && x.e2e.is_empty())
                        {
                            Some(x) => {
                                x.e2e = points;
                                x.e2e_conditions = Some(tag);
                                if kv.is_some() {
                                    x.kv_capacity = kv;
                                }
                                if x.checkpoint.is_none() {
                                    x.checkpoint = model;
                                }
                            }
                            None => rows.push(Row {
                                report: idx,
                                format,
                                composite_s: [None; 3],
                                kernels: None,
                                rank: None,
                                e2e: points,
                                e2e_conditions: Some(tag),
                                kv_capacity: kv.or_else(|| predicted.clone()),
                                checkpoint: checkpoint.clone().or(model),
                                notes: if r.complete {
                                    Vec::new()
                                } else {
                                    vec!["incomplete run".into()]
                                },
                                quality: None,
                            }),
                        }
                    }
                }
            }
            rows.extend(quality::rows(&r, idx));
            entry.on_board = !rows.is_empty();
            b.rows.extend(rows);
            b.reports.push(entry);
        }
        b.kernel_conditions = ktags.list;
        b.e2e_conditions = etags.list;
        b.rank();
        Ok(b)
    }

    /// Rank rows by the composite at M = 1 within each kernel tag, and order the board: kernel
    /// tags in order, by rank; then the rows with only end-to-end figures, by tag.
    fn rank(&mut self) {
        let mut by_tag: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, r) in self.rows.iter().enumerate() {
            if let (Some(t), Some(_)) = (&r.kernels, r.composite_s[0]) {
                by_tag.entry(t.clone()).or_default().push(i);
            }
        }
        for idx in by_tag.values_mut() {
            idx.sort_by(|a, b| {
                let (x, y) = (self.rows[*a].composite_s[0], self.rows[*b].composite_s[0]);
                x.unwrap_or(f64::INFINITY)
                    .total_cmp(&y.unwrap_or(f64::INFINITY))
            });
            for (rank, i) in idx.iter().enumerate() {
                self.rows[*i].rank = Some(rank + 1);
            }
        }
        let tag_pos = |t: &Option<String>, list: &[Conditions]| {
            t.as_ref()
                .and_then(|t| list.iter().position(|c| &c.tag == t))
                .unwrap_or(usize::MAX)
        };
        let (kc, ec) = (self.kernel_conditions.clone(), self.e2e_conditions.clone());
        let reports = self.reports.clone();
        self.rows.sort_by(|a, b| {
            (tag_pos(&a.kernels, &kc), a.rank.unwrap_or(usize::MAX))
                .cmp(&(tag_pos(&b.kernels, &kc), b.rank.unwrap_or(usize::MAX)))
                .then_with(|| tag_pos(&a.e2e_conditions, &ec).cmp(&tag_pos(&b.e2e_conditions, &ec)))
                .then_with(|| reports[a.report].path.cmp(&reports[b.report].path))
                .then_with(|| format_rank(&a.format).cmp(&format_rank(&b.format)))
        });
    }

    /// The composite cell: `6.81 ms (147 tok/s)`, `—` when not measured.
    fn composite_cell(s: Option<f64>, m: usize) -> String {
        match s {
            Some(s) => format!(
                "{} ({} tok/s)",
                human_seconds(s),
                thousands((m as f64 / s).round() as u64)
            ),
            None => "—".into(),
        }
    }

    /// The end-to-end cell: `c=1 48.8 · c=4 179` (output tok/s), `—` when none.
    fn e2e_cell(points: &[E2ePoint]) -> String {
        if points.is_empty() {
            return "—".into();
        }
        points
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p.label,
                    crate::output::table::grouped(p.tok_per_s, 1)
                )
            })
            .collect::<Vec<_>>()
            .join(" · ")
    }

    /// A per-point cell of an optional figure: `c=1 95.0 % · c=4 80.0 %`, `—` when no point
    /// has it.
    fn e2e_extra_cell(points: &[E2ePoint], f: impl Fn(&E2ePoint) -> Option<String>) -> String {
        let cells: Vec<String> = points
            .iter()
            .filter_map(|p| f(p).map(|v| format!("{} {v}", p.label)))
            .collect();
        if cells.is_empty() {
            "—".into()
        } else {
            cells.join(" · ")
        }
    }

    /// The KV cell: `248,976 (/metrics …)`.
    fn kv_cell(kv: &Option<(u64, String)>) -> String {
        kv.as_ref()
            .map(|(t, src)| format!("{} tokens ({src})", thousands(*t)))
            .unwrap_or_else(|| "—".into())
    }

    /// The board as Markdown: the table, the conditions of each tag, and what is not on it.
    pub fn markdown(&self) -> String {
        let mut o = String::from("# rigbench board\n\n");
        let on = self.reports.iter().filter(|r| r.on_board).count();
        o.push_str(&format!(
            "Made by `rigbench board {}` from {} results files: {} on the board, {} without a board figure, {} skipped (both listed below). One row per report and format.\n\n",
            self.roots.join(" "),
            thousands((self.reports.len() + self.skipped.len()) as u64),
            thousands(on as u64),
            thousands((self.reports.len() - on) as u64),
            thousands(self.skipped.len() as u64),
        ));
        let head = [
            "rig",
            "GPU",
            "format",
            "composite M = 1",
            "M = 16",
            "M = 64",
            "kernel conditions",
            "rank",
            "e2e output tok/s",
            "e2e SLO attainment",
            "e2e J / output token",
            "e2e conditions",
            "KV capacity",
            "checkpoint / model",
            "quality vs reference",
            "notes",
            "report",
        ];
        let body: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let rep = &self.reports[r.report];
                vec![
                    rep.rig_label.clone(),
                    if rep.gpus > 1 {
                        format!("{} ×{}", rep.gpu, rep.gpus)
                    } else {
                        rep.gpu.clone()
                    },
                    r.format.clone(),
                    Self::composite_cell(r.composite_s[0], BOARD_M[0]),
                    Self::composite_cell(r.composite_s[1], BOARD_M[1]),
                    Self::composite_cell(r.composite_s[2], BOARD_M[2]),
                    r.kernels.clone().unwrap_or_else(|| "—".into()),
                    match (&r.kernels, r.rank) {
                        (Some(t), Some(n)) => format!("{n} in {t}"),
                        _ => "—".into(),
                    },
                    Self::e2e_cell(&r.e2e),
                    Self::e2e_extra_cell(&r.e2e, |p| {
                        p.goodput.map(|g| format!("{:.1} %", g * 100.0))
                    }),
                    Self::e2e_extra_cell(&r.e2e, |p| {
                        p.j_per_output_token.map(|j| format!("{j:.4}"))
                    }),
                    r.e2e_conditions.clone().unwrap_or_else(|| "—".into()),
                    Self::kv_cell(&r.kv_capacity),
                    r.checkpoint
                        .as_ref()
                        .map(|c| format!("`{c}`"))
                        .unwrap_or_else(|| "—".into()),
                    r.quality
                        .as_ref()
                        .map_or_else(|| "—".into(), quality::QualityCell::markdown),
                    if r.notes.is_empty() {
                        String::new()
                    } else {
                        r.notes.join("; ")
                    },
                    format!("`{}`", rep.path),
                ]
            })
            .collect();
        o.push_str(&crate::output::table::markdown_table(&head, &body));
        o.push_str("\nComposite: the summed GEMM time of one decode step of the suite's model on rigbench's own kernels (FP8 including its activation quantization), and in brackets the decode tok/s the linear layers alone allow (M ÷ time). A rank compares the rows of one kernel-conditions tag only; rows of different tags are not ranked against each other, since their conditions differ:\n\n");
        for c in &self.kernel_conditions {
            o.push_str(&format!(
                "- **{}** ({}): {}\n",
                c.tag,
                crate::output::table::plural(c.rows as u64, "row", "rows"),
                c.text
            ));
        }
        if self.kernel_conditions.is_empty() {
            o.push_str("- none: no results file read has a decode-step composite\n");
        }
        o.push_str("\nEnd to end: the output tokens per second of each valid sweep point (`c=N`: N requests in flight). They are not ranked: each tag is one engine, device, model and workload:\n\n");
        for c in &self.e2e_conditions {
            o.push_str(&format!(
                "- **{}** ({}): {}\n",
                c.tag,
                crate::output::table::plural(c.rows as u64, "row", "rows"),
                c.text
            ));
        }
        if self.e2e_conditions.is_empty() {
            o.push_str("- none: no results file read has an end-to-end run of a GPU\n");
        }
        if self.rows.iter().any(|r| r.quality.is_some()) {
            o.push_str("\nQuality vs reference: a candidate of `rigbench quality` against the reference of its own session (docs/quality.md): the verdict (McNemar exact on the task pack, bootstrap intervals on perplexity), KL(reference‖candidate) in nats from the top-k, top-1 agreement, task items passed. Not ranked: each belongs to its own reference and model.\n");
        }
        o.push_str("\nKV capacity: the tokens the engine's KV cache held, as it reported them; without an engine, the capacity predicted for the inspected checkpoint (a prediction from its metadata, for the GPU memory of that rig).\n");
        let quiet: Vec<&ReportEntry> = self
            .reports
            .iter()
            .filter(|r| !r.notes.is_empty())
            .collect();
        if !quiet.is_empty() {
            o.push_str(
                "\n## Not on the board\n\nWhat of these reports is not on the board, and why:\n\n",
            );
            for r in quiet {
                o.push_str(&format!("- `{}`: {}\n", r.path, r.notes.join("; ")));
            }
        }
        if !self.skipped.is_empty() {
            o.push_str("\n## Skipped\n\nFiles named results.json that could not be read as rigbench results:\n\n");
            for (p, why) in &self.skipped {
                o.push_str(&format!("- `{p}`: {why}\n"));
            }
        }
        o
    }

    /// The board as CSV: one line per row, figures in SI units (seconds, tokens per second), the
    /// conditions spelled out beside their tags.
    ///
    /// # Errors
    /// The CSV writer fails (it writes to memory).
    pub fn csv(&self) -> anyhow::Result<String> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record([
            "report",
            "rig_label",
            "gpu",
            "gpus",
            "format",
            "composite_m1_s",
            "composite_m16_s",
            "composite_m64_s",
            "kernel_conditions",
            "kernel_conditions_text",
            "rank",
            "e2e_output_tok_per_s",
            "e2e_slo_attainment",
            "e2e_j_per_output_token",
            "e2e_conditions",
            "e2e_conditions_text",
            "kv_capacity_tokens",
            "kv_capacity_source",
            "checkpoint",
            "quality_verdict",
            "quality_kl_ref_to_candidate",
            "quality_top1_agreement",
            "quality_tasks",
            "quality_mcnemar_p",
            "quality_reference",
            "notes",
            "rigbench_version",
            "created_utc",
        ])?;
        let text = |tag: &Option<String>, list: &[Conditions]| {
            tag.as_ref()
                .and_then(|t| list.iter().find(|c| &c.tag == t))
                .map(|c| c.text.clone())
                .unwrap_or_default()
        };
        let num = |v: Option<f64>| v.map(|x| format!("{x:e}")).unwrap_or_default();
        for r in &self.rows {
            let rep = &self.reports[r.report];
            let q = |f: &dyn Fn(&quality::QualityCell) -> String| {
                r.quality.as_ref().map(f).unwrap_or_default()
            };
            w.write_record([
                rep.path.clone(),
                rep.rig_label.clone(),
                rep.gpu.clone(),
                rep.gpus.to_string(),
                r.format.clone(),
                num(r.composite_s[0]),
                num(r.composite_s[1]),
                num(r.composite_s[2]),
                r.kernels.clone().unwrap_or_default(),
                text(&r.kernels, &self.kernel_conditions),
                r.rank.map(|n| n.to_string()).unwrap_or_default(),
                r.e2e
                    .iter()
                    .map(|p| format!("{}:{:.3}", p.label, p.tok_per_s))
                    .collect::<Vec<_>>()
                    .join(";"),
                r.e2e
                    .iter()
                    .filter_map(|p| p.goodput.map(|g| format!("{}:{g:.4}", p.label)))
                    .collect::<Vec<_>>()
                    .join(";"),
                r.e2e
                    .iter()
                    .filter_map(|p| p.j_per_output_token.map(|j| format!("{}:{j:e}", p.label)))
                    .collect::<Vec<_>>()
                    .join(";"),
                r.e2e_conditions.clone().unwrap_or_default(),
                text(&r.e2e_conditions, &self.e2e_conditions),
                r.kv_capacity
                    .as_ref()
                    .map(|k| k.0.to_string())
                    .unwrap_or_default(),
                r.kv_capacity
                    .as_ref()
                    .map(|k| k.1.clone())
                    .unwrap_or_default(),
                r.checkpoint.clone().unwrap_or_default(),
                q(&|c: &quality::QualityCell| c.verdict.clone()),
                q(&|c: &quality::QualityCell| format!("{:e}", c.kl_ref_to_candidate)),
                q(&|c: &quality::QualityCell| format!("{}", c.top1_agreement)),
                q(&|c: &quality::QualityCell| c.tasks.clone()),
                q(&|c: &quality::QualityCell| format!("{}", c.mcnemar_p)),
                q(&|c: &quality::QualityCell| c.reference.clone()),
                r.notes.join("; "),
                rep.rigbench_version.clone(),
                rep.created_utc.clone(),
            ])?;
        }
        Ok(String::from_utf8(w.into_inner()?)?)
    }
}

/// Formats in the order of the capability table (BF16, FP8, W4A16, W4A4), others after.
fn format_rank(f: &str) -> usize {
    GemmFormat::ALL
        .iter()
        .position(|g| g.display_name() == f)
        .unwrap_or(GemmFormat::ALL.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_an_error_naming_it() {
        let e = Board::read(&[PathBuf::from("/nonexistent/reports")]).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/reports"), "{e:#}");
    }

    #[test]
    fn other_schema_versions_and_broken_files_are_skipped_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir_all(&a).unwrap();
        let mut r = Results::new(Default::default(), "cpu-x86-64".into(), "x".into());
        r.complete = true;
        crate::output::write::atomic_write_json(&a.join("results.json"), &r).unwrap();
        let b = d.path().join("b");
        std::fs::create_dir_all(&b).unwrap();
        let mut v = serde_json::to_value(&r).unwrap();
        v["schema_version"] = 99.into();
        std::fs::write(b.join("results.json"), v.to_string()).unwrap();
        let c = d.path().join("c/deeper");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("results.json"), b"{ not json").unwrap();
        let board = Board::read(&[d.path().to_path_buf()]).unwrap();
        assert_eq!(board.reports.len(), 1);
        assert!(!board.reports[0].on_board);
        assert_eq!(board.skipped.len(), 2, "{:?}", board.skipped);
        assert!(
            board.skipped[0].1.contains("version 99"),
            "{:?}",
            board.skipped
        );
        assert!(
            board.skipped[1].1.contains("not valid JSON"),
            "{:?}",
            board.skipped
        );
        let md = board.markdown();
        assert!(
            md.contains("## Skipped") && md.contains("version 99"),
            "{md}"
        );
        assert!(board.rows.is_empty());
    }
}
