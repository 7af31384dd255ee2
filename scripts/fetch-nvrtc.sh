#!/usr/bin/env bash
# Fetch NVRTC (CUDA 13) and the CUDA headers the kernels include, without a GPU or a CUDA toolkit,
# so that the tests compile every kernels/*.cu on a machine that has neither (CI). They come from
# NVIDIA's PyPI wheels `nvidia-cuda-nvrtc` (libnvrtc.so.13, its builtins) and
# `nvidia-cuda-runtime` (cuda_bf16.h, cuda_fp8.h, ...), pinned below, installed with pip into a
# virtual environment under the rigbench cache folder (175 MB, once).
#
# Where it goes: ${RIGBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rigbench}/nvrtc-13.5.37/.
# Prints two lines to source, e.g. `env=$(scripts/fetch-nvrtc.sh) && eval "$env"`:
#   export RIGBENCH_CUDA_INCLUDE=<the wheels' include folder>  (crates/gpu/src/probe.rs; not CUDA_HOME,
#                                  whose change makes cargo rebuild cudarc and everything above it)
#   export LD_LIBRARY_PATH=<their lib folder>:...              (cudarc dlopens libnvrtc.so.13)
# A second run with the environment present does nothing but print them.
set -euo pipefail

VERSION=13.5.37
cache="${RIGBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rigbench}"
venv="$cache/nvrtc-$VERSION"
cu13="$venv/lib/python3.$(python3 -c 'import sys; print(sys.version_info[1])')/site-packages/nvidia/cu13"

if [ ! -f "$cu13/lib/libnvrtc.so.13" ] || [ ! -f "$cu13/include/cuda_bf16.h" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    python3 -m venv "$venv" >&2
    if ! "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$VERSION" "nvidia-cuda-runtime==$VERSION" >&2; then
        echo "fetch-nvrtc: 'pip install nvidia-cuda-nvrtc==$VERSION nvidia-cuda-runtime==$VERSION' failed: PyPI must be reachable (or a pip index that has the wheels)" >&2
        rm -rf "$venv"
        exit 1
    fi
    for f in lib/libnvrtc.so.13 include/cuda_bf16.h; do
        if [ ! -f "$cu13/$f" ]; then
            echo "fetch-nvrtc: the wheels installed, but $cu13/$f is missing: their layout changed; update this script" >&2
            exit 1
        fi
    done
fi
printf 'export RIGBENCH_CUDA_INCLUDE=%q\n' "$cu13/include"
# The caller's own LD_LIBRARY_PATH is appended when the line is evaluated, not now.
printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$cu13/lib"
