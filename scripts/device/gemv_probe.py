#!/usr/bin/env python3
"""Probe of kernels/gemv.cu on a GPU, before it is wired into the GEMM layer: correctness against
PyTorch (BF16: torch.matmul; FP8: the FP32 sum of the dequantized E4M3 codes, and
torch._scaled_mm with row-wise scales where it runs) and time next to cuBLAS (torch.matmul BF16,
torch._scaled_mm FP8 per-token x per-channel) at M = 1, 2, 4, 8 on the weight shapes of Qwen3-8B and
Qwen3.6-27B, with a cold L2 (the weights rotate through copies larger than twice the L2) and the
launches captured in a CUDA graph (no launch overhead in either).

Usage (on the device): python3 scripts/device/gemv_probe.py > $OUT/gemv.txt
Prints one line per (shape, M, kernel): median us, GB/s of the weight bytes, the ratio to the
weight-byte floor at the measured copy rate, and rel L2 against the reference. Needs torch and cupy.
"""
import os
import sys

import cupy as cp
import torch

SRC = open(os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "gemv.cu")).read()
VARIANTS = [(4, 2), (4, 4), (8, 2), (8, 4)]
SHAPES = [  # (name, N, K)
    ("8b.qkv", 6144, 4096), ("8b.o", 4096, 4096), ("8b.gate_up", 24576, 4096), ("8b.down", 4096, 12288),
    ("27b.o", 5120, 6144), ("27b.gate_up", 34816, 5120), ("27b.down", 5120, 17408), ("8b.lm_head", 151936, 4096),
]
MS = [1, 2, 4, 8]
L2_BYTES = 60 << 20


def build():
    inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    own = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")  # common.cuh
    names = [f"gemv_{t}_w{w}_u{u}" for t in ("bf16", "fp8") for (w, u) in VARIANTS]
    mod = cp.RawModule(code=SRC, options=("-std=c++17", "--gpu-architecture=sm_90", f"-I{inc}", f"-I{own}"),
                       name_expressions=None)
    return {n: mod.get_function(n) for n in names}


def copy_rate():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (s.elapsed_time(e) / 1e3)


def timed(fn, reps=20):
    """Median us of one call of fn(i) (i picks the weight copy), each call captured in a graph."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    calls = 8
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    ts = []
    for _ in range(reps):
        st, en = torch.cuda.Event(True), torch.cuda.Event(True)
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        ts.append(st.elapsed_time(en) * 1e3 / calls)
    ts.sort()
    return ts[len(ts) // 2]


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)).item()


def main():
    torch.manual_seed(0)
    k = build()
    bw = copy_rate()
    print(f"device {torch.cuda.get_device_name()} copy rate {bw / 1e12:.3f} TB/s (read + write)")
    stream = lambda: cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for name, n, kk in SHAPES:
        wbytes = n * kk * 2
        copies = max(2, -(-2 * L2_BYTES // (n * kk)) + 1)
        wb = [torch.randn(n, kk, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(min(copies, 8))]
        w8 = [(w * 20).to(torch.float8_e4m3fn) for w in wb]
        ws = torch.rand(n, device="cuda", dtype=torch.float32) * 0.01 + 0.001
        for m in MS:
            x = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
            xs = (x.float().abs().amax(dim=1) / 448.0).clamp_min(1e-12)
            xq = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = (x.float() @ wb[0].float().t())
            ref8 = (xq.float() @ w8[0].float().t()) * xs[:, None] * ws[None, :]
            rows = []
            t = timed(lambda i: torch.matmul(x, wb[i % len(wb)].t(), out=y))
            rows.append(("cublas_bf16", t, wbytes, rel_l2(torch.matmul(x, wb[0].t()), ref)))
            try:
                def sm(i):
                    return torch._scaled_mm(xq, w8[i % len(w8)].t(), scale_a=xs[:, None].contiguous(),
                                            scale_b=ws[None, :].contiguous(), out_dtype=torch.bfloat16)
                out = sm(0)
                t = timed(sm)
                rows.append(("cublas_fp8_rowwise", t, wbytes // 2, rel_l2(out, ref8)))
            except Exception as e:  # noqa: BLE001
                print(f"# {name} M={m}: torch._scaled_mm row-wise not available: {e}")
            grid = ((n + 15) // 16, 1, 1)
            for (wv, u) in VARIANTS:
                fb = k[f"gemv_bf16_w{wv}_u{u}"]
                ff = k[f"gemv_fp8_w{wv}_u{u}"]
                blk = (32 * wv, 1, 1)

                def lb(i, fb=fb, blk=blk):
                    with stream():
                        fb(grid, blk, (cp.uint64(wb[i % len(wb)].data_ptr()), cp.uint64(x.data_ptr()),
                                       cp.uint64(y.data_ptr()), cp.int32(m), cp.int32(n), cp.int32(kk)))

                lb(0)
                torch.cuda.synchronize()
                e_b = rel_l2(y, ref)
                t = timed(lb)
                rows.append((f"gemv_bf16_w{wv}_u{u}", t, wbytes, e_b))

                def lf(i, ff=ff, blk=blk):
                    with stream():
                        ff(grid, blk, (cp.uint64(w8[i % len(w8)].data_ptr()), cp.uint64(xq.data_ptr()),
                                       cp.uint64(ws.data_ptr()), cp.int32(1), cp.uint64(xs.data_ptr()), cp.int32(1),
                                       cp.uint64(y.data_ptr()), cp.int32(m), cp.int32(n), cp.int32(kk)))

                lf(0)
                torch.cuda.synchronize()
                e_f = rel_l2(y, ref8)
                t = timed(lf)
                rows.append((f"gemv_fp8_w{wv}_u{u}", t, wbytes // 2, e_f))
            for (kn, t, by, err) in rows:
                fl = by / bw * 1e6  # the weight bytes at the copy rate (read + written bytes per second)
                print(f"{name:12s} N={n:6d} K={kk:5d} M={m} {kn:20s} {t:8.2f} us {by / t / 1e3:7.1f} GB/s "
                      f"x{t / fl:5.2f} of floor rel_l2 {err:.2e}")
            sys.stdout.flush()
        del wb, w8


if __name__ == "__main__":
    main()
