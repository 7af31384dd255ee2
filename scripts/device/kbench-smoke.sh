#!/usr/bin/env bash
# One-call check of the kernel-bench host paths on a GPU machine (issue 11, host side):
#   rigbench kernels --suite smoke --timing both --peers on --check-determinism
# i.e. cold and CUDA-graph timing (rotating weight copies) for rigbench's bf16/fp8/w4a16, the
# decode-step composite, the T0/BW fit, per-case clock polling, and the peers (torch matmul,
# _scaled_mm with its activation quantization, tinygemm, gemlite INT4 from .peers/).
#
# Needs, in the repository root on the device machine: target/release/rigbench (carried), .peers/
# (carried; made here by scripts/fetch-peers.sh), Python 3 with PyTorch and Triton; $OUT.
# Device `run`:  carry ["target/release/rigbench", ".peers"],
#                command "bash scripts/device/kbench-smoke.sh"
# Budget: under 2 minutes. gemlite runs with autotune 'default' here (one config per kernel: its
# Triton compiles would otherwise dominate a fresh machine); the report says its figures are
# untuned. Set RIGBENCH_GEMLITE_AUTOTUNE=fast for tuned gemlite rows.
# Returns in $OUT (at most 8 files): kbench-smoke.tgz (the report folder), report.md, log.txt,
# nvidia-smi.txt. If the 115 s guard stops it, results.json in the archive holds every case measured
# until then (re-render with `rigbench report --render DIR`).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export RIGBENCH_GEMLITE_AUTOTUNE="${RIGBENCH_GEMLITE_AUTOTUNE:-default}"
export NCCL_NVLS_ENABLE=0
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
ls -la .peers target/release/rigbench >> "$OUT/log.txt" 2>&1 || true
start=$(date +%s)
timeout -k 5 115 ./target/release/rigbench kernels --suite smoke --timing both --peers on \
    --check-determinism --out "$OUT/smoke" >> "$OUT/log.txt" 2>&1
rc=$?
echo "rigbench exit $rc after $(( $(date +%s) - start )) s" >> "$OUT/log.txt"
if [ -f "$OUT/smoke/report.md" ]; then
    cp "$OUT/smoke/report.md" "$OUT/report.md"
fi
tar czf "$OUT/kbench-smoke.tgz" -C "$OUT" smoke 2>> "$OUT/log.txt" && rm -rf "$OUT/smoke"
tail -5 "$OUT/log.txt"
exit "$rc"
