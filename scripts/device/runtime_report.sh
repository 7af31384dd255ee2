#!/usr/bin/env bash
# Issue 10 on a GPU machine, in one command: the H200 report with the built-in runtime on the
# GPU (parity check first, then BF16 / FP8 / W4A16 e2e runs, runtime benchmarks with the decode
# bound, fidelity), plus the transformers reference check on the CUDA backend.
#
# Needs: the repo checkout with a release binary at target/release/rigbench (built elsewhere;
# no Rust here), the CUDA 13 driver, NVRTC and cuBLASLt; python3 with PyTorch for the kernel
# peers (optional: --peers off otherwise). No network.
# Outputs (under $OUT, at most 8 files): report.tgz (the report folder), serve-*.log, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=target/release/rigbench
OUT=${OUT:-/tmp/rigbench-out}
mkdir -p "$OUT"
MODEL=${MODEL:-synthetic:qwen3-8b}
REPORT_DIR=$(mktemp -d)/report

{
  echo "== rig"; $BIN rig
  echo "== serve --device cuda startup lines (KV in vLLM's form)"
} > "$OUT/summary.txt" 2>&1

# Startup lines of serve on the GPU for each format (KV capacity, memory plan), then stop it.
for q in bf16 fp8 nvfp4; do
  args=(serve --model "$MODEL" --device cuda:0 --port 0)
  [ "$q" != bf16 ] && args+=(--quantize "$q")
  timeout 600 $BIN "${args[@]}" > "$OUT/serve-$q.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q "listening on" "$OUT/serve-$q.log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  { echo "-- $q"; grep -E "KV cache|concurrency|note|error|backend on" "$OUT/serve-$q.log"; } >> "$OUT/summary.txt"
done

# The report: kernels (copy roofline, BF16 peak), then the GPU runtime section.
timeout 3000 $BIN report --model "$MODEL" --out "$REPORT_DIR" ${REPORT_ARGS:-} >> "$OUT/summary.txt" 2>&1
echo "report exit: $?" >> "$OUT/summary.txt"
tar -czf "$OUT/report.tgz" -C "$(dirname "$REPORT_DIR")" report
ls -la "$OUT" >> "$OUT/summary.txt"
