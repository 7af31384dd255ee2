#!/usr/bin/env bash
# One device call that checks, before any report of record is taken, the parts of this round
# that had never run on a GPU (correctness only):
#
#   1. `devcheck --only wg-probe`: every launch configuration of the Hopper W4A16 wgmma kernel
#      against the CPU reference, in its own process (docs/w4a16-notes.md);
#   2. scripts/device/peers_sanity.py: Humming and vLLM's Marlin alone, whole outputs against a
#      float64 reference (docs/w4a16-notes.md, "Engine kernels beside rigbench's");
#   3. `devcheck --only hybrid,reference`: the Gated-DeltaNet kernels and hybrid parity with the
#      CPU backend, and transformers' greedy tokens of the tiny Qwen3.5 fixture on the GPU
#      (docs/runtime.md, "Hybrids").
# The speed of each part is the report of record's (scripts/device/h200-report.sh).
#
# Device `run`: carry ["target/release/rigbench", ".peers"], command
# "bash scripts/device/round4-dev.sh"; shared/fixtures/models/ (a copy of ../shared's, ignored by
# git) travels with the checkout. Budget: under 6.5 minutes (each step has its own timeout).
# Returns in $OUT: summary.txt (read first) and logs.tgz (every step's full log).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
BIN=${BIN:-target/release/rigbench}
export NCCL_NVLS_ENABLE=0
L="$OUT/logs"
mkdir -p "$L"
SUM="$OUT/summary.txt"
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$SUM"; }
nvidia-smi >"$L/nvidia-smi.txt" 2>&1 || true
say "$($BIN --version 2>&1) on $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)"

say "1. wg-probe"
timeout -k 5 100 "$BIN" devcheck --only wg-probe >"$L/wg-probe.txt" 2>&1
say "   exit $?: $(grep -E '^(PASS|FAIL|SKIP) wg-probe' "$L/wg-probe.txt" | tail -1)"
grep -E 'failed:' "$L/wg-probe.txt" | head -5 | tee -a "$SUM"

say "2. engine peers alone"
hdir="${TMPDIR:-/tmp}/rigbench-humming-dev"
if python3 -m pip install --quiet --no-index --no-deps --target "$hdir" .peers/humming/humming_kernels-*.whl >>"$L/peers.txt" 2>&1; then
    export PYTHONPATH="$hdir${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONUNBUFFERED=1 timeout -k 5 80 python3 scripts/device/peers_sanity.py >>"$L/peers.txt" 2>&1
say "   exit $?"
grep -E "^sanity|ok|FAIL|Error|error" "$L/peers.txt" | head -30 | tee -a "$SUM"

say "3. hybrid checks"
FX=shared/fixtures/models/tiny-qwen35-hybrid-transformers5
REF=()
[ -f "$FX/reference_greedy.json" ] && REF=(--hf-reference "$FX")
timeout -k 5 190 "$BIN" devcheck --only hybrid,reference --prompts 8 --steps 48 --preset none "${REF[@]}" \
    >"$L/devcheck-hybrid.log" 2>&1
say "   exit $?"
grep -E "^(PASS|FAIL|SKIP)|reference|NOT RUN" "$L/devcheck-hybrid.log" | head -40 | tee -a "$SUM"

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
say "done"
