#!/usr/bin/env bash
# Round 8 (mixtures of experts on the GPU) on one H100 or H200: each part writes its log or
# tarball under $OUT and a few lines to $OUT/summary.txt (read it first).
#   PARTS (space-separated, default "moeref moe35"):
#     moe:    `devcheck --only moe,moe-gemm`: greedy parity with the CPU backend on
#             synthetic:tiny-moe (BF16, FP8, NVFP4), and the grouped expert GEMMs of the
#             qwen3.6-35b-a3b suite's [moe] table (cold and in graphs, against their byte floor);
#     moeref: `devcheck --only reference` on the tiny MoE checkpoints saved by transformers 5.24
#             (Qwen3.5-MoE and Qwen3-MoE, tests/fixtures/real/models/) and, as a regression, the
#             dense and hybrid ones: the CUDA backend must reproduce transformers' greedy tokens;
#     hybrid: `devcheck --only hybrid`: the hybrids' parity with flash-decoding attention (on by
#             default since this round) and with the CUDA-core kernel, to read each against;
#     peer:   scripts/device/moe_peer.py: PyTorch's loop of matmuls and torch._grouped_mm on the
#             same [moe] cases (BF16, graph timing as rigbench's);
#     moe35:  `report --no-kernels --peers off --model synthetic:qwen3.6-35b-a3b` (BF16, FP8,
#             W4A16: batch 1 and batch N with the experts each step touched, decode by context);
#     moe30:  the same for synthetic:qwen3-30b-a3b (Qwen3 attention with a sparse MLP);
#     ksuite: `kernels --suite suites/kernels/qwen3.6-35b-a3b.toml` at M = 1, 4, 16, 32, 64, cold
#             and graph: the dense shapes, the [moe] grouped cases and the MoE decode-step
#             composite.
# Needs target/rb.gz (a stripped, gzipped release binary, carried) and $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu --format=csv > "$S" 2>&1
F=tests/fixtures/real/models
for p in ${PARTS:-moeref moe35}; do
  l=$(left); [ "$l" -lt 45 ] && { echo "no time left for $p" >> "$S"; continue; }
  case "$p" in
    moeref)
      timeout -k 5 "$l" "$BIN" devcheck --only reference --preset none \
        --hf-reference $F/tiny-qwen35-moe-transformers5 --hf-reference $F/tiny-qwen3-moe-transformers5 \
        --hf-reference $F/tiny-qwen35-hybrid-transformers5 --hf-reference $F/tiny-qwen3-transformers5 \
        > "$OUT/moeref.log" 2>&1
      echo "== moeref: exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|SKIP)|rror" "$OUT/moeref.log" | cut -c1-260 >> "$S" ;;
    moe)
      timeout -k 5 "$l" "$BIN" devcheck --only moe,moe-gemm --preset none > "$OUT/moe.log" 2>&1
      echo "== moe devcheck: exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|SKIP)|rror" "$OUT/moe.log" | cut -c1-230 | head -40 >> "$S" ;;
    hybrid)
      timeout -k 5 "$l" "$BIN" devcheck --only hybrid --preset none > "$OUT/hybrid.log" 2>&1
      echo "== hybrid devcheck (flash decode attention by default, CUDA-core rows to read it against): exit $? at $(el)" >> "$S"
      grep -E "^(PASS|FAIL|SKIP)|rror" "$OUT/hybrid.log" | cut -c1-260 | head -40 >> "$S" ;;
    peer)
      PYTHONUNBUFFERED=1 timeout -k 5 "$l" python3 scripts/device/moe_peer.py > "$OUT/peer.txt" 2>&1
      echo "== moe peer: exit $? at $(el)" >> "$S"
      grep -E "^device|B=1 |B=32 " "$OUT/peer.txt" | cut -c1-160 | head -30 >> "$S" ;;
    moe35|moe30)
      m=qwen3.6-35b-a3b; [ "$p" = moe30 ] && m=qwen3-30b-a3b
      R=/tmp/$p; rm -rf "$R"; mkdir -p "$R"
      timeout -k 10 "$l" "$BIN" report --no-kernels --peers off --model "synthetic:$m" ${EXTRA:-} --out "$R/report" > "$R/report.log" 2>&1
      echo "== runtime report $m: exit $? at $(el)" >> "$S"
      grep -E "^- Built-in runtime|^Conditions: backend|batch [0-9]+: the last timed step" "$R/report/report.md" "$R/report/report-details.md" 2>/dev/null | cut -c1-700 >> "$S"
      tail -5 "$R/report.log" | cut -c1-400 >> "$S"
      tar -czf "$OUT/$p.tgz" -C /tmp "$p" ;;
    ksuite)
      R=/tmp/ksuite; rm -rf "$R"; mkdir -p "$R"
      timeout -k 10 "$l" "$BIN" kernels --suite suites/kernels/qwen3.6-35b-a3b.toml --m 1,4,16,32,64 \
        --formats bf16,fp8,w4a16 --timing both --peers off --max-time 0.1 --out "$R/k" > "$R/k.log" 2>&1
      echo "== kernel suite qwen3.6-35b-a3b: exit $? at $(el)" >> "$S"
      grep -A12 "Decode step with the grouped experts" "$R"/k/*.md 2>/dev/null | head -16 | cut -c1-200 >> "$S"
      tar -czf "$OUT/ksuite.tgz" -C /tmp ksuite ;;
    *) echo "unknown part $p" >> "$S" ;;
  esac
done
echo "== done at $(el)" >> "$S"
