//! What the engine readers write through: facts into the boot they belong to (see the module
//! docs of `log` for when a fact starts a new boot), kernel choices, the version and line-form
//! counts, and the number and size helpers for what a line prints.

use super::boot::Boot;
use super::records::{EngineLog, KernelChoice};
use crate::diagnose::line::{rank_of, Line};

/// A number as printed (`652,144`, `2048`).
pub(crate) fn num(s: &str) -> Option<u64> {
    s.replace(',', "").trim().parse().ok()
}

/// A finite float as printed (`1,024.00`, `0.38`).
pub(crate) fn fnum(s: &str) -> Option<f64> {
    s.trim()
        .trim_end_matches(',')
        .replace(',', "")
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
}

/// A size in `unit` (KiB … TiB, KB … TB) in bytes, when finite and below 10^19.
pub(crate) fn to_bytes(v: f64, unit: &str) -> Option<u64> {
    let mult = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let b = v * mult;
    (b.is_finite() && (0.0..1e19).contains(&b)).then(|| b.round() as u64)
}

/// Whether a process role runs several processes per boot (a worker pool: `VllmWorker`,
/// `Worker_TP1`, `VllmWorkerProcess`, `RayWorkerWrapper`), as opposed to once per boot
/// (`APIServer`, `EngineCore_DP0`).
pub(super) fn worker_role(role: &str) -> bool {
    role.contains("Worker") || role.contains("worker") || rank_of(role).is_some()
}

/// How a fact relates to what the current boot already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Another value from the same process starts a new boot (the default).
    NewBoot,
    /// Another value from the same process replaces the first (TensorRT-LLM sizes a small KV
    /// cache before the real one).
    Replace,
}

impl EngineLog {
    /// Count one line of `engine`'s own form (the engine is the most frequent form).
    pub(crate) fn note_form(&mut self, engine: &'static str) {
        *self.forms.entry(engine).or_insert(0) += 1;
    }

    /// Lines whose header (or a reader) counted as `engine`'s own form (`vllm`, `sglang`,
    /// `llama.cpp`, `tensorrt-llm`, `rigbench`, `torch`).
    pub fn form_lines(&self, engine: &str) -> usize {
        self.forms.get(engine).copied().unwrap_or(0)
    }

    /// Count a line that gave a fact.
    pub(crate) fn recognised(&mut self) {
        self.lines_recognised += 1;
    }

    /// Record the engine version (the first one stated is the log's; each boot keeps its own).
    pub(crate) fn set_version(&mut self, l: &Line, v: String) {
        if let Some(b) = self.fact(l, 0, "version", &v, "engine start", Repeat::NewBoot) {
            b.engine_version = Some(v.clone());
        }
        if self.engine_version.is_none() {
            self.engine_version = Some(v);
            self.engine_version_line = Some(l.no);
        }
        self.recognised();
    }

    /// The boot being read, if any.
    pub(crate) fn current_boot(&mut self) -> Option<&mut Boot> {
        self.boots.last_mut()
    }

    fn new_boot(&mut self, no: usize) {
        let index = self.boots.len() + 1;
        self.boots.push(Boot {
            index,
            line: no,
            last_line: no,
            ..Default::default()
        });
    }

    /// The boot a startup fact of `stage` belongs to (see the module docs), created when none
    /// fits. `start marker` facts (a model-loading line) only open a boot.
    pub(crate) fn boot_for(&mut self, l: &Line, stage: u8) -> &mut Boot {
        let need_new = match self.boots.last() {
            None => true,
            Some(b) => stage < b.stage,
        };
        if need_new {
            self.new_boot(l.no);
        }
        let b = self.boots.last_mut().expect("pushed above");
        b.stage = b.stage.max(stage);
        b.last_line = l.no;
        b
    }

