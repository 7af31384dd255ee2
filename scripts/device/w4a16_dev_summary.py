#!/usr/bin/env python3
"""Summary of a scripts/device/w4a16-dev.sh run (stdlib only).

Usage: w4a16_dev_summary.py OUT_DIR
Reads OUT_DIR/bench/results.json (or OUT_DIR/bench-nowg/results.json when the first bench did not
finish), OUT_DIR/tune.log (the tuner's lines, RIGBENCH_TUNE_LOG=1) and OUT_DIR/wg-probe.txt, and
prints Markdown: the probe's verdict, the decode-step composite per M (bf16, w4a16, their ratio),
the time = T0 + bytes/BW fit per M, the NVFP4 byte floor at the smallest M, the path the tuner
chose per (shape, M) with the best time of each W4A16 kind, and every check that failed.
Figures are the run's own (graph timing when the run had it, else cold, as labelled).
"""

import json
import os
import sys


# Result folders and their tuner logs, in the order the script makes them.
RUNS = (("bench", "tune.log"), ("bench-nowg", "tune-nowg.log"))


def load_results(out, sub):
    p = os.path.join(out, sub, "results.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        r = json.load(f)
    return r.get("kernels", r)


def case_time(c):
    """(seconds, mode): graph timing when present, else the case's own timing."""
    g = c.get("graph")
    if g and g.get("timing"):
        return g["timing"]["median_s"], "graph"
    t = c["timing"]
    return t["median_s"], ("graph" if t.get("graph") else "cold")


def fit(points):
    """Least squares time = t0 + bytes / bw over (bytes, seconds); (t0_s, bw_bytes_per_s)."""
    n = len(points)
    if n < 2:
        return None
    xm = sum(p[0] for p in points) / n
    ym = sum(p[1] for p in points) / n
    sxx = sum((p[0] - xm) ** 2 for p in points)
    if sxx <= 0:
        return None
    b = sum((p[0] - xm) * (p[1] - ym) for p in points) / sxx
    a = ym - b * xm
    return a, (1.0 / b if b > 0 else None)


def kind_of(path):
    if "wgmma" in path:
        return "wgmma"
    if "v2" in path:
        return "v2"
    if "dequant" in path:
        return "dequant"
    if "fused" in path:
        return "fused-ks" if "K split between them" in path else "fused"
    return "?"


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    print("# W4A16 development run\n")
    probe = os.path.join(out, "wg-probe.txt")
    if os.path.exists(probe):
        with open(probe) as f:
            lines = f.read().splitlines()
        verdict = [l for l in lines if l.split(" ", 1)[0] in ("PASS", "FAIL", "SKIP")]
        fails = [l.strip() for l in lines if l.strip().startswith("failed:")]
        print("wg-probe: " + (verdict[-1] if verdict else "no verdict line (crashed or timed out?): " + " | ".join(lines[-3:])))
        for l in fails[:10]:
            print("  " + l)
        print()
    found = 0
    for sub, tune in RUNS:
        k = load_results(out, sub)
        if k is None:
            continue
        found += 1
        print(f"# {sub}/results.json\n")
        summarize(k, os.path.join(out, tune))
    if not found:
        print("no results.json under bench/ or bench-nowg/")
        return 1
    return 0


def summarize(k, tl):
    cases = [c for c in k["cases"] if c.get("provider", "rigbench") == "rigbench"]
    step = (k.get("suite") or {}).get("decode_step") or {}
    counts = {s["shape"]: s["count"] for s in step.get("shapes", [])}
    copy = (k.get("copy_bandwidth") or {}).get("bytes_per_s")
    ms = sorted({c["m"] for c in cases})
    if not ms:
        print("no rigbench case was timed; skips and notes:\n")
        for s in k.get("skipped", [])[:10]:
            print(f"- skipped {s.get('implementation')} {s.get('shape')} M={s.get('m')}: {s.get('reason', '')[:300]}")
        for n in k.get("notes", [])[:10]:
            print(f"- note: {n[:400]}")
        print()
        return
    impls = [i for i in ("bf16", "fp8", "w4a16") if any(c["implementation"] == i for c in cases)]
    mode = case_time(cases[0])[1] if cases else "?"

    def by(impl, m):
        return {c["shape"]: c for c in cases if c["implementation"] == impl and c["m"] == m}

    print(f"## Decode-step composite ({mode} timing; Σ count × GEMM time)\n")
    print("| M | " + " | ".join(impls) + " | w4a16 speed-up vs bf16 | w4a16 at M ÷ w4a16 at M=%d |" % ms[0])
    print("|---|" + "---|" * (len(impls) + 2))
    comp = {}
    for m in ms:
        row = []
        for i in impls:
            cs = by(i, m)
            if counts and all(s in cs for s in counts):
                t = sum(case_time(cs[s])[0] * n for s, n in counts.items())
                comp[(i, m)] = t
                row.append(f"{t * 1e3:.2f} ms")
            else:
                row.append(f"incomplete ({len(cs)}/{len(counts)} shapes)")
        b, w, w1 = comp.get(("bf16", m)), comp.get(("w4a16", m)), comp.get(("w4a16", ms[0]))
        sp = f"{b / w:.2f}×" if b and w else "-"
        rel = f"{w / w1:.2f}" if w and w1 else "-"
        print(f"| {m} | " + " | ".join(row) + f" | {sp} | {rel} |")
    print()
    if copy and counts:
        w4 = by("w4a16", ms[0])
        if all(s in w4 for s in counts):
            floor = sum(w4[s]["derived"]["weight_bytes"] * n for s, n in counts.items()) / copy
            t = comp.get(("w4a16", ms[0]))
            print(f"NVFP4 byte floor at M={ms[0]} (weight bytes ÷ copy bandwidth {copy / 1e12:.2f} TB/s): {floor * 1e3:.2f} ms; w4a16 composite reaches {100 * floor / t:.0f}% of it\n")

    print(f"## time = T0 + bytes/BW over the shapes ({mode} timing; M ≤ 128)\n")
    print("Also without in_proj_ba (the 7 shapes issue 22's Humming fit could use).\n")
    print("| M | impl | T0 | BW | shapes | T0 (7) | BW (7) |")
    print("|---|---|---|---|---|---|---|")
    for m in [m for m in ms if m <= 128]:
        for i in impls:
            cs = [c for c in by(i, m).values() if c["derived"].get("weight_bytes")]
            cells = []
            for sel in (cs, [c for c in cs if c["shape"] != "in_proj_ba"]):
                f = fit([(c["derived"]["weight_bytes"], case_time(c)[0]) for c in sel])
                if f:
                    bw = f"{f[1] / 1e12:.2f} TB/s" if f[1] else "-"
                    cells += [f"{f[0] * 1e6:.2f} µs", bw]
                else:
                    cells += ["-", "-"]
            print(f"| {m} | {i} | {cells[0]} | {cells[1]} | {len(cs)} | {cells[2]} | {cells[3]} |")
    print()

    # Tuner lines: tune \t impl \t NxK \t M=m \t shape \t status \t us \t path-or-why
    best = {}
    status = {}
    if os.path.exists(tl):
        with open(tl, errors="replace") as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) < 8 or p[0] != "tune" or p[1] != "w4a16":
                    continue
                shape, m, st, us, what = p[4], int(p[3][2:]), p[5], p[6], p[7]
                kd = kind_of(what)
                key = (shape, m, kd)
                status.setdefault(key, {"ok": 0, "rejected": 0, "error": 0})
                status[key][st] = status[key].get(st, 0) + 1
                if st == "ok":
                    t = float(us)
                    if key not in best or t < best[key]:
                        best[key] = t
    kinds = ["fused", "fused-ks", "v2", "wgmma", "dequant"]
    print("## W4A16 per (shape, M): chosen path, and the best tuned time per kind (cold, µs)\n")
    print("| shape | M | chosen | time | " + " | ".join(kinds) + " |")
    print("|---|---|---|---|" + "---|" * len(kinds))
    for m in ms:
        for s, c in sorted(by("w4a16", m).items()):
            cells = []
            for kd in kinds:
                key = (s, m, kd)
                if key not in status:
                    cells.append("")
                    continue
                st = status[key]
                bad = st["rejected"] + st["error"]
                cell = f"{best[key]:.1f}" if key in best else "-"
                if bad:
                    cell += f" ({bad} failed)"
                cells.append(cell)
            t, md = case_time(c)
            print(f"| {s} | {m} | {kind_of(c['path'])} | {t * 1e6:.1f} µs {md} | " + " | ".join(cells) + " |")
    print()
    sk = [s for s in k.get("skipped", []) if s.get("provider", "rigbench") == "rigbench"]
    failed = [c for c in cases if not (c.get("check") or {}).get("passed", True)]
    print(f"## Checks\n\n{len(cases)} cases timed, {len(failed)} failed their check, {len(sk)} skipped")
    for s in sk[:20]:
        print(f"- skipped {s['implementation']} {s['shape']} M={s.get('m')}: {s['reason'][:300]}")
    for n in k.get("notes", []):
        if "wgmma" in n or "failed their check" in n or "not offered" in n:
            print(f"- note: {n[:400]}")
    det = k.get("determinism", [])
    if det:
        ok = sum(1 for d in det if d.get("bit_exact"))
        print(f"- determinism: {ok}/{len(det)} bit-exact")
    print()


if __name__ == "__main__":
    sys.exit(main())
