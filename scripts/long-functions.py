#!/usr/bin/env python3
"""List the Rust functions of src/ longer than a limit (default 200 lines), longest first.

Usage: scripts/long-functions.py [LIMIT] [ROOT]

A function runs from its `fn` line to the line of its closing brace (brace matching that skips
strings, chars and comments); docs/architecture.md, "GPU layer", keeps the counts.
"""
import os
import re
import sys


def strip(line, state):
    """The line without comments and string contents; state carries block comments/strings."""
    out = []
    i = 0
    while i < len(line):
        c = line[i]
        if state["block"]:
            if line.startswith("*/", i):
                state["block"] -= 1
                i += 2
                continue
            if line.startswith("/*", i):
                state["block"] += 1
                i += 2
                continue
            i += 1
            continue
        if state["str"]:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                state["str"] = False
            i += 1
            continue
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] += 1
            i += 2
            continue
        if c == '"':
            state["str"] = True
            i += 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out)


FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    state = {"block": 0, "str": False}
    code = [strip(l, state) for l in lines]
    found = []
    for i, l in enumerate(code):
        m = FN.match(l)
        if not m:
            continue
        depth = 0
        opened = False
        for j in range(i, len(code)):
            for ch in code[j]:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    break
            else:
                if opened and depth == 0:
                    found.append((j - i + 1, m.group(7), i + 1))
                    break
                continue
            break
    return found


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    root = sys.argv[2] if len(sys.argv) > 2 else "src"
    rows = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                rows += [(n, name, p, line) for n, name, line in functions(p) if n > limit]
    rows.sort(reverse=True)
    for n, name, p, line in rows:
        print(f"{n:5} {p}:{line} {name}")
    print(f"{len(rows)} functions over {limit} lines")


if __name__ == "__main__":
    main()
