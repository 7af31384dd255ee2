//! Error lines grouped into [`ErrorGroup`]s: consecutive ERROR lines of one process and call
//! site, plain and chained tracebacks, the same message from several ranks (see the module docs
//! of `log`).

use std::sync::OnceLock;

use regex::Regex;

use super::records::{ChainLink, EngineLog, ErrorGroup};
use crate::diagnose::cause::{classify, Cause};
use crate::diagnose::line::{is_exception_line, Form, Level, Line};

/// The largest number of error groups kept (a crash-looping log repeats itself).
const MAX_ERRORS: usize = 200;
/// Text lines kept per error group for cause search.
const MAX_TEXT: usize = 400;

/// `Exception`-like: a (dotted) CamelCase name, then `: ` or the end (`torch._dynamo.exc.
/// BackendCompilerFailed: …`), for the last line of a traceback whose name has no `Error`
/// suffix.
fn exception_like(text: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^(?:[A-Za-z_]\w*\.)*[A-Z][A-Za-z0-9_]*(?::\s|:$|$)").expect("static regex")
    })
    .is_match(text.trim())
}

impl EngineLog {
    /// Group error lines (see the module docs).
    pub(super) fn errors_from(&mut self, l: &Line) {
        let is_err = l.level.is_some_and(Level::is_error);
        let headered = matches!(
            l.form,
            Form::Vllm | Form::Glog | Form::Llamacpp | Form::Python | Form::Trtllm
        );
        // A process is its role and, when stated, its pid: two runs of one role are two.
        let process = match (&l.proc, l.pid) {
            (Some(p), Some(pid)) => Some(format!("{p}#{pid}")),
            (p, _) => p.clone(),
        };
        let key = (process.clone(), l.site.clone());
        // A header from this process that is not an error closes its open group.
        if headered && !is_err {
            self.open.remove(&process);
        }
        if is_err {
            self.error_line(l, process, key);
            return;
        }
        if self.chained_glue(l) {
            return;
        }
        if matches!(l.form, Form::Plain | Form::Sglang) && self.plain_traceback_line(l) {
            return;
        }
        // A line outside any error block that names a cause (plain `ValueError: ...`, the
        // engine's `Value error, ...`, argparse's `prog: error: ...`, a toolchain warning), or a
        // plain exception line.
        self.standalone_error(l);
    }

    /// An ERROR line of `process` at call site `key`: it extends the process's open group of
    /// the same key, or opens a new group (a traceback piece, an exception, or a headline).
    fn error_line(
        &mut self,
        l: &Line,
        process: Option<String>,
        key: (Option<String>, Option<String>),
    ) {
        let text = l.text();
        if let Some(&gi) = self.open.get(&process) {
            if self.errors[gi].key.as_ref() == Some(&key) {
                self.extend_group(gi, l);
                return;
            }
        }
        self.open.remove(&process);
        if self.errors.len() >= MAX_ERRORS {
            return;
        }
        let piece = l.is_traceback_piece();
        let gi = self.errors.len();
        let mut g = self.group_at(l);
        g.key = Some(key);
        g.level = l.level;
        if piece {
            g.traceback_lines = 1;
        } else if is_exception_line(text) {
            g.exception = Some(text.to_string());
            g.headline = Some(text.to_string());
            g.chain.push(ChainLink {
                exception: text.to_string(),
                line: l.no,
                relation: None,
            });
        } else if !text.is_empty() {
            g.headline = Some(text.to_string());
        }
        g.text.push((l.no, text.to_string()));
        g.sites.extend(l.site.clone());
        self.errors.push(g);
        self.open.insert(process, gi);
        self.chain_tail = None;
        self.recognised();
    }

    /// A chained traceback continues after its exception line: blank lines, then the glue.
    /// True when `l` is that glue and joined the group.
    fn chained_glue(&mut self, l: &Line) -> bool {
        let text = l.text();
        if let Some((gi, _)) = self.chain_tail {
            let glue = text.starts_with("The above exception was the direct cause")
                || text.starts_with("During handling of the above exception");
            if glue && self.errors[gi].proc == l.proc {
                self.plain_tb = Some(gi);
                self.chain_tail = None;
                self.extend_group(gi, l);
                return true;
            }
            if !text.is_empty() {
                self.chain_tail = None;
            }
        }
        false
    }

    /// Plain (headerless) tracebacks and exception lines, and argparse's usage block. True when
    /// `l` was taken.
    fn plain_traceback_line(&mut self, l: &Line) -> bool {
        let text = l.text();
        if let Some(gi) = self.plain_tb {
            let same_proc = self.errors[gi].proc == l.proc;
            if same_proc && (l.is_traceback_piece() || text.is_empty()) {
                self.extend_group(gi, l);
                return true;
            }
            if same_proc
                && (is_exception_line(text)
                    || (exception_like(text) && self.errors[gi].traceback_lines > 1))
            {
                self.extend_group_exception(gi, l);
                self.plain_tb = None;
                self.chain_tail = Some((gi, l.no));
                return true;
            }
            self.plain_tb = None;
        }
        if text.contains("Traceback (most recent call last)") && self.errors.len() < MAX_ERRORS {
            let gi = self.errors.len();
            let mut g = self.group_at(l);
            g.traceback_lines = 1;
            g.headline = text
                .find("Traceback (most recent call last)")
                .map(|i| text[..i].trim().trim_end_matches(':').trim().to_string())
                .filter(|h| !h.is_empty());
            g.text.push((l.no, text.to_string()));
            self.errors.push(g);
            self.plain_tb = Some(gi);
            self.recognised();
            return true;
        }
        // argparse prints its usage block before `prog: error: …`.
        if text.starts_with("usage: ") {
            self.usage_line = Some(l.no);
            return true;
        }
        false
    }

