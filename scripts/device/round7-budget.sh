#!/usr/bin/env bash
# Round 7 on one H100 or H200: the default report within its five-minute budget, and the hybrid's
# runtime report with its decode-by-context profile (state snapshots) in all three formats.
#   PARTS (space-separated, default "default hybrid"):
#     default: `report` with no flags (the default --budget 5m), from an empty kernel cache
#              (a fresh RIGBENCH_CACHE_DIR): the wall time, the plan and what it left out;
#     full:    `report --budget none` from the cache the default run filled (the full suite, for
#              comparison; only when time is left);
#     hybrid:  `report --no-kernels --peers off --model synthetic:qwen3.6-27b`: parity, e2e and
#              benchmarks in BF16 / FP8 / W4A16, and batch-1 decode by context (128 / 4k / 32k)
#              with the per-op table and the Gated-DeltaNet state bytes per step.
# Needs target/rb.gz (a stripped, gzipped release binary, carried) and $OUT. Returns in $OUT:
# summary.txt (read it first), default.tgz, hybrid.tgz (full.tgz when run).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/device/lib.sh
# An empty kernel cache: the default run compiles every kernel, as on a new GPU (lib.sh keeps an
# inherited RIGBENCH_CACHE_DIR; this script must not).
export RIGBENCH_CACHE_DIR=$(mktemp -d)
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
for p in ${PARTS:-default hybrid}; do
  l=$(left); [ "$l" -lt 60 ] && { echo "no time left for $p" >> "$S"; continue; }
  case "$p" in
    default|full)
      R=/tmp/$p; rm -rf "$R"; mkdir -p "$R"
      args=(); [ "$p" = full ] && args=(--budget none)
      t0=$(date +%s.%N)
      timeout -k 10 "$l" "$BIN" report "${args[@]}" --out "$R/report" > "$R/report.log" 2>&1
      rc=$?
      t1=$(date +%s.%N)
      echo "== $p report: exit $rc, wall $(echo "$t1 - $t0" | bc) s (process), at $(el)" >> "$S"
      grep -E "^rigbench: budget" "$R/report.log" | cut -c1-400 >> "$S"
      python3 - "$R/report/results.json" >> "$S" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("wall_s", r.get("wall_s"), "complete", r.get("complete"), "interrupted", r.get("interrupted"))
b = (r.get("budget") or {}).get("plan") or {}
print("plan m", b.get("m"), "peers", b.get("peers"), "repeats", b.get("repeats"), "estimate_s", round(b.get("estimate_s", 0), 1))
print("parts", [(k, round(v, 1)) for k, v in b.get("parts", [])])
print("left out", b.get("left_out"))
k = r.get("kernels") or {}
print("kernel cases", len(k.get("cases", [])), "skipped", len(r.get("skipped", [])), "failed", [f.get("what") for f in r.get("failed", [])])
PY
      ls "$R/report" | tr '\n' ' ' >> "$S"; echo >> "$S"
      tar -czf "$OUT/$p.tgz" -C /tmp "$p" ;;
    hybrid)
      R=/tmp/hybrid; rm -rf "$R"; mkdir -p "$R"
      timeout -k 10 "$l" "$BIN" report --no-kernels --peers off --model synthetic:qwen3.6-27b --out "$R/report" > "$R/report.log" 2>&1
      echo "== hybrid runtime report: exit $? at $(el)" >> "$S"
      grep -E "^- Built-in runtime|^Conditions: backend" "$R/report/report.md" | cut -c1-700 >> "$S" 2>/dev/null
      grep -h -E "^#### Batch-1 decode by context|Gated-DeltaNet (delta rule|causal conv)|decode by context" "$R/report/report.md" "$R/report/report-details.md" 2>/dev/null | cut -c1-300 >> "$S"
      tar -czf "$OUT/hybrid.tgz" -C /tmp hybrid ;;
    *) echo "unknown part $p" >> "$S" ;;
  esac
done
