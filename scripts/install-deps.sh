#!/bin/sh
# Installs every build, test and run dependency from Debian's archive.
# Idempotent and quiet: skips apt entirely when everything is already present.
set -eu
PKGS="build-essential cmake ninja-build pkg-config git
libboost1.81-dev libboost-json1.81-dev libspdlog-dev libfmt-dev libcli11-dev
libsqlite3-dev libseccomp-dev libarchive-dev libssl-dev
libgtest-dev libgmock-dev libbenchmark-dev
python3 python3-pytest busybox-static iproute2 procps mmdebstrap"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
