#!/usr/bin/env bash
# Round 5, final call on one H200, with the final binary (the GPU foundation as its own crate,
# the copy bandwidth measured after trimming the memory pool):
#   1. report --suite smoke --no-e2e --peers off --no-fidelity: every bench kernel through the
#      typed launchers of the crate, and the kernel bench's copy bandwidth;
#   2. the runtime reports of synthetic:qwen3-8b and synthetic:qwen3-32b
#      (`report --no-kernels --peers off --model ...`).
# Needs: target/rb.gz (a stripped, gzipped release binary, carried), $OUT.
# SMOKE=0 skips step 1. Returns in $OUT: summary.txt, smoke.tgz, runtime.tgz.
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
if [ "${SMOKE:-1}" = 1 ]; then
timeout -k 5 150 "$BIN" report --suite smoke --no-e2e --peers off --no-fidelity --out /tmp/smoke/report > /tmp/smoke.log 2>&1
echo "smoke report: exit $? at $(el)" >> "$S"
mkdir -p /tmp/smoke && cp /tmp/smoke.log /tmp/smoke/report.log
nvidia-smi > /tmp/smoke/nvidia-smi.txt 2>&1 || true
grep -h -i -E "copy|checks passed|failed" /tmp/smoke/report/report.md | head -8 | cut -c1-300 >> "$S"
tar -czf "$OUT/smoke.tgz" -C /tmp smoke
fi
R=/tmp/rt; rm -rf "$R"; mkdir -p "$R"
for m in qwen3-8b qwen3-32b; do
  left=$(( 585 - ($(date +%s) - START) ))
  [ "$left" -lt 60 ] && { echo "no time left for $m" >> "$S"; break; }
  timeout -k 10 "$left" "$BIN" report --no-kernels --peers off --model "synthetic:$m" --out "$R/$m" > "$R/$m.log" 2>&1
  echo "runtime report $m: exit $? at $(el)" >> "$S"
  cp "$R/$m.log" "$R/$m/report.log" 2>/dev/null
  grep -E "^- Built-in runtime|^Conditions: backend" "$R/$m/report.md" | cut -c1-700 >> "$S" 2>/dev/null
  tar -czf "$OUT/runtime.tgz" -C /tmp rt
done
