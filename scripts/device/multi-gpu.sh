#!/usr/bin/env bash
# Issue 15 on a machine with two or more GPUs (written for nvidia-h200-x2), in one command of
# about 2-4 minutes: `rigbench rig`, then `rigbench report --devices all`, which benches the
# kernel suite on every GPU at once, measures the interconnect (P2P copies, NCCL all-reduce at
# the decode-step and large sizes), runs the PyTorch peers (tensor.to copies,
# torch.distributed all_reduce with NCCL: scripts/peer_multigpu.py, embedded in the binary), and
# writes the TP section. Packs everything into one archive under $OUT and prints a summary last.
#
# Needs: this checkout, target/release/rigbench (carried), python3 with PyTorch (for the peers),
# libnccl.so.2 (or RIGBENCH_NCCL_LIB=/path/to/libnccl.so.N). No Rust, no network.
# Kernel suite: qwen3.6-27b (all 8 shapes, so the decode-step composite is whole) at the decode
# M values 1..256, formats bf16,fp8,w4a16 (w4a4 needs sm_100+). Override with SUITE_ARGS, e.g.
#   SUITE_ARGS="--suite smoke" scripts/device/multi-gpu.sh
# Outputs: $OUT/multi-gpu-report.tgz (report folder, rig.md, rig.json, nvidia-smi topology,
# logs) and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
B=${RIGBENCH:-target/release/rigbench}
SUITE_ARGS=${SUITE_ARGS:---suite qwen3.6-27b --m 1,2,4,8,16,32,64,128,256 --formats bf16,fp8,w4a16}
# NVLink multicast is switched off on these machines; rigbench sets it too, for itself and for
# every child it starts.
export NCCL_NVLS_ENABLE=0

W=$(mktemp -d)
mkdir -p "$W/multi-gpu"
D="$W/multi-gpu"
started=$(date +%s)

{
    nvidia-smi -L
    echo
    nvidia-smi topo -m
    echo
    nvidia-smi topo -p2p r
    echo
    nvidia-smi nvlink -s 2>/dev/null | head -60
} >"$D/nvidia-smi-topology.txt" 2>&1

timeout 60 "$B" rig >"$D/rig.md" 2>"$D/rig.stderr"
echo "rig: exit $?" >>"$D/exit-codes.txt"
timeout 60 "$B" rig --json >"$D/rig.json" 2>>"$D/rig.stderr"

# shellcheck disable=SC2086
timeout 270 "$B" report --devices all --no-e2e --peers on $SUITE_ARGS --out "$D/report" \
    >"$D/report.stdout" 2>"$D/report.stderr"
rc=$?
echo "report: exit $rc (124 = stopped by the 270 s limit; results.json keeps what was measured)" >>"$D/exit-codes.txt"
# A report cut short still has results.json: render what it has.
if [ ! -f "$D/report/report.md" ] && [ -f "$D/report/results.json" ]; then
    "$B" report --render "$D/report" >>"$D/report.stdout" 2>>"$D/report.stderr"
fi

tar czf "$OUT/multi-gpu-report.tgz" -C "$W" multi-gpu

python3 - "$D/report/results.json" "$rc" "$(( $(date +%s) - started ))" >"$OUT/summary.txt" 2>&1 <<'PY'
import json, sys
path, rc, secs = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"multi-gpu.sh: report exit {rc}, {secs} s; archive multi-gpu-report.tgz")
try:
    r = json.load(open(path))
except Exception as e:  # noqa: BLE001
    print(f"no results.json: {e}")
    sys.exit(0)
rig = r.get("rig", {})
print(f"rig label {r.get('rig_label')}; GPUs: " + "; ".join(f"{g['index']}: {g['name']}" for g in rig.get("gpus", [])))
t = rig.get("topology") or {}
for l in t.get("links", []):
    print(f"  link GPU{l['a']}-GPU{l['b']}: {l['connection']}, P2P access {l.get('p2p_access')} (source {t.get('source')})")
k = r.get("kernels") or {}
mg = r.get("multi_gpu") or {}
print(f"kernel cases: first GPU {len(k.get('cases', []))}; others: " +
      ", ".join(f"GPU{d['device']} {len((d.get('kernels') or {}).get('cases', []))}" + (f" ERROR {d['error']}" if d.get('error') else "")
                for d in mg.get("device_kernels", [])))
sp = mg.get("spread") or {}
for d in sp.get("devices", []):
    g = d.get("geomean_vs_fastest")
    print(f"  GPU{d['device']}: {d['cases']} cases, vs fastest {'n/a' if g is None else f'{(g-1)*100:+.1f}%'}, median SM clock {d.get('median_sm_clock_mhz')} MHz, throttle {d.get('throttle')}")
for f in sp.get("findings", []):
    print(f"  FINDING {f['id']}: {f['message']}")
peers = mg.get("peers") or {}
pc = {(c["src"], c["dst"]): c for c in peers.get("p2p", [])}
for c in (mg.get("p2p") or {}).get("copies", []):
    p = pc.get((c["src"], c["dst"]))
    extra = f"; torch {p['bytes_per_s']/1e9:.1f} GB/s ({(c['bytes_per_s']/p['bytes_per_s']-1)*100:+.1f}%)" if p else ""
    print(f"P2P GPU{c['src']}->GPU{c['dst']}: {c['bytes_per_s']/1e9:.1f} GB/s (peer access {c['peer_access']}){extra}")
for b in (mg.get("p2p") or {}).get("bidirectional", []):
    print(f"P2P both ways GPU{b['a']}<->GPU{b['b']}: {b['bytes_per_s']/1e9:.1f} GB/s")
ar = mg.get("allreduce") or {}
pa = {(tuple(a["devices"]), a["bytes"]): a for a in peers.get("allreduce", [])}
if ar:
    print(f"NCCL {ar.get('nccl_version')} ({ar.get('library')}), env {ar.get('env')}")
for w in ar.get("worlds", []):
    print(f"all-reduce over {w['devices']}: check {'passed' if w.get('check_passed') else 'FAILED'}")
    for p in w.get("points", []):
        q = pa.get((tuple(w["devices"]), p["bytes"]))
        extra = f"; torch {q['timing']['median_s']*1e6:.1f} us busBW {q['busbw']/1e9:.1f} GB/s ({(p['timing']['median_s']/q['timing']['median_s']-1)*100:+.1f}% time)" if q else ""
        print(f"  {p['bytes']:>10} B (M={p.get('m')}): {p['timing']['median_s']*1e6:8.1f} us, busBW {p['busbw']/1e9:6.1f} GB/s{extra}")
for s in mg.get("allreduce_per_step", []):
    print(f"TP={s['tp']} M={s['m']}: all-reduce per decode step {s['step_s']*1e3:.2f} ms ({s['per_step']} x {s['allreduce_s']*1e6:.1f} us)")
tp = mg.get("tp")
if tp:
    for row in tp.get("rows", []):
        print(f"TP prediction {row['label']} M={row['m']} TP={row['tp']}: {row['total_s']*1e3:.2f} ms (x{row['speedup_vs_tp1']:.2f})")
for st in peers.get("status", []):
    print(f"peer {st['provider']}: available={st['available']} ({st['detail']})")
for n in peers.get("notes", []) + mg.get("notes", []):
    print(f"note: {n}")
for s in r.get("skipped", []):
    print(f"skipped {s['what']}: {s['reason']}")
PY
rm -rf "$W"
ls -l "$OUT"
cat "$OUT/summary.txt"
