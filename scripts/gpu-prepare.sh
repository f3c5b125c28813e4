#!/usr/bin/env bash
# On an ordinary machine with Debian's package registry, before a GPU check:
# puts ZeroMQ, cppzmq and GoogleTest packages into .device/ (ignored by git),
# for a GPU machine that has no package registry, and the nvidia-cuda-crt wheel
# of the GPU machine's CUDA version (GPU_CUDA, default 13.0: torch 2.11 there):
# CUDA's pip runtime wheel, which torch depends on, has cuda_runtime_api.h but
# not the crt/ headers it includes. There, start with
#   source .device/unpack.sh && bash scripts/gpu-check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=$(readlink -f ../shared/device/prepare.sh 2>/dev/null || echo ../shared/device/prepare.sh)
if [ ! -f "$prepare" ]; then
  echo "no $prepare: fetch libzmq5 libzmq3-dev cppzmq-dev libsodium23 libpgm-5.3-0 libnorm1" \
       "libbsd0 libmd0 libgtest-dev with 'apt-get download' into .device/debs yourself" >&2
  exit 1
fi
bash "$prepare"
(cd .device/debs && apt-get download -qq libgtest-dev 2>/dev/null && ls -1 libgtest-dev*.deb)
mkdir -p .device/wheels
${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
  -d .device/wheels "nvidia-cuda-crt==${GPU_CUDA:-13.0}.*"
ls -1 .device/wheels
