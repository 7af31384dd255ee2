#!/usr/bin/env python3
"""Peer GEMM providers for `rigbench kernels`, run in the same session with the same shapes, M
values, L2 flush and stopping rule as rigbench's own cases.

Driven by rigbench: `python3 scripts/peer_kernels.py --spec spec.json --out peers.json`.
The spec (written by rigbench) holds: shapes [{name, n, k}], m [..], l2_flush_bytes, warmup,
stopping {min_samples, max_samples, target_rel_std, max_time_s}.

Providers (each checked against a float64 reference on sampled outputs before it is timed):
  torch  torch.matmul BF16 (cuBLAS)
  torch  torch._scaled_mm FP8 E4M3 per-tensor scales, BF16 out (M padded to a multiple of 16,
         as the op requires; activation quantization not included, as in rigbench's fp8 rows)
  torch  torch._weight_int4pack_mm (tinygemm INT4 W4A16, group 128)
  vllm   Marlin NVFP4 GEMM, when vllm is importable (reported unavailable otherwise)

Output JSON: {"peers": [{provider, implementations, available, detail}],
              "cases": [{provider, implementation, format, shape, m, n, k, path, check, samples_s}],
              "skipped": [{provider, implementation, shape, m, reason}]}
Timing: CUDA events (torch.cuda.Event(enable_timing=True)) around each call; before each sample
the L2 is flushed by reading a buffer of l2_flush_bytes (as rigbench does).
"""

import argparse
import json
import statistics
import sys
import time
import traceback

