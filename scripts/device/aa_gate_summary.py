#!/usr/bin/env python3
"""Summarize an aa-gate.sh session: false-alarm and detection rates of `rigbench compare`.

Usage: aa_gate_summary.py WORK OUT

Reads WORK/settings.json, WORK/compare/aa_NN.{json,rc} (A/A comparisons, optionally
aa_NN_confirm.*) and WORK/compare/plant_NN_IMPL_SHAPE.{json,rc} (planted trials, optionally
*_confirm.*); writes OUT/aa-gate-summary.md and OUT/aa-gate-summary.json. Standard library only.

Definitions (docs/gate.md):
- an A/A comparison passes when `compare` exits 0; the false-alarm rate is the share that do not;
- a planted trial detects when some metric of the planted implementation and shape is Regressed
  and no other metric is Regressed or Missing ("clean"); "any" counts detection regardless.
"""

import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rc(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def failing(cmp):
    """Ids of rows that fail the gate (regressed or missing)."""
    if not cmp:
        return []
    return [r["id"] for r in cmp.get("rows", []) if r.get("verdict") in ("regressed", "missing")]


def pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def main(work, out):
    settings = load(os.path.join(work, "settings.json")) or {}
    cdir = os.path.join(work, "compare")

    aa = []
    for j in sorted(glob.glob(os.path.join(cdir, "aa_[0-9][0-9].json"))):
        stem = j[:-5]
        run = int(os.path.basename(stem)[3:])
        cmp = load(j)
        conf = load(stem + "_confirm.json")
        aa.append({
            "run": run,
            "exit": rc(stem + ".rc"),
            "failing": failing(cmp),
            "counts": (cmp or {}).get("counts"),
            "confirm_exit": rc(stem + "_confirm.rc") if conf is not None else None,
            "confirm_failing": failing(conf) if conf is not None else None,
            "confirm": (conf or {}).get("confirm"),
        })

    trials = []
    for j in sorted(glob.glob(os.path.join(cdir, "plant_*.json"))):
        if j.endswith("_confirm.json"):
            continue
        stem = j[:-5]
        _, run, impl, shape = os.path.basename(stem).split("_", 3)
        prefix = f"kernels/rigbench/{impl}/{shape}/"
        cmp = load(j)
        fail = failing(cmp)
        hit = any(i.startswith(prefix) for i in fail)
        other = [i for i in fail if not i.startswith(prefix)]
        t = {
            "run": int(run),
            "implementation": impl,
            "shape": shape,
            "exit": rc(stem + ".rc"),
            "planted_metrics": len((cmp or {}).get("planted", [])),
            "hit": hit,
            "others": other,
            "clean": hit and not other,
        }
        conf = load(stem + "_confirm.json")
        if conf is not None:
            cf = failing(conf)
            t["confirm_exit"] = rc(stem + "_confirm.rc")
            t["confirm_hit"] = any(i.startswith(prefix) for i in cf)
            t["confirm_others"] = [i for i in cf if not i.startswith(prefix)]
            t["confirm_clean"] = t["confirm_hit"] and not t["confirm_others"]
        # The gate's outcome: `compare --confirm` where it was run, else the plain comparison.
        t["gate_clean"] = t.get("confirm_clean", t["clean"])
        trials.append(t)

    n_aa = len(aa)
    aa_pass = sum(1 for a in aa if a["exit"] == 0)
    aa_pass_confirm = sum(
        1 for a in aa if a["exit"] == 0 or (a["confirm_exit"] is not None and a["confirm_exit"] == 0)
    )
    n_t = len(trials)
    clean = sum(1 for t in trials if t["clean"])
    anyhit = sum(1 for t in trials if t["hit"])
    with_others = sum(1 for t in trials if t["others"])
    conf_trials = [t for t in trials if "confirm_exit" in t]
    gate_clean = sum(1 for t in trials if t["gate_clean"])
    # Clean trials re-run with --confirm (a sample): does the plant still get caught?
    conf_sample = [t for t in conf_trials if t["clean"]]

    by_target = {}
    for t in trials:
        k = (t["implementation"], t["shape"])
        d = by_target.setdefault(k, [0, 0])
        d[0] += int(t["clean"])
        d[1] += 1

    summary = {
        "settings": settings,
        "aa": {"comparisons": n_aa, "exit_0": aa_pass, "exit_0_with_confirm": aa_pass_confirm,
               "false_alarm_rate": (n_aa - aa_pass) / n_aa if n_aa else None,
               "false_alarm_rate_with_confirm": (n_aa - aa_pass_confirm) / n_aa if n_aa else None,
               "runs": aa},
        "planted": {"trials": n_t, "detected_clean": clean, "detected_any": anyhit,
                    "trials_with_other_metrics_flagged": with_others,
                    "detection_rate": clean / n_t if n_t else None,
                    "detected_clean_with_confirm": gate_clean,
                    "detection_rate_with_confirm": gate_clean / n_t if n_t else None,
                    "clean_sample_confirmed": len(conf_sample),
                    "clean_sample_still_clean": sum(1 for t in conf_sample
                                                    if t.get("confirm_clean")),
                    "confirm_trials": len(conf_trials),
                    "confirm_detected": sum(1 for t in conf_trials if t.get("confirm_hit")),
                    "by_target": {f"{i}/{s}": {"clean": c, "trials": n}
                                  for (i, s), (c, n) in sorted(by_target.items())},
                    "trials": trials},
    }

    s = settings
    secs = s.get("seconds", {})
    md = []
    md.append("# CI gate: false-alarm and detection rates\n")
    if s.get("skip_measure"):
        md.append("**Self-test of the pipeline on runs that were not measured for this session "
                  "(AA_SKIP_MEASURE=1): these rates are not evidence.**\n")
    flags = (f"`report --no-e2e --peers off --suite {s.get('suite')} --m {s.get('m_list')}`, "
             f"every shape")
    if s.get("external_baseline"):
        runs = (f"Runs: {s.get('runs')} independent runs of one binary with the same flags "
                f"({flags}), {s.get('repeats')} repeats each, each compared with a baseline "
                f"saved earlier (`{s.get('baseline_file')}`, another session)")
    else:
        runs = (f"Runs: {s.get('runs')} independent runs of one binary with the same flags "
                f"({flags}): run 1 with {s.get('base_repeats')} repeats saved as the baseline, "
                f"runs 2-{s.get('runs')} with {s.get('repeats')} repeats each, compared with it")
    md.append(
        f"{runs} at the default thresholds (kernels 2%, family-wise confidence 95%). Planted "
        f"change: +{s.get('plant_percent')}% on one implementation and one shape per trial (raw "
        f"samples of the results scaled by `compare --plant`).\n")
    rows = [
        ("A/A comparisons", str(n_aa)),
        ("A/A exit 0", f"{aa_pass}/{n_aa} ({pct(aa_pass, n_aa)})"),
        ("A/A exit 0 after --confirm of the failing ones",
         f"{aa_pass_confirm}/{n_aa} ({pct(aa_pass_confirm, n_aa)})"),
        (f"planted +{s.get('plant_percent')}% trials", str(n_t)),
        ("detected, nothing else flagged", f"{clean}/{n_t} ({pct(clean, n_t)})"),
        ("detected (any)", f"{anyhit}/{n_t} ({pct(anyhit, n_t)})"),
        ("trials with another metric flagged", f"{with_others}/{n_t}"),
    ]
    if conf_trials:
        rows.append(("detected, nothing else flagged, by the gate (`compare --confirm` on every "
                     "trial not clean above; the clean ones counted as clean, a sample of them "
                     "re-run below)", f"{gate_clean}/{n_t} ({pct(gate_clean, n_t)})"))
        cs = sum(1 for t in conf_sample if t.get("confirm_clean"))
        rows.append(("sample of clean trials re-run with --confirm: still clean",
                     f"{cs}/{len(conf_sample)}"))
    rows.append(("time: measuring / A/A compares / planted compares / total (s)",
                 f"{secs.get('measure')} / {secs.get('aa')} / {secs.get('planted')} / "
                 f"{secs.get('total')}"))
    md.append("| measure | value |\n|---|---|")
    for k, v in rows:
        md.append(f"| {k} | {v} |")
    md.append("")
    md.append("## A/A comparisons\n")
    md.append("| run | exit | failing metrics | with --confirm |\n|---|---|---|---|")
    for a in aa:
        fail = ", ".join(f"`{i}`" for i in a["failing"][:6]) or "—"
        if len(a["failing"]) > 6:
            fail += f" and {len(a['failing']) - 6} more"
        conf = "—" if a["confirm_exit"] is None else f"exit {a['confirm_exit']}"
        md.append(f"| {a['run']} | {a['exit']} | {fail} | {conf} |")
    md.append("")
    md.append("## Detection by implementation and shape\n")
    md.append("| implementation/shape | detected cleanly | by the gate (with --confirm) |\n"
              "|---|---|---|")
    for (i, sh), (c, n) in sorted(by_target.items()):
        g = sum(1 for t in trials
                if (t["implementation"], t["shape"]) == (i, sh) and t["gate_clean"])
        md.append(f"| {i}/{sh} | {c}/{n} | {g}/{n} |")
    missed = [t for t in trials if not t["clean"]]
    if missed:
        md.append("\nTrials not detected cleanly:\n")
        for t in missed[:40]:
            conf = ""
            if "confirm_exit" in t:
                conf = (f"; with --confirm: exit {t['confirm_exit']}, hit {t['confirm_hit']}, "
                        f"others {', '.join(t['confirm_others'][:4]) or '—'}")
            md.append(f"- run {t['run']} {t['implementation']}/{t['shape']}: hit {t['hit']}, "
                      f"others {', '.join(t['others'][:4]) or '—'}{conf}")
    md.append("")
    with open(os.path.join(out, "aa-gate-summary.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "aa-gate-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
