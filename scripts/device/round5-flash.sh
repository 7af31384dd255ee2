#!/usr/bin/env bash
# Round 5, second call on one H200: the flash-decoding kernel with P as BF16 hi/lo operands (on
# by default now) and the SwiGLU + FP8 quantization split over blocks, checked and measured:
#   1. devcheck --only kernels,attention: the fused SwiGLU + FP8 quant against the two launches
#      (bit for bit), every decode-attention case against the CPU reference (read-flushed L2
#      timings), whole-model greedy parity with each kernel at head_dim 64 / 128;
#   2. devcheck --only contexts --formats bf16: batch-1 decode at 128 / 4k / 32k with the flash
#      kernel and with the CUDA-core kernel, same process;
#   3. the runtime report of synthetic:qwen3-8b, then of synthetic:qwen3-32b
#      (`report --no-kernels --peers off --model ...`).
# Needs: target/rb.gz (a stripped, gzipped release binary, carried), $OUT.
# Returns in $OUT: summary.txt, devcheck.tgz, runtime.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export NCCL_NVLS_ENABLE=0
export RIGBENCH_CACHE_DIR=$(mktemp -d)
BIN=/tmp/rigbench
gunzip -c target/rb.gz > "$BIN" && chmod +x "$BIN" || { echo "no binary" > "$OUT/summary.txt"; exit 1; }
S="$OUT/summary.txt"
START=$(date +%s)
el() { echo "$(( $(date +%s) - START )) s"; }
W=/tmp/dev; mkdir -p "$W"
nvidia-smi > "$W/nvidia-smi.txt" 2>&1 || true
timeout -k 5 150 "$BIN" devcheck --only kernels,attention --preset none > "$W/attention.log" 2>&1
echo "devcheck kernels,attention: exit $? at $(el)" >> "$S"
grep -E "^(PASS|FAIL|note|attention:)" "$W/attention.log" | cut -c1-400 >> "$S"
timeout -k 5 90 "$BIN" devcheck --only contexts --preset qwen3-8b --formats bf16 > "$W/contexts.log" 2>&1
echo "devcheck contexts: exit $? at $(el)" >> "$S"
tar -czf "$OUT/devcheck.tgz" -C /tmp dev
R=/tmp/rt; rm -rf "$R"; mkdir -p "$R"
for m in qwen3-8b qwen3-32b; do
  left=$(( 585 - ($(date +%s) - START) ))
  [ "$left" -lt 60 ] && { echo "no time left for $m" >> "$S"; break; }
  timeout -k 10 "$left" "$BIN" report --no-kernels --peers off --model "synthetic:$m" --out "$R/$m" > "$R/$m.log" 2>&1
  echo "runtime report $m: exit $? at $(el)" >> "$S"
  cp "$R/$m.log" "$R/$m/report.log" 2>/dev/null
  grep -E "^- Built-in runtime" "$R/$m/report.md" >> "$S" 2>/dev/null
  tar -czf "$OUT/runtime.tgz" -C /tmp rt
done
