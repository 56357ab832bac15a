// Safe unpacking of one image layer (a tar stream, plain, gzip, zstd, xz or
// bzip2) into an empty directory, converting OCI conventions to overlayfs ones.
//
// Promises:
// - Nothing is ever written outside `dir_fd`: every path is resolved from
//   dir_fd with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//   RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), one component at a time, and the
//   last component is created with O_EXCL / O_NOFOLLOW semantics. Absolute
//   names, `..` components, entries or hard-link targets reached through a
//   symlink, and device nodes (other than 0/0 whiteouts) are refused with
//   kInvalidArgument naming the entry. Symlinks themselves are kept as they
//   are (inside a sandbox they resolve inside its root).
// - Ownership is shifted: an entry owned by uid/gid N gets host uid/gid
//   uid_base + N, so files look right inside the sandbox's user namespace and
//   nothing in a layer is owned by host root. Ids >= id_count are refused.
//   Setuid/setgid bits are kept (they are setuid to the shifted owner) unless
//   refuse_setuid is set.
// - Whiteouts `.wh.NAME` become 0/0 character devices NAME; opaque markers
//   `.wh..wh..opq` set user.overlay.opaque=y on their directory (the runtime
//   mounts overlayfs with `userxattr` inside the sandbox's user namespace,
//   where trusted.overlay.* is not readable). Other `.wh..wh.` names are refused.
// - Extended attributes: user.* is kept except user.overlay.* (which would
//   steer overlayfs); security.*, trusted.* and system.* are dropped.
// - Budget: the sum of the regular files' apparent sizes (a sparse file counts
//   its full size), the entry count and the decompressed stream size are
//   capped; free space on the target file system is checked while writing so
//   that at least reserve_bytes stay free. Exceeding any of them fails with
//   kInsufficientStorage / kPayloadTooLarge and a message saying which.
// - diff_id is "sha256:<hex>" of the whole uncompressed tar stream (what OCI
//   calls the layer's DiffID), so the same content in any compression gets
//   the same id.
// On failure the directory holds a partial tree; the caller removes it.
//
// Needs root on the host (chown to shifted ids, mknod of whiteouts).
// Thread rules: reentrant; concurrent calls on different directories are fine.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace tp::image {

struct UnpackLimits {
  uint64_t max_bytes = 64ull << 30;       // sum of regular files' apparent sizes
  uint64_t max_entries = 1'000'000;       // tar entries
  uint64_t max_stream_bytes = 0;          // decompressed tar bytes; 0 = max_bytes + 1 GiB
  uint64_t reserve_bytes = 512ull << 20;  // keep this much free on the target file system
  uint32_t uid_base = 100000;
  uint32_t id_count = 65536;
  bool refuse_setuid = false;
};

struct UnpackStats {
  std::string diff_id;     // sha256:<hex> of the uncompressed tar
  uint64_t bytes = 0;      // apparent bytes of regular files
  uint64_t entries = 0;    // tar entries processed
  uint64_t whiteouts = 0;  // .wh.* converted
  uint64_t opaque_dirs = 0;
  uint64_t xattrs_dropped = 0;
};

// Reads raw (possibly compressed) bytes: returns the count, 0 at the end, -1 on error.
using ByteSource = std::function<ssize_t(void* buf, size_t n)>;
// A ByteSource over `fd` (read(2), EINTR retried); the caller keeps the fd open.
ByteSource fd_source(int fd);

Result<UnpackStats> unpack_layer(const ByteSource& src, int dir_fd, const UnpackLimits& lim);
// Convenience: unpack a file.
Result<UnpackStats> unpack_layer_file(const std::string& path, int dir_fd, const UnpackLimits& lim);

// Splits a tar entry name into components: strips leading "./" and trailing
// "/", drops "." and empty components; refuses absolute names, "..", NUL,
// over-long components (> 255) or names (> 4096) and depth > 256. The root
// entry ("./") yields an empty vector.
Result<std::vector<std::string>> split_entry_path(std::string_view name);

// Removes a directory tree below dir_fd/name without following symlinks.
Result<void> remove_tree_at(int dir_fd, const std::string& name);

}  // namespace tp::image