    /// A line outside any error block that names a cause, or a plain exception line: a group
    /// of its own.
    fn standalone_error(&mut self, l: &Line) {
        let text = l.text();
        let candidate = l.level.is_none()
            || (l.level == Some(Level::Warning)
                && text.contains("not compatible with the current PyTorch"));
        if candidate && self.errors.len() < MAX_ERRORS {
            let looks_error = is_exception_line(text)
                || text.to_ascii_lowercase().contains("error")
                || text.contains("not supported");
            let cause = classify(text, "").filter(|c| {
                !matches!(c, Cause::CapabilityTooLow { .. } | Cause::PortInUse { .. })
                    || looks_error
            });
            let exception = is_exception_line(text) && !text.contains("Warning");
            let plain_error = [
                "error loading model",
                "failed to load model",
                "exiting due to model loading error",
                "exiting due to HTTP server error",
                "Scheduler hit an exception",
                "failed to initialize the context",
            ]
            .iter()
            .any(|m| text.contains(m));
            if cause.is_some() || exception || plain_error {
                let first = match (&cause, self.usage_line) {
                    (Some(Cause::InvalidArguments { .. }), Some(u)) if l.no - u <= 40 => u,
                    _ => l.no,
                };
                let mut g = self.group_at(l);
                g.line = first;
                g.headline = Some(text.to_string());
                g.exception = exception.then(|| text.to_string());
                if exception {
                    g.chain.push(ChainLink {
                        exception: text.to_string(),
                        line: l.no,
                        relation: None,
                    });
                }
                g.level = l.level;
                if let Some(c) = cause {
                    g.causes.push((c.clone(), l.no));
                    g.cause = Some(c);
                    g.cause_line = Some(l.no);
                }
                g.text.push((l.no, text.to_string()));
                let gi = self.errors.len();
                self.errors.push(g);
                if exception {
                    self.chain_tail = Some((gi, l.no));
                }
                self.usage_line = None;
                self.recognised();
            }
        }
    }

    /// A new group opened by line `l`, in the current boot.
    fn group_at(&self, l: &Line) -> ErrorGroup {
        let boot = self.boots.last();
        ErrorGroup {
            line: l.no,
            last_line: l.no,
            proc: l.proc.clone(),
            pids: l.pid.into_iter().collect(),
            ranks: l.rank.into_iter().collect(),
            occurrences: 1,
            boot: boot.map(|b| b.index),
            after_shutdown: boot.and_then(|b| b.shutdown_line),
            ..Default::default()
        }
    }

    fn extend_group_exception(&mut self, gi: usize, l: &Line) {
        self.extend_group(gi, l);
        let text = l.text();
        let g = &mut self.errors[gi];
        if g.exception.as_deref() != Some(text) {
            g.exception = Some(text.to_string());
        }
        if !g.chain.iter().any(|c| c.line == l.no) {
            let relation = g.pending_relation.take();
            g.chain.push(ChainLink {
                exception: text.to_string(),
                line: l.no,
                relation,
            });
        }
    }

    fn extend_group(&mut self, gi: usize, l: &Line) {
        let text = l.text();
        let g = &mut self.errors[gi];
        g.last_line = l.no;
        if let Some(r) = l.rank {
            g.ranks.insert(r);
        }
        if let Some(p) = l.pid {
            g.pids.insert(p);
        }
        if text.starts_with("The above exception was the direct cause") {
            g.pending_relation = Some("direct cause".into());
        } else if text.starts_with("During handling of the above exception") {
            g.pending_relation = Some("during handling".into());
        }
        let exception = is_exception_line(text)
            || (exception_like(text) && g.traceback_lines > 1 && l.msg.len() == text.len());
        if exception && !l.is_traceback_piece() {
            g.traceback_lines += 1;
            g.exception = Some(text.to_string());
            let relation = g.pending_relation.take();
            g.chain.push(ChainLink {
                exception: text.to_string(),
                line: l.no,
                relation,
            });
        } else if l.is_traceback_piece() {
            g.traceback_lines += 1;
        } else if g.headline.is_none() && !text.is_empty() && g.traceback_lines == 0 {
            g.headline = Some(text.to_string());
        }
        if g.text.len() < MAX_TEXT {
            g.text.push((l.no, text.to_string()));
        }
        g.sites.extend(l.site.clone());
        self.recognised();
    }
}
