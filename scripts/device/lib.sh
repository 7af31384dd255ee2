# Sourced by the round scripts (scripts/device/round*.sh) after `cd` to the repository root:
# checks $OUT, sets the device-run environment, unpacks the carried binary and defines the
# budget helpers. Sets BIN (the unpacked rigbench), S ($OUT/summary.txt), START (epoch s).
#   el:   seconds since START, as "N s";
#   left: seconds left of ${BUDGET:-585} (one `run` call is 600 s at most).
# Needs target/rb.gz (a stripped, gzipped release binary, carried); a missing one writes
# "no binary" to the summary and exits 1.
: "${OUT:?set OUT to the output folder}"
export NCCL_NVLS_ENABLE=0
export RIGBENCH_CACHE_DIR=${RIGBENCH_CACHE_DIR:-$(mktemp -d)}
BIN=/tmp/rigbench
S="$OUT/summary.txt"
gunzip -c target/rb.gz > "$BIN" && chmod +x "$BIN" || { echo "no binary" > "$S"; exit 1; }
START=$(date +%s)
el() { echo "$(( $(date +%s) - START )) s"; }
left() { echo $(( ${BUDGET:-585} - ($(date +%s) - START) )); }
