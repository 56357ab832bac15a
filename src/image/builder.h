// Image builds from a small spec: a Debian root made by mmdebstrap from the
// Debian archive, with extra packages, files copied in and commands run in the
// new root, stored as one layer.
//
// Spec (JSON):
//   {"name": "py", "version": "1",            version optional (next integer)
//    "suite": "bookworm",                      default bookworm
//    "variant": "apt",                         mmdebstrap variant: essential, apt, minbase, ...
//    "mirror": "http://deb.debian.org/debian", optional
//    "packages": ["python3-minimal"],
//    "files": [{"src": "/host/path", "dst": "/opt/dir"}],   copied into directory dst
//    "run": ["echo hi > /etc/motd"],           /bin/sh -c inside the root
//    "env": {"K": "V"}, "workdir": "/", "user": "", "cmd": ["python3"]}
// Isolation: mmdebstrap runs in --mode=unshare as root of a user namespace
// the daemon makes for the build (uid/gid 0..65535 inside = host
// kBuildIdBase.., which no sandbox uses), so apt, dpkg, maintainer scripts and
// every hook hold capabilities only over the build's own namespaces. Its
// mount namespace is a read-only view: /usr and /etc of the host, a few
// device nodes, a fresh /proc of its own pid namespace, /sys read-only, the
// build's private directory (its only writable host path, also its /tmp) and a
// file:// mirror read-only; nothing else of the host exists there. A seccomp
// filter (the sandbox policy minus the mount calls mmdebstrap needs) covers
// the whole process tree. `run` steps additionally get new pid, mount, net
// (loopback only), ipc and uts namespaces and pivot_root (not chroot) into the
// new root with mmdebstrap's view detached, so they reach neither the network,
// the build's other processes nor any path outside the new root.
//
// Files: a spec's `files` are read with the caller's permissions
// (sys::read_host_tar as `files_reader`), unpacked into the build's private
// directory (owned by the build's root; names starting with ".wh." and
// setuid/setgid bits are refused) and copied in from there by mmdebstrap;
// nothing in the build opens the host path. Copied files are owned by root in
// the image.
//
// Builds are cached: the layer of a spec whose build inputs (suite, variant,
// mirror, packages, files' destinations and staged content, commands) were
// built before is reused while it is still stored (images/build-cache/<key>).
//
// Needs root and the mmdebstrap, unshare and perl programs.
// Thread rules: build_image may run concurrently with itself and the store.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "image/image_store.h"
#include "sys/host_reader.h"

namespace tp::image {

struct BuildSpec {
  std::string name, version;
  std::string suite = "bookworm";
  std::string variant = "apt";
  std::string mirror = "http://deb.debian.org/debian";
  std::vector<std::string> packages;
  std::vector<std::pair<std::string, std::string>> files;  // host src -> directory in the root
  std::vector<std::string> run;
  ImageDefaults defaults;
};

// Host ids of a build's user namespace (root inside = kBuildIdBase).
inline constexpr uint32_t kBuildIdBase = 200000;
inline constexpr uint32_t kBuildIdCount = 65536;

Result<BuildSpec> parse_build_spec(const std::string& json_text);

// Reads each of s.files as `who` into stage_dir/<i>/<basename of src>, owned
// by the build's root, and returns one content digest per file (paths, types,
// modes, link targets and bytes of the staged tree; not times). stage_dir must
// exist. Errors name the file: kPermissionDenied when `who` may not read it.
Result<std::vector<std::string>> stage_build_files(const BuildSpec& s, const sys::HostReader& who,
                                                   const std::string& stage_dir);
// The cache key of a spec's layer (sha256 hex of its build inputs), given the
// digests stage_build_files returned.
std::string build_cache_key(const BuildSpec& s, const std::vector<std::string>& file_digests);
// The mmdebstrap argv for a spec writing `out_tar`, copying in the staged
// files of stage_build_files(s, _, stage_dir).
std::vector<std::string> mmdebstrap_argv(const BuildSpec& s, const std::string& out_tar,
                                         const std::string& stage_dir);

struct BuildResult {
  ImageRecord image;
  bool cached = false;
  std::string log_tail;  // last lines of mmdebstrap's output
};
// Errors: the spec's files unreadable for files_reader (kPermissionDenied,
// kNotFound), mmdebstrap failing (kInvalidArgument with the end of its log) or
// running past timeout_s (kDeadlineExceeded). Nothing of a failed build
// remains: its processes are killed with its pid namespace and its private
// directory is removed.
Result<BuildResult> build_image(ImageStore& store, const BuildSpec& s,
                                const sys::HostReader& files_reader, int timeout_s = 1800);

}  // namespace tp::image
