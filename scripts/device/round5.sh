#!/usr/bin/env bash
# Round 5 on one H200, one call per preset:
#   1. (CACHE=1) the compiled-kernel cache's effect on start-up (docs/architecture.md, "GPU
#      layer"): `report --suite smoke --no-e2e --peers off --no-fidelity` twice with an empty
#      RIGBENCH_CACHE_DIR, then `serve` of $MODEL (FP8, which also tunes) from an empty cache and
#      again from the filled one, timed to its "listening on" line;
#   2. the runtime report of $MODEL (docs/runtime.md, "In a report"):
#      `report --no-kernels --peers off --model $MODEL` (parity, e2e per format, benchmarks,
#      decode at 128 / 4k / 32k contexts, the per-op profile, the goals table).
# Needs: target/rb.gz (a stripped, gzipped release binary, carried), $OUT.
# Returns in $OUT: summary.txt, nvidia-smi.txt, cache.tgz (CACHE=1), runtime.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
MODEL=${MODEL:-synthetic:qwen3-8b}
START=$(date +%s)
export NCCL_NVLS_ENABLE=0
BIN=/tmp/rigbench
gunzip -c target/rb.gz > "$BIN" && chmod +x "$BIN" || { echo "no binary" > "$OUT/summary.txt"; exit 1; }
S="$OUT/summary.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.2f}')"; }

if [ "${CACHE:-0}" = 1 ]; then
  W=/tmp/cache-work; mkdir -p "$W"
  export RIGBENCH_CACHE_DIR=$(mktemp -d)
  for run in 1 2; do
    t0=$(now)
    timeout -k 5 150 "$BIN" report --suite smoke --no-e2e --peers off --no-fidelity \
      --out "$W/smoke$run" > "$W/smoke$run.log" 2>&1
    rc=$?; t1=$(now)
    echo "smoke report run $run (RIGBENCH_CACHE_DIR empty before run 1): exit $rc, wall $(elapsed $t0 $t1) s" >> "$S"
    grep -h -o -E "[^.]*(compiled by NVRTC|compiled-kernel cache)[^.]*" "$W/smoke$run/report.md" | sort | uniq -c >> "$S"
  done
  ls -la "$RIGBENCH_CACHE_DIR"/kernels >> "$S" 2>&1
  for run in cold warm; do
    [ "$run" = cold ] && export RIGBENCH_CACHE_DIR=$(mktemp -d)
    t0=$(now)
    "$BIN" serve --model "$MODEL" --device cuda:0 --port 0 --quantize fp8 > "$W/serve-$run.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 2400); do
      grep -q "listening on" "$W/serve-$run.log" && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    t1=$(now)
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    echo "serve $MODEL fp8 cuda:0, $run kernel cache: $(elapsed $t0 $t1) s to 'listening on'" >> "$S"
    grep -h -i -E "nvrtc|kernel cache|compiled|tun" "$W/serve-$run.log" | head -20 >> "$S"
  done
  tar -czf "$OUT/cache.tgz" -C /tmp cache-work
fi

export RIGBENCH_CACHE_DIR=${RIGBENCH_CACHE_DIR:-$(mktemp -d)}
R=/tmp/rt; rm -rf "$R"
# The call is limited to 600 s: what is left of 580 s, unless RT_LIMIT says otherwise.
RT_LIMIT=${RT_LIMIT:-$(( 580 - ($(date +%s) - START) ))}
t0=$(now)
timeout -k 10 "$RT_LIMIT" "$BIN" report --no-kernels --peers off --model "$MODEL" --out "$R/report" \
  ${REPORT_ARGS:-} > "$R.log" 2>&1
rc=$?; t1=$(now)
echo "runtime report $MODEL: exit $rc, wall $(elapsed $t0 $t1) s" >> "$S"
mkdir -p "$R"; cp "$R.log" "$R/report.log"
tar -czf "$OUT/runtime.tgz" -C /tmp rt
tail -5 "$R.log" >> "$S"
