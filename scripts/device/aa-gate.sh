#!/usr/bin/env bash
# Measure the CI gate's false-alarm and detection rates on this GPU (issue 13; method in
# docs/gate.md). Run on the GPU machine from the repository root, with the release binary at
# target/release/rigbench and python3 (stdlib only) on the PATH; writes under $OUT:
#
#   aa-gate-summary.md    the rates (the table docs/gate.md quotes) and what was flagged
#   aa-gate-summary.json  the same, machine-readable
#   aa-gate-runs.tgz      every run's results.json, report.md and log, and every compare's JSON
#   aa-gate.log           this script's log
#
# What it does:
#   1. RUNS independent runs (separate processes) of the same binary with the same flags:
#      `report --no-e2e --peers off` on the kernel suite SUITE restricted to the M values M_LIST
#      (every shape kept). Run 1 has BASE_REPEATS repeats and is saved as the baseline (as CI
#      would save one); runs 2..RUNS have REPEATS repeats (as each CI job would measure).
#   2. A/A: each of runs 2..RUNS compared with the baseline at the default thresholds (exit 0 is
#      a pass); a comparison that fails is repeated with --confirm (re-measures the flagged
#      cases on this GPU) when CONFIRM=1.
#   3. Detection: for each of runs 2..RUNS and each (implementation, shape) measured, the same
#      comparison with a PLANT% slowdown planted in that implementation on that shape (the raw
#      samples of the results scaled: `compare --plant`, a test hook allowed by
#      RIGBENCH_TEST_HOOKS=1). A trial detects when a metric of that implementation and shape
#      regresses and nothing else does. With CONFIRM=1 the gate is `compare --confirm`: every
#      trial not detected cleanly is re-run with --confirm, and so is a sample of
#      CONFIRM_PLANT_TRIALS clean ones (the plant applies to the re-measurement too: it must
#      still be caught).
#   4. The summary.
#
# Knobs (environment): RUNS=11 BASE_REPEATS=6 REPEATS=3 M_LIST=1,16,256,2048 SUITE=qwen3.6-27b
# PLANT=10 CONFIRM=1 CONFIRM_PLANT_TRIALS=6 BIN=target/release/rigbench JOBS=$(nproc).
# AA_SKIP_MEASURE=1 with AA_WORK=DIR skips step 1 and uses DIR/run01..runNN (a CPU self-test of
# steps 2-4, e.g. on runs resampled from committed reports by scripts/aa_gate_resample.py; its
# rates are not evidence).
set -uo pipefail
# Paths given relative to the caller's directory, before moving to the repository root.
if [ -n "${AA_BASELINE:-}" ] && [ -e "$AA_BASELINE" ]; then
    AA_BASELINE=$(realpath "$AA_BASELINE")
fi
cd "$(dirname "$0")/../.."

BIN=${BIN:-target/release/rigbench}
OUT=${OUT:?set OUT to the folder for the results}
RUNS=${RUNS:-11}
BASE_REPEATS=${BASE_REPEATS:-6}
REPEATS=${REPEATS:-3}
M_LIST=${M_LIST:-1,16,256,2048}
SUITE=${SUITE:-qwen3.6-27b}
PLANT=${PLANT:-10}
CONFIRM=${CONFIRM:-1}
CONFIRM_PLANT_TRIALS=${CONFIRM_PLANT_TRIALS:-6}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
WORK=${AA_WORK:-$(mktemp -d)}
LABEL=aa-gate

