#!/bin/sh
# Installs the fuzzing toolchain from Debian's archive (bookworm main): clang 19
# with its compiler-rt (libFuzzer, ASan, UBSan runtimes) and llvm-symbolizer.
# Clang 14/16 cannot be used: libstdc++ 12's <expected> needs __cpp_concepts >=
# 202002, which clang defines from version 19 on.
# Idempotent and quiet: skips apt entirely when everything is already present.
set -eu
exec sh "$(dirname "$0")/apt-ensure.sh" clang-19 libclang-rt-19-dev llvm-19
