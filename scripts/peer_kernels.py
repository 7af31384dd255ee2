#!/usr/bin/env python3
"""Peer GEMM providers for `rigbench kernels`, run in the same session with the same shapes, M
values, L2 flush, stopping rule and timing modes as rigbench's own cases.

Driven by rigbench: `python3 scripts/peer_kernels.py --spec spec.json --out peers.json`.
The spec (written by rigbench) holds: shapes [{name, n, k}], m [..], l2_flush_bytes, warmup,
stopping {min_samples, max_samples, target_rel_std, max_time_s}, timing {cold, graph,
graph_min_total_bytes, graph_min_launches, graph_max_copies}, sys_path [peer folders, e.g. .peers/
holding gemlite/, humming/*.whl and vllm-marlin/libmarlin_nvfp4.so, see scripts/fetch-peers.sh],
resume [true: --out holds the output of an earlier, stopped run of this script; its cases and
skips are kept and not run again], providers [the providers to run; absent: all], nvfp4
[rigbench's NVFP4 generator, per-shape probes and per-(shape, M) activation seeds, sampled
coordinates and f64 references, and the tolerance: src/kernels/peer_nvfp4.rs].
`--self-test INTS` prints the pure helpers' values as JSON for rigbench's host tests.
Environment: RIGBENCH_GEMLITE_AUTOTUNE (gemlite's autotune setting: fast, the default; default =
one config per kernel, for quick checks; max); RIGBENCH_GEMLITE_NATIVE_ATOMIC=1 (keep gemlite's
BF16 atomic adds in its split-K kernels: faster, but they fail the correctness check at small M).

Progress: the output is saved (atomically) after every case, and before each case (and before
the GPU work that prepares it) its key is written as "in_flight". A CUDA error (e.g. an illegal
memory access) poisons the whole CUDA context, so the script then exits at once (status 70)
leaving that key in place: rigbench records the case as skipped with the error and starts the
script again with resume, so the other cases still run in a fresh context.

Providers (each checked against a float64 reference on sampled outputs before it is timed):
  torch    torch.matmul BF16 (cuBLAS)
  torch    torch._scaled_mm FP8 E4M3 per-tensor scales, BF16 out (M padded to a multiple of 16,
           as the op requires); its activation quantization (amax / 448 per tensor, then a cast,
           in plain torch ops) is timed separately as the extra part `activation_quant`, as
           rigbench's fp8 rows do
  torch    torch._weight_int4pack_mm (tinygemm INT4 W4A16, group 128)
  gemlite  gemlite.A16W4_INT_g128: gemlite's Triton INT4 weight-only GEMM, group 128, BF16
           activations, HQQ convention (W_q - zero) * scale; needs the `gemlite/` package folder
           on a sys_path entry (see scripts/fetch-peers.sh) and triton >= 3.6
  humming      Humming (PyPI humming-kernels; imported, or installed offline from the carried
               wheel): W4A16 NVFP4 on rigbench's own tensors, its configuration recorded per case;
               a shape it refuses (AssertionError, N = 96) is skipped with the REFUSED prefix
  vllm-marlin  vLLM's Marlin NVFP4 x BF16 kernels from the carried libmarlin_nvfp4.so (built by
               scripts/build-marlin.sh), weights and scales repacked here as vLLM does; its launch
               plan recorded per case
  vllm         vLLM's own prepare_fp4_layer_for_marlin / apply_fp4_marlin_linear when importable
The NVFP4 providers are checked against rigbench's CPU reference from the spec (rel_l2 within
its W4A16 tolerance) on rigbench's activations, regenerated bit for bit from the case's seed.

Output JSON: {"peers": [{provider, implementations, available, detail}],
              "cases": [{provider, implementation, format, shape, m, n, k, path, config, check,
                         samples_s, stop_reason, weight_bytes, extra: [{name, samples_s,
                         stop_reason}], graph: {samples_s, stop_reason, launches, weight_copies,
                         weight_bytes_total, extra} | null, graph_skip, t_start, t_end}],
              "skipped": [{provider, implementation, shape, m, reason}],
              "in_flight": {provider, implementation, shape, m} | null}
Timing, cold: CUDA events (torch.cuda.Event(enable_timing=True)) around each call; before each
sample the L2 is flushed by reading a buffer of l2_flush_bytes (as rigbench does). Graph: the
weights copied until the copies exceed graph_min_total_bytes (4 x L2; at least 2 copies), the
smallest multiple of the copy count >= graph_min_launches calls rotating over them captured in a
torch.cuda.CUDAGraph; a sample is one replay between events divided by the calls (rigbench's
rule, src/kernels/bench.rs graph_plan). Sampling stops as rigbench's stopping rule: converged
(sigma/mean <= target after >= min_samples), sample cap, or time cap (never below min_samples).
t_start / t_end are Unix seconds around a case's sampling, so rigbench can attach the SM clock
it polled meanwhile.
"""

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
import types

TOL = 5e-3  # same rule as rigbench's named tolerances: BF16 output rounding + accumulation order
GROUP = 128

# The skip reason of a shape an implementation does not take (Humming refuses N = 96): rigbench's
# decode-step composite may then count rigbench's BF16 GEMM for that shape, as an engine keeps
# such a layer unquantized (src/kernels/composite.rs, REFUSED_PREFIX; the same text there).
REFUSED = "refuses this shape: "

MASK32 = 0xFFFFFFFF


