#!/usr/bin/env python3
"""PyTorch's figures for rigbench's multi-GPU transfers, run in the same session with the same
sizes, warm-up and sample counts.

Driven by rigbench: `python3 scripts/peer_multigpu.py --spec spec.json --out peers.json`.
The spec (written by rigbench):
  {"p2p": {"devices": [0, 1], "bytes": N, "warmup": 3, "samples": 20} | null,
   "allreduce": {"worlds": [[0, 1]], "sizes": [{"bytes": B, "iters": I}], "warmup": 5,
                 "samples": 10} | null}

Providers (each checked once before it is timed):
  torch  `tensor.to(other_device)` between every ordered pair of GPUs: one copy of `bytes` between
         torch.cuda.Event(enable_timing=True) events recorded on the source GPU's current stream
         (PyTorch runs a cross-device copy on the source device's current stream); bandwidth =
         bytes / median time. Checked: the copy equals its source on a strided sample.
  torch  `torch.distributed.all_reduce` (NCCL backend, BF16, SUM), one process per GPU
         (torch.multiprocessing, spawn; rendezvous through a file). Per size: warm-up, then per
         sample `iters` back-to-back all-reduces between torch.cuda.synchronize() calls on the
         host clock, divided by iters; the samples of all ranks are averaged rank-wise, as
         nccl-tests does (`-a 1`). Checked: rank r sends r + 1; every output must be n(n+1)/2.
The environment is rigbench's: NCCL_NVLS_ENABLE=0 is set by rigbench and inherited.

Output JSON: {"status": [{provider, implementations, available, detail}],
              "p2p": [{src, dst, bytes, samples_s}],
              "allreduce": [{devices, bytes, iters, samples_s}],
              "notes": [..]}
"""

import argparse
import json
import os
import sys
import tempfile
import time
import traceback


def save(out, path):
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def p2p(torch, spec, out, path):
    devs = spec["devices"]
    nbytes = int(spec["bytes"])
    for src in devs:
        x = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device=f"cuda:{src}")
        for dst in devs:
            if src == dst:
                continue
            try:
                target = torch.device(f"cuda:{dst}")
                y = x.to(target)
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
                if not torch.equal(y[::4099].cpu(), x[::4099].cpu()):
                    out["notes"].append(f"tensor.to copy GPU{src} -> GPU{dst} gave wrong bytes: not timed")
                    continue
                del y
                with torch.cuda.device(src):
                    stream = torch.cuda.current_stream(src)
                    for _ in range(int(spec["warmup"])):
                        y = x.to(target)
                    torch.cuda.synchronize(src)
                    torch.cuda.synchronize(dst)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    samples = []
                    for _ in range(max(1, int(spec["samples"]))):
                        start.record(stream)
                        y = x.to(target)
                        end.record(stream)
                        end.synchronize()
                        samples.append(start.elapsed_time(end) * 1e-3)
                    del y
                out["p2p"].append({"src": src, "dst": dst, "bytes": nbytes, "samples_s": samples})
            except Exception as e:  # noqa: BLE001
                out["notes"].append(f"tensor.to copy GPU{src} -> GPU{dst} failed: {type(e).__name__}: {e}")
            save(out, path)
        del x
        torch.cuda.empty_cache()


def allreduce_worker(rank, devices, sizes, warmup, samples, rdv, result_dir):
    import torch
    import torch.distributed as dist

    dev = devices[rank]
    torch.cuda.set_device(dev)
    n = len(devices)
    res = {"rank": rank, "sizes": [], "error": None}
    try:
        dist.init_process_group("nccl", init_method=f"file://{rdv}", rank=rank, world_size=n,
                                device_id=torch.device(f"cuda:{dev}"))
        # The check.
        x = torch.full((1024,), float(rank + 1), dtype=torch.bfloat16, device=f"cuda:{dev}")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = n * (n + 1) / 2
        res["check_wrong"] = int((x.float() != want).sum().item())
        maxb = max(int(s["bytes"]) for s in sizes)
        buf = torch.zeros(maxb // 2, dtype=torch.bfloat16, device=f"cuda:{dev}")
        for s in sizes:
            count = int(s["bytes"]) // 2
            iters = max(1, int(s["iters"]))
            t = buf[:count]
            for _ in range(warmup):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            got = []
            for _ in range(max(1, samples)):
                torch.cuda.synchronize()
                dist.barrier(device_ids=[dev])
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t)
                torch.cuda.synchronize()
                got.append((time.perf_counter() - t0) / iters)
            res["sizes"].append({"bytes": int(s["bytes"]), "iters": iters, "samples_s": got})
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def allreduce(torch, spec, out, path):
    import torch.multiprocessing as mp

    for world in spec["worlds"]:
        with tempfile.TemporaryDirectory() as d:
            rdv = os.path.join(d, "rendezvous")
            try:
                mp.start_processes(allreduce_worker, nprocs=len(world), join=True, start_method="spawn",
                                   args=(world, spec["sizes"], int(spec["warmup"]), int(spec["samples"]), rdv, d))
            except Exception as e:  # noqa: BLE001
                out["notes"].append(f"torch.distributed all_reduce on GPUs {world} failed: {type(e).__name__}: {e}")
            ranks = []
            for r in range(len(world)):
                p = os.path.join(d, f"rank{r}.json")
                if os.path.exists(p):
                    with open(p) as f:
                        ranks.append(json.load(f))
            errors = [r["error"] for r in ranks if r.get("error")]
            if errors:
                out["notes"].append(f"torch.distributed all_reduce on GPUs {world}: {errors[0]}")
            wrong = sum(r.get("check_wrong", 0) for r in ranks)
            if wrong:
                out["notes"].append(f"torch.distributed all_reduce on GPUs {world} gave {wrong} wrong outputs: not used")
                continue
            if len(ranks) != len(world) or not ranks:
                continue
            for i, s in enumerate(ranks[0]["sizes"]):
                per_rank = [r["sizes"][i]["samples_s"] for r in ranks if i < len(r["sizes"])]
                if len(per_rank) != len(world):
                    continue
                avg = [sum(v) / len(v) for v in zip(*per_rank)]
                out["allreduce"].append({"devices": world, "bytes": s["bytes"], "iters": s["iters"],
                                         "samples_s": avg})
        save(out, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    out = {"status": [], "p2p": [], "allreduce": [], "notes": []}
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        out["status"].append({"provider": "torch", "implementations": [], "available": False,
                              "detail": f"PyTorch not importable: {e}"})
        save(out, args.out)
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        out["status"].append({"provider": "torch", "implementations": [], "available": False,
                              "detail": f"PyTorch sees {torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s); two or more are needed"})
        save(out, args.out)
        return 0
    impls = []
    if spec.get("p2p"):
        impls.append("tensor.to")
    nccl = None
    if spec.get("allreduce"):
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_nccl_available():
                impls.append("torch.distributed.all_reduce")
                nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            else:
                out["notes"].append("torch.distributed has no NCCL backend here: no all-reduce peer")
        except Exception as e:  # noqa: BLE001
            out["notes"].append(f"torch.distributed unavailable: {type(e).__name__}: {e}")
    out["status"].append({"provider": "torch", "implementations": impls, "available": True,
                          "detail": f"torch {torch.__version__}, CUDA {torch.version.cuda}"
                                    + (f", NCCL {nccl} (its own copy)" if nccl else "")
                                    + f", NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}"})
    save(out, args.out)
    if spec.get("p2p"):
        p2p(torch, spec["p2p"], out, args.out)
    if nccl and spec.get("allreduce"):
        allreduce(torch, spec["allreduce"], out, args.out)
    save(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
