#!/bin/sh
# microvm-assets.sh BUILD_DIR: prepares what the microvm tier boots, in BUILD_DIR/microvm/
# (the daemon finds it there, next to bin/; --microvm-assets names another place):
#   vmlinuz      the kernel of Debian's cloud kernel package (apt-get download, unpacked)
#   initrd.img   busybox, src/runtime/microvm/guest/init, the modules of guest/modules.list
#                and BUILD_DIR/bin/tp-agent
#   host.erofs   the `host` image for VMs: the files of the host's essential packages and
#                python3 (with their dependencies), a minimal /etc, merged-/usr links
#   assets.id    a digest of the three: part of every template's key
# Idempotent: each piece is rebuilt only when what it is made of changed.
# Needs root (apt, depmod into the build tree is not root-only, mkfs.erofs of root files).
set -eu
build=$(cd "${1:?usage: microvm-assets.sh BUILD_DIR}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
out="$build/microvm"
mkdir -p "$out"
sh "$src/scripts/apt-ensure.sh" qemu-system-x86 qemu-utils busybox-static cpio erofs-utils kmod

# -- kernel: the version linux-image-cloud-amd64 points at -----------------------------
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
fi
[ -n "$pkg" ] || { echo "microvm-assets: no linux-image-cloud-amd64 in apt's lists" >&2; exit 1; }
kver=${pkg#linux-image-}
kdir="$out/kernel/$kver"
if [ ! -f "$kdir/done" ]; then
  rm -rf "$out/kernel"
  mkdir -p "$kdir/dl"
  (cd "$kdir/dl" && apt-get download -qq "$pkg" 2>/dev/null)
  dpkg -x "$kdir"/dl/*.deb "$kdir/pkg"
  rm -rf "$kdir/dl"
  depmod -b "$kdir/pkg" "$kver"  # the package ships no modules.dep
  touch "$kdir/done"
fi
cp -p "$kdir/pkg/boot/vmlinuz-$kver" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
echo "$kver" >"$out/kernel.version"

# -- initramfs -----------------------------------------------------------------------
guest="$src/src/runtime/microvm/guest"
agent="$build/bin/tp-agent"
[ -x "$agent" ] || { echo "microvm-assets: $agent is not built" >&2; exit 1; }
stamp=$(cat "$guest/init" "$guest/modules.list" "$agent" /bin/busybox | sha256sum | cut -c1-16)-$kver
if [ "$(cat "$out/initrd.stamp" 2>/dev/null)" != "$stamp" ]; then
  st="$out/initrd.staging"
  rm -rf "$st"
  mkdir -p "$st/bin" "$st/proc" "$st/sys" "$st/dev" "$st/newroot" "$st/rw" "$st/lower"
  cp /bin/busybox "$st/bin/busybox"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$st/bin/$a"; done
  cp "$guest/init" "$st/init"
  chmod 0755 "$st/init"
  cp "$agent" "$st/tp-agent"
  grep -v '^#' "$guest/modules.list" | sed '/^$/d' | sed "s|^|$kver/kernel/|" >"$st/modules.list"
  while read -r m; do
    mkdir -p "$st/lib/modules/$(dirname "$m")"
    cp "$kdir/pkg/lib/modules/$m" "$st/lib/modules/$m"
  done <"$st/modules.list"
  (cd "$st" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$out/initrd.img.tmp"
  mv "$out/initrd.img.tmp" "$out/initrd.img"
  rm -rf "$st"
  echo "$stamp" >"$out/initrd.stamp"
fi

# -- the host image ------------------------------------------------------------------
pkgs=$(/usr/bin/python3 "$src/scripts/microvm-host-packages.py")
hstamp=$(echo "$pkgs" | sha256sum | cut -c1-16)
if [ "$(cat "$out/host.stamp" 2>/dev/null)" != "$hstamp" ] || [ ! -f "$out/host.erofs" ]; then
  st="$out/host.staging"
  rm -rf "$st"
  mkdir -p "$st"
  # shellcheck disable=SC2086
  # Paths as they are on disk (merged /usr: /bin/x is /usr/bin/x), files and links only.
  # shellcheck disable=SC2086
  dpkg -L $(echo "$pkgs" | cut -f1) 2>/dev/null | /usr/bin/python3 -c '
import os, sys
seen = set()
for line in sys.stdin:
    f = line.rstrip("\n")
    if not f.startswith("/") or f.startswith(("/etc/", "/var/", "/home/", "/root/", "/boot/")):
        continue
    if not os.path.lexists(f) or (os.path.isdir(f) and not os.path.islink(f)):
        continue
    p = os.path.join(os.path.realpath(os.path.dirname(f)), os.path.basename(f))
    if p not in seen:
        seen.add(p)
        print(p[1:])
' | LC_ALL=C sort >"$out/host.files"
  tar -C / --no-recursion --ignore-failed-read -cf - -T "$out/host.files" 2>/dev/null | tar -C "$st" -xpf -
  for l in bin lib lib64 sbin lib32 libx32; do
    [ -L "/$l" ] && ln -sfn "$(readlink "/$l")" "$st/$l"
  done
  mkdir -p "$st/etc" "$st/proc" "$st/sys" "$st/dev" "$st/tmp" "$st/run" "$st/root" "$st/var/tmp" \
    "$st/home" "$st/mnt"
  chmod 1777 "$st/tmp" "$st/var/tmp"
  chmod 0700 "$st/root"
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$st/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$st/etc/group"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$st/etc/hosts"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$st/etc/nsswitch.conf"
  : >"$st/etc/resolv.conf"
  for f in os-release debian_version ld.so.conf ld.so.cache localtime; do
    [ -e "/etc/$f" ] && cp -pL "/etc/$f" "$st/etc/$f"
  done
  [ -d /etc/ld.so.conf.d ] && cp -a /etc/ld.so.conf.d "$st/etc/"
  [ -d /etc/alternatives ] && cp -a /etc/alternatives "$st/etc/"
  mkfs.erofs --quiet -zlz4hc "$out/host.erofs.tmp" "$st" >/dev/null
  mv "$out/host.erofs.tmp" "$out/host.erofs"
  rm -rf "$st"
  echo "$hstamp" >"$out/host.stamp"
fi
cat "$out/initrd.stamp" "$out/host.stamp" "$out/kernel.version" | sha256sum | cut -c1-16 >"$out/assets.id"
