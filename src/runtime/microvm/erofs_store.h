// Read-only block images of image layers for the microvm tier.
//
// A layer (a directory of the image store, src/image/) becomes one erofs image
// <dir>/<hex>.erofs, built once by mkfs.erofs on first use and kept while the
// layer is (layers are content-addressed and immutable, so the image is
// cached per layer digest and shared by every image version and VM that uses
// the layer). Layer files are stored as host ids storage_uid_base + N; the
// build runs mkfs.erofs in a user namespace that maps those back to N (and
// nothing else), so the image holds the ids the guest should see. Whiteouts
// (0/0 character devices) and user.overlay.opaque markers are kept as they
// are; the guest mounts its overlay with userxattr. A build writes into a
// private temporary directory and renames, so a crash leaves no half image
// under the final name (leftover temporaries are removed at start).
//
// Thread rules: image_for() from any thread; concurrent callers of one digest
// wait for one build.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::runtime::microvm {

class ErofsStore {
 public:
  ErofsStore(std::string dir, std::string mkfs_path, uint32_t storage_uid_base)
      : dir_(std::move(dir)), mkfs_(std::move(mkfs_path)), storage_base_(storage_uid_base) {}
  // Makes the directory and removes unfinished builds of an earlier run.
  Result<void> init();
  // File name (in dir) of the image of layer `digest` ("sha256:<hex>") whose
  // files are in `layer_dir`; built now if missing.
  Result<std::string> image_for(const std::string& digest, const std::string& layer_dir);
  // Removes the images of layers not in `live` (digests); returns how many.
  size_t remove_except(const std::vector<std::string>& live);
  const std::string& dir() const { return dir_; }

 private:
  Result<void> build(const std::string& layer_dir, const std::string& name);
  std::string dir_, mkfs_;
  uint32_t storage_base_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::mutex>> per_layer_;
};

}  // namespace tp::runtime::microvm
