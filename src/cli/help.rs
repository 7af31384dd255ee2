//! The text after each `--help`: the exit codes that command can give, rendered from one table
//! ([`exits`]), and examples. The README's table of exit codes is [`exits`]`(Cmd::Top)`;
//! `tests/it/exit_codes.rs` runs one case for every code of every command and checks the code the
//! process exits with, and that each `--help` shows exactly the codes of its table.
//!
//! Example lines stay under 80 columns (long ones continue with `\`), so clap's wrapping at the
//! terminal width never breaks a command in two.

use crate::error::{EXIT_SECOND_SIGINT, EXIT_SECOND_SIGTERM};
use crate::ExitStatus;

/// A command whose `--help` documents exit codes (`Top`: `rigbench --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// `rigbench --help`: every code any command gives.
    Top,
    /// `rigbench rig`.
    Rig,
    /// `rigbench kernels`.
    Kernels,
    /// `rigbench inspect`.
    Inspect,
    /// `rigbench serve`.
    Serve,
    /// `rigbench e2e`.
    E2e,
    /// `rigbench report`.
    Report,
    /// `rigbench compare`.
    Compare,
    /// `rigbench diagnose`.
    Diagnose,
    /// `rigbench board`.
    Board,
}

impl Cmd {
    /// Every command with a help text, `Top` first.
    pub const ALL: [Cmd; 10] = [
        Cmd::Top,
        Cmd::Rig,
        Cmd::Kernels,
        Cmd::Inspect,
        Cmd::Serve,
        Cmd::E2e,
        Cmd::Report,
        Cmd::Compare,
        Cmd::Diagnose,
        Cmd::Board,
    ];

    /// The subcommand's name (`""` for `Top`).
    pub fn name(self) -> &'static str {
        match self {
            Cmd::Top => "",
            Cmd::Rig => "rig",
            Cmd::Kernels => "kernels",
            Cmd::Inspect => "inspect",
            Cmd::Serve => "serve",
            Cmd::E2e => "e2e",
            Cmd::Report => "report",
            Cmd::Compare => "compare",
            Cmd::Diagnose => "diagnose",
            Cmd::Board => "board",
        }
    }
}

/// One documented exit code: the code, and when the command exits with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The process exit code.
    pub code: u8,
    /// When it is given (one sentence, no trailing period).
    pub when: &'static str,
}

const fn exit(status: ExitStatus, when: &'static str) -> Exit {
    Exit {
        code: status.code(),
        when,
    }
}

/// The second-signal codes of the commands that stop cleanly on a first signal.
const SECOND_SIGNAL: [Exit; 2] = [
    Exit {
        code: EXIT_SECOND_SIGINT,
        when: "a second SIGINT (Ctrl-C): stops at once; engines rigbench started are killed",
    },
    Exit {
        code: EXIT_SECOND_SIGTERM,
        when: "a second SIGTERM: stops at once; engines rigbench started are killed",
    },
];

