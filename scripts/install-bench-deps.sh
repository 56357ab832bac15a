#!/bin/sh
# Installs what `make bench` needs on top of scripts/install-deps.sh: the peer runtimes
# (crun, runc, bubblewrap), hyperfine for whole-process timing, and matplotlib for charts.
# Kept apart so that `make test` stays lean. Idempotent: skips apt when all are present.
set -eu
# python3-munkres first: it satisfies python3-fonttools' "scipy | munkres" so that apt does not
# pull scipy -> pythran -> libboost-dev (1.74), which conflicts with libboost1.81-dev.
PKGS="crun runc bubblewrap hyperfine python3-munkres python3-matplotlib busybox-static util-linux procps"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # One package per call, in list order, so that munkres is in place before matplotlib's
  # dependencies are resolved.
  for p in $missing; do
    apt-get install -y -qq --no-install-recommends "$p" >/dev/null
  done
fi
