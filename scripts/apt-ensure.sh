#!/bin/sh
# apt-ensure.sh [--one-by-one] PKG...: installs the Debian packages among PKG that
# are missing, quietly; does nothing (not even apt-get update) when all are present.
# --one-by-one installs them one apt call at a time, in the order given, for lists
# whose dependency resolution depends on what is already installed.
set -eu
one_by_one=0
if [ "${1:-}" = "--one-by-one" ]; then
  one_by_one=1
  shift
fi
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ "$one_by_one" = 1 ]; then
  for p in $missing; do apt-get install -y -qq --no-install-recommends "$p" >/dev/null; done
else
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
