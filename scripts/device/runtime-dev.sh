#!/usr/bin/env bash
# Development checks of the CUDA runtime and the W4A16 kernels on a GPU machine, in one call:
# kernel checks, parity with the CPU backend, transformers' greedy reference, the W4A16 timing
# anatomy, decode/prefill speed, a kernel bench at decode M in both timing modes, and an e2e run
# through `serve` on the GPU. Needs target/release/rigbench and, for the reference check, the
# fixture model copied to .devdata/tiny-qwen3-transformers5 (both carried). Writes 8 files to
# $OUT and prints a summary last.
set -u
B=./target/release/rigbench
S=$(date +%s)
t() { echo "[t=$(($(date +%s) - S))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv >"$OUT/nvidia-smi.txt" 2>&1
t parity
timeout 150 $B devcheck --only kernels,parity,reference --hf-reference .devdata/tiny-qwen3-transformers5 >"$OUT/parity.log" 2>&1
echo "rc=$?" >>"$OUT/parity.log"
t anatomy
timeout 90 $B devcheck --only anatomy >"$OUT/anatomy.log" 2>&1
echo "rc=$?" >>"$OUT/anatomy.log"
t speed
timeout 100 $B devcheck --only speed --preset qwen3-8b >"$OUT/speed.log" 2>&1
timeout 120 $B devcheck --only speed --preset qwen3-32b >>"$OUT/speed.log" 2>&1
echo "rc=$?" >>"$OUT/speed.log"
t kernels
RIGBENCH_TUNE_LOG=1 timeout 150 $B kernels --formats bf16,fp8,w4a16 --m "${KB_M:-1,16,32,64,128}" \
    --peers off --timing both --out "$OUT/kb" >"$OUT/kbench.log" 2>&1
echo "rc=$?" >>"$OUT/kbench.log"
tar czf "$OUT/kb.tgz" -C "$OUT" kb && rm -rf "$OUT/kb"
t e2e
timeout 120 $B e2e --model synthetic:qwen3-8b --suite tiny --out "$OUT/e2e" >"$OUT/e2e.log" 2>&1
echo "rc=$?" >>"$OUT/e2e.log"
tar czf "$OUT/e2e.tgz" -C "$OUT" e2e && rm -rf "$OUT/e2e"
t done
tail -n 25 "$OUT/parity.log"
cat "$OUT/anatomy.log"
grep -E "speed|FAIL|note" "$OUT/speed.log"
grep -E "^tune|error|Error" "$OUT/kbench.log" | grep -E "w4a16" | tail -12
tail -n 4 "$OUT/kbench.log"
tail -n 6 "$OUT/e2e.log"
