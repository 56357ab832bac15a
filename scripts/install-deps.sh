#!/bin/sh
# Installs every build, test and run dependency from Debian's archive.
# Idempotent and quiet: skips apt entirely when everything is already present.
# The function tier runs its languages from the host image (read-only views of the
# host's /usr): python3, gcc and g++ (build-essential), bash, perl (essential) and nodejs.
set -eu
exec sh "$(dirname "$0")/apt-ensure.sh" \
  build-essential cmake ninja-build pkg-config git clang-format-14 \
  libboost1.81-dev libboost-json1.81-dev libspdlog-dev libfmt-dev libcli11-dev \
  libsqlite3-dev libseccomp-dev libarchive-dev libssl-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  python3 python3-pytest python3-pytest-xdist python3-yaml busybox-static iproute2 procps mmdebstrap \
  libpython3.11-testsuite nodejs
