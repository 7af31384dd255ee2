#!/usr/bin/env bash
# The last device call of round 4, in one command: the W4A16 wgmma kernel after its activation
# pre-pass (scripts/device/w4a16-dev.sh: probe, then the qwen3.6-27b bench of bf16 and w4a16 at
# M = 1, 16, 64, 128, 256, 1,024, graph timing) and the runtime's decode attention and fused FP8
# quantization (scripts/device/rt24-dev.sh). Carry ["target/rb.gz"] (the stripped release
# binary, gzipped to fit the transfer limit); budget under 9.5 minutes.
# Returns in $OUT: w4.tgz and rt.tgz (each script's own outputs), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
mkdir -p target/release
[ -x target/release/rigbench ] || { gunzip -c target/rb.gz > target/release/rigbench && chmod +x target/release/rigbench; }
export NCCL_NVLS_ENABLE=0
start=$(date +%s)
OUT="$OUT/w4" BENCH_LIMIT=${BENCH_LIMIT:-150} M_LIST=1,16,64,128,256,1024 bash scripts/device/w4a16-dev.sh > "$OUT/w4-stdout.txt" 2>&1
echo "w4a16-dev exit $? after $(( $(date +%s) - start )) s" >> "$OUT/summary.txt"
OUT="$OUT/rt" bash scripts/device/rt24-dev.sh > "$OUT/rt-stdout.txt" 2>&1
echo "rt24-dev exit $? after $(( $(date +%s) - start )) s" >> "$OUT/summary.txt"
mv "$OUT/w4-stdout.txt" "$OUT/w4/"; mv "$OUT/rt-stdout.txt" "$OUT/rt/"
head -c 5000 "$OUT/w4/summary.md" 2>/dev/null; head -c 6000 "$OUT/rt/summary.txt" 2>/dev/null
tar czf "$OUT/w4.tgz" -C "$OUT" w4 && rm -rf "$OUT/w4"
tar czf "$OUT/rt.tgz" -C "$OUT" rt && rm -rf "$OUT/rt"
cat "$OUT/summary.txt"
