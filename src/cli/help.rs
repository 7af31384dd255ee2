//! The text after each `--help`: the exit codes that command can give (README's table) and
//! examples. Example lines stay under 80 columns (long ones continue with `\`), so clap's
//! wrapping at the terminal width never breaks a command in two.

/// `rigbench --help`.
pub const TOP: &str = "\
Exit codes:
  0   ok
  1   error from the environment or an input file (no GPU library, a busy port,
      an unreachable URL, an unreadable file, an engine that failed)
  2   regression (compare)
  3   baseline missing or incompatible (compare)
  4   error-level findings (inspect, diagnose)
  64  bad command line: an unknown flag, or a value rigbench rejects

Examples:
  rigbench rig
  rigbench report                      # the main job; prints the verdict
  rigbench report --checkpoint path/to/checkpoint
  rigbench inspect path/to/checkpoint
  rigbench compare --baseline-dir baselines reports/<rig>/<time>

Without a GPU every command still runs and says what it skipped and why.";

/// `rigbench rig --help`.
pub const RIG: &str = "\
Exit codes: 0 ok (with or without a GPU); 1 error; 64 bad command line.

Examples:
  rigbench rig
  rigbench rig --all          # the table for every compute capability
  rigbench rig --json";

/// `rigbench kernels --help`.
pub const KERNELS: &str = "\
Exit codes: 0 ok (without a GPU the benches are skipped with the reason);
1 error; 64 bad command line.

Examples:
  rigbench kernels --suite smoke
  rigbench kernels --formats bf16,w4a16 --m 1,16,64 --out r1
  rigbench kernels --check-determinism --determinism-runs 3";

/// `rigbench inspect --help`.
pub const INSPECT: &str = "\
Exit codes: 0 no error-level finding; 4 error-level findings; 1 the folder or
its metadata cannot be read; 64 bad command line.

Examples:
  rigbench inspect path/to/checkpoint
  rigbench inspect path/to/checkpoint --cc sm_120 --gpu-mem-gib 32
  rigbench inspect path/to/checkpoint --json";

/// `rigbench serve --help`.
pub const SERVE: &str = "\
Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 error (a busy port, a model that
cannot be loaded); 64 bad command line.

Examples:
  rigbench serve --model synthetic:tiny --port 8000
  rigbench serve --model synthetic:qwen3-8b --num-layers 2 --quantize nvfp4
  rigbench serve --model path/to/checkpoint --spec-method ngram --spec-k 3
  curl -s http://127.0.0.1:8000/v1/chat/completions \\
    -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'";

/// `rigbench e2e --help`.
pub const E2E: &str = "\
Built-in suites: tiny (default), fixed-1k-256, narrative, code, shared-prefix,
open-loop.

Exit codes: 0 at least one valid run; 1 error (an engine that cannot be
reached or fails, no valid run, an interruption); 64 bad command line.

Every run starts with POST /reset_prefix_cache, which empties the engine's
prefix cache (cold runs then check for 0 hits; warm runs prime it again): an
engine at --url loses what its cache held.

Examples:
  rigbench e2e
  rigbench e2e --suite fixed-1k-256 --url http://127.0.0.1:8000
  rigbench e2e --suite code --url http://127.0.0.1:8000 \\
    --engine-cmd 'vllm serve Qwen/Qwen3-8B --port 8000'";

/// `rigbench diagnose --help`.
pub const DIAGNOSE: &str = "\
Exit codes: 0 no error-level finding; 4 error-level findings; 1 a file cannot
be read; 64 bad command line.

Examples:
  rigbench diagnose --log vllm.log
  rigbench diagnose --log vllm.log --metrics metrics.txt \\
    --checkpoint ./Qwen3.6-35B-A3B-NVFP4 --cc sm_120
  rigbench diagnose --log engine.log --rig reports/my-rig/20260101T000000Z \\
    --out diag/";

/// `rigbench report --help`.
pub const REPORT: &str = "\
Exit codes: 0 ok (parts that cannot run are skipped with the reason); 1 error
(the report folder cannot be written, a results file cannot be read); 64 bad
command line.

Examples:
  rigbench report
  rigbench report --suite smoke --no-e2e --out r1
  rigbench report --checkpoint path/to/checkpoint --check-determinism
  rigbench report --save-baseline --rig-label my-rig
  rigbench report --render reports/<rig>/<time>   # redraw from results.json";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_lines_fit_80_columns_and_every_help_has_exit_codes() {
        for (name, text) in [
            ("top", TOP),
            ("rig", RIG),
            ("kernels", KERNELS),
            ("inspect", INSPECT),
            ("serve", SERVE),
            ("e2e", E2E),
            ("report", REPORT),
            ("diagnose", DIAGNOSE),
        ] {
            assert!(text.contains("Exit codes"), "{name}");
            assert!(text.contains("64"), "{name}");
            for l in text.lines() {
                assert!(l.chars().count() <= 80, "{name}: {l}");
            }
        }
    }
}
