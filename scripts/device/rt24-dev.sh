#!/usr/bin/env bash
# The runtime's decode attention and fused FP8 quantization on a GPU machine, in one command
# (docs/runtime.md, "Decode attention" and "Fused FP8 quantization"). Builds nothing.
#
# Needs, in the repository root on the device machine: target/release/rigbench (carried),
# python3 (stdlib only); $OUT.
# Device `run`:  carry ["target/release/rigbench"], command "bash scripts/device/rt24-dev.sh"
# Budget: under 5 minutes (each step has its own `timeout`; a step cut short keeps its partial
# log, since devcheck prints each line as it finishes).
# Returns in $OUT (5 files): summary.txt (read it first; also printed last), attention.log,
# parity.log, contexts.log, speed.log.
#
# Steps:
#   1. `devcheck --only attention` (<= 90 s): the flash-decoding kernel and the CUDA-core kernel
#      against the CPU reference on paged caches with shuffled block tables (head_dim 64/128/256,
#      BF16 and FP8 KV, contexts 1 to 32,768, batch 1 to 32, 1 to 16 query heads per KV head;
#      tolerance FLASH_DECODE_REL_L2 = 1e-2), each timed against its KV bytes ÷ copy rate; then
#      greedy parity with the CPU backend for a tiny model at head_dim 64 and 128 (BF16 and FP8
#      KV), where the flash kernel runs inside the whole model.
#   2. `devcheck --only parity` (<= 45 s): the tiny preset's parity in BF16, FP8 (its FP8
#      linears take the fused RMSNorm / SwiGLU + FP8 quantization kernels), W4A16 and FP8 KV.
#   3. `devcheck --only contexts --preset qwen3-8b` (<= 100 s): batch-1 decode at 128, 4,096 and
#      32,768 positions in BF16, FP8 and W4A16, with the flash kernel then the CUDA-core kernel,
#      and the per-op profile of one step at each context with each op's share of the bound.
#   4. `devcheck --only speed --preset qwen3-8b` (<= 70 s): the existing speed lines (batch 1
#      against the weight-streaming bound, batch 32 at 1k contexts, prefill 4k, the 4k profile).
# Knobs: BIN, FORMATS (default bf16,fp8,nvfp4), PRESET (default qwen3-8b).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
BIN=${BIN:-target/release/rigbench}
FORMATS=${FORMATS:-bf16,fp8,nvfp4}
PRESET=${PRESET:-qwen3-8b}
mkdir -p "$OUT"
SUM="$OUT/summary.txt"
: >"$SUM"
say() { echo "$*" >>"$SUM"; }
status=0
if [ ! -x "$BIN" ]; then
    say "no rigbench binary at $BIN (cargo build --release elsewhere and carry target/release/rigbench, or set BIN)"
    cat "$SUM"
    exit 1
fi
say "== $(date -u +%FT%TZ) $($BIN --version 2>/dev/null) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

step() { # name limit log args...
    local name=$1 limit=$2 log=$3
    shift 3
    say "== $name"
    timeout "$limit" "$BIN" devcheck "$@" >"$log" 2>&1
    local rc=$?
    if [ $rc -eq 124 ]; then
        say "TIMEOUT after ${limit}s (partial log kept)"
        status=1
    elif [ $rc -ne 0 ]; then
        say "exit $rc"
        status=1
        tail -3 "$log" >>"$SUM"
    fi
}

step "1. devcheck --only attention" 90 "$OUT/attention.log" --only attention --preset none --prompts 4 --steps 48
grep -E "^(PASS|FAIL|note|attention:)" "$OUT/attention.log" >>"$SUM"
step "2. devcheck --only parity (tiny)" 45 "$OUT/parity.log" --only parity --preset none --prompts 4 --steps 48
grep -E "^(PASS|FAIL|note)" "$OUT/parity.log" >>"$SUM"
step "3. devcheck --only contexts --preset $PRESET" 100 "$OUT/contexts.log" --only contexts --preset "$PRESET" --formats "$FORMATS"
grep -E "^(context |FAIL|note|contexts:)" "$OUT/contexts.log" >>"$SUM"
step "4. devcheck --only speed --preset $PRESET" 70 "$OUT/speed.log" --only speed --preset "$PRESET" --formats "$FORMATS"
grep -E "^(speed|FAIL|copy|  batch-1 decode at|  note)" "$OUT/speed.log" >>"$SUM"

# The issue's targets, from this run's own lines (a target without its line: "not measured").
python3 - "$OUT/attention.log" "$OUT/contexts.log" "$OUT/speed.log" <<'EOF' >>"$SUM"
import re, sys
att, ctx, spd = (open(p, errors="replace").read() if p else "" for p in sys.argv[1:4])
print("== goals (ratios within this run)")
# Decode attention <= 1.5x KV bytes / copy rate at 4k and 32k, batch 1 and 32 (flash kernel,
# head_dim 128, BF16 KV: Qwen3-8B's shape).
for ctxn, b in [(4096, 1), (32768, 1), (4096, 32)]:
    m = re.search(rf"attention hd128 G4 kv8 ctx{ctxn} b{b} BF16 .*?flash rel L2 \S+, [\d.]+ us = ([\d.]+)x the bound", att)
    print(f"decode attention ctx {ctxn} batch {b} <= 1.5x bound: " +
          (f"{float(m.group(1)):.2f}x -> {'met' if float(m.group(1)) <= 1.5 else 'NOT met'}" if m else "not measured: no timed flash line in attention.log"))
print("decode attention ctx 32768 batch 32: not measured: devcheck's cases stop at batch 32 x 1k and batch 32 x 4k (host memory of the CPU reference)")
targets = {"bf16": 80, "fp8": 70, "nvfp4": 60}
for f, t in targets.items():
    m = re.search(rf"context \S+ {f} Flash: batch-1 decode at 128 positions ([\d.]+) tok/s \(([\d.]+)% of the bound", ctx)
    print(f"{f} batch-1 decode at a 128-token context >= {t}% of the bound: " +
          (f"{m.group(2)}% -> {'met' if float(m.group(2)) >= t else 'NOT met'}" if m else "not measured: no Flash 128 line in contexts.log"))
m = re.search(r"speed \S+ bf16: .*batch-32 @1k [\d.]+ tok/s \(([\d.]+)x batch 1\)", spd)
print("BF16 batch 32 (1k contexts) >= 15x batch 1: " +
      (f"{m.group(1)}x -> {'met' if float(m.group(1)) >= 15 else 'NOT met'}" if m else "not measured: no bf16 speed line in speed.log"))
for f in targets:
    for c in (128, 4096, 32768):
        a = re.search(rf"context \S+ {f} Flash: batch-1 decode at {c} positions ([\d.]+) tok/s", ctx)
        b = re.search(rf"context \S+ {f} CudaCores: batch-1 decode at {c} positions ([\d.]+) tok/s", ctx)
        if a and b:
            print(f"{f} ctx {c}: flash {a.group(1)} tok/s vs cuda-cores {b.group(1)} tok/s ({float(a.group(1))/float(b.group(1)):.2f}x)")
EOF
say "== done, status $status"
cat "$SUM"
exit $status
