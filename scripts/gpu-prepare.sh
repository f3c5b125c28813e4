#!/usr/bin/env bash
# On an ordinary machine with Debian's package registry, before a GPU check:
# puts ZeroMQ, cppzmq and GoogleTest packages into .device/ (ignored by git),
# for a GPU machine that has no package registry. There, start with
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
