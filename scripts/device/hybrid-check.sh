#!/usr/bin/env bash
# The Qwen3.5 / 3.6 hybrid runtime on a GPU machine, in one command (docs/runtime.md, "Hybrids"):
#
#   1. `devcheck --only hybrid,reference`: the Gated-DeltaNet kernels against the CPU backend on
#      random inputs (the model's dims and Qwen3.6-27B's 128-wide heads); parity with the CPU
#      backend on synthetic:tiny-hybrid in BF16, FP8, W4A16 and with an FP8 KV cache, and on a
#      head_dim-256 variant (the wide attention kernel); decode after a chunked prefill against
#      decode after a token-by-token prefill; and, when the fixture is found, transformers'
#      greedy tokens of shared/fixtures/models/tiny-qwen35-hybrid-transformers5 on the GPU
#      (every token, or a near-tie named: the CPU's GPU-rounding mode leaves 'kernels stream'
#      at step 10, a 0.0147-logit near-tie);
#   2. `serve --model synthetic:qwen3.6-27b` startup lines (KV cache of the 16 attention layers,
#      Gated-DeltaNet state slots, what "KV cache size" counts);
#   3. `devcheck --only speed --preset qwen3.6-27b`: batch-1 decode against the weight-streaming
#      bound (weights + the state read and written + the KV at 4,096 tokens), batch 32 at
#      4,096-token contexts, prefill of 4,096 tokens, per format (bf16, fp8, nvfp4; the mixed
#      recipe with MIXED=1), with a per-op profile of one step.
#   With REPORT=1 afterwards (longer than the 5 minutes of steps 1-3; run it as its own call):
#   4. `report --no-kernels --peers off --model synthetic:qwen3.6-27b`: e2e through `rigbench
#      serve`, the runtime benchmarks and the fidelity table in BF16, FP8 and W4A16.
#
# Needs: the repo checkout with a release binary at target/release/rigbench (built elsewhere),
# the CUDA driver, NVRTC and cuBLASLt. FIXTURE=dir overrides where the transformers fixture is
# looked for (default: shared/fixtures/... in the checkout, then ../shared/fixtures/...).
# Outputs under $OUT: summary.txt (read it first), devcheck-hybrid.log, devcheck-speed.log,
# serve-27b.log, and with REPORT=1 report.tgz. Exit status: 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/rigbench}
OUT=${OUT:-/tmp/rigbench-out}
mkdir -p "$OUT"
SUM="$OUT/summary.txt"
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
status=0

if [ ! -x "$BIN" ]; then
    say "no rigbench binary at $BIN (cargo build --release elsewhere and carry target/release/rigbench, or set BIN)"
    exit 1
fi
say "== $(date -u +%FT%TZ) $($BIN --version 2>/dev/null) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

FIXTURE=${FIXTURE:-}
if [ -z "$FIXTURE" ]; then
    for d in shared/fixtures/models/tiny-qwen35-hybrid-transformers5 ../shared/fixtures/models/tiny-qwen35-hybrid-transformers5; do
        [ -f "$d/reference_greedy.json" ] && FIXTURE=$d && break
    done
fi
REF=()
if [ -n "$FIXTURE" ] && [ -f "$FIXTURE/reference_greedy.json" ]; then
    REF=(--hf-reference "$FIXTURE")
else
    say "NOT RUN: transformers' reference tokens on the GPU: the fixture tiny-qwen35-hybrid-transformers5 is not in this tree (carry shared/ or set FIXTURE=dir)"
fi

# 1. Correctness on the GPU (about a minute).
say "== 1. hybrid checks (devcheck --only hybrid,reference)"
timeout 300 "$BIN" devcheck --only hybrid,reference --prompts 8 --steps 48 --preset none "${REF[@]}" \
    >"$OUT/devcheck-hybrid.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL)|reference|note:" "$OUT/devcheck-hybrid.log" | tee -a "$SUM"
[ $rc -ne 0 ] && { status=1; say "devcheck hybrid exit $rc (see devcheck-hybrid.log)"; tail -5 "$OUT/devcheck-hybrid.log" >>"$SUM"; }

# 2. Startup lines of the 27B shape in BF16 (the KV and state plan), then stop it.
say "== 2. serve --model synthetic:qwen3.6-27b --device cuda:0 (startup lines)"
timeout 240 "$BIN" serve --model synthetic:qwen3.6-27b --device cuda:0 --port 0 --max-model-len 32768 \
    >"$OUT/serve-27b.log" 2>&1 &
pid=$!
for _ in $(seq 1 220); do
    grep -q "listening on" "$OUT/serve-27b.log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
kill $pid 2>/dev/null
wait $pid 2>/dev/null
grep -E "KV cache|concurrency|Hybrid|state|lowered|prefix caching|error|Error" "$OUT/serve-27b.log" | tee -a "$SUM"

# 3. Speed of the 27B shape per format (about a minute each).
say "== 3. speed (devcheck --only speed --preset qwen3.6-27b)"
SPEED_ARGS=(--only speed --preset qwen3.6-27b --formats "${FORMATS:-bf16,fp8,nvfp4}")
[ "${MIXED:-0}" = 1 ] && SPEED_ARGS+=(--with-mixed)
timeout 420 "$BIN" devcheck "${SPEED_ARGS[@]}" >"$OUT/devcheck-speed.log" 2>&1
rc=$?
grep -E "^(speed|FAIL|copy)|batch-1 decode at" "$OUT/devcheck-speed.log" | tee -a "$SUM"
[ $rc -ne 0 ] && { status=1; say "devcheck speed exit $rc (see devcheck-speed.log)"; tail -5 "$OUT/devcheck-speed.log" >>"$SUM"; }
# Targets (docs/runtime.md): BF16 batch 1 >= 75% of its bound; W4A16 batch 1 >= 1.8x BF16.
python3 - "$OUT/devcheck-speed.log" <<'EOF' | tee -a "$SUM"
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"speed \S+ (\S+): .*batch-1 decode ([\d.]+) tok/s \((\d+)% of the bound", line)
    if m:
        rows[m.group(1)] = (float(m.group(2)), int(m.group(3)))
if "bf16" in rows:
    t, pct = rows["bf16"]
    print(f"target BF16 batch 1 >= 75% of the bound: {pct}% -> {'met' if pct >= 75 else 'MISSED'}")
    if "nvfp4" in rows:
        r = rows["nvfp4"][0] / t
        print(f"target W4A16 batch 1 >= 1.8x BF16: {r:.2f}x -> {'met' if r >= 1.8 else 'MISSED'}")
EOF

# 4. The report (REPORT=1; long).
if [ "${REPORT:-0}" = 1 ]; then
    REPORT_DIR=$(mktemp -d)/report
    say "== 4. report --no-kernels --peers off --model synthetic:qwen3.6-27b"
    timeout "${REPORT_TIMEOUT:-3000}" "$BIN" report --no-kernels --peers off --model synthetic:qwen3.6-27b \
        --out "$REPORT_DIR" ${REPORT_ARGS:-} >"$OUT/report.log" 2>&1
    say "report exit: $?"
    tail -20 "$OUT/report.log" >>"$SUM"
    tar -czf "$OUT/report.tgz" -C "$(dirname "$REPORT_DIR")" report
fi
say "== done, status $status"
exit $status
