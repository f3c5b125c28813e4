#!/usr/bin/env bash
# Makes the older root the portable wheel is built in (scripts/wheel-check.sh):
# Debian 11 "bullseye" (glibc 2.31, GCC 10.2, its libstdc++ GLIBCXX_3.4.28),
# and in it a static libzmq for batchcast alone:
#   - ZeroMQ 4.3.4, Debian 11's source and patches, hashes pinned here;
#   - without Kerberos (GSSAPI), NORM, PGM or libsodium, and with CURVE off:
#     batchcast binds ipc:// and loopback endpoints of one machine, which
#     CURVE would not protect better than the socket's file mode and the
#     kernel do, and a crypto library is a dependency to keep up to date;
#   - position-independent, linked into batchcast's modules with its symbols
#     hidden (-Wl,--exclude-libs), so no other libzmq in the process can clash.
#
#   bash scripts/oldroot.sh [ROOT]    # default build/oldroot/bullseye
#
# Needs root (or sudo) for debootstrap and chroot, and Debian's registry.
# What is already there is kept: a second run takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(realpath -m "${1:-build/oldroot/bullseye}")
mirror=${BATCHCAST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

zmq_version=4.3.4
zmq_debian=4.3.4-1+deb11u1
zmq_orig_sha=0ff5a531c9ffaf0dfdc7dc78d13d1383088f454896d252934c429b2554d10559
zmq_debian_sha=b7d4e926ec14b5ae58b6808d13597fe414f402fdbd17153bf2b3db9e39bc2a0c

if [ ! -x "$root/usr/bin/g++" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "== apt-get install debootstrap"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
  fi
  echo "== debootstrap bullseye into $root (glibc 2.31, GCC 10)"
  $SUDO rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  $SUDO debootstrap --variant=minbase --include=g++,make,cmake,patch,xz-utils \
    bullseye "$root" "$mirror" >"$root.log" 2>&1 || { cat "$root.log" >&2; exit 1; }
fi

if [ ! -f "$root/opt/zmq/lib/libzmq.a" ]; then
  echo "== libzmq $zmq_debian, static, in the old root"
  src=$root/opt/src
  $SUDO rm -rf "$src"
  $SUDO mkdir -p "$src"
  pool=$mirror/pool/main/z/zeromq3
  $SUDO curl -fsS -o "$src/orig.tar.gz" "$pool/zeromq3_$zmq_version.orig.tar.gz"
  $SUDO curl -fsS -o "$src/debian.tar.xz" "$pool/zeromq3_${zmq_debian//+/%2B}.debian.tar.xz"
  echo "$zmq_orig_sha  $src/orig.tar.gz" | sha256sum -c --quiet
  echo "$zmq_debian_sha  $src/debian.tar.xz" | sha256sum -c --quiet
  $SUDO chroot "$root" sh -euc "
    cd /opt/src
    tar xzf orig.tar.gz && mv libzmq-$zmq_version zeromq
    tar xJf debian.tar.xz -C zeromq
    cd zeromq
    while read -r p; do case \$p in ''|'#'*) ;; *) patch -s -p1 < debian/patches/\$p ;; esac; done \
      < debian/patches/series
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/opt/zmq \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED=OFF -DBUILD_STATIC=ON \
      -DBUILD_TESTS=OFF -DWITH_DOCS=OFF -DWITH_PERF_TOOL=OFF -DENABLE_CPACK=OFF \
      -DWITH_LIBSODIUM=OFF -DENABLE_CURVE=OFF -DWITH_LIBBSD=OFF -DENABLE_DRAFTS=OFF \
      -DWITH_OPENPGM=OFF -DWITH_NORM=OFF -DWITH_VMCI=OFF -DWITH_GSSAPI_KRB5=OFF >/dev/null
    cmake --build build -j$(nproc) >/dev/null
    cmake --install build >/dev/null
  " >"$root.zmq.log" 2>&1 || { cat "$root.zmq.log" >&2; exit 1; }
  # cppzmq is two headers (C++ over zmq.h): the build machine's copy.
  cppzmq=$(ls /usr/include/zmq.hpp 2>/dev/null) ||
    { echo "oldroot: cppzmq's zmq.hpp not found: apt-get install cppzmq-dev" >&2; exit 1; }
  $SUDO cp "$cppzmq" /usr/include/zmq_addon.hpp "$root/opt/zmq/include/"
  $SUDO rm -rf "$src"
fi
echo "$root"
