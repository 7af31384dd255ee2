#!/usr/bin/env bash
# Fetch the peers that rigbench's peer script (scripts/peer_kernels.py) runs beside its own kernels,
# into .peers/ (git-ignored), from PyPI, so that they can be carried to a GPU machine and run there
# without network:
#   gemlite 0.6.0.post2    Triton INT4 W4A16 GEMM (pure Python; needs triton >= 3.6 there)
#   humming-kernels 0.1.20 Humming: the W4A16 NVFP4 kernels vLLM >= 0.32 runs for weight-only
#                          NVFP4 on sm_90 (its 0.6 MB wheel; it JIT-compiles its CUDA sources with
#                          the machine's nvcc, so it needs torch and nvcc there, not here)
#   vllm 0.33.0 (source)   only the Marlin kernel templates (csrc/quantization/marlin/*.h,
#                          *.cuh) and csrc/core/scalar_type.hpp, compiled here by
#                          scripts/build-marlin.sh into .peers/vllm-marlin/libmarlin_nvfp4.so
#                          (the `vllm-marlin` peer; needs nvcc >= 12.8 here, no GPU)
# Run once on a machine with network, then carry .peers/ with the binary (device `run` carry list:
# ["target/release/rigbench", ".peers"]). rigbench finds it in ./.peers, next to the source tree of
# the binary, or in $RIGBENCH_PEERS_DIR. Nothing here is needed at run time but .peers/.
# Environment: PEERS (default "gemlite humming vllm-marlin": which to fetch), MARLIN_ARCHS (see
# scripts/build-marlin.sh), SKIP_MARLIN_BUILD=1 (fetch the sources only).
set -euo pipefail
cd "$(dirname "$0")/.."
GEMLITE_VERSION=0.6.0.post2
HUMMING_VERSION=0.1.20
VLLM_VERSION=0.33.0
PEERS="${PEERS:-gemlite humming vllm-marlin}"
dest=.peers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dest"
want() { case " $PEERS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if want gemlite; then
    python3 -m pip download --quiet --no-deps --no-binary :all: "gemlite==${GEMLITE_VERSION}" -d "$tmp/gl"
    tar xzf "$tmp/gl/gemlite-${GEMLITE_VERSION}.tar.gz" -C "$tmp/gl"
    rm -rf "$dest/gemlite"
    cp -r "$tmp/gl/gemlite-${GEMLITE_VERSION}/gemlite" "$dest/gemlite"
    cp "$tmp/gl/gemlite-${GEMLITE_VERSION}/LICENSE" "$dest/gemlite/LICENSE"
    echo "gemlite ${GEMLITE_VERSION} -> $dest/gemlite ($(du -sh "$dest/gemlite" | cut -f1))"
fi

if want humming; then
    # The wheel itself is carried: the GPU machine installs it offline with
    #   python3 -m pip install --no-index --no-deps --target DIR .peers/humming/humming_kernels-*.whl
    # (scripts/peer_kernels.py does this into a temporary folder when it finds no `humming`).
    rm -rf "$dest/humming"
    mkdir -p "$dest/humming"
    python3 -m pip download --quiet --no-deps --only-binary :all: --python-version 3.10 \
        --platform manylinux_2_28_x86_64 "humming-kernels==${HUMMING_VERSION}" -d "$dest/humming"
    echo "humming-kernels ${HUMMING_VERSION} -> $(ls "$dest"/humming/*.whl) ($(du -sh "$dest/humming" | cut -f1))"
fi

if want vllm-marlin; then
    # `pip download` of vLLM's source distribution downloads and unpacks it, then fails while
    # generating its metadata without torch; --no-clean keeps the unpacked tree (in TMPDIR), and
    # --no-build-isolation stops pip from building torch as a build dependency first.
    if ! TMPDIR="$tmp" python3 -m pip download --quiet --no-clean --no-deps --no-binary :all: \
        --no-build-isolation "vllm==${VLLM_VERSION}" -d "$tmp/vllm" > "$tmp/vllm.log" 2>&1; then
        echo "(pip's metadata step for vllm failed as expected without torch; using the unpacked sources)"
    fi
    tree=""
    if ls "$tmp"/vllm/vllm-"${VLLM_VERSION}".tar.gz >/dev/null 2>&1; then
        tar xzf "$tmp/vllm/vllm-${VLLM_VERSION}.tar.gz" -C "$tmp" \
            "vllm-${VLLM_VERSION}/csrc/quantization/marlin" "vllm-${VLLM_VERSION}/csrc/core/scalar_type.hpp" \
            "vllm-${VLLM_VERSION}/LICENSE"
        tree="$tmp/vllm-${VLLM_VERSION}"
    else
        tree="$(dirname "$(dirname "$(dirname "$(find "$tmp" -path '*/csrc/quantization/marlin/marlin_template.h' | head -1)")")")"
        tree="$(dirname "$tree")"
    fi
    if [ ! -f "$tree/csrc/quantization/marlin/marlin_template.h" ]; then
        echo "fetch-peers: vLLM ${VLLM_VERSION}'s sources were not found after pip download; its log:" >&2
        tail -20 "$tmp/vllm.log" >&2
        exit 1
    fi
    out="$dest/vllm-marlin"
    rm -rf "$out"
    mkdir -p "$out/src/csrc/quantization/marlin" "$out/src/csrc/core"
    cp "$tree"/csrc/quantization/marlin/*.h "$tree"/csrc/quantization/marlin/*.cuh "$out/src/csrc/quantization/marlin/"
    cp "$tree/csrc/core/scalar_type.hpp" "$out/src/csrc/core/"
    cp "$tree/LICENSE" "$out/src/LICENSE"
    echo "${VLLM_VERSION}" > "$out/VLLM_VERSION"
    echo "vllm ${VLLM_VERSION} Marlin sources -> $out/src ($(du -sh "$out/src" | cut -f1))"
    if [ "${SKIP_MARLIN_BUILD:-0}" = 1 ]; then
        echo "not built (SKIP_MARLIN_BUILD=1): run scripts/build-marlin.sh"
    else
        bash scripts/build-marlin.sh "$out/src" "$out/libmarlin_nvfp4.so"
    fi
fi
echo ".peers/: $(du -sh "$dest" | cut -f1)"