def mul32(x, c):
    """(x * c) mod 2^32 for 0 <= x < 2^32 and a constant c < 2^32, without leaving 48 bits: works
    on Python ints and on torch int64 tensors alike."""
    return ((x * (c & 0xFFFF)) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def hash32(x):
    """rigbench's integer hash (lowbias32, src/kernels/data.rs hash32) on ints or int64 tensors."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def nvfp4_code_bits(idx, seed, salt):
    """Byte `idx` of rigbench's packed E2M1 codes (src/kernels/data.rs nvfp4_weight)."""
    return hash32(idx ^ hash32(seed ^ salt)) & 0xFF


def nvfp4_scale_bits(idx, seed, salt):
    """Byte `idx` of rigbench's E4M3 block scales: exponent field 5..9, any mantissa, positive."""
    h = hash32(idx ^ hash32(seed ^ salt))
    return ((5 + (h >> 8) % 5) << 3) | (h & 7)


def uniform_pm1_bits(idx, seed):
    """The 24-bit integer behind rigbench's uniform value in [-1, 1) for element `idx`:
    value = bits * 2^-24 * 2 - 1 (exact in FP32)."""
    return hash32(idx ^ hash32(seed)) >> 8


def marlin_weight_perm():
    """The order in which Marlin's repack (vLLM gptq_marlin_repack, 4-bit weights, 16-bit
    activations) stores the 1024 codes of four 16×16 tiles (16 k × 64 n): per thread of a warp
    the codes of its mma fragments, then interleaved so that one 32-bit word dequantizes into
    BF16 pairs. Facts from vLLM's marlin_utils_test.get_weight_perm; rigbench's own code."""
    perm = []
    for i in range(32):
        col = i // 4
        rows = (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)
        one = [16 * r + col + 8 * half for half in (0, 1) for r in rows]
        for j in range(4):
            perm.extend(p + 256 * j for p in one)
    inter = (0, 2, 4, 6, 1, 3, 5, 7)
    return [perm[g * 8 + t] for g in range(len(perm) // 8) for t in inter]


def marlin_scale_perm():
    """The order of the 64 scales of one group row (8 × 8 tile columns) Marlin reads for
    grouped scales (vLLM marlin_permute_scales, group size < K)."""
    return [i + 8 * j for i in range(8) for j in range(8)]


def marlin_padded_nk(n, k, group=16):
    """The smallest (N, K) Marlin takes for [N, K]: N a multiple of 64 and K of 128, or N of 128
    and K of 64 (K kept a multiple of the group), the smaller area first, as vLLM pads."""
    import math

    def up(x, m):
        return (x + m - 1) // m * m

    cands = ((up(n, 64), up(k, math.lcm(128, group))), (up(n, 128), up(k, math.lcm(64, group))))
    return min(cands, key=lambda nk: (nk[0] * nk[1], nk[0] + nk[1]))


def humming_config_text(cfg):
    """A short description of the kernel configuration Humming's heuristic chose (humming/tune:
    Sm90Heuristics.get_config for sm_90) from its config dict."""
    if not isinstance(cfg, dict):
        return str(cfg)
    keys = ("mma_type", "block_shape", "warp_shape", "num_stages", "num_ctas_per_sm", "use_tma", "use_warp_spec",
            "use_stream_k", "num_sms", "multi_cast_size_a", "raster_group_m")
    parts = [f"{key}={cfg[key]}" for key in keys if key in cfg and cfg[key] not in (None, False)]
    rest = sorted(set(cfg) - set(keys))
    if rest:
        parts.append("+" + ",".join(rest))
    return " ".join(parts) or "(empty config)"


def self_test(values):
    """Print the pure helpers' results for rigbench's host tests (no torch needed)."""
    out = {
        "hash32": [hash32(v) for v in values],
        "code_bits": [nvfp4_code_bits(v, 0x4A160001, 0x5EED0001) for v in values],
        "scale_bits": [nvfp4_scale_bits(v, 0x4A160001, 0x5EED0002) for v in values],
        "uniform_bits": [uniform_pm1_bits(v, 7) for v in values],
        "marlin_weight_perm": marlin_weight_perm(),
        "marlin_scale_perm": marlin_scale_perm(),
        "marlin_padded_nk": [marlin_padded_nk(96, 5120), marlin_padded_nk(5120, 6144), marlin_padded_nk(100, 200)],
        "refused": REFUSED,
    }
    print(json.dumps(out))


def graph_plan(nbytes, min_total, min_launches):
    """(copies, launches): the fewest copies (>= 2) whose total exceeds min_total, and the
    smallest multiple of that count >= min_launches (rigbench's graph_plan)."""
    copies = max(2, min_total // max(1, nbytes) + 1)
    launches = copies * max(1, -(-min_launches // copies))
    return copies, launches


def import_gemlite(paths):
    """Import gemlite from a carried folder; returns (module, None) or (None, reason)."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)
    found = [p for p in paths if os.path.isdir(os.path.join(p, "gemlite"))]
    try:
        import tqdm  # noqa: F401
    except ImportError:
        # gemlite's helper imports tqdm for progress bars only; a stand-in keeps it importable.
        stub = types.ModuleType("tqdm")
        stub.tqdm = lambda it=None, *a, **k: it
        sys.modules["tqdm"] = stub
    try:
        import gemlite  # noqa: F401
        from gemlite import helper  # noqa: F401
        return gemlite, None
    except Exception as e:  # noqa: BLE001
        where = ", ".join(found) if found else "no gemlite/ folder in " + (", ".join(paths) or "(no sys_path given)")
        return None, (f"gemlite could not be imported ({type(e).__name__}: {e}); looked in: {where}. "
                      "Run scripts/fetch-peers.sh and carry .peers/")


def rigbench_nvfp4(torch, n, k, gen, dev):
    """rigbench's NVFP4 weight for [n, k] (src/kernels/data.rs nvfp4_weight with the spec's seed and
    salts), bit for bit, on the GPU: packed codes u8 [n, k/2] and E4M3 block scales u8 [n, k/16]."""
    seed, cs, ss = int(gen["seed"]), int(gen["code_salt"]), int(gen["scale_salt"])
    codes = torch.empty(n * k // 2, dtype=torch.uint8, device=dev)
    scales = torch.empty(n * k // 16, dtype=torch.uint8, device=dev)
    step = 1 << 24
    for buf, f, salt in ((codes, nvfp4_code_bits, cs), (scales, nvfp4_scale_bits, ss)):
        for i0 in range(0, buf.numel(), step):
            idx = torch.arange(i0, min(buf.numel(), i0 + step), dtype=torch.int64, device=dev)
            buf[i0:i0 + idx.numel()] = f(idx, seed, salt).to(torch.uint8)
    return codes.view(n, k // 2), scales.view(n, k // 16)


def check_probe(codes, scales, probe):
    """Compare regenerated tensors with the bytes rigbench wrote into the spec at a few positions;
    raises when one differs (the peer would not be running on rigbench's tensors)."""
    flat = {"codes": codes.reshape(-1), "scales": scales.reshape(-1)}
    for key, pairs in probe.items():
        if key not in flat:
            continue
        for idx, want in pairs:
            got = int(flat[key][int(idx)].item())
            if got != int(want):
                raise RuntimeError(f"{key}[{idx}] = {got}, rigbench has {want}: the regenerated NVFP4 tensors "
                                   "are not rigbench's")


def rigbench_activations(torch, m, k, seed, dev):
    """rigbench's BF16 activations [m, k] for `seed` (src/kernels/data.rs bf16_uniform, scale 1):
    element i = bf16_rn(bits(i) · 2^-24 · 2 − 1), bit for bit."""
    out = torch.empty(m * k, dtype=torch.bfloat16, device=dev)
    step = 1 << 24
    for i0 in range(0, m * k, step):
        idx = torch.arange(i0, min(m * k, i0 + step), dtype=torch.int64, device=dev)
        v = uniform_pm1_bits(idx, seed).to(torch.float32) * (1.0 / 16777216.0) * 2.0 - 1.0
        out[i0:i0 + idx.numel()] = v.to(torch.bfloat16)
    return out.view(m, k)


def import_humming(paths):
    """Import Humming (PyPI humming-kernels); when it is not installed, install its wheel carried in
    <path>/humming/ offline (pip --no-index --no-deps --target) into a temporary folder, reused by
    later starts. Returns (module, None) or (None, reason)."""
    import glob
    import subprocess
    import tempfile

    try:
        import humming  # noqa: F401
        return humming, None
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001
        return None, f"humming could not be imported ({type(e).__name__}: {e})"
    wheels = sorted(w for p in paths for w in glob.glob(os.path.join(p, "humming", "humming_kernels-*.whl")))
    if not wheels:
        return None, ("humming is not installed and no humming/humming_kernels-*.whl was found in "
                      + (", ".join(paths) or "(no peer folder)") + ": run scripts/fetch-peers.sh and carry .peers/")
    wheel = wheels[-1]
    target = os.path.join(tempfile.gettempdir(), "rigbench-" + os.path.basename(wheel)[:-4])
    if not os.path.isfile(os.path.join(target, "humming", "__init__.py")):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                            "--target", target, wheel], capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            return None, f"pip install --no-index --no-deps {os.path.basename(wheel)} failed: {last}"
    sys.path.insert(0, target)
    try:
        import humming  # noqa: F401
        return humming, None
    except Exception as e:  # noqa: BLE001
        return None, f"humming installed from {os.path.basename(wheel)} could not be imported ({type(e).__name__}: {e})"


class MarlinLib:
    """vLLM's Marlin NVFP4 × BF16 kernels behind rigbench's raw-pointer entry point
    (scripts/peers/marlin_nvfp4_entry.cu, built by scripts/build-marlin.sh)."""

    ABI = 1

    def __init__(self, path):
        import ctypes

        self.ct = ctypes
        self.path = path
        self.lib = ctypes.CDLL(path)
        c_int, c_ll, c_p, c_char_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_char_p
        self.lib.rb_marlin_abi_version.restype = c_int
        abi = self.lib.rb_marlin_abi_version()
        if abi != self.ABI:
            raise RuntimeError(f"{path} has entry-point ABI {abi}, this script needs {self.ABI}: rebuild it "
                               "with scripts/build-marlin.sh")
        self.lib.rb_marlin_workspace.argtypes = [c_int, ctypes.POINTER(c_ll), ctypes.POINTER(c_ll), c_char_p, c_int]
        self.lib.rb_marlin_describe.argtypes = [c_int, c_int, c_int, c_char_p, c_int]
        self.lib.rb_marlin_nvfp4_bf16.argtypes = [c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_int, c_int, c_int, c_int,
                                                   c_int, c_p, c_char_p, c_int]
        for f in (self.lib.rb_marlin_workspace, self.lib.rb_marlin_describe, self.lib.rb_marlin_nvfp4_bf16):
            f.restype = c_int
        self.err = ctypes.create_string_buffer(512)
        folder = os.path.dirname(path)
        self.version = "?"
        try:
            with open(os.path.join(folder, "VLLM_VERSION")) as f:
                self.version = f.read().strip()
        except OSError:
            pass
        self.build = ""
        try:
            with open(path + ".build") as f:
                self.build = "; ".join(line.strip() for line in f if line.strip())
        except OSError:
            pass

    def workspace(self, m):
        ct = self.ct
        a, b = ct.c_longlong(0), ct.c_longlong(0)
        if self.lib.rb_marlin_workspace(m, ct.byref(a), ct.byref(b), self.err, len(self.err)) != 0:
            raise RuntimeError(self.err.value.decode(errors="replace"))
        return a.value, b.value

    def describe(self, m, n, k):
        buf = self.ct.create_string_buffer(1024)
        rc = self.lib.rb_marlin_describe(m, n, k, buf, len(buf))
        text = buf.value.decode(errors="replace")
        if rc != 0:
            raise RuntimeError(text)
        return text

    def gemm(self, a, b, s, gs, c, c_tmp, locks, m, n, k, stream):
        rc = self.lib.rb_marlin_nvfp4_bf16(a.data_ptr(), b.data_ptr(), s.data_ptr(), gs.data_ptr(), c.data_ptr(),
                                           c_tmp.data_ptr(), locks.data_ptr(), m, n, k, a.stride(0), 1, stream,
                                           self.err, len(self.err))
        if rc != 0:
            raise RuntimeError("Marlin: " + self.err.value.decode(errors="replace"))
        return c


def find_marlin(paths):
    """The built `vllm-marlin` library in <path>/vllm-marlin/; (MarlinLib, None) or (None, reason)."""
    libs = [os.path.join(p, "vllm-marlin", "libmarlin_nvfp4.so") for p in paths]
    found = [p for p in libs if os.path.isfile(p)]
    if not found:
        srcs = [os.path.join(p, "vllm-marlin", "src") for p in paths if os.path.isdir(os.path.join(p, "vllm-marlin", "src"))]
        why = ("its sources are in " + srcs[0] + " but the library was not built: run scripts/build-marlin.sh") if srcs \
            else "no vllm-marlin/libmarlin_nvfp4.so in " + (", ".join(paths) or "(no peer folder)") + \
            ": run scripts/fetch-peers.sh and carry .peers/"
        return None, why
    try:
        return MarlinLib(found[0]), None
    except Exception as e:  # noqa: BLE001
        return None, f"{found[0]} could not be loaded ({type(e).__name__}: {e})"


def marlin_repack_nvfp4(torch, w_u8, n, k):
    """Marlin's weight layout (vLLM gptq_marlin_repack, 4-bit, 16-bit activations) of ModelOpt NVFP4
    codes `w_u8` [n, k/2] (byte j of a row: element 2j in the low nibble): int32 [k/16, 2n]. Done
    with torch ops, 64·c output columns at a time (the permutation never crosses 64 columns)."""
    dev = w_u8.device
    perm = torch.tensor(marlin_weight_perm(), device=dev, dtype=torch.long)
    out = torch.empty((k // 16, 2 * n), dtype=torch.int32, device=dev)
    step = max(64, (1 << 26) // max(1, k) // 64 * 64)
    for n0 in range(0, n, step):
        cn = min(step, n - n0)
        blk = w_u8[n0:n0 + cn]
        codes = torch.stack((blk & 0xF, blk >> 4), dim=-1).reshape(cn, k)
        q = codes.t().reshape(k // 16, 16, cn // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, cn * 16)
        q = q.reshape(-1, 1024)[:, perm].reshape(k // 16, cn * 2, 8).to(torch.int64)
        packed = torch.zeros((k // 16, cn * 2), dtype=torch.int64, device=dev)
        for i in range(8):
            packed |= q[:, :, i] << (4 * i)
        packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed).to(torch.int32)
        out[:, 2 * n0:2 * (n0 + cn)] = packed
    return out


def marlin_scales_nvfp4(torch, sc_u8, n, k, ws2):
    """Marlin's NVFP4 scales and global scale (vLLM prepare_fp4_layer_for_marlin with BF16
    activations): the E4M3 block scales [n, k/16] transposed to [k/16, n], permuted as Marlin reads
    them, re-encoded as S0E5M3 bytes (×2^7, and ×2^f so that the largest uses the range; scales
    below 2 after that flush to 0), and the FP32 tensor scale times 2^(126 − 7) / 2^f.
    Returns (scales uint8 view [k/16, n], global FP32 [1], f)."""
    s = sc_u8.view(torch.float8_e4m3fn).t().contiguous().to(torch.bfloat16)
    s = s.reshape(-1, 64)[:, torch.tensor(marlin_scale_perm(), device=s.device)].reshape(-1, n)
    s = s.to(torch.half)
    s = s.view(-1, 4)[:, [0, 2, 1, 3]].reshape(s.size(0), -1)
    w = s.float() * 128
    factor = 1.0
    if (w > 0).any():
        top = w[w > 0].max()
        if top < 448 * 128:
            factor = float((448 * 128 / top).log2().floor().exp2().item())
    if factor > 1.0:
        s = (s.float() * factor).to(torch.half)
    s = s * 128
    s[s < 2] = 0
    s = (s.view(torch.int16) << 1).view(torch.uint8)[:, 1::2].contiguous()
    gs = torch.tensor([ws2], dtype=torch.float32, device=s.device) * (2.0 ** (126 - 7)) / factor
    return s, gs, factor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec")
    ap.add_argument("--out")
    ap.add_argument("--self-test", metavar="INTS", help="print the pure helpers' values at these comma-separated "
                    "integers as JSON (rigbench's host tests) and exit")
    args = ap.parse_args()
    if args.self_test is not None:
        self_test([int(v) for v in args.self_test.split(",") if v])
        return 0
    if not args.spec or not args.out:
        ap.error("--spec and --out are required")
    with open(args.spec) as f:
        spec = json.load(f)
    timing = spec.get("timing") or {"cold": True, "graph": False}
    do_cold = bool(timing.get("cold", True))
    do_graph = bool(timing.get("graph", False))
    out = {"peers": [], "cases": [], "skipped": [], "in_flight": None}

    def save():
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(args.out + ".tmp", args.out)

    done = set()
    if spec.get("resume") and os.path.exists(args.out):
        with open(args.out) as f:
            prev = json.load(f)
        out["cases"] = list(prev.get("cases") or [])
        out["skipped"] = list(prev.get("skipped") or [])
        done = {(c["provider"], c["implementation"], c["shape"], c["m"]) for c in out["cases"] + out["skipped"]}
        # A key left in flight by a stopped run is not this run's: clear it before anything else
        # can fail (rigbench would otherwise blame that case for a failure during start-up).
        save()

    def context_broken():
        """Whether the CUDA context is unusable (an earlier kernel faulted): errors surface at a
        later call, so ask the GPU to finish its queued work."""
        try:
            torch.cuda.synchronize()
            return False
        except Exception:  # noqa: BLE001
            return True

    def is_fatal(e):
        """A CUDA error that poisons the context (not one a case can be skipped for)."""
        return isinstance(e, getattr(torch, "AcceleratorError", ())) or context_broken()

    def die_on_cuda_error(e):
        """A CUDA error poisons the context: exit now, leaving out["in_flight"] saved."""
        key = out.get("in_flight") or {}
        print(f"CUDA error in {key.get('implementation', '?')} {key.get('shape', '?')} M={key.get('m', '?')}: "
              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr, flush=True)
        os._exit(70)

    def settle():
        """Wait for the GPU work queued so far; a fault in it is the in-flight case's."""
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            die_on_cuda_error(e)

    def claim(provider, impl, shape, m):
        """Name the case whose GPU work starts now (saved, so a crash leaves it named). The
        work queued for the case named before is finished first, so its faults stay its own."""
        settle()
        key = {"provider": provider, "implementation": impl, "shape": shape, "m": m}
        if out["in_flight"] != key:  # the M's preparation and its first case share a key
            out["in_flight"] = key
            save()

    def release():
        """The in-flight case's GPU work is finished: nothing is in flight."""
        settle()
        if out["in_flight"] is not None:
            out["in_flight"] = None
            save()

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
    chosen = spec.get("providers")  # None: every provider
    chosen = None if chosen is None else set(chosen)

    def want(provider):
        return chosen is None or provider in chosen

    def not_asked(provider, impls_):
        out["peers"].append({"provider": provider, "implementations": impls_, "available": False,
                             "detail": "not asked for (--peer-providers)"})

    paths = list(spec.get("sys_path") or [])
    impls = ["torch.matmul", "torch._scaled_mm", "torch._weight_int4pack_mm"] if want("torch") else []
    if want("torch"):
        out["peers"].append({"provider": "torch", "implementations": impls, "available": True,
                             "detail": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                       f"{torch.cuda.get_device_name(0)}"})
    else:
        not_asked("torch", ["torch.matmul", "torch._scaled_mm", "torch._weight_int4pack_mm"])
    gemlite, gl_err = import_gemlite(paths) if want("gemlite") else (None, None)
    gl_autotune = os.environ.get("RIGBENCH_GEMLITE_AUTOTUNE", "fast")
    gl_native_atomic = os.environ.get("RIGBENCH_GEMLITE_NATIVE_ATOMIC") == "1"
    if gemlite is not None and not gl_native_atomic:
        # gemlite's own accuracy switch: its split-K kernels add partial sums with atomics; on
        # sm_90 these are BF16 atomics by default, whose rounding fails the check (rel_l2 1-2% at
        # M <= 4 on this suite's shapes); off, they accumulate in FP32 and cast at the end.
        try:
            gemlite.set_native_atomic_bfp16(False)
        except Exception as e:  # noqa: BLE001
            gemlite, gl_err = None, f"gemlite.set_native_atomic_bfp16(False) failed: {type(e).__name__}: {e}"
    if gemlite is not None and gl_autotune != "fast":
        try:
            gemlite.set_autotune(gl_autotune)
        except Exception as e:  # noqa: BLE001
            gemlite, gl_err = None, f"gemlite.set_autotune({gl_autotune!r}) failed: {type(e).__name__}: {e}"
    if not want("gemlite"):
        not_asked("gemlite", ["gemlite.A16W4_INT_g128"])
    elif gemlite is not None:
        import triton
        out["peers"].append({"provider": "gemlite", "implementations": ["gemlite.A16W4_INT_g128"],
                             "available": True,
                             "detail": f"gemlite {getattr(gemlite, '__version__', '?')} (Triton {triton.__version__}), "
                                       f"INT4 weight-only, group 128, BF16 activations, autotune '{gl_autotune}'"
                                       + ("" if gl_autotune == "fast" else " (not gemlite's default 'fast': "
                                          "its figures are untuned)")
                                       + ("; native BF16 atomic adds (gemlite's default on sm_90)" if gl_native_atomic
                                          else "; split-K partial sums in FP32 (gemlite.set_native_atomic_bfp16(False)): "
                                          "its default BF16 atomics fail the correctness check at small M")
                                       + "; its NVFP4 weight-only path (A16W4_NVFP) is not run: Triton's "
                                       "dot_scaled fails to compile on sm_90"})
    else:
        out["peers"].append({"provider": "gemlite", "implementations": ["gemlite.A16W4_INT_g128"],
                             "available": False, "detail": gl_err})

    # NVFP4 W4A16 peers: rigbench's own NVFP4 tensors (regenerated bit for bit from its seeds,
    # checked at probed positions) and its own activations; checked against rigbench's CPU
    # reference (the spec's `nvfp4` section) before timing.
    nv = spec.get("nvfp4") or {}
    nv_shapes = nv.get("shapes") or {}
    nv_note = "" if nv_shapes else "; the spec has no NVFP4 references (rigbench too old?), so no NVFP4 rows"
    humming, hm_err = (None, None)
    if want("humming"):
        humming, hm_err = import_humming(paths)
    if not want("humming"):
        not_asked("humming", ["humming.nvfp4"])
    elif humming is not None:
        out["peers"].append({
            "provider": "humming", "implementations": ["humming.nvfp4"], "available": bool(nv_shapes),
            "detail": f"humming-kernels {getattr(humming, '__version__', '?')} (vLLM >= 0.32's W4A16 NVFP4 path on "
                      "sm_90): HummingLayer with ModelOpt NVFP4 tensors (weight u8 [N, K/2], weight_scale E4M3 "
                      "[N, K/16], weight_scale_2 FP32), transform(), layer(x); its CUDA sources JIT-compiled on "
                      "first use of each shape (not timed); kernel configuration by its own heuristic "
                      "(humming.tune, Sm90Heuristics on sm_90), named per case; graph timing is its fair view "
                      "(its Python dispatch takes longer than the kernel)" + nv_note})
    else:
        out["peers"].append({"provider": "humming", "implementations": ["humming.nvfp4"], "available": False,
                             "detail": hm_err})
    marlin, mr_err = find_marlin(paths) if want("vllm-marlin") else (None, None)
    if not want("vllm-marlin"):
        not_asked("vllm-marlin", ["marlin.nvfp4"])
    elif marlin is not None:
        out["peers"].append({
            "provider": "vllm-marlin", "implementations": ["marlin.nvfp4"], "available": bool(nv_shapes),
            "detail": f"vLLM {marlin.version}'s Marlin kernels (csrc/quantization/marlin, FP4 E2M1 × BF16, group 16, "
                      "FP32 global reduction) built by scripts/build-marlin.sh ({}) and called through rigbench's "
                      "raw-pointer entry point; weights and scales repacked as vLLM's prepare_fp4_layer_for_marlin "
                      "does (ported to torch ops in scripts/peer_kernels.py); N padded to Marlin's tiles as vLLM "
                      "pads (the output slice copy timed with it); launch plan per case; graph timing is its fair "
                      "view (a ctypes call per GEMM)".format(marlin.build or "build facts not recorded") + nv_note})
    else:
        out["peers"].append({"provider": "vllm-marlin", "implementations": ["marlin.nvfp4"], "available": False,
                             "detail": mr_err})
    vllm_fp4, vl_err = None, None
    if want("vllm"):
        try:
            import vllm  # noqa: F401
            from vllm.model_executor.layers.quantization.utils import marlin_utils as vllm_mu
            from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as vllm_mu4
            vllm_fp4 = (vllm, vllm_mu, vllm_mu4)
        except Exception as e:  # noqa: BLE001
            vl_err = (f"vLLM is not importable on this machine ({type(e).__name__}: {e}); its own ops are not run "
                      "(the vllm-marlin peer runs the same kernels from vLLM's sources)")
    if not want("vllm"):
        not_asked("vllm", ["vllm.apply_fp4_marlin_linear"])
    elif vllm_fp4 is not None:
        out["peers"].append({
            "provider": "vllm", "implementations": ["vllm.apply_fp4_marlin_linear"], "available": bool(nv_shapes),
            "detail": f"vllm {vllm_fp4[0].__version__}: its own prepare_fp4_layer_for_marlin and "
                      "apply_fp4_marlin_linear (torch.ops._C.marlin_gemm) on the same tensors" + nv_note})
    else:
        out["peers"].append({"provider": "vllm", "implementations": ["vllm.apply_fp4_marlin_linear"],
                             "available": False, "detail": vl_err})
    if not nv_shapes:
        humming = marlin = vllm_fp4 = None
    save()

    flush = torch.full((int(spec["l2_flush_bytes"]) or 1,), 17, dtype=torch.uint8, device=dev)
    st = spec["stopping"]
    gen = torch.Generator(device=dev)

    def sample(take):
        """Samples from take() until the stopping rule says stop; returns (samples, reason)."""
        samples = []
        t0 = time.time()
        while True:
            samples.append(take())
            n = len(samples)
            if n >= st["max_samples"]:
                return samples, "sample_cap"
            if n >= st["min_samples"] and n >= 2:
                mu = statistics.fmean(samples)
                if mu > 0 and statistics.stdev(samples) / mu <= st["target_rel_std"]:
                    return samples, "converged"
            # The time cap never stops a case below min_samples.
            if time.time() - t0 >= st["max_time_s"] and n >= max(1, st["min_samples"]):
                return samples, "time_cap"

    def time_cold(fn):
        for _ in range(int(spec["warmup"])):
            fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

        def take():
            if spec["l2_flush_bytes"]:
                flush.max()  # a read of 2x L2, as rigbench's flush (clean lines, no write-back)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3

        return sample(take)

    def capture(fns, launches):
        """A CUDAGraph of `launches` calls rotating over fns; returns (graph, last output)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for f in fns[:2]:
                f()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        last = None
        with torch.cuda.graph(g):
            for i in range(launches):
                last = fns[i % len(fns)]()
        return g, last

    def time_graph(g, launches):
        for _ in range(max(1, int(spec["warmup"]))):
            g.replay()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

        def take():
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / launches

        return sample(take)

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

    def nbytes(*ts):
        return int(sum(t.numel() * t.element_size() for t in ts if t is not None))

    e4m3 = getattr(torch, "float8_e4m3fn", None)
    g_min_total = int(timing.get("graph_min_total_bytes") or 0)
    g_min_launches = int(timing.get("graph_min_launches") or 8)
    g_max_copies = int(timing.get("graph_max_copies") or 4096)
    if do_graph and g_min_total <= 0:
        g_min_total = 4 * (int(spec["l2_flush_bytes"]) // 2 or (60 << 20))

    t_begin = time.time()
    nv_impls = [(p_, i_) for p_, i_, on in (("humming", "humming.nvfp4", humming is not None),
                                             ("vllm-marlin", "marlin.nvfp4", marlin is not None),
                                             ("vllm", "vllm.apply_fp4_marlin_linear", vllm_fp4 is not None)) if on]
    impl_names = impls + (["gemlite.A16W4_INT_g128"] if gemlite is not None else []) + [i_ for _, i_ in nv_impls]
    providers = {"gemlite.A16W4_INT_g128": "gemlite"}
    providers.update({i_: p_ for p_, i_ in nv_impls})
    torch_side = bool(impls) or gemlite is not None
    nv_gen = nv.get("generator") or {}
    nv_tol = float((nv.get("tolerance") or {}).get("value", TOL))
    nv_tol_name = (nv.get("tolerance") or {}).get("name", "PEER_REL_L2")
    for shape in spec["shapes"]:
        n, k, name = shape["n"], shape["k"], shape["name"]
        if done and all((providers.get(i, "torch"), i, name, m) in done for i in impl_names for m in spec["m"]):
            continue  # every case of this shape ran in the earlier run (resume)
        release()  # the weights made next are no case's own
        w_bf16 = w_fp8 = q_int = scales = None
        if torch_side:
            gen.manual_seed(sum(map(ord, name)))
            w_bf16 = (torch.rand(n, k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
            w_fp8 = (torch.rand(n, k, device=dev, generator=gen) * 4 - 2).to(e4m3) if e4m3 else None
            w_scale = torch.tensor(1.0 / 64, device=dev)
            # INT4 codes 0..15, group 128 along K; scale per group and row; zero point 8.
            q_int = torch.randint(0, 16, (n, k), device=dev, dtype=torch.int32, generator=gen)
            scales = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.02 + 0.005).to(torch.bfloat16) \
                if k % GROUP == 0 else None
        int4_err = None if k % GROUP == 0 else f"K = {k} is not a multiple of the group size {GROUP}"
        # tinygemm: scale and zero (BF16) per group and row; zero in its convention is the value
        # added after (q - 8) * scale, so 0 here. Two candidate nibble orders for the uint8 input
        # (torchao packs the even element in the high nibble); the correctness check decides.
        int4_packings = []
        sz = None
        if scales is not None and "torch._weight_int4pack_mm" in impls:
            sz = torch.stack([scales, torch.zeros_like(scales)], dim=2).contiguous()
            todo = [m for m in spec["m"] if ("torch", "torch._weight_int4pack_mm", name, m) not in done]
            if todo:
                claim("torch", "torch._weight_int4pack_mm", name, todo[0])  # a crash here skips that case
            orders = (("even k in high nibble", True), ("even k in low nibble", False))
            for order, even_high in orders if todo else ():
                try:
                    hi, lo = (q_int[:, ::2], q_int[:, 1::2]) if even_high else (q_int[:, 1::2], q_int[:, ::2])
                    u8 = ((hi << 4) | lo).to(torch.uint8)
                    int4_packings.append((order, torch._convert_weight_to_int4pack(u8, 8)))
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)
                    int4_err = f"{type(e).__name__}: {e}"
        gl_layer, gl_err_shape = None, None
        if gemlite is not None:
            if scales is None:
                gl_err_shape = int4_err
            else:
                todo = [m for m in spec["m"] if ("gemlite", "gemlite.A16W4_INT_g128", name, m) not in done]
                if todo:
                    claim("gemlite", "gemlite.A16W4_INT_g128", name, todo[0])  # a crash here skips that case
                try:
                    if not todo:
                        raise RuntimeError("every gemlite case of this shape ran in the earlier run")
                    gl_layer = gemlite.helper.A16Wn(device="cuda:0", dtype=torch.bfloat16).from_weights(
                        q_int.to(torch.uint8), scales.t().contiguous(),
                        torch.full_like(scales.t().contiguous(), 8.0), 4, GROUP)
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)
                    gl_err_shape = f"gemlite could not pack the weights: {type(e).__name__}: {e}"
        # NVFP4 peers: rigbench's tensors for this shape, then each peer's own form of them.
        nvs = nv_shapes.get(name)
        nv_todo = [(p_, i_) for p_, i_ in nv_impls if any((p_, i_, name, m_) not in done for m_ in spec["m"])]
        nv_err = None if nvs is not None else "the spec has no rigbench reference for this shape"
        hm_layer = mr_w = vl_layer = None
        hm_err_shape = mr_err_shape = vl_err_shape = None
        mr_nk = (n, k)
        if nv_todo and nvs is not None:
            first_m = next(m_ for m_ in spec["m"] if (nv_todo[0][0], nv_todo[0][1], name, m_) not in done)
            claim(nv_todo[0][0], nv_todo[0][1], name, first_m)  # a crash here skips that case
            w_nv = sc_nv = None
            try:
                w_nv, sc_nv = rigbench_nvfp4(torch, n, k, nv_gen, dev)
                check_probe(w_nv, sc_nv, nvs.get("probe") or {})
            except Exception as e:  # noqa: BLE001
                if is_fatal(e):
                    die_on_cuda_error(e)
                nv_err = f"regenerating rigbench's NVFP4 tensors failed: {type(e).__name__}: {e}"
                w_nv = sc_nv = None
            ws2 = float(nv_gen.get("weight_scale_2", 1.0 / 64))
            todo_of = {p_: i_ for p_, i_ in nv_todo}
            if w_nv is not None and "humming" in todo_of:
                claim("humming", "humming.nvfp4", name, first_m)
                try:
                    from humming.layer import HummingLayer
                    layer = HummingLayer(shape_n=n, shape_k=k,
                                         weight_config={"quant_method": "modelopt", "quant_algo": "NVFP4"},
                                         torch_dtype=torch.bfloat16).to("cuda")
                    layer.load_from_tensors({"weight": w_nv, "weight_scale": sc_nv.view(torch.float8_e4m3fn),
                                             "weight_scale_2": torch.tensor([ws2], dtype=torch.float32, device=dev)})
                    layer.transform()
                    hm_layer = layer
                except AssertionError as e:
                    hm_err_shape = (f"{REFUSED}Humming raised AssertionError for N = {n}, K = {k}"
                                    + (f" ({e})" if str(e) else "") + " while preparing the layer")
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)
                    hm_err_shape = f"Humming could not take the weights: {type(e).__name__}: {e}"
            if w_nv is not None and "vllm-marlin" in todo_of:
                claim("vllm-marlin", "marlin.nvfp4", name, first_m)
                try:
                    pn, pk = marlin_padded_nk(n, k)
                    w_p, sc_p = w_nv, sc_nv
                    if (pn, pk) != (n, k):
                        w_p = torch.zeros((pn, pk // 2), dtype=torch.uint8, device=dev)
                        w_p[:n, :k // 2] = w_nv
                        sc_p = torch.zeros((pn, pk // 16), dtype=torch.uint8, device=dev)
                        sc_p[:n, :k // 16] = sc_nv
                    qw = marlin_repack_nvfp4(torch, w_p, pn, pk)
                    ms, gs, factor = marlin_scales_nvfp4(torch, sc_p, pn, pk, ws2)
                    mr_w, mr_nk = (qw, ms, gs), (pn, pk)
                    mr_factor = factor
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)
                    mr_err_shape = f"repacking for Marlin failed: {type(e).__name__}: {e}"
            if w_nv is not None and "vllm" in todo_of:
                claim("vllm", "vllm.apply_fp4_marlin_linear", name, first_m)
                try:
                    _, vllm_mu, vllm_mu4 = vllm_fp4
                    lay = torch.nn.Module()
                    lay.weight = torch.nn.Parameter(w_nv.clone(), requires_grad=False)
                    lay.weight_scale = torch.nn.Parameter(sc_nv.view(torch.float8_e4m3fn).clone(), requires_grad=False)
                    lay.weight_global_scale = torch.nn.Parameter(
                        torch.tensor(ws2, dtype=torch.float32, device=dev), requires_grad=False)
                    lay.output_size_per_partition, lay.input_size_per_partition = n, k
                    lay.params_dtype = torch.bfloat16
                    vllm_mu4.prepare_fp4_layer_for_marlin(lay)
                    lay.rb_workspace = vllm_mu.marlin_make_workspace_new(dev)
                    vl_layer = lay
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)
                    vl_err_shape = f"vLLM's prepare_fp4_layer_for_marlin failed: {type(e).__name__}: {e}"
            del w_nv, sc_nv
        copies_cache = {}
        release()

        for m in spec["m"]:
            todo_m = [(providers.get(i, "torch"), i) for i in impl_names if (providers.get(i, "torch"), i, name, m) not in done]
            if not todo_m:
                continue  # every case of this M ran in the earlier run (resume)
            claim(todo_m[0][0], todo_m[0][1], name, m)  # its inputs and references are made now
            if torch_side:
                a = (torch.rand(m, k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
                rows = sample_idx(m, 32, dev)
                cols = sample_idx(n, 64, dev)
                a_s = a[rows].double()

            def skip(provider, impl, reason):
                if (provider, impl, name, m) in done:
                    return
                out["skipped"].append({"provider": provider, "implementation": impl, "shape": name, "m": m,
                                       "reason": reason})

            def record(provider, impl, fmt, path, make, weights, clone, wbytes, ref, get_out, extra=(),
                       check=("float64 torch on 32x64 sampled outputs", "PEER_REL_L2", TOL), config=None):
                """Check, then time `make(weights)` cold and/or in a graph over weight copies.
                `check`: (reference description, tolerance name, tolerance); `config`: a callable
                naming the configuration the implementation chose (called after the first run)."""
                if (provider, impl, name, m) in done:
                    return
                claim(provider, impl, name, m)
                ref_text, tol_name, tol = check
                try:
                    fn = make(weights)
                    res = fn()
                    torch.cuda.synchronize()
                    err = rel_l2(get_out(res), ref)
                    if not err <= tol:
                        skip(provider, impl, f"failed its correctness check, not timed: rel_l2 = {err:.3e} > {tol}")
                        return
                    chose = None
                    if config is not None:
                        try:
                            chose = config()
                        except Exception as e:  # noqa: BLE001
                            if is_fatal(e):
                                die_on_cuda_error(e)
                            chose = f"(not known: {type(e).__name__}: {e})"
                    case = {"provider": provider, "implementation": impl, "format": fmt, "shape": name,
                            "m": m, "n": n, "k": k, "path": path, "config": chose,
                            "check": {"reference": ref_text, "metric": "rel_l2",
                                      "value": err, "tolerance_name": tol_name, "tolerance": tol,
                                      "passed": True},
                            "samples_s": [], "stop_reason": None, "weight_bytes": wbytes, "extra": [],
                            "graph": None, "graph_skip": None, "t_start": time.time(), "t_end": None}
                    if do_cold:
                        case["samples_s"], case["stop_reason"] = time_cold(fn)
                        for pname, pfn in extra:
                            s, r = time_cold(pfn)
                            case["extra"].append({"name": pname, "samples_s": s, "stop_reason": r})
                    if do_graph:
                        try:
                            case["graph"] = graph_case(impl, make, weights, clone, wbytes, ref, get_out, extra, tol)
                        except Exception as e:  # noqa: BLE001
                            if is_fatal(e):
                                die_on_cuda_error(e)
                            case["graph_skip"] = f"{type(e).__name__}: {e}"
                    case["t_end"] = time.time()
                    if not case["samples_s"] and case["graph"] is None:
                        skip(provider, impl, f"graph timing (--timing graph) could not run: {case['graph_skip']}")
                        return
                    out["cases"].append(case)
                except Exception as e:  # noqa: BLE001
                    if is_fatal(e):
                        die_on_cuda_error(e)  # os._exit: the finally below does not run
                    skip(provider, impl, f"{type(e).__name__}: {e}")
                finally:
                    release()

            def graph_case(impl, make, weights, clone, wbytes, ref, get_out, extra, tol=TOL):
                copies, launches = graph_plan(wbytes, g_min_total, g_min_launches)
                if copies > g_max_copies:
                    raise RuntimeError(f"its {wbytes} weight bytes would need {copies} copies to exceed "
                                       f"{g_min_total} bytes (more than {g_max_copies})")
                key = impl
                have = copies_cache.get(key)
                if have is None or len(have) < copies:
                    have = [weights] + [clone(weights) for _ in range(copies - 1)]
                    copies_cache[key] = have
                fns = [make(w) for w in have[:copies]]
                g, last = capture(fns, launches)
                s, r = time_graph(g, launches)
                torch.cuda.synchronize()
                err = rel_l2(get_out(last), ref)
                if not err <= tol:
                    raise RuntimeError(f"the graph's output failed the correctness check (rel_l2 = {err:.3e}): "
                                       "graph timing discarded")
                res = {"samples_s": s, "stop_reason": r, "launches": launches, "weight_copies": copies,
                       "weight_bytes_total": copies * wbytes, "extra": []}
                del g, last, fns
                for pname, pfn in extra:
                    ge, _ = capture([pfn], launches)
                    es, er = time_graph(ge, launches)
                    res["extra"].append({"name": pname, "samples_s": es, "stop_reason": er})
                    del ge
                return res

            if impls:
                ref = a_s @ w_bf16[cols].double().t()
                record("torch", "torch.matmul", "bf16", "torch.nn.functional.linear BF16 (cuBLAS)",
                       lambda w: (lambda: torch.nn.functional.linear(a, w)), w_bf16, lambda w: w.clone(),
                       nbytes(w_bf16), ref, lambda r: r[rows][:, cols])

                if ("torch", "torch._scaled_mm", name, m) in done:
                    pass
                elif w_fp8 is not None and hasattr(torch, "_scaled_mm"):
                    claim("torch", "torch._scaled_mm", name, m)
                    mp = ((m + 15) // 16) * 16
                    try:
                        a_pad = torch.zeros(mp, k, device=dev, dtype=torch.bfloat16)
                        a_pad[:m] = a
                        a_scale = (a.abs().max().float() / 448.0).clamp(min=1e-12)
                        a_fp8 = (a_pad.float() / a_scale).to(e4m3)
                        ref8 = (a_fp8[:m][rows].double() * a_scale.double()) @ \
                            (w_fp8[cols].double() * w_scale.double()).t()
                        fp8_err = None
                    except Exception as e:  # noqa: BLE001
                        if is_fatal(e):
                            die_on_cuda_error(e)
                        fp8_err = f"preparing its inputs failed: {type(e).__name__}: {e}"

                    def quant():
                        s = (a_pad.abs().amax().float() / 448.0).clamp(min=1e-12)
                        return (a_pad.float() / s).to(e4m3), s

                    if fp8_err:
                        skip("torch", "torch._scaled_mm", fp8_err)
                    else:
                        record("torch", "torch._scaled_mm", "fp8",
                               f"torch._scaled_mm FP8 E4M3 per-tensor, BF16 out (M padded to {mp}); activation quantization "
                               "in plain torch ops (abs-amax, divide, cast), timed separately",
                               lambda w: (lambda: torch._scaled_mm(a_fp8, w.t(), scale_a=a_scale, scale_b=w_scale,
                                                                   out_dtype=torch.bfloat16)),
                               w_fp8, lambda w: w.clone(), nbytes(w_fp8, w_scale), ref8, lambda r: r[:m][rows][:, cols],
                               extra=[("activation_quant", quant)])
                else:
                    skip("torch", "torch._scaled_mm", "this PyTorch has no float8_e4m3fn / _scaled_mm")

                ref4 = None
                if scales is not None:
                    w_deq = (q_int[cols] - 8).to(torch.float64) * \
                        scales.t()[cols].repeat_interleave(GROUP, dim=1).to(torch.float64)
                    ref4 = a_s @ w_deq.t()
                if ("torch", "torch._weight_int4pack_mm", name, m) in done:
                    pass
                elif int4_packings:
                    claim("torch", "torch._weight_int4pack_mm", name, m)
                    order, packed = int4_packings[0]
                    probe_err = None
                    try:
                        for o, p in int4_packings:
                            r = torch._weight_int4pack_mm(a, p, GROUP, sz)
                            if rel_l2(r[rows][:, cols], ref4) <= TOL:
                                order, packed = o, p
                                break
                    except Exception as e:  # noqa: BLE001
                        if is_fatal(e):
                            die_on_cuda_error(e)
                        probe_err = f"choosing the nibble order failed: {type(e).__name__}: {e}"
                    if probe_err:
                        skip("torch", "torch._weight_int4pack_mm", probe_err)
                    else:
                        record("torch", "torch._weight_int4pack_mm", "w4a16",
                               f"tinygemm INT4 W4A16 (torch._weight_int4pack_mm, group 128, innerKTiles 8; {order})",
                               lambda w: (lambda: torch._weight_int4pack_mm(a, w[0], GROUP, w[1])), (packed, sz),
                               lambda w: (w[0].clone(), w[1].clone()), nbytes(packed, sz), ref4, lambda r: r[rows][:, cols])
                else:
                    skip("torch", "torch._weight_int4pack_mm", int4_err)

            if gemlite is not None:
                if gl_layer is not None:
                    record("gemlite", "gemlite.A16W4_INT_g128", "w4a16",
                           "gemlite Triton INT4 W4A16 (A16Wn, group 128, HQQ (W_q - zero) * scale; its own "
                           "kernel choice and autotune per M; split-K sums in "
                           + ("BF16 atomics)" if gl_native_atomic else "FP32)"),
                           lambda layer: (lambda: layer(a)), gl_layer, copy.deepcopy,
                           nbytes(gl_layer.W_q, gl_layer.scales,
                                  gl_layer.zeros if isinstance(gl_layer.zeros, torch.Tensor) else None),
                           ref4, lambda r: r[rows][:, cols])
                else:
                    skip("gemlite", "gemlite.A16W4_INT_g128", gl_err_shape)
            if nv_impls:
                nv_case = next((c_ for c_ in (nvs or {}).get("cases", []) if c_["m"] == m), None)
                nv_left = [(p_, i_) for p_, i_ in nv_impls if (p_, i_, name, m) not in done]
                if nv_left and (nv_case is None or nv_err):
                    for p_, i_ in nv_left:
                        skip(p_, i_, nv_err or "the spec has no rigbench reference at this M")
                elif nv_left:
                    claim(nv_left[0][0], nv_left[0][1], name, m)
                    a_nv = rigbench_activations(torch, m, k, int(nv_case["seed_a"]), dev)
                    rows_nv = torch.tensor(nv_case["rows"], device=dev, dtype=torch.long)
                    cols_nv = torch.tensor(nv_case["cols"], device=dev, dtype=torch.long)
                    ref_nv = torch.tensor(nv_case["values"], dtype=torch.float64, device=dev).reshape(
                        len(nv_case["rows"]), len(nv_case["cols"]))
                    nv_check = (f"rigbench's CPU reference (f64 over the exact NVFP4 operands, "
                                f"{len(nv_case['rows'])}x{len(nv_case['cols'])} sampled outputs)", nv_tol_name, nv_tol)

                    def pick(r):
                        return r[rows_nv][:, cols_nv]

                    if humming is not None:
                        if hm_layer is None:
                            skip("humming", "humming.nvfp4", hm_err_shape or nv_err or "not prepared")
                        else:
                            def hm_config(layer=hm_layer, m_=m):
                                # What its launcher runs: the heuristic's table of M intervals
                                # (lo, hi] -> config, compiled for the layer on first use.
                                from humming.tune import get_heuristics_config
                                table = get_heuristics_config(layer.humming_config, device=dev)
                                if isinstance(table, dict):
                                    return humming_config_text(table)
                                for lo, hi, cfg in table:
                                    if lo < m_ <= hi:
                                        return f"{humming_config_text(cfg)} (its choice for M in ({lo}, {hi}])"
                                return "(no interval of its table holds this M)"

                            record("humming", "humming.nvfp4", "w4a16",
                                   f"Humming {getattr(humming, '__version__', '?')} NVFP4 (ModelOpt tensors, "
                                   "group 16) × BF16, BF16 out; kernel by its heuristic",
                                   lambda layer: (lambda: layer(a_nv)), hm_layer, copy.deepcopy,
                                   nbytes(*hm_layer.parameters()), ref_nv, pick, check=nv_check, config=hm_config)
                    if marlin is not None:
                        if mr_w is None:
                            skip("vllm-marlin", "marlin.nvfp4", mr_err_shape or nv_err or "not prepared")
                        else:
                            pn, pk = mr_nk
                            a_mr = a_nv
                            if pk != k:
                                a_mr = torch.zeros((m, pk), dtype=torch.bfloat16, device=dev)
                                a_mr[:, :k] = a_nv
                            c_mr = torch.empty((m, pn), dtype=torch.bfloat16, device=dev)
                            tmp_n, lock_n = marlin.workspace(m)
                            c_tmp = torch.empty((tmp_n,), dtype=torch.float32, device=dev)
                            locks = torch.zeros((lock_n,), dtype=torch.int32, device=dev)

                            def mr_make(w, a_=a_mr, c_=c_mr, t_=c_tmp, l_=locks, m_=m, pn_=pn, pk_=pk):
                                def run():
                                    marlin.gemm(a_, w[0], w[1], w[2], c_, t_, l_, m_, pn_, pk_,
                                                torch.cuda.current_stream().cuda_stream)
                                    # vLLM slices padded output columns off with a copy (marlin_unpad_output).
                                    return c_ if pn_ == n else c_[:, :n].contiguous()
                                return run

                            record("vllm-marlin", "marlin.nvfp4", "w4a16",
                                   f"vLLM {marlin.version} Marlin NVFP4 (E2M1 × BF16, group 16, S0E5M3 scales "
                                   f"×2^{int(math.log2(mr_factor))}), BF16 out, FP32 global reduce"
                                   + (f"; weights padded to N = {pn}, K = {pk} and the output sliced" if (pn, pk) != (n, k)
                                      else ""),
                                   mr_make, mr_w, lambda w: tuple(t_.clone() for t_ in w), nbytes(*mr_w), ref_nv, pick,
                                   check=nv_check, config=lambda m_=m, pn_=pn, pk_=pk: marlin.describe(m_, pn_, pk_))
                    if vllm_fp4 is not None:
                        if vl_layer is None:
                            skip("vllm", "vllm.apply_fp4_marlin_linear", vl_err_shape or nv_err or "not prepared")
                        else:
                            vllm_mu4 = vllm_fp4[2]

                            def vl_make(lay, a_=a_nv):
                                return lambda: vllm_mu4.apply_fp4_marlin_linear(
                                    input=a_, weight=lay.weight, weight_scale=lay.weight_scale,
                                    weight_global_scale=lay.weight_global_scale, workspace=lay.rb_workspace,
                                    size_n=n, size_k=k)

                            record("vllm", "vllm.apply_fp4_marlin_linear", "w4a16",
                                   f"vllm {vllm_fp4[0].__version__} apply_fp4_marlin_linear (Marlin NVFP4 × BF16)",
                                   vl_make, vl_layer, copy.deepcopy,
                                   nbytes(vl_layer.weight, vl_layer.weight_scale, vl_layer.weight_global_scale),
                                   ref_nv, pick, check=nv_check)
            print(f"peers: {name} M={m} done ({time.time() - t_begin:.0f} s)", file=sys.stderr, flush=True)
        copies_cache.clear()
        del w_bf16, w_fp8, q_int, int4_packings, gl_layer, hm_layer, mr_w, vl_layer
        torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        # One line rigbench can quote (a traceback's last line is often a hint, not the error).
        print(f"peer script failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr, flush=True)
        # A CUDA error outside a case's own try: 70, like one inside it; the case claimed last
        # is still named in the output.
        torch_mod = sys.modules.get("torch")
        fatal = isinstance(e, getattr(torch_mod, "AcceleratorError", ())) if torch_mod else False
        sys.exit(70 if fatal or "CUDA error" in str(e) else 1)
