#!/usr/bin/env bash
# One-call check of the engine W4A16 peers and the per-token FP8 rows on a GPU machine:
#   Humming (from the carried wheel, installed offline), vLLM's Marlin (the carried
#   .peers/vllm-marlin/libmarlin_nvfp4.so), rigbench's bf16 / fp8 / fp8-rowwise / w4a16, on the
#   smoke suite's three shapes (o_proj, in_proj_ba, gate_up) at M = 1, 16, 64, cold and graph
#   timing, every peer checked against rigbench's CPU reference on rigbench's own NVFP4 tensors.
#
# Needs in the repository root on the device machine: target/release/rigbench and .peers/ (both
# carried; .peers/ made by scripts/fetch-peers.sh), Python 3 with PyTorch, nvcc (Humming compiles
# its kernels with it), $OUT.
# Device `run`:  carry ["target/release/rigbench", ".peers"],
#                command "bash scripts/device/peers-dev.sh"
# Budget: about 4.5 minutes at most (Humming JIT-compiles about 15 s per shape; the sanity check
# has 75 s, rigbench 185 s; the guard keeps what ran: results.json in the archive, re-render with
# `rigbench report --render DIR`).
# Returns in $OUT: sanity.txt (scripts/device/peers_sanity.py: each peer alone), peers-dev.tgz
# (the report folder), report.md, table.txt (one line per peer case and skip), log.txt,
# nvidia-smi.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export NCCL_NVLS_ENABLE=0
log="$OUT/log.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
{ ls -la .peers .peers/* target/release/rigbench; python3 --version; command -v nvcc && nvcc --version | tail -1; } >> "$log" 2>&1
# Humming, offline from the carried wheel.
hdir="${TMPDIR:-/tmp}/rigbench-humming-dev"
if python3 -m pip install --quiet --no-index --no-deps --target "$hdir" .peers/humming/humming_kernels-*.whl >> "$log" 2>&1; then
    export PYTHONPATH="$hdir${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import humming, torch; print('humming', humming.__version__, 'torch', torch.__version__, torch.version.cuda)" >> "$log" 2>&1
else
    echo "Humming wheel did not install (see above)" >> "$log"
fi
python3 -c "import ctypes; l = ctypes.CDLL('.peers/vllm-marlin/libmarlin_nvfp4.so'); print('marlin entry ABI', l.rb_marlin_abi_version())" >> "$log" 2>&1
# Each peer on its own first, outside rigbench (whole outputs against a float64 reference, every
# Marlin launch path, one graph replay each): tells a peer's failure from rigbench's driving of
# it, and fills Humming's kernel cache for o_proj.
start=$(date +%s)
PYTHONUNBUFFERED=1 timeout -k 5 75 python3 scripts/device/peers_sanity.py > "$OUT/sanity.txt" 2>&1
echo "sanity exit $? after $(( $(date +%s) - start )) s" >> "$OUT/sanity.txt"
start=$(date +%s)
timeout -k 5 185 ./target/release/rigbench kernels --suite smoke --m 1,16,64 \
    --formats bf16,fp8,w4a16 --timing both --peers on --peer-providers humming,vllm-marlin \
    --max-time 0.1 --out "$OUT/peers-dev" >> "$log" 2>&1
rc=$?
echo "rigbench exit $rc after $(( $(date +%s) - start )) s" >> "$log"
if [ -f "$OUT/peers-dev/results.json" ]; then
    python3 - "$OUT/peers-dev/results.json" > "$OUT/table.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
k = r.get("kernels") or {}
for p in k.get("peers", []):
    print(f"peer {p['provider']}: ran={p['available']} {p['detail'][:160]}")
def g(c):
    t = c.get("graph") or {}
    tt = (t.get("timing") or {}).get("median_s") if t else None
    if tt is None and (c["timing"].get("graph")):
        tt = c["timing"]["median_s"]
    return tt
print(f"{'provider':12} {'impl':16} {'shape':12} {'M':>4} {'cold us':>9} {'graph us':>9} {'rel_l2':>9}  config/path")
for c in k.get("cases", []):
    cold = c["timing"]["median_s"] if not c["timing"].get("graph") else None
    gr = g(c)
    q = [e for e in c.get("extra", []) if e["name"] in ("activation_quant", "rmsnorm_quant")]
    extra = " ".join(f"{e['name']}={e['timing']['median_s'] * 1e6:.2f}us" for e in q)
    print(f"{c['provider']:12} {c['implementation']:16} {c['shape']:12} {c['m']:>4} "
          f"{(cold or 0) * 1e6:9.2f} {(gr or 0) * 1e6:9.2f} {c['check']['value'] if c.get('check') else 0:9.2e}  "
          f"{extra} {c['path'][-150:]}")
for s in k.get("skipped", []):
    print(f"SKIP {s['provider']} {s['implementation']} {s['shape']} M={s['m']}: {s['reason'][:200]}")
EOF
    cat "$OUT/table.txt"
fi
[ -f "$OUT/peers-dev/report.md" ] && cp "$OUT/peers-dev/report.md" "$OUT/report.md"
tar czf "$OUT/peers-dev.tgz" -C "$OUT" peers-dev 2>> "$log" && rm -rf "$OUT/peers-dev"
grep -E "^sanity|^  plan" "$OUT/sanity.txt"
tail -8 "$log"
exit "$rc"
