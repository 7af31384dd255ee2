#!/usr/bin/env bash
# One-call check of rigbench's W4A16 kernels on an H200 (docs/w4a16-notes.md, "Round 3" and
# "Round 4"): the Hopper wgmma kernel (kernels/w4a16_wg.cu, since round 4 fed by the activation
# pre-pass and 16-byte copies) and the fused kernel's in-CTA split-K instances next to the
# existing paths, tuned per (shape, M) after each configuration's correctness check. Humming and
# Marlin are not run here (peers off): compare with their figures of the same card's report.
# Builds nothing.
#
# Needs, in the repository root on the device machine: target/release/rigbench (carried),
# python3 (stdlib only); $OUT.
# Device `run`:  carry ["target/release/rigbench"], command "bash scripts/device/w4a16-dev.sh"
# Budget: about 4 to 5 minutes (probe ≤ 120 s, bench ≤ BENCH_LIMIT = 210 s, fallback only when
# the bench died early).
# Returns in $OUT (at most 6 files): summary.md (also printed last), wg-probe.txt, tune.log
# (tune-nowg.log), log.txt, bench.tgz (the bench folders: report.md, results.json, kernels.csv,
# plots; and logs-full.txt: nvidia-smi and the benches' logs without the tuner lines).
#
# Steps:
#   1. `rigbench devcheck --only wg-probe`, in its own process: every launch configuration of the
#      wgmma kernel once on small shapes against the CPU reference (a kernel fault or hang ends
#      only this process) -> $OUT/wg-probe.txt.
#   2. `rigbench kernels --suite qwen3.6-27b --formats bf16,w4a16 --m $M_LIST --timing graph
#      --peers off --check-determinism` with every tuner candidate logged (RIGBENCH_TUNE_LOG=1:
#      tab-separated lines, its check verdict or launch error and its cold time) -> $OUT/bench/
#      (report.md, results.json, kernels.csv ...), $OUT/tune.log, $OUT/bench.log. When step 1
#      failed, the wgmma kernel is switched off here (RIGBENCH_W4A16_WG=off); when it passed,
#      the bench does not probe again (RIGBENCH_W4A16_WG_PROBE=off).
#   3. Only if step 2 failed with the wgmma kernel on (a crash, or CUDA errors among its skips: a
#      fault poisons the CUDA context): the same bench without it -> $OUT/bench-nowg/. A bench
#      stopped by its time limit keeps its partial results (written as it goes).
#   4. scripts/device/w4a16_dev_summary.py -> $OUT/summary.md, printed last: the probe's verdict,
#      the composite per M, the T0 / BW fits, the byte floor at M = 1, the chosen path and best
#      time per kind for every (shape, M), failed checks and skips.
# Knobs: M_LIST (default 1,16,64,128,256,1024), BENCH_LIMIT (s), BIN, and RIGBENCH_W4A16_KINDS
# (e.g. `wgmma` to offer only the wgmma kernel, making its check and time visible on every case).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
BIN=${BIN:-target/release/rigbench}
M_LIST=${M_LIST:-1,16,64,128,256,1024}
BENCH_LIMIT=${BENCH_LIMIT:-210}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[w4a16-dev $(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
ls -la "$BIN" >>"$LOG" 2>&1 || { say "no $BIN: carry target/release/rigbench"; exit 2; }

say "1. wgmma probe (own process)"
timeout -k 5 120 "$BIN" devcheck --only wg-probe >"$OUT/wg-probe.txt" 2>&1
probe_rc=$?
say "   probe exit $probe_rc after $(elapsed) s: $(grep -E '^(PASS|FAIL|SKIP) wg-probe' "$OUT/wg-probe.txt" | tail -1)"
if [ "$probe_rc" -eq 0 ]; then wg=on; else wg=off; fi

bench() { # $1 = output folder, $2 = RIGBENCH_W4A16_WG, $3 = time limit
    RIGBENCH_TUNE_LOG=1 RIGBENCH_W4A16_WG="$2" RIGBENCH_W4A16_WG_PROBE=off \
        timeout -k 5 "$3" "$BIN" kernels --suite qwen3.6-27b --formats bf16,w4a16 --m "$M_LIST" \
        --timing graph --peers off --check-determinism --out "$OUT/$1" \
        >"$OUT/$1.log" 2>"$OUT/$1.stderr"
}

say "2. bench with the wgmma kernel $wg (limit $BENCH_LIMIT s)"
bench bench "$wg" "$BENCH_LIMIT"
bench_rc=$?
grep -P '^tune\t' "$OUT/bench.stderr" >"$OUT/tune.log" 2>/dev/null || true
say "   bench exit $bench_rc after $(elapsed) s; $(wc -l <"$OUT/tune.log") tuner lines"

# A kernel fault poisons the CUDA context: every later case is skipped with a CUDA error while
# the process still exits normally, so look for such errors too.
# A bench stopped by its time limit (124, 137) was slow, not broken: its partial results stand.
died=0
case "$bench_rc" in 0|124|137) ;; *) died=1 ;; esac
if grep -qE 'CUDA_ERROR_(ILLEGAL|LAUNCH_FAILED|MISALIGNED|HARDWARE|ASSERT)' "$OUT/bench/results.json" 2>/dev/null; then
    died=1
fi
left=$(( 285 - $(elapsed) ))
if [ "$died" -eq 1 ] && [ "$wg" = on ] && [ "$left" -gt 60 ]; then
    say "3. the bench with the wgmma kernel failed (exit $bench_rc, or CUDA errors in its skips): again without it (limit $left s)"
    bench bench-nowg off "$left"
    say "   exit $? after $(elapsed) s"
    grep -P '^tune\t' "$OUT/bench-nowg.stderr" >"$OUT/tune-nowg.log" 2>/dev/null || true
fi

python3 scripts/device/w4a16_dev_summary.py "$OUT" >"$OUT/summary.md" 2>>"$LOG"
# At most 8 files come back from $OUT: keep summary.md, wg-probe.txt, tune.log (and
# tune-nowg.log), log.txt; the bench folders and their full logs go into bench.tgz.
for f in nvidia-smi.txt bench.log bench.stderr bench-nowg.log bench-nowg.stderr; do
    [ -f "$OUT/$f" ] && { echo "=== $f"; grep -v -P '^tune\t' "$OUT/$f"; } >>"$LOG.full"
done
dirs=""
for d in bench bench-nowg; do [ -d "$OUT/$d" ] && dirs="$dirs $d"; done
[ -f "$LOG.full" ] && mv "$LOG.full" "$OUT/logs-full.txt" && dirs="$dirs logs-full.txt"
if [ -n "$dirs" ]; then
    # shellcheck disable=SC2086
    tar czf "$OUT/bench.tgz" -C "$OUT" $dirs && (cd "$OUT" && rm -rf $dirs)
fi
rm -f "$OUT"/nvidia-smi.txt "$OUT"/bench.log "$OUT"/bench.stderr "$OUT"/bench-nowg.log "$OUT"/bench-nowg.stderr
say "done after $(elapsed) s; files: $(cd "$OUT" && ls | tr '\n' ' ')"
cat "$OUT/summary.md"
exit "$bench_rc"