/// What 64 means for every command.
const USAGE: &str = "bad command line: an unknown flag, or a value rigbench rejects";
/// What 64 means for the commands that take a suite and write a report folder.
const USAGE_SUITE: &str = "bad command line: an unknown flag, a value rigbench rejects, a \
--suite that cannot be used (no such name, a missing or malformed file), or --out naming a \
folder that holds a report, without --force";
/// The exit codes `cmd` documents, in increasing order: the one source of its `--help` text and
/// of the README's table (`Cmd::Top`).
pub fn exits(cmd: Cmd) -> Vec<Exit> {
    use ExitStatus::*;
    let mut v = match cmd {
        Cmd::Top => vec![
            exit(Ok, "ok"),
            exit(Error, "an error from the environment or an input file: no GPU library, a busy port, an unreachable URL, an unreadable or malformed input file, an engine that failed; also a run stopped by SIGINT or SIGTERM, after writing what it measured (marked interrupted)"),
            exit(Regression, "a regression or a missing metric (compare)"),
            exit(BaselineUnusable, "baseline missing or incompatible (compare)"),
            exit(LintErrors, "error-level findings (inspect, diagnose)"),
            exit(NothingTimed, "asked to time kernel cases and timed none (kernels without a GPU, or with every case failed or skipped; report on a GPU whose kernel cases all failed or were skipped)"),
            exit(Usage, "bad command line: an unknown flag, or a value rigbench rejects (a --suite that cannot be used, --out naming a folder that holds a report or a diagnosis, without --force)"),
        ],
        Cmd::Rig => vec![exit(Ok, "ok, with or without a GPU"), exit(Usage, USAGE)],
        Cmd::Kernels => vec![
            exit(Ok, "at least one kernel case was timed (this needs a GPU)"),
            exit(Error, KERNELS_1),
            exit(NothingTimed, "no kernel case was timed: no GPU (the benches are skipped with the reason; the CPU accuracy study still runs), or every case failed its check or was skipped"),
            exit(Usage, USAGE_SUITE),
        ],
        Cmd::Inspect => vec![
            exit(Ok, "no error-level finding"),
            exit(Error, "the folder or its metadata cannot be read (or the hub cannot be reached for hf://)"),
            exit(LintErrors, "error-level findings"),
            exit(Usage, "bad command line: an unknown flag, or a value rigbench rejects (e.g. a --cc that names no known card, an --engine outside vllm==0.23 … 0.34 and sglang==0.5, or --engine without a card)"),
        ],
        Cmd::Serve => vec![
            exit(Ok, "stopped by Ctrl-C or SIGTERM (also while the model is loading)"),
            exit(Error, "a busy port or an address this host lacks (checked before the model loads), or a model that cannot be loaded"),
            exit(Usage, USAGE),
        ],
        Cmd::E2e => vec![
            exit(Ok, "at least one valid run"),
            exit(Error, E2E_1),
            exit(Usage, USAGE_SUITE),
        ],
        Cmd::Report => vec![
            exit(Ok, "ok: parts that cannot run here (no GPU, no engine asked for) are skipped with the reason"),
            exit(Error, REPORT_1),
            exit(NothingTimed, "on a GPU: kernel cases were asked for and none was timed (every case failed its check or was skipped); without a GPU the kernel part is skipped and this is not given"),
            exit(Usage, USAGE_SUITE),
        ],
        Cmd::Compare => vec![
            exit(Ok, "no regression"),
            exit(Error, "an error: the results cannot be read, or an output cannot be written"),
            exit(Regression, "a metric regressed, or a baseline metric is missing from RESULTS (a vanished metric usually means a case now fails or is skipped)"),
            exit(BaselineUnusable, "baseline missing or unusable: unreadable, another schema version, another kernel or end-to-end suite, a rig mismatch without --allow-rig-mismatch"),
            exit(Usage, USAGE),
        ],
        Cmd::Diagnose => vec![
            exit(Ok, "no error-level finding"),
            exit(Error, "an input file cannot be read"),
            exit(LintErrors, "error-level findings"),
            exit(Usage, "bad command line: an unknown flag, a value rigbench rejects (e.g. a --cc that names no known card), or --out naming a folder that holds a diagnosis, without --force"),
        ],
        Cmd::Board => vec![
            exit(Ok, "the board was written (results files it cannot read are skipped, each with a line saying why)"),
            exit(Error, "a folder cannot be read, no results file in them could be read, or an output cannot be written"),
            exit(Usage, USAGE),
        ],
    };
    if matches!(cmd, Cmd::Top | Cmd::Kernels | Cmd::E2e | Cmd::Report) {
        v.extend(SECOND_SIGNAL);
    }
    v
}

/// `kernels`, code 1.
const KERNELS_1: &str = "an error: the report folder (--out) cannot be written, or a GPU \
library failed; or stopped by SIGINT or SIGTERM, after writing what it measured (marked \
interrupted)";
/// `e2e`, code 1.
const E2E_1: &str = "an error: an engine that cannot be reached or fails, no valid run, an \
unreadable input file (--tokenizer, --engine-log); or stopped by SIGINT or SIGTERM, after \
writing what it measured (marked interrupted)";
/// `report`, code 1.
const REPORT_1: &str = "an error: an engine it was asked to measure failed (the reason opens \
the verdict), the report folder cannot be written, a results file (--render) cannot be read; or \
stopped by SIGINT or SIGTERM, after writing what it measured (marked interrupted)";

/// The help's width: lines end before column 80.
const WIDTH: usize = 79;
/// Where the description of a code starts (`  130  `).
const INDENT: usize = 7;

