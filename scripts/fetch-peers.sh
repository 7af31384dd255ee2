#!/usr/bin/env bash
# Fetch the pure-Python peer packages that rigbench's peer script (scripts/peer_kernels.py) puts on
# sys.path, into .peers/ (git-ignored), so they can be carried to a GPU machine without network:
#   gemlite 0.6.0.post2 (Triton INT4 W4A16 GEMM; needs triton >= 3.6 there, and numpy).
# Run once on a machine with network; then carry .peers/ with the binary (device `run` carry list:
# ["target/release/rigbench", ".peers"]). rigbench finds it in ./.peers, next to the source tree of
# the binary, or in $RIGBENCH_PEERS_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
GEMLITE_VERSION=0.6.0.post2
dest=.peers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "gemlite==${GEMLITE_VERSION}" -d "$tmp"
tar xzf "$tmp/gemlite-${GEMLITE_VERSION}.tar.gz" -C "$tmp"
mkdir -p "$dest"
rm -rf "$dest/gemlite"
cp -r "$tmp/gemlite-${GEMLITE_VERSION}/gemlite" "$dest/gemlite"
cp "$tmp/gemlite-${GEMLITE_VERSION}/LICENSE" "$dest/gemlite/LICENSE"
echo "gemlite ${GEMLITE_VERSION} -> $dest/gemlite ($(du -sh "$dest/gemlite" | cut -f1))"
