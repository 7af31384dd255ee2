#!/usr/bin/env python3
"""Make rigbench's two built-in traces (traces/agentic.jsonl, traces/chat.jsonl).

Both are small and synthetic: no user data, a fixed seed, reproducible byte for byte
(`python3 scripts/make_traces.py` rewrites them; docs/traces.md describes the formats).

agentic.jsonl, vLLM timed_trace records (timestamp in seconds, 16 tokens per hash id) with a
`session_id` and a `delay` (ms of think time, i.e. the tool's run time, after the previous answer):
6 agent sessions of 5 steps. Every step starts with the same 12-block (192-token) system prompt
and tool list (hash ids 0..11, shared by all sessions), then the session's whole history so far
(its earlier tool results and answers, as hash ids of its own), then a new tool result of 2 to 4
blocks: the context grows each step and all of it but the new part was sent before.

chat.jsonl, ShareGPT-like conversations: 8 sessions of 3 short turns (a short system prompt, a
one- or two-sentence user message, answers of 16 to 32 tokens), starting 1.5 s apart, with 1 to 3
s of think time between a reply and the next user message.
"""
import json
import os
import random

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "traces")
BLOCK = 16


def agentic(rng):
    lines = []
    system = list(range(12))
    next_id = 1000
    for s in range(6):
        history = []
        t = s * 2.0
        for step in range(5):
            new = rng.randint(2, 4)
            ids = list(range(next_id, next_id + new))
            next_id += new
            hash_ids = system + history + ids
            # The last block is partial: input_length leaves 1 to 15 tokens of it unused.
            input_length = len(hash_ids) * BLOCK - rng.randint(1, BLOCK - 1)
            out = rng.choice([16, 24, 32])
            delay = 0 if step == 0 else rng.randint(200, 800)
            lines.append({
                "session_id": f"agent-{s}",
                "timestamp": round(t, 3),
                "input_length": input_length,
                "output_length": out,
                "hash_ids": hash_ids,
                "delay": delay,
            })
            # The answer and the tool result join the history (as blocks of their own).
            history = history + ids + [next_id]
            next_id += 1
            t += 1.0
    return lines


SENTENCES = [
    "What is a good way to keep bread fresh for a week?",
    "Can you suggest a name for a small grey cat?",
    "How long should I boil an egg for a soft yolk?",
    "Explain in one sentence why the sky looks blue.",
    "Give me a short tip for falling asleep faster.",
    "What should I pack for a two day hike?",
    "Write one line of encouragement for a student.",
    "How do I remove a coffee stain from cotton?",
    "Which is heavier, a litre of water or a litre of oil?",
    "Suggest a quick vegetarian dinner.",
    "Why do onions make people cry?",
    "What is a polite way to decline an invitation?",
]


def chat(rng):
    lines = []
    for s in range(8):
        conv = [{"from": "system", "value": "You are a helpful assistant. Answer briefly."}]
        for turn in range(3):
            msg = rng.choice(SENTENCES)
            if rng.random() < 0.5:
                msg += " " + rng.choice(SENTENCES)
            h = {"from": "human", "value": msg}
            if turn > 0:
                h["think_time_s"] = round(rng.uniform(1.0, 3.0), 2)
            conv.append(h)
            conv.append({"from": "gpt", "value": "", "output_tokens": rng.choice([16, 24, 32])})
        lines.append({"id": f"chat-{s}", "timestamp": round(s * 1.5, 3), "conversations": conv})
    return lines


def write(name, lines):
    with open(os.path.join(ROOT, name), "w", encoding="utf-8") as f:
        for l in lines:
            f.write(json.dumps(l, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    write("agentic.jsonl", agentic(random.Random(40)))
    write("chat.jsonl", chat(random.Random(41)))
