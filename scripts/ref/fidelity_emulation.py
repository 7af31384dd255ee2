#!/usr/bin/env python3
"""An independent PyTorch emulation of rigbench's FP8, W4A16 NVFP4 and W4A4 NVFP4 formats on
SmolLM2-135M-Instruct, run once to check the figures of rigbench's fidelity study
(src/runtime_eval/quality.rs; method in docs/fidelity.md). Not run by CI: it needs torch,
transformers >= 5 and gguf (see scripts/ref/smollm2_reference.py for the setup).

    /tmp/venv-ref/bin/python scripts/ref/fidelity_emulation.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

It shares no code with rigbench: the model is transformers' LlamaForCausalLM loaded from the
GGUF; the quantizers are written here from the formats' definitions:
- BF16: every linear weight and the embedding rounded to bfloat16 (round to nearest even);
  RMSNorm weights stay float32; activations float32.
- FP8 W8A8: weight scale amax/448 per tensor (q/k/v share one amax, gate/up share one, as fused
  layers do), E4M3 round to nearest even; activations E4M3 per token with scale amax(row)/448.
- W4A16 NVFP4: per-tensor scale amax/(6*448) (shared as above); per block of 16 along K the scale
  amax(block)/(6*tensor scale) cast to E4M3 (a zero scale becomes 1); elements divided by
  e4m3(scale)*tensor scale and rounded to E2M1 (nearest, ties to even, saturating at 6).
- W4A4 NVFP4 (emulated): W4A16's weights; the input of every quantized linear quantized the same
  way per token (one row = one tensor).
Embedding and lm_head stay BF16 in every format.

Measured as rigbench measures: teacher-forced on the first 256 token ids of
tests/fixtures/text/public-domain.txt (top-1 agreement with BF16, mean KL(P_bf16 || P_fmt) in
nats from float64 log-softmax, perplexity), and greedy (arg-max, no EOS stop) on the first 8
prompts of FIDELITY_PROMPTS in src/runtime_eval/check.rs, 16 tokens each. Writes
tests/fixtures/smollm2/emulation.json.
"""
import ast
import json
import os
import re
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEXT_TOKENS, PROMPTS, GREEDY = 256, 8, 16
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gu", "up_proj": "gu"}
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def default_path():
    cache = os.environ.get("RIGBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ["HOME"], ".cache"), "rigbench"
    )
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompts():
    src = open(os.path.join(ROOT, "src", "runtime_eval", "check.rs"), encoding="utf-8").read()
    body = re.search(r"FIDELITY_PROMPTS: \[&str; \d+\] = \[(.*?)\n\];", src, re.S).group(1)
    return [ast.literal_eval(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', body)]


def e4m3(x):
    """Round to E4M3 (nearest even), saturating at 448 (torch's cast gives NaN beyond it)."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1(x):
    """Round to E2M1 magnitudes, ties to the even code, saturating at 6."""
    a = x.abs()
    # Thresholds: <=0.25 ->0, <0.75 ->0.5, <=1.25 ->1, <1.75 ->1.5, <=2.5 ->2, <3.5 ->3, <=5 ->4, else 6.
    code = torch.zeros_like(a, dtype=torch.long)
    code = torch.where(a > 0.25, 1, code)
    code = torch.where(a >= 0.75, 2, code)
    code = torch.where(a > 1.25, 3, code)
    code = torch.where(a >= 1.75, 4, code)
    code = torch.where(a > 2.5, 5, code)
    code = torch.where(a >= 3.5, 6, code)
    code = torch.where(a > 5.0, 7, code)
    return torch.sign(x) * E2M1[code] + 0.0 * x


def nvfp4(w, tensor_scale):
    """Quantize-dequantize a [rows, K] float32 matrix to NVFP4 with the given per-tensor scale
    (a scalar, or one per row shaped [rows, 1, 1])."""
    rows, k = w.shape
    b = w.reshape(rows, k // 16, 16)
    bamax = b.abs().amax(dim=-1, keepdim=True)
    scale = bamax / (torch.tensor(6.0) * tensor_scale)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    s = e4m3(scale)
    denom = s * tensor_scale
    denom = torch.where(denom == 0, torch.tensor(2.0**-9) * tensor_scale, denom)
    q = e2m1(b / denom)
    return (q * (s * tensor_scale)).reshape(rows, k)


def nvfp4_tensor_scale(amax):
    return amax / 2688.0 if amax > 0 else torch.tensor(1.0)


def fp8_weight(w, amax):
    s = amax / 448.0 if amax > 0 else torch.tensor(1.0)
    return e4m3(w * (1.0 / s)) * s


def fp8_act(x):
    amax = x.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return e4m3(x * (1.0 / s)) * s


def nvfp4_act(x):
    """Each token (row) quantized as its own tensor: per-row scale amax/(6*448)."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    amax = rows.abs().amax(dim=-1, keepdim=True)
    ts = torch.where(amax > 0, amax / 2688.0, torch.ones_like(amax)).reshape(-1, 1, 1)
    return nvfp4(rows, ts).reshape(shape)


def linears(model):
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.startswith("model.layers."):
            yield name, mod


def apply(model, base, fmt):
    """Load `base` (bf16-rounded state) and quantize the decoder linears to `fmt`."""
    model.load_state_dict(base)
    for h in getattr(model, "_hooks", []):
        h.remove()
    model._hooks = []
    if fmt == "bf16":
        return
    groups = {}
    for name, mod in linears(model):
        layer, proj = name.rsplit(".", 1)
        key = (layer.rsplit(".", 1)[0], FUSED.get(proj, proj))
        groups[key] = max(groups.get(key, torch.tensor(0.0)), mod.weight.abs().max())
    with torch.no_grad():
        for name, mod in linears(model):
            layer, proj = name.rsplit(".", 1)
            amax = groups[(layer.rsplit(".", 1)[0], FUSED.get(proj, proj))]
            if fmt == "fp8":
                mod.weight.copy_(fp8_weight(mod.weight, amax))
            else:
                mod.weight.copy_(nvfp4(mod.weight, nvfp4_tensor_scale(amax)))
            act = {"fp8": fp8_act, "nvfp4-w4a4": nvfp4_act}.get(fmt)
            if act is not None:
                model._hooks.append(mod.register_forward_pre_hook(lambda m, a, f=act: (f(a[0]),)))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else default_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    base = {}
    for k, v in model.state_dict().items():
        v = v.clone()
        if v.dim() == 2:  # linear weights and the (tied) embedding; norms stay float32
            v = v.to(torch.bfloat16).to(torch.float32)
        base[k] = v
    text = open(os.path.join(ROOT, "tests", "fixtures", "text", "public-domain.txt"), encoding="utf-8").read()
    ids = tok(text, add_special_tokens=False)["input_ids"][:TEXT_TOKENS]
    ps = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts()[:PROMPTS]]

    def run(fmt):
        apply(model, base, fmt)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            greedy = []
            for p in ps:
                seq = list(p)
                for _ in range(GREEDY):
                    seq.append(int(torch.argmax(model(torch.tensor([seq])).logits[0, -1])))
                greedy.append(seq[len(p):])
        return logits, greedy

    ref_logits, ref_greedy = run("bf16")
    target = torch.tensor(ids[1:])
    lp_ref = torch.log_softmax(ref_logits, -1)

    def ppl(lp):
        return float(torch.exp(-lp[torch.arange(len(target)), target].mean()))

    out = {
        "source": f"scripts/ref/fidelity_emulation.py; transformers {transformers.__version__}, torch {torch.__version__}",
        "text_tokens": len(ids),
        "prompts": len(ps),
        "greedy_tokens": GREEDY,
        "bf16_perplexity": ppl(lp_ref),
        "formats": {},
    }
    for fmt in ["fp8", "nvfp4", "nvfp4-w4a4"]:
        logits, greedy = run(fmt)
        lp = torch.log_softmax(logits, -1)
        kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp(min=0)
        same = sum(a == b for r, c in zip(ref_greedy, greedy) for a, b in zip(r, c))
        out["formats"][fmt] = {
            "top1_agreement": float((logits.argmax(-1) == ref_logits.argmax(-1)).double().mean()),
            "mean_kl": float(kl.mean()),
            "max_kl": float(kl.max()),
            "perplexity": ppl(lp),
            "greedy_agreement": same / (len(ps) * GREEDY),
        }
        print(fmt, out["formats"][fmt], flush=True)
    with open(os.path.join(ROOT, "tests", "fixtures", "smollm2", "emulation.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
