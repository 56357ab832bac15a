// The `host` image: an instant root made of a small skeleton plus read-only
// binds of the host's system directories (docs/architecture.md).
//
// ensure_host_image() builds, once, <data_dir>/images/host/rootfs: the
// directories a Linux root needs, merged-/usr symlinks as the host has them,
// and a minimal /etc of our own (passwd/group with root and nobody only,
// hosts, resolv.conf with loopback, nsswitch.conf) plus copies of public,
// non-secret host files that sh, coreutils and python3 need (ld.so.cache,
// ld.so.conf(.d), os-release, localtime, alternatives, ssl/certs). It never
// copies /etc/shadow, /etc/gshadow, /etc/ssl/private, /root, /home or ssh
// keys. Every entry is owned by `uid_base` (root of the sandboxes' user
// namespace) so copy-up inside a sandbox works. The runtime uses the rootfs as
// the overlay lower layer and binds `ro_binds` (host /usr, and /bin etc. on
// hosts without merged /usr) read-only at the same path.
//
// The build is atomic (temp dir + rename) and guarded, so concurrent callers
// and crashed builds are fine; an existing rootfs with the current version
// marker is reused.
// Thread rules: safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::image {

struct HostImage {
  std::string rootfs;                 // lower directory (skeleton)
  std::vector<std::string> ro_binds;  // absolute host paths, bound read-only at the same path
};

Result<HostImage> ensure_host_image(const std::string& data_dir, uint32_t uid_base);

}  // namespace tp::image
