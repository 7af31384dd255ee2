#!/usr/bin/env python3
"""PyTorch peers of rigbench's grouped expert GEMM (src/gemm/moe.rs) on the same card, for the
cases of a kernel suite's [moe] table (default suites/kernels/qwen3.6-35b-a3b.toml), BF16:

  loop:       one torch.matmul per active expert over the pairs routed to it (what a plain
              PyTorch MoE layer does);
  grouped_mm: torch._grouped_mm over the pairs sorted by expert (one launch), where this
              PyTorch has it.

Routing as rigbench's gemm::moe::route_ids (balanced, zipf:S with SplitMix64 draws, few:N), each
graph launch its own routing (experts rotated by v * touched), timed as rigbench times its graph
mode: V launches in one CUDA graph, per launch. Prints one line per case:
  peer <impl> <linear> bf16 B=<batch> <routing>: <touched> experts, graph <us> us
Weights and activations are random (timing only). The peers read the pairs' rows already sorted
by expert (no gather), which rigbench's kernel does inside.
"""
import math
import sys
import tomllib

import torch

MASK = (1 << 64) - 1


class SplitMix64:
    """rigbench's stats::rng::SplitMix64 (Steele, Lea and Flood, 2014)."""

    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def route_ids(dist, batch, k, e, seed):
    """gemm::moe::route_ids."""
    k = min(k, e)
    ids = []
    if dist == "balanced":
        return [(b * k + j) % e for b in range(batch) for j in range(k)]
    if dist.startswith("few:"):
        few = max(k, min(int(dist[4:]), e))
        return [(b * k + j) % few for b in range(batch) for j in range(k)]
    s = float(dist[5:])
    w = [1.0 / (r ** s) for r in range(1, e + 1)]
    rng = SplitMix64(seed)
    for _ in range(batch):
        chosen = []
        while len(chosen) < k:
            free = sum(w[x] for x in range(e) if x not in chosen)
            u = (rng.next() >> 11) / float(1 << 53) * free
            pick = e - 1
            for x in range(e):
                if x in chosen:
                    continue
                if u < w[x]:
                    pick = x
                    break
                u -= w[x]
            if pick in chosen:
                pick = next(x for x in reversed(range(e)) if x not in chosen)
            chosen.append(pick)
        ids.extend(chosen)
    return ids


def variant(dist, batch, k, e, v, shift):
    return [(x + v * shift) % e for x in route_ids(dist, batch, k, e, v)]


def time_graph(fn, launches):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(20):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / launches)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "suites/kernels/qwen3.6-35b-a3b.toml"
    spec = tomllib.load(open(path, "rb"))["moe"]
    e, k = spec["experts"], spec["top_k"]
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    has_grouped = hasattr(torch, "_grouped_mm")
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, _grouped_mm: {has_grouped}")
    for lin in spec["linears"]:
        n, kk = lin["n"], lin["k"]
        w = torch.randn(e, n, kk, device=dev, dtype=torch.bfloat16) / math.sqrt(kk)
        wt = w.transpose(1, 2)  # [E, K, N] view for grouped_mm (b is K x N per group)
        for batch in spec["batches"]:
            pairs = batch * k
            x = torch.randn(pairs, kk, device=dev, dtype=torch.bfloat16)
            for dist in spec["distributions"]:
                ids0 = variant(dist, batch, k, e, 0, 0)
                touched = len(set(ids0))
                per = 2 * n * kk
                v_n = max(2, min(64, (4 * l2) // max(1, touched * per) + 1))
                routes = []
                for v in range(v_n):
                    ids = variant(dist, batch, k, e, v, touched)
                    order = sorted(range(pairs), key=lambda p: (ids[p], p))
                    active = sorted(set(ids))
                    counts = [sum(1 for x in ids if x == a) for a in active]
                    routes.append((order, active, counts))
                y = torch.empty(pairs, n, device=dev, dtype=torch.bfloat16)

                def loop():
                    for order, active, counts in routes:
                        at = 0
                        for a, c in zip(active, counts):
                            torch.matmul(x[at:at + c], w[a].t(), out=y[at:at + c])
                            at += c

                us = time_graph(loop, v_n)
                print(f"peer loop {lin['name']} bf16 B={batch} {dist}: {touched} experts, graph {us:.1f} us")
                if has_grouped:
                    offs = []
                    for order, active, counts in routes:
                        full = [0] * e
                        for a, c in zip(active, counts):
                            full[a] = c
                        cum, o = 0, []
                        for c in full:
                            cum += c
                            o.append(cum)
                        offs.append(torch.tensor(o, device=dev, dtype=torch.int32))

                    def grouped():
                        for o in offs:
                            torch._grouped_mm(x, wt, offs=o, out_dtype=torch.bfloat16)

                    try:
                        us = time_graph(grouped, v_n)
                        print(f"peer grouped_mm {lin['name']} bf16 B={batch} {dist}: {touched} experts, graph {us:.1f} us")
                    except Exception as ex:  # noqa: BLE001 - report and go on
                        print(f"peer grouped_mm {lin['name']} B={batch} {dist}: failed: {str(ex)[:200]}")
                        has_grouped = False
        del w, wt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
