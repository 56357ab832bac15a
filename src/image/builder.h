// Image builds from a small spec: a Debian root made by mmdebstrap from the
// Debian archive, with extra packages, files copied in and commands run in the
// new root, stored as one layer (DESIGN.md, Images).
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
// Commands run in the build sandbox: chroot into the new root inside fresh
// pid, mount, net (loopback only), ipc and uts namespaces, so they reach
// neither the network nor host processes. They run as root of the build tree
// (the tree is ownership-shifted when stored), so specs come from operators,
// not from sandboxes.
//
// Builds are cached: the layer of a spec whose build inputs (suite, variant,
// mirror, packages, files' paths/sizes/mtimes, commands) were built before is
// reused while it is still stored (images/build-cache/<key>).
//
// Needs root and the mmdebstrap, unshare and chroot programs.
// Thread rules: build_image may run concurrently with itself and the store.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "image/image_store.h"

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

Result<BuildSpec> parse_build_spec(const std::string& json_text);
// The cache key of a spec's layer (sha256 hex of its build inputs).
Result<std::string> build_cache_key(const BuildSpec& s);
// The mmdebstrap argv for a spec writing `out_tar`.
std::vector<std::string> mmdebstrap_argv(const BuildSpec& s, const std::string& out_tar);

struct BuildResult {
  ImageRecord image;
  bool cached = false;
  std::string log_tail;  // last lines of mmdebstrap's output
};
Result<BuildResult> build_image(ImageStore& store, const BuildSpec& s, int timeout_s = 1800);

}  // namespace tp::image
