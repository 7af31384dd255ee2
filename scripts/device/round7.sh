#!/usr/bin/env bash
# Round 7 on one H100 or H200, in as few calls as the device time allows: each part writes its
# log or tarball under $OUT and a few lines to $OUT/summary.txt (read it first).
#   PARTS (space-separated, default "gemv devcheck default"):
#     gemv:     scripts/device/gemv_probe.py (kernels/gemv.cu against cuBLAS through PyTorch on the
#               same card: correctness and time at M = 1, 2, 4, 8, cold L2, CUDA graphs);
#     devcheck: `devcheck --only kernels,parity,hybrid --preset none` (the GEMM layer from its
#               new room src/gemm/, the CUDA prelude, the hybrids; the runtime's GEMV tuning runs
#               inside every whole-model parity load);
#     default:  `report` with no flags (the default --budget 5m) from an empty kernel cache: the
#               wall time, the plan and what it left out (scripts/device/round7-budget.sh);
#     hybrid:   `report --no-kernels --peers off --model synthetic:qwen3.6-27b` (three formats,
#               decode by context with the Gated-DeltaNet state snapshots);
#     rt8b:     `report --no-kernels --peers off --model synthetic:qwen3-8b` (the runtime with the
#               GEMVs chosen at load: backend notes list each choice and both times).
# Needs target/rb.gz (a stripped, gzipped release binary, carried) and $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
# An empty kernel cache for the default part, as on a new GPU (lib.sh keeps an inherited one).
export RIGBENCH_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu --format=csv > "$S" 2>&1
for p in ${PARTS:-gemv devcheck default}; do
  l=$(left); [ "$l" -lt 45 ] && { echo "no time left for $p" >> "$S"; continue; }
  case "$p" in
    gemv)
      PYTHONUNBUFFERED=1 timeout -k 5 "$l" python3 scripts/device/gemv_probe.py > "$OUT/gemv.txt" 2>&1
      echo "== gemv probe: exit $? at $(el)" >> "$S"
      grep -E "^device| M=1 | M=8 " "$OUT/gemv.txt" | grep -E "^device|cublas|w8_u4" | cut -c1-200 >> "$S" ;;
    devcheck)
      timeout -k 5 "$l" "$BIN" devcheck --only "${ONLY:-kernels,parity,hybrid}" --preset none > "$OUT/devcheck.log" 2>&1
      echo "== devcheck: exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|SKIP)" "$OUT/devcheck.log" | cut -c1-220 >> "$S"
      grep -E "small-M path|GEMV" "$OUT/devcheck.log" | head -3 | cut -c1-600 >> "$S" ;;
    default)
      R=/tmp/default; rm -rf "$R"; mkdir -p "$R"
      t0=$(date +%s)
      timeout -k 10 "$l" "$BIN" report --out "$R/report" > "$R/report.log" 2>&1
      echo "== default report: exit $?, wall $(( $(date +%s) - t0 )) s (process), at $(el)" >> "$S"
      grep -E "^rigbench: budget" "$R/report.log" | cut -c1-400 >> "$S"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('wall_s', r.get('wall_s'), 'budget', json.dumps(r.get('budget'))[:900])" "$R/report/results.json" >> "$S" 2>&1
      tar -czf "$OUT/default.tgz" -C /tmp default ;;
    hybrid|rt8b)
      m=qwen3.6-27b; [ "$p" = rt8b ] && m=qwen3-8b
      R=/tmp/$p; rm -rf "$R"; mkdir -p "$R"
      timeout -k 10 "$l" "$BIN" report --no-kernels --peers off --model "synthetic:$m" --out "$R/report" > "$R/report.log" 2>&1
      echo "== runtime report $m: exit $? at $(el)" >> "$S"
      grep -E "^- Built-in runtime|^Conditions: backend" "$R/report/report.md" | cut -c1-700 >> "$S" 2>/dev/null
      grep -h -E "small-M path" "$R/report/report.md" "$R/report/report-details.md" 2>/dev/null | head -3 | cut -c1-900 >> "$S"
      tar -czf "$OUT/$p.tgz" -C /tmp "$p" ;;
    *) echo "unknown part $p" >> "$S" ;;
  esac
done
echo "== done at $(el)" >> "$S"
