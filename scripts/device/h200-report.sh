#!/usr/bin/env bash
# The H200 report of record, in one call: `report` with the determinism check, peers (gemlite
# carried in .peers/), both timing modes, and the built-in runtime on the GPU for
# synthetic:qwen3-32b (parity first, then BF16 / FP8 / W4A16 e2e, runtime benchmarks, fidelity).
# Carry target/release/rigbench and .peers. Writes report.tgz, report.log and nvidia-smi.txt.
set -u
B=./target/release/rigbench
S=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv >"$OUT/nvidia-smi.txt" 2>&1
timeout "${REPORT_S:-570}" $B report --check-determinism --peers on --timing both \
    --model "${MODEL:-synthetic:qwen3-32b}" --out "$OUT/rep" >"$OUT/report.log" 2>&1
echo "rc=$? after $(($(date +%s) - S)) s" >>"$OUT/report.log"
if [ ! -f "$OUT/rep/report.md" ] && [ -f "$OUT/rep/results.json" ]; then
    $B report --render "$OUT/rep" >>"$OUT/report.log" 2>&1
fi
tar czf "$OUT/report.tgz" -C "$OUT" rep && rm -rf "$OUT/rep"
tail -n 40 "$OUT/report.log"
