#!/usr/bin/env bash
# Round 7, "arch" branch, on one H200: the moved GPU paths ran before on the same card
# (reports/nvidia-h200-sm90/20261202T044000Z-gemm-layer-final/); run them again from the new
# places and compare. What moved: the GEMM layer to src/gemm/ (ops, tuner, FP8 quantization,
# the W4A16 configurations, candidates and launches, the wgmma host side); one CUDA prelude
# kernels/common.cuh included by every kernels/*.cu through NVRTC's include path (and hashed
# into the compiled-kernel cache key); the q/k-norm + RoPE + paged-KV-write kernel body shared
# by the dense and hybrid sources (kernels/qk_norm_rope_kv.cuh); typed GpuError variants.
#   PARTS (space-separated, default "devcheck attention wgprobe smoke rt8b"):
#     devcheck:  `devcheck --only kernels,parity,hybrid --preset none` (the self-checks of the
#                GEMM layer's quantization kernel, whole-model parity of every format through
#                the moved GEMM layer and tuner, the hybrids' checks incl. hy_qk_norm_rope_kv);
#                ONLY=... replaces the parts, PRESET=... the speed preset;
#     attention: `devcheck --only attention --preset none` (rt_qk_norm_rope_kv feeds it);
#     wgprobe:   `devcheck --only wg-probe` (the wgmma kernel from src/gemm/w4a16_wg.rs, its
#                probe from src/kernels/impls/w4a16_wg.rs);
#     smoke:     `report --suite smoke --no-e2e --peers off --no-fidelity` (every bench kernel
#                through the moved GEMM layer; the kernel notes show every module compiled with
#                the prelude: a fresh RIGBENCH_CACHE_DIR, then the same command again must say
#                "loaded from the compiled-kernel cache" for every module);
#     rt8b / rt32b: `report --no-kernels --peers off --model synthetic:qwen3-8b|32b`.
# Compare with 20261202T044000Z-gemm-layer-final/: the checks pass, the tuner's choices and the
# runtime's tok/s within run-to-run spread (2%), the same kernel sources except each file's
# SHA-256 (they now include common.cuh).
# Needs target/rb.gz (a stripped, gzipped release binary, carried) and $OUT. Returns in $OUT:
# summary.txt (read it first) and one log or tarball per part.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
for p in ${PARTS:-devcheck attention wgprobe smoke rt8b}; do
  l=$(left); [ "$l" -lt 40 ] && { echo "no time left for $p" >> "$S"; continue; }
  case "$p" in
    devcheck|attention|wgprobe)
      only=${ONLY:-kernels,parity,hybrid}; [ "$p" = attention ] && only=attention
      [ "$p" = wgprobe ] && only=wg-probe
      timeout -k 5 "$l" "$BIN" devcheck --only "$only" --preset "${PRESET:-none}" > "$OUT/$p.log" 2>&1
      echo "== $p: exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|SKIP|INFO|speed)|^note: (FP8|W4A16|kernels)|^anatomy|^wg-probe" "$OUT/$p.log" | cut -c1-400 >> "$S" ;;
    smoke)
      mkdir -p /tmp/smoke
      for run in 1 2; do
        timeout -k 5 "$(left)" "$BIN" report --suite smoke --no-e2e --peers off --no-fidelity --out "/tmp/smoke/report$run" > "/tmp/smoke/report$run.log" 2>&1
        echo "== smoke report (run $run of 2, same cache): exit $? at $(el)" >> "$S"
        grep -h -i -E "copy|checks passed|failed" "/tmp/smoke/report$run/report.md" | head -8 | cut -c1-300 >> "$S"
        grep -h -E "compiled-kernel cache|compiled by NVRTC" "/tmp/smoke/report$run/report.md" | head -8 | cut -c1-300 >> "$S"
      done
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