    /// Record a fact in the current boot (see the module docs for when it starts a new boot);
    /// `None` when another rank already set it or the same process printed the same value again.
    pub(crate) fn fact(
        &mut self,
        l: &Line,
        stage: u8,
        field: &'static str,
        value: &str,
        what: &str,
        repeat: Repeat,
    ) -> Option<&mut Boot> {
        enum Decision {
            Repeated,
            OtherRank,
            Replace,
            NewBoot,
            Here,
        }
        let proc = l.proc.clone();
        let decision = match self.boots.last() {
            None => Decision::NewBoot,
            Some(b) => match b.setters.get(field) {
                Some((p, v)) if *p == proc && v == value => Decision::Repeated,
                Some((p, v)) if *p != proc && (v == value || stage >= b.stage) => {
                    Decision::OtherRank
                }
                Some((p, _)) if *p == proc && repeat == Repeat::Replace => Decision::Replace,
                Some(_) => Decision::NewBoot,
                None if stage < b.stage => Decision::NewBoot,
                None => Decision::Here,
            },
        };
        match decision {
            Decision::Repeated | Decision::OtherRank => {
                let b = self.boots.last_mut().expect("checked");
                if matches!(decision, Decision::Repeated) {
                    b.repeated_lines += 1;
                }
                b.last_line = l.no;
                return None;
            }
            Decision::NewBoot => self.new_boot(l.no),
            Decision::Replace | Decision::Here => {}
        }
        let b = self.boots.last_mut().expect("a boot");
        b.stage = b.stage.max(stage);
        b.last_line = l.no;
        b.setters.insert(field, (proc, value.to_string()));
        b.last_stage = Some((what.to_string(), l.no));
        Some(b)
    }

    /// Record the KV-cache dtype stated at line `no`: a new value replaces the old one (and its
    /// line) when `replace` is set or none was stated; the same value keeps its first line.
    pub(crate) fn set_kv_dtype(&mut self, dtype: &str, no: usize, replace: bool) {
        let same = self.kv_cache_dtype.as_deref() == Some(dtype);
        if same || (!replace && self.kv_cache_dtype.is_some()) {
            return;
        }
        self.kv_cache_dtype = Some(dtype.to_string());
        self.kv_cache_dtype_line = Some(no);
        self.kv_cache_dtype_resolved = false;
    }

    /// Record a kernel choice once.
    pub(crate) fn push_choice(&mut self, what: String, kernel: &str, no: usize) {
        self.push_choice_among(what, kernel, no, Vec::new());
    }

    /// Record a kernel choice once, with the candidates the line lists.
    pub(crate) fn push_choice_among(
        &mut self,
        what: String,
        kernel: &str,
        no: usize,
        candidates: Vec<String>,
    ) {
        if !self
            .kernel_choices
            .iter()
            .any(|c| c.what == what && c.kernel == kernel)
        {
            self.kernel_choices.push(KernelChoice {
                what,
                kernel: kernel.to_string(),
                line: no,
                candidates,
            });
        }
        self.recognised();
    }

    /// A new process of a once-per-boot role, after that role failed under another pid in the
    /// current boot, starts a new boot.
    pub(super) fn track_process(&mut self, l: &Line) {
        let (Some(pid), Some(role)) = (l.pid, l.proc.as_deref()) else {
            return;
        };
        let role = role.to_string();
        let failed_role = |log: &EngineLog, b: &Boot, other: u32| {
            log.errors
                .iter()
                .any(|g| g.boot == Some(b.index) && g.pids.contains(&other))
        };
        let new = match self.boots.last() {
            Some(b) => match b.role_pids.get(&role) {
                Some(&other) if other != pid && !worker_role(&role) => failed_role(self, b, other),
                _ => false,
            },
            None => false,
        };
        if new {
            self.new_boot(l.no);
            if let Some(b) = self.boots.last_mut() {
                b.last_stage = Some((format!("a new {role} process (pid {pid})"), l.no));
            }
        }
        if let Some(b) = self.boots.last_mut() {
            b.role_pids.insert(role, pid);
            b.pids.insert(pid);
        }
    }
}