/// Wrap `text` into lines of at most [`WIDTH`] columns, the first starting with `first` and the
/// others with `INDENT` spaces.
fn wrap(first: &str, text: &str, out: &mut String) {
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        let len = line.chars().count() + usize::from(!empty) + word.chars().count();
        if !empty && len > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(INDENT);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

/// The `Exit codes:` block of `cmd`, from [`exits`].
pub fn exit_codes_text(cmd: Cmd) -> String {
    let mut o = String::from("Exit codes:\n");
    for e in exits(cmd) {
        wrap(&format!("  {:<4} ", e.code), e.when, &mut o);
    }
    o
}

/// The README's table of exit codes (Markdown), from [`exits`]`(Cmd::Top)`: `tests/it/docs.rs`
/// checks that the README holds it.
pub fn exit_codes_markdown() -> String {
    let mut o = String::from("| code | meaning |\n|---|---|\n");
    for e in exits(Cmd::Top) {
        o.push_str(&format!("| {} | {} |\n", e.code, e.when));
    }
    o
}

/// The text after `--help` of `cmd`: what it says first (if anything), its exit codes and its
/// examples.
pub fn after_help(cmd: Cmd) -> String {
    let (before, examples) = match cmd {
        Cmd::Top => ("", TOP),
        Cmd::Rig => ("", RIG),
        Cmd::Kernels => ("", KERNELS),
        Cmd::Inspect => ("", INSPECT),
        Cmd::Serve => ("", SERVE),
        Cmd::E2e => (E2E_BEFORE, E2E),
        Cmd::Report => (REPORT_BEFORE, REPORT),
        Cmd::Compare => (COMPARE_BEFORE, COMPARE),
        Cmd::Diagnose => ("", DIAGNOSE),
        Cmd::Board => (BOARD_BEFORE, BOARD),
    };
    let mut o = String::new();
    if !before.is_empty() {
        o.push_str(before);
        o.push_str("\n\n");
    }
    o.push_str(&exit_codes_text(cmd));
    o.push('\n');
    o.push_str(examples);
    o
}

/// `rigbench --help`: examples.
const TOP: &str = "\
Examples:
  rigbench rig
  rigbench report                      # the main job; prints the verdict
  rigbench report --checkpoint path/to/checkpoint
  rigbench inspect path/to/checkpoint
  rigbench compare --baseline-dir baselines reports/<rig>/<time>
  rigbench board reports/              # one table of many rigs' reports

Without a GPU every command still runs and says what it skipped and why.";

/// `rigbench rig --help`: examples.
const RIG: &str = "\
Examples:
  rigbench rig
  rigbench rig --all          # the table for every compute capability
  rigbench rig --json";

/// `rigbench kernels --help`: examples.
const KERNELS: &str = "\
Examples:
  rigbench kernels --suite smoke
  rigbench kernels --formats bf16,w4a16 --m 1,16,64 --out r1
  rigbench kernels --check-determinism --determinism-runs 3";

/// `rigbench inspect --help`: examples.
const INSPECT: &str = "\
Examples:
  rigbench inspect path/to/checkpoint
  rigbench inspect path/to/checkpoint --cc sm_120 --gpu-mem-gib 32
  rigbench inspect path/to/checkpoint --json";

/// `rigbench serve --help`: examples.
const SERVE: &str = "\
Examples:
  rigbench serve --model synthetic:tiny --port 8000
  rigbench serve --model synthetic:qwen3-8b --num-layers 2 --quantize nvfp4
  rigbench serve --model path/to/checkpoint --spec-method ngram --spec-k 3
  curl -s http://127.0.0.1:8000/v1/chat/completions \\
    -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'";

/// `rigbench e2e --help`: what it says before the exit codes.
const E2E_BEFORE: &str = "\
Built-in suites: tiny (default), fixed-1k-256, narrative, code, shared-prefix,
open-loop.

Every run starts with POST /reset_prefix_cache, which empties the engine's
prefix cache (cold runs then check for 0 hits; warm runs prime it again): an
engine at --url loses what its cache held.";

/// `rigbench e2e --help`: examples.
const E2E: &str = "\
Examples:
  rigbench e2e
  rigbench e2e --suite fixed-1k-256 --url http://127.0.0.1:8000
  rigbench e2e --suite code --url http://127.0.0.1:8000 \\
    --engine-cmd 'vllm serve Qwen/Qwen3-8B --port 8000'";

/// `rigbench diagnose --help`: examples.
const DIAGNOSE: &str = "\
Examples:
  rigbench diagnose --log vllm.log
  rigbench diagnose --log vllm.log --metrics metrics.txt \\
    --checkpoint ./Qwen3.6-35B-A3B-NVFP4 --cc sm_120
  rigbench diagnose --log engine.log --rig reports/my-rig/20260101T000000Z \\
    --out diag/";

/// `rigbench report --help`: what it says before the exit codes.
const REPORT_BEFORE: &str = "\
The end-to-end part drives the built-in runtime, or an engine given with --url
or --engine-cmd, with e2e's flags (the e2e suite is --e2e-suite; --suite is
the kernel suite). Against an engine at --url every run starts with POST
/reset_prefix_cache, which empties its prefix cache.";

