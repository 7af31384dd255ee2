#!/usr/bin/env python3
"""Reference figures for rigbench's SmolLM2 tests, made once with Hugging Face transformers and
committed (tests/fixtures/smollm2/). Not run by CI: it needs torch, transformers >= 5 and gguf.

    python3 -m venv /tmp/venv-ref
    /tmp/venv-ref/bin/pip install torch "transformers>=5" gguf numpy
    scripts/fetch-smollm2.sh
    /tmp/venv-ref/bin/python scripts/ref/smollm2_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes:
- reference.json: transformers' greedy continuations of 4 prompts (2 text, 2 chat), loaded from
  the same GGUF in float32, with the logit gap between the top two candidates at every step (to
  name near-ties); its ids of the fixed text tests/fixtures/text/public-domain.txt; and the
  perplexity of that text (float32 and bfloat16) over its first 256 tokens and over all of it.
- tensors.tsv: the file's own tensor table as gguf-py reads it (name, ggml type, shape), which
  `rigbench inspect` is checked against.
- dequant_cases.json: random blocks of every ggml type gguf-py dequantizes, with its f32
  values, which rigbench's dequantization is checked against.
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch
import transformers
import gguf
from gguf import quants
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "smollm2")
TEXT = os.path.join(ROOT, "tests", "fixtures", "text", "public-domain.txt")
NEW_TOKENS = 16
PREFIX = 256

TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
CHAT_PROMPTS = [
    "What is the boiling point of water at sea level?",
    "Write a haiku about the ocean.",
]


def default_path():
    cache = os.environ.get("RIGBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ["HOME"], ".cache"), "rigbench"
    )
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def greedy(model, ids, masked):
    """Greedy continuation with the EOS ids masked (what min_new_tokens does), and the gap
    between the top two logits at each step."""
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=masked[0],
    )
    toks = out.sequences[0, len(ids):].tolist()
    gaps, seconds = [], []
    for row in out.logits:
        r = row[0].float().clone()
        for m in masked:
            r[m] = -float("inf")
        top = torch.topk(r, 2)
        gaps.append(float(top.values[0] - top.values[1]))
        seconds.append(int(top.indices[1]))
    return toks, gaps, seconds


def perplexity(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="mean")
    return float(torch.exp(nll)), float(nll)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else default_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    masked = eos if isinstance(eos, list) else [eos]

    cases = []
    for kind, prompt in [("text", p) for p in TEXT_PROMPTS] + [("chat", p) for p in CHAT_PROMPTS]:
        if kind == "chat":
            rendered = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        else:
            rendered = prompt
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        toks, gaps, seconds = greedy(model, ids, masked)
        cases.append(
            {
                "prompt": prompt,
                "kind": kind,
                "rendered": rendered,
                "prompt_ids": ids,
                "greedy_ids": toks,
                "greedy_text": tok.decode(toks),
                "top2_gap_f32": gaps,
                "second_ids": seconds,
            }
        )

    text = open(TEXT, encoding="utf-8").read()
    text_ids = tok(text, add_special_tokens=False)["input_ids"]
    ppl = {}
    for dtype_name, dtype in [("float32", torch.float32), ("bfloat16", torch.bfloat16)]:
        m = model.to(dtype)
        ppl[dtype_name] = {
            "prefix": dict(zip(("ppl", "mean_nll"), perplexity(m, text_ids[:PREFIX]))),
            "full": dict(zip(("ppl", "mean_nll"), perplexity(m, text_ids))),
        }
        if dtype_name == "bfloat16":
            for c in cases:
                c["greedy_ids_bf16"] = greedy(m, c["prompt_ids"], masked)[0]
    model.to(torch.float32)

    ref = {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"gguf-py {getattr(gguf, '__version__', '?')}; AutoModelForCausalLM.from_pretrained(gguf_file=...) "
        f"in float32 (bfloat16 for the *_bf16 fields); greedy with min_new_tokens={NEW_TOKENS}, which masks the EOS ids",
        "gguf": name,
        "gguf_sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "masked_ids": masked,
        "new_tokens": NEW_TOKENS,
        "cases": cases,
        "text": {
            "file": "tests/fixtures/text/public-domain.txt",
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "ids": text_ids,
            "prefix_tokens": PREFIX,
            "perplexity": ppl,
            "method": "one forward pass over the ids (no BOS: tokenizer.ggml.add_bos_token is false); "
            "perplexity = exp(mean negative log-likelihood of ids[1:])",
        },
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")

    reader = gguf.GGUFReader(path)
    with open(os.path.join(OUT, "tensors.tsv"), "w") as f:
        f.write("name\tggml_type\tshape\n")
        for t in reader.tensors:
            shape = list(reversed([int(x) for x in t.shape]))
            f.write(f"{t.name}\t{t.tensor_type.name}\t{shape}\n")

    rng = np.random.default_rng(7)
    dq = []
    for qt in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16",
    ]:
        t = gguf.GGMLQuantizationType[qt]
        block, size = gguf.GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, size=2 * size, dtype=np.uint8)
        # Keep the FP16/BF16 scales finite and moderate: every f16 field of the block gets a
        # value in [-2, 2] (their offsets per ggml-common.h).
        f16_at = {
            "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
            "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
            "BF16": [], "F16": [0],
        }[qt]
        for b in range(2):
            for at in f16_at:
                v = np.float16(rng.uniform(-2, 2)).view(np.uint16)
                raw[b * size + at : b * size + at + 2] = np.frombuffer(np.uint16(v).tobytes(), np.uint8)
        if qt == "BF16":
            vals = rng.uniform(-3, 3, size=2).astype(np.float32)
            raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        values = quants.dequantize(raw, t).astype(np.float32).reshape(-1)
        dq.append({"type": qt, "bytes_hex": raw.tobytes().hex(), "values": [float(x) for x in values]})
    with open(os.path.join(OUT, "dequant_cases.json"), "w") as f:
        json.dump({"source": "gguf-py quants.dequantize on random blocks (seed 7)", "cases": dq}, f)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
