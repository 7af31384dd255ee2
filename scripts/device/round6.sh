#!/usr/bin/env bash
# Round 6 on one H200: the GEMM layer shared by the kernel bench and the runtime (kernels::ops,
# kernels::tuner), and the checks that had not run on a GPU.
#   PARTS (space-separated, default "devcheck smoke rt8b"):
#     devcheck: `devcheck --only kernels,parity,hybrid --preset none` (the fused-quant self-checks
#               against the GEMM layer's quantization kernel, whole-model parity of every format
#               through the shared FP8 path and tuner, and the hybrids' checks with the flash-
#               decoding parity rows);
#               (ONLY=... replaces the parts, PRESET=... the speed preset);
#     attention: `devcheck --only attention --preset none`;
#     smoke:    `report --suite smoke --no-e2e --peers off --no-fidelity` (every bench kernel,
#               fp8-rowwise through kernels::ops, the bench's tuner through kernels::tuner);
#     rt8b / rt32b: `report --no-kernels --peers off --model synthetic:qwen3-8b|32b`.
# Needs target/rb.gz (a stripped, gzipped release binary, carried) and $OUT. Returns in $OUT:
# summary.txt (read it first) and one log or tarball per part.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
for p in ${PARTS:-devcheck smoke rt8b}; do
  l=$(left); [ "$l" -lt 40 ] && { echo "no time left for $p" >> "$S"; continue; }
  case "$p" in
    devcheck|attention)
      only=${ONLY:-kernels,parity,hybrid}; [ "$p" = attention ] && only=attention
      timeout -k 5 "$l" "$BIN" devcheck --only "$only" --preset "${PRESET:-none}" > "$OUT/$p.log" 2>&1
      echo "== $p: exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|INFO|speed)|^note: (FP8|W4A16|kernels)|^anatomy" "$OUT/$p.log" | cut -c1-400 >> "$S" ;;
    smoke)
      timeout -k 5 "$l" "$BIN" report --suite smoke --no-e2e --peers off --no-fidelity --out /tmp/smoke/report > /tmp/smoke.log 2>&1
      echo "== smoke report: exit $? at $(el)" >> "$S"
      mkdir -p /tmp/smoke && cp /tmp/smoke.log /tmp/smoke/report.log
      grep -h -i -E "copy|checks passed|failed" /tmp/smoke/report/report.md | head -8 | cut -c1-300 >> "$S"
      tar -czf "$OUT/smoke.tgz" -C /tmp smoke ;;
    rt8b|rt32b)
      m=qwen3-8b; [ "$p" = rt32b ] && m=qwen3-32b
      R=/tmp/rt; mkdir -p "$R"
      timeout -k 10 "$l" "$BIN" report --no-kernels --peers off --model "synthetic:$m" --out "$R/$m" > "$R/$m.log" 2>&1
      echo "== runtime report $m: exit $? at $(el)" >> "$S"
      cp "$R/$m.log" "$R/$m/report.log" 2>/dev/null
      grep -E "^- Built-in runtime|^Conditions: backend" "$R/$m/report.md" | cut -c1-700 >> "$S" 2>/dev/null
      tar -czf "$OUT/runtime.tgz" -C /tmp rt ;;
    *) echo "unknown part $p" >> "$S" ;;
  esac
done