# Comparisons of an earlier session in a reused AA_WORK would be counted: start afresh.
rm -rf "$WORK/compare"
mkdir -p "$OUT" "$WORK/compare"
LOG="$OUT/aa-gate.log"
: >"$LOG"
say() { echo "[aa-gate $(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

if [ ! -x "$BIN" ]; then
    say "no rigbench binary at $BIN (build it with cargo build --release, or set BIN)"
    exit 1
fi
# AA_BASELINE=FILE: compare with a baseline saved earlier (e.g. by another session on another
# machine of the same kind: the gate as CI meets it, days apart); every run is then a CI run.
FIRST=2
if [ -n "${AA_BASELINE:-}" ]; then
    FIRST=1
    [ -f "$AA_BASELINE" ] || { say "AA_BASELINE=$AA_BASELINE is not a file"; exit 64; }
fi
if [ $((RUNS - FIRST + 1)) -lt 10 ]; then
    say "RUNS=$RUNS: at least 10 A/A comparisons are needed (11 runs, or 10 with AA_BASELINE)"
    exit 64
fi
FLAGS=(--suite "$SUITE" --m "$M_LIST" --no-e2e --peers off --rig-label "$LABEL")
t0=$(date +%s)
declare -A RUN_S

# 1. Runs.
if [ "${AA_SKIP_MEASURE:-0}" != 1 ]; then
    for i in $(seq 1 "$RUNS"); do
        dir=$(printf '%s/run%02d' "$WORK" "$i")
        rm -rf "$dir"
        s=$(date +%s)
        if [ "$i" -eq 1 ] && [ "$FIRST" -eq 2 ]; then
            "$BIN" report "${FLAGS[@]}" --repeats "$BASE_REPEATS" --out "$dir" \
                --save-baseline --baseline-dir "$WORK/baselines" --force-baseline \
                >"$dir.log" 2>&1
        else
            "$BIN" report "${FLAGS[@]}" --repeats "$REPEATS" --out "$dir" >"$dir.log" 2>&1
        fi
        rc=$?
        RUN_S[$i]=$(( $(date +%s) - s ))
        say "run $i: exit $rc in ${RUN_S[$i]} s"
        if [ "$i" -eq 2 ]; then
            projected=$(( RUN_S[1] + (RUNS - 1) * RUN_S[2] ))
            say "projected measuring time: ${projected} s (target about 240 s; if far above, lower M_LIST or REPEATS)"
        fi
        if [ "$rc" -ne 0 ]; then
            say "run $i failed (see $dir.log); stopping"
            tail -20 "$dir.log" | tee -a "$LOG" >&2
            exit 1
        fi
    done
else
    say "AA_SKIP_MEASURE=1: using the runs in $WORK (a self-test of the pipeline, not evidence)"
    if [ -z "${AA_BASELINE:-}" ]; then
        rm -rf "$WORK/baselines"
        "$BIN" report --render "$WORK/run01" --save-baseline --baseline-dir "$WORK/baselines" \
            --force-baseline >>"$LOG" 2>&1 || { say "cannot save run01 as the baseline"; exit 1; }
    fi
fi
t_measured=$(date +%s)
if [ -n "${AA_BASELINE:-}" ]; then
    # The baseline the comparisons use travels with the evidence.
    mkdir -p "$WORK/baselines/external"
    cp "$AA_BASELINE" "$WORK/baselines/external/" 2>/dev/null || true
fi
# Keep what was measured even if a time limit stops the comparisons (the final pack replaces it).
if [ "${AA_SKIP_MEASURE:-0}" != 1 ]; then
    tar -C "$WORK" -czf "$OUT/aa-gate-runs.tgz" --exclude='*.svg' --exclude='kernels.csv' \
        $(cd "$WORK" && ls -d run[0-9]* baselines 2>/dev/null)
    say "measured runs packed into $OUT/aa-gate-runs.tgz"
fi
BASELINE=${AA_BASELINE:-$(ls "$WORK"/baselines/*/*.json 2>/dev/null | head -1)}
if [ -z "$BASELINE" ]; then
    say "no baseline was saved under $WORK/baselines"
    exit 1
fi
say "baseline: $BASELINE"

# 2. A/A comparisons.
export RIGBENCH_TEST_HOOKS=1
for i in $(seq "$FIRST" "$RUNS"); do
    run=$(printf '%s/run%02d' "$WORK" "$i")
    out=$(printf '%s/compare/aa_%02d' "$WORK" "$i")
    "$BIN" compare --baseline "$BASELINE" "$run" --json >"$out.json" 2>"$out.err"
    echo $? >"$out.rc"
    say "A/A run $i: exit $(cat "$out.rc")"
    if [ "$(cat "$out.rc")" = 2 ] && [ "$CONFIRM" = 1 ]; then
        "$BIN" compare --baseline "$BASELINE" "$run" --json --confirm \
            >"${out}_confirm.json" 2>"${out}_confirm.err"
        echo $? >"${out}_confirm.rc"
        say "A/A run $i with --confirm: exit $(cat "${out}_confirm.rc")"
    fi
done
t_aa=$(date +%s)

# 3. Planted slowdowns: one trial per (run, implementation, shape).
python3 - "$(printf '%s/run%02d' "$WORK" "$FIRST")/results.json" >"$WORK/targets.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
seen = []
for c in r["kernels"]["cases"]:
    if c["provider"] == "rigbench" and (c["implementation"], c["shape"]) not in seen:
        seen.append((c["implementation"], c["shape"]))
for i, s in seen:
    print(i, s)
PY
: >"$WORK/trials.txt"
for i in $(seq "$FIRST" "$RUNS"); do
    while read -r impl shape; do
        printf '%02d %s %s\n' "$i" "$impl" "$shape" >>"$WORK/trials.txt"
    done <"$WORK/targets.txt"
done
trial() {
    local i=$1 impl=$2 shape=$3
    local run="$WORK/run$i" out="$WORK/compare/plant_${i}_${impl}_${shape}"
    "$BIN" compare --baseline "$BASELINE" "$run" --json \
        --plant "kernels/rigbench/$impl/$shape/*=$PLANT" >"$out.json" 2>"$out.err"
    echo $? >"$out.rc"
}
export -f trial
export BIN BASELINE WORK PLANT
xargs -P "$JOBS" -L 1 bash -c 'trial "$@"' _ <"$WORK/trials.txt"
say "planted trials: $(wc -l <"$WORK/trials.txt")"
# The gate is `compare --confirm`: re-run with --confirm every trial that the plain comparison
# did not detect cleanly (another metric flagged, or the planted one missed), and a sample of
# CONFIRM_PLANT_TRIALS clean trials spread over the list (the plant applies to the
# re-measurement too: it must still be caught).
if [ "$CONFIRM" = 1 ] && [ "${AA_SKIP_MEASURE:-0}" != 1 ]; then
    python3 - "$WORK" "$CONFIRM_PLANT_TRIALS" >"$WORK/confirm-trials.txt" <<'PY'
import json, sys
work, sample = sys.argv[1], max(0, int(sys.argv[2]))
unclean, clean = [], []
for line in open(f"{work}/trials.txt"):
    i, impl, shape = line.split()
    prefix = f"kernels/rigbench/{impl}/{shape}/"
    try:
        rows = json.load(open(f"{work}/compare/plant_{i}_{impl}_{shape}.json")).get("rows", [])
    except (OSError, ValueError):
        rows = []
    fail = [r["id"] for r in rows if r.get("verdict") in ("regressed", "missing")]
    ok = any(f.startswith(prefix) for f in fail) and all(f.startswith(prefix) for f in fail)
    (clean if ok else unclean).append(line.strip())
step = max(1, len(clean) // sample) if sample > 0 else 0
picked = clean[::step][:sample] if step else []
for t in unclean + picked:
    print(t)
PY
    say "planted trials re-run with --confirm: $(wc -l <"$WORK/confirm-trials.txt") (every unclean one, and a sample of clean ones)"
    while read -r i impl shape; do
        out="$WORK/compare/plant_${i}_${impl}_${shape}_confirm"
        "$BIN" compare --baseline "$BASELINE" "$WORK/run$i" --json --confirm \
            --plant "kernels/rigbench/$impl/$shape/*=$PLANT" >"$out.json" 2>"$out.err" </dev/null
        echo $? >"$out.rc"
        say "planted trial $i $impl $shape with --confirm: exit $(cat "$out.rc")"
    done <"$WORK/confirm-trials.txt"
fi
t_end=$(date +%s)

# 4. Summary.
cat >"$WORK/settings.json" <<JSON
{"runs": $RUNS, "base_repeats": $BASE_REPEATS, "repeats": $REPEATS, "m_list": "$M_LIST",
 "suite": "$SUITE", "plant_percent": $PLANT, "confirm": $CONFIRM,
 "skip_measure": ${AA_SKIP_MEASURE:-0}, "first_compared_run": $FIRST,
 "baseline_file": "$(basename "$BASELINE")", "external_baseline": $([ -n "${AA_BASELINE:-}" ] && echo true || echo false),
 "seconds": {"measure": $((t_measured - t0)), "aa": $((t_aa - t_measured)),
             "planted": $((t_end - t_aa)), "total": $((t_end - t0))},
 "run_seconds": {$(for k in "${!RUN_S[@]}"; do printf '"%s": %s,' "$k" "${RUN_S[$k]}"; done | sed 's/,$//')}}
JSON
python3 scripts/device/aa_gate_summary.py "$WORK" "$OUT" 2>>"$LOG" || {
    say "the summary failed (see $LOG)"
    exit 1
}

# 5. Pack the evidence (runs' results, reports and logs; compare outputs).
tar -C "$WORK" -czf "$OUT/aa-gate-runs.tgz" \
    --exclude='*.svg' --exclude='kernels.csv' \
    $(cd "$WORK" && ls -d run[0-9]* baselines compare settings.json 2>/dev/null)
say "done in $((t_end - t0)) s; summary in $OUT/aa-gate-summary.md"
cat "$OUT/aa-gate-summary.md"
