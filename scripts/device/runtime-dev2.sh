#!/usr/bin/env bash
# Second development call: the transformers reference on the GPU, the W4A16 timing anatomy, a
# profiled decode step of qwen3-32b, and the whole report pipeline on a small kernel suite
# (e2e per format through serve on the GPU, runtime benchmarks, fidelity). 8 files under $OUT.
set -u
B=./target/release/rigbench
S=$(date +%s)
t() { echo "[t=$(($(date +%s) - S))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv >"$OUT/nvidia-smi.txt" 2>&1
t reference
timeout 60 $B devcheck --only reference --hf-reference .devdata/tiny-qwen3-transformers5 >"$OUT/ref.log" 2>&1
t anatomy
timeout 90 $B devcheck --only anatomy >"$OUT/anatomy.log" 2>&1
t speed
timeout 100 $B devcheck --only speed --preset qwen3-32b --formats bf16,nvfp4 >"$OUT/speed.log" 2>&1
t report
timeout "${REPORT_S:-240}" $B report --suite smoke --peers off --model synthetic:qwen3-8b --out "$OUT/rep" >"$OUT/report.log" 2>&1
echo "rc=$?" >>"$OUT/report.log"
tar czf "$OUT/rep.tgz" -C "$OUT" rep && rm -rf "$OUT/rep"
t done
cat "$OUT/ref.log" "$OUT/anatomy.log" "$OUT/speed.log"
tail -n 30 "$OUT/report.log"