TOL = 5e-3  # same rule as rigbench's named tolerances: BF16 output rounding + accumulation order


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    out = {"peers": [], "cases": [], "skipped": []}

    def save():
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f)
        import os

        os.replace(args.out + ".tmp", args.out)

    try:
        import torch
    except Exception as e:  # noqa: BLE001
        out["peers"].append({"provider": "torch", "implementations": [], "available": False,
                             "detail": f"PyTorch not importable: {e}"})
        save()
        return 0
    if not torch.cuda.is_available():
        out["peers"].append({"provider": "torch", "implementations": [], "available": False,
                             "detail": "PyTorch has no CUDA device"})
        save()
        return 0
    dev = torch.device("cuda")
    impls = ["torch.matmul", "torch._scaled_mm", "torch._weight_int4pack_mm"]
    out["peers"].append({"provider": "torch", "implementations": impls, "available": True,
                         "detail": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                   f"{torch.cuda.get_device_name(0)}"})
    try:
        import vllm  # noqa: F401
        from vllm import _custom_ops  # noqa: F401
        out["peers"].append({"provider": "vllm", "implementations": ["marlin_nvfp4"], "available": False,
                             "detail": f"vllm {vllm.__version__} importable, but rigbench's driver for its "
                                       "Marlin NVFP4 op is not written yet"})
    except Exception as e:  # noqa: BLE001
        out["peers"].append({"provider": "vllm", "implementations": ["marlin_nvfp4"], "available": False,
                             "detail": f"vLLM is not importable on this machine ({type(e).__name__}: {e}); "
                                       "no Marlin NVFP4 rows"})
    save()

    flush = torch.full((int(spec["l2_flush_bytes"]) or 1,), 17, dtype=torch.uint8, device=dev)
    st = spec["stopping"]
    gen = torch.Generator(device=dev)

    def time_it(fn):
        for _ in range(int(spec["warmup"])):
            fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        samples = []
        t0 = time.time()
        while True:
            if spec["l2_flush_bytes"]:
                flush.max()  # a read of 2x L2, as rigbench's flush (clean lines, no write-back)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
            n = len(samples)
            if n >= st["max_samples"]:
                break
            if n >= st["min_samples"] and n >= 2:
                mu = statistics.fmean(samples)
                if mu > 0 and statistics.stdev(samples) / mu <= st["target_rel_std"]:
                    break
            if time.time() - t0 >= st["max_time_s"] and n >= min(3, st["min_samples"]):
                break
        return samples

    def rel_l2(got, ref):
        got = got.double()
        if not torch.isfinite(got).all():
            return float("inf")
        den = ref.norm().item()
        return (got - ref).norm().item() / den if den > 0 else float("inf")

    def sample_idx(total, cap, device):
        if total <= cap:
            return torch.arange(total, device=device)
        idx = torch.randperm(total, device=device, generator=gen)[:cap]
        idx[0], idx[-1] = 0, total - 1
        return idx.sort().values

    e4m3 = getattr(torch, "float8_e4m3fn", None)
    for shape in spec["shapes"]:
        n, k, name = shape["n"], shape["k"], shape["name"]
        gen.manual_seed(sum(map(ord, name)))
        w_bf16 = (torch.rand(n, k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
        w_fp8 = (torch.rand(n, k, device=dev, generator=gen) * 4 - 2).to(e4m3) if e4m3 else None
        w_scale = torch.tensor(1.0 / 64, device=dev)
        # tinygemm INT4: uint8 [n, k/2]; group 128 along K; scale and zero per group and row.
        q_int = torch.randint(0, 16, (n, k), device=dev, dtype=torch.int32, generator=gen)
        group = 128
        scales = (torch.rand(k // group, n, device=dev, generator=gen) * 0.02 + 0.005).to(torch.bfloat16)
        sz = torch.stack([scales, torch.zeros_like(scales)], dim=2).contiguous()
        # Two candidate nibble orders for the uint8 input (torchao packs the even element in the
        # high nibble); the correctness check decides which one this PyTorch uses.
        int4_packings = []
        int4_err = None
        if k % group == 0:
            for order, u8 in (("even k in high nibble", ((q_int[:, ::2] << 4) | q_int[:, 1::2]).to(torch.uint8)),
                              ("even k in low nibble", ((q_int[:, 1::2] << 4) | q_int[:, ::2]).to(torch.uint8))):
                try:
                    int4_packings.append((order, torch._convert_weight_to_int4pack(u8, 8)))
                except Exception as e:  # noqa: BLE001
                    int4_err = f"{type(e).__name__}: {e}"
        else:
            int4_err = f"K = {k} is not a multiple of the group size {group}"

        for m in spec["m"]:
            a = (torch.rand(m, k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
            rows = sample_idx(m, 32, dev)
            cols = sample_idx(n, 64, dev)
            a_s = a[rows].double()

            def record(impl, fmt, path, fn, ref, get_out):
                try:
                    res = fn()
                    torch.cuda.synchronize()
                    err = rel_l2(get_out(res), ref)
                    if not err <= TOL:
                        out["skipped"].append({"provider": "torch", "implementation": impl, "shape": name, "m": m,
                                               "reason": f"failed its correctness check, not timed: rel_l2 = {err:.3e} > {TOL}"})
                        return
                    samples = time_it(fn)
                    out["cases"].append({"provider": "torch", "implementation": impl, "format": fmt, "shape": name,
                                         "m": m, "n": n, "k": k, "path": path,
                                         "check": {"reference": "float64 torch on 32x64 sampled outputs", "metric": "rel_l2",
                                                   "value": err, "tolerance_name": "PEER_REL_L2", "tolerance": TOL,
                                                   "passed": True},
                                         "samples_s": samples})
                except Exception as e:  # noqa: BLE001
                    out["skipped"].append({"provider": "torch", "implementation": impl, "shape": name, "m": m,
                                           "reason": f"{type(e).__name__}: {e}"})
                finally:
                    save()

            ref = a_s @ w_bf16[cols].double().t()
            record("torch.matmul", "bf16", "torch.nn.functional.linear BF16 (cuBLAS)",
                   lambda: torch.nn.functional.linear(a, w_bf16), ref, lambda r: r[rows][:, cols])

            if w_fp8 is not None and hasattr(torch, "_scaled_mm"):
                mp = ((m + 15) // 16) * 16
                a_pad = torch.zeros(mp, k, device=dev, dtype=torch.bfloat16)
                a_pad[:m] = a
                a_scale = (a.abs().max().float() / 448.0).clamp(min=1e-12)
                a_fp8 = (a_pad.float() / a_scale).to(e4m3)
                wt = w_fp8.t()
                ref8 = (a_fp8[:m][rows].double() * a_scale.double()) @ (w_fp8[cols].double() * w_scale.double()).t()
                record("torch._scaled_mm", "fp8", f"torch._scaled_mm FP8 E4M3 per-tensor, BF16 out (M padded to {mp})",
                       lambda: torch._scaled_mm(a_fp8, wt, scale_a=a_scale, scale_b=w_scale, out_dtype=torch.bfloat16),
                       ref8, lambda r: r[:m][rows][:, cols])
            else:
                out["skipped"].append({"provider": "torch", "implementation": "torch._scaled_mm", "shape": name, "m": m,
                                       "reason": "this PyTorch has no float8_e4m3fn / _scaled_mm"})

            if int4_packings:
                w_deq = (q_int[cols] - 8).to(torch.float64) * \
                    scales.t()[cols].repeat_interleave(group, dim=1).to(torch.float64)
                ref4 = a_s @ w_deq.t()
                order, packed = int4_packings[0]
                for o, p in int4_packings:
                    r = torch._weight_int4pack_mm(a, p, group, sz)
                    if rel_l2(r[rows][:, cols], ref4) <= TOL:
                        order, packed = o, p
                        break
                record("torch._weight_int4pack_mm", "w4a16",
                       f"tinygemm INT4 W4A16 (torch._weight_int4pack_mm, group 128, innerKTiles 8; {order})",
                       lambda: torch._weight_int4pack_mm(a, packed, group, sz), ref4,
                       lambda r: r[rows][:, cols])
            else:
                out["skipped"].append({"provider": "torch", "implementation": "torch._weight_int4pack_mm", "shape": name,
                                       "m": m, "reason": int4_err})
            del a
        del w_bf16, w_fp8, q_int, int4_packings
        torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