/// `rigbench report --help`: examples.
const REPORT: &str = "\
Examples:
  rigbench report
  rigbench report --suite smoke --no-e2e --out r1
  rigbench report --checkpoint path/to/checkpoint --check-determinism
  rigbench report --url http://127.0.0.1:8000 --e2e-suite fixed-1k-256 \\
    --concurrency 1,8 --engine-version 0.11.0
  rigbench report --save-baseline --rig-label my-rig
  rigbench report --render reports/<rig>/<time>   # redraw from results.json";

/// `rigbench compare --help`: the method, before the exit codes.
const COMPARE_BEFORE: &str = "\
Timings: the repeat is the unit (report --repeats R): the change is the ratio
of the geometric means of the repeats' medians (when both sides record each
repeat's slot in the rotated implementation order, the slot-adjusted change
of a fit with the slot as a block factor), its interval uses their between-run
variance (moderated across the metric's family) and each interval is built at
1 − α/m over the m timing metrics (Bonferroni; α = 1 − --confidence,
family-wise). Regressed/Improved only when the whole interval lies beyond the
noise threshold, Same when it lies within it, Not enough samples when it is
wider, Ambiguous otherwise. --confirm re-measures the regressed kernel cases
with this binary and keeps a regression only when it reproduces. Values are
compared against their own tolerance, labels exactly or by rank.
--deterministic-only compares values and labels only. See docs/gate.md.";

/// `rigbench compare --help`: examples.
const COMPARE: &str = "\
Examples:
  rigbench compare --baseline-dir baselines reports/<rig>/<time>
  rigbench compare --baseline reports/<rig>/<time-a> reports/<rig>/<time-b>
  rigbench compare --deterministic-only --baseline b.json target/ci-report";

/// `rigbench board --help`: what it does, before the exit codes.
const BOARD_BEFORE: &str = "\
Reads every results.json under the folders given (any rig, any results schema
version this rigbench reads; others are skipped with the reason) into one
table per rig and format: the decode-step composite at M = 1, 16 and 64, the
end-to-end tok/s with their conditions, the KV capacity and the checkpoint.
Rows whose conditions differ are grouped apart and never ranked together.";

/// `rigbench board --help`: examples.
const BOARD: &str = "\
Examples:
  rigbench board reports/
  rigbench board reports/ ~/rig-reports --out board/";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_help_fits_80_columns_and_lists_its_codes_in_order() {
        for cmd in Cmd::ALL {
            let text = after_help(cmd);
            assert!(text.contains("Exit codes:\n"), "{cmd:?}");
            assert!(text.contains("Examples:\n"), "{cmd:?}");
            for l in text.lines() {
                assert!(l.chars().count() < 80, "{cmd:?}: {l}");
            }
            let codes: Vec<u8> = exits(cmd).iter().map(|e| e.code).collect();
            let mut sorted = codes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                codes, sorted,
                "{cmd:?}: codes in increasing order, once each"
            );
            assert!(codes.contains(&0) && codes.contains(&64), "{cmd:?}");
        }
    }

    #[test]
    fn the_top_table_is_the_union_of_the_commands_tables() {
        let mut all: Vec<u8> = Cmd::ALL[1..]
            .iter()
            .flat_map(|c| exits(*c))
            .map(|e| e.code)
            .collect();
        all.sort_unstable();
        all.dedup();
        let top: Vec<u8> = exits(Cmd::Top).iter().map(|e| e.code).collect();
        assert_eq!(top, all);
        assert_eq!(top, vec![0, 1, 2, 3, 4, 5, 64, 130, 143]);
    }

    #[test]
    fn long_descriptions_wrap_under_the_description_column() {
        let t = exit_codes_text(Cmd::Report);
        assert!(t.starts_with("Exit codes:\n  0    ok"), "{t}");
        assert!(t.contains("\n  143  a second SIGTERM"), "{t}");
        // Continuation lines start at the description column.
        for l in t.lines().skip(1) {
            let lead = l.len() - l.trim_start().len();
            assert!(lead == 2 || lead == INDENT, "{l:?}");
        }
    }
}
