#!/bin/sh
# Installs what `make bench` needs on top of scripts/install-deps.sh: the peer runtimes
# (crun, runc, bubblewrap), hyperfine for whole-process timing, and matplotlib for charts.
# Kept apart so that `make test` stays lean. Idempotent: skips apt when all are present.
set -eu
# python3-munkres first, one package per apt call: it satisfies python3-fonttools'
# "scipy | munkres" so that apt does not pull scipy -> pythran -> libboost-dev (1.74),
# which conflicts with libboost1.81-dev.
exec sh "$(dirname "$0")/apt-ensure.sh" --one-by-one \
  crun runc bubblewrap hyperfine python3-munkres python3-matplotlib busybox-static util-linux procps
