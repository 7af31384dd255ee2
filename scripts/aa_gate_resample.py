#!/usr/bin/env python3
"""Build fake repeated runs from committed H200 reports, to self-test scripts/device/aa-gate.sh
on a machine without a GPU (AA_SKIP_MEASURE=1). The rates such a self-test prints are NOT
evidence of the gate on a GPU: the runs are resampled, not measured.

Usage: aa_gate_resample.py OUT_DIR [RUNS] [BASE_REPEATS] [REPEATS] [M_LIST] [SEED]

Each fake run r takes, for every rigbench kernel case present in every committed run of
reports/nvidia-h200-sm90/ (restricted to M_LIST), one committed run's samples per repeat, drawn
with replacement (a bootstrap over runs), and records the repeats as `report --repeats` does
(`kernels.repeats`). Run 1 gets BASE_REPEATS repeats, the others REPEATS.
"""

import glob
import json
import os
import random
import statistics
import sys


def main():
    out = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 11
    base_repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    m_list = [int(x) for x in (sys.argv[5] if len(sys.argv) > 5 else "1,16,256,2048").split(",")]
    seed = int(sys.argv[6]) if len(sys.argv) > 6 else 13
    root = os.path.join(os.path.dirname(__file__), "..", "reports", "nvidia-h200-sm90")
    files = sorted(glob.glob(os.path.join(root, "*", "results.json")))
    committed = [json.load(open(f)) for f in files]
    template = committed[-1]

    def key(c):
        return (c["implementation"], c["shape"], c["m"])

    tables = []
    for r in committed:
        tables.append({key(c): c for c in r["kernels"]["cases"] if c["provider"] == "rigbench"})
    keys = [key(c) for c in template["kernels"]["cases"]
            if c["provider"] == "rigbench" and c["m"] in m_list
            and all(key(c) in t for t in tables)]
    rng = random.Random(seed)
    for i in range(1, runs + 1):
        reps = base_repeats if i == 1 else repeats
        picks = [[rng.randrange(len(committed)) for _ in range(reps)] for _ in keys]
        cases, rep_cases = [], []
        for k, pick in zip(keys, picks):
            parts = [tables[p][k] for p in pick]
            c = json.loads(json.dumps(parts[0]))
            samples = [x for p in parts for x in p["timing"]["samples_s"]]
            c["timing"]["samples_s"] = samples
            c["timing"]["median_s"] = statistics.median(samples)
            rep_cases.append({"provider": "rigbench", "implementation": k[0], "shape": k[1],
                              "m": k[2], "sizes": [len(p["timing"]["samples_s"]) for p in parts]})
            for e in c["extra"]:
                es = [next(x for x in p["extra"] if x["name"] == e["name"]) for p in parts]
                e["timing"]["samples_s"] = [x for t in es for x in t["timing"]["samples_s"]]
                e["timing"]["median_s"] = statistics.median(e["timing"]["samples_s"])
                rep_cases.append({"provider": "rigbench", "implementation": k[0], "shape": k[1],
                                  "m": k[2], "part": e["name"],
                                  "sizes": [len(t["timing"]["samples_s"]) for t in es]})
            cases.append(c)
        r = json.loads(json.dumps(template))
        r["rig_label"] = "aa-gate"
        r["command_line"] = f"(resampled from committed reports by {os.path.basename(__file__)})"
        r["kernels"]["cases"] = cases
        r["kernels"]["determinism"] = []
        r["kernels"]["repeats"] = {"count": reps, "order": [], "cases": rep_cases}
        r["e2e"] = None
        r["checkpoint"] = None
        r["complete"] = True
        d = os.path.join(out, f"run{i:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "results.json"), "w") as f:
            json.dump(r, f)
    print(f"{runs} resampled runs of {len(keys)} cases from {len(committed)} committed runs in {out}")


if __name__ == "__main__":
    main()
