#!/usr/bin/env bash
# Build the `vllm-marlin` peer: vLLM's Marlin GEMM kernels for NVFP4 weights × BF16 activations,
# compiled with nvcc into one shared library behind rigbench's raw-pointer entry point
# (scripts/peers/marlin_nvfp4_entry.cu; no PyTorch headers, scripts/peers/shim/ stands in for the
# one macro the templates use). scripts/peer_kernels.py loads it with ctypes.
#
# Usage: scripts/build-marlin.sh [SRC] [OUT]
#   SRC  the extracted vLLM sources (csrc/quantization/marlin/ and csrc/core/scalar_type.hpp);
#        default .peers/vllm-marlin/src (made by scripts/fetch-peers.sh)
#   OUT  the library; default .peers/vllm-marlin/libmarlin_nvfp4.so
# Environment: MARLIN_ARCHS (default "80 86 89 90 120": SASS for each, PTX for the last),
#              NVCC (default nvcc on PATH), JOBS (parallel compiles, default the core count).
# Needs nvcc from CUDA 12.8 or newer (sm_120) and a host C++17 compiler; no GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-$root/.peers/vllm-marlin/src}"
out="${2:-$root/.peers/vllm-marlin/libmarlin_nvfp4.so}"
nvcc="${NVCC:-nvcc}"
archs="${MARLIN_ARCHS:-80 86 89 90 120}"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
marlin="$src/csrc/quantization/marlin"
for f in "$marlin/marlin_template.h" "$marlin/kernel.h" "$src/csrc/core/scalar_type.hpp"; do
    [ -f "$f" ] || { echo "build-marlin: $f is missing: run scripts/fetch-peers.sh first" >&2; exit 2; }
done
command -v "$nvcc" >/dev/null || { echo "build-marlin: $nvcc not found (set NVCC or put CUDA's bin on PATH)" >&2; exit 2; }
gencode=()
last=""
for a in $archs; do
    gencode+=("-gencode" "arch=compute_${a},code=sm_${a}")
    last=$a
done
gencode+=("-gencode" "arch=compute_${last},code=compute_${last}")
# The flags vLLM's build gives these sources (PyTorch's CUDA defines, relaxed constexpr).
flags=(-std=c++17 -O3 -Xcompiler -fPIC --expt-relaxed-constexpr
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
       -diag-suppress 177 -I "$root/scripts/peers/shim" -I "$src/csrc" -I "$marlin")
obj="$(mktemp -d)"
trap 'rm -rf "$obj"' EXIT
start=$(date +%s)
# Part 0: the host entry point; parts 1-4: the kernels of 1-4 16-row blocks per CTA.
printf '%s\n' 0 1 2 3 4 | xargs -P "$jobs" -I{} \
    "$nvcc" "${flags[@]}" "${gencode[@]}" -DRB_MARLIN_PART={} \
    -c "$root/scripts/peers/marlin_nvfp4_entry.cu" -o "$obj/part{}.o"
mkdir -p "$(dirname "$out")"
# CUDA's runtime is linked statically (no libcudart needed where it runs): its library folder.
home="${CUDA_HOME:-$(dirname "$(dirname "$(command -v "$nvcc")")")}"
"$nvcc" -shared "${gencode[@]}" -L "$home/lib" -L "$home/lib64" -o "$out.tmp" "$obj"/part*.o
mv "$out.tmp" "$out"
ver="$("$nvcc" --version | tail -1)"
printf 'archs: %s\nnvcc: %s\nbuilt: %s s\n' "$archs" "$ver" "$(( $(date +%s) - start ))" > "$out.build"
echo "vllm-marlin -> $out ($(du -h "$out" | cut -f1), sm ${archs// /,}, $(( $(date +%s) - start )) s)"
