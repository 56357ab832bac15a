// ImageStore: content-addressed layers and versioned images under
// <data_dir>/images (docs/architecture.md).
//
// Layout:
//   images/layers/sha256/<hex>/root        the layer, unpacked once, read-only by
//                                          convention; the overlay lower dir
//   images/layers/sha256/<hex>/layer.json  size, entries, source, creation time
//   images/images.json                     image records (rewritten atomically)
//   images/tmp/                            unpacks in progress, renamed into place
//                                          only when complete
// A layer's id is the sha256 of its uncompressed tar (the OCI DiffID), so
// importing the same content twice, in any compression, stores it once.
// <hex>/ is mode 0700 owned by uid_base (root of the sandboxes' user
// namespace): sandboxes can reach the layer, host users cannot (layers may
// hold setuid files, setuid to a shifted uid).
//
// Images: "name:version" -> parts, top first; a part is a layer
// ("sha256:<hex>") or another image ("image:name[:version]", resolved when a
// sandbox is created, so base, toolkit and workspace can each be replaced on
// its own), plus defaults (env, workdir, user, command). A reference
// without version means the most recently created version. An explicit
// layer stack is "layers:sha256:<top>,sha256:<next>,..." (top first).
//
// Reference counting: a layer is referenced by the image records that list it
// and pinned by every live user (a resolve() pin held by a sandbox, an import
// in progress). gc() removes layers that are neither referenced nor pinned,
// never one in use; it takes them out of the store under the lock before
// deleting them, so a concurrent resolve() either pins a layer or does not
// find it.
//
// Thread rules: every method may be called from any thread concurrently.
// Imports and gc do blocking I/O: call them from blocking threads. Pins keep
// the store alive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "image/layer_unpack.h"
#include "image/oci_archive.h"

namespace tp::image {

struct StoreOptions {
  std::string data_dir;
  UnpackLimits limits;        // per layer (uid_base is taken from here)
  uint64_t budget_bytes = 0;  // total apparent bytes of all layers; 0 = no budget
};

struct LayerInfo {
  std::string digest;  // sha256:<hex>
  std::string path;    // lower directory
  uint64_t bytes = 0;
  uint64_t entries = 0;
  int64_t created_ms = 0;
  std::string source;
  uint32_t image_refs = 0;  // filled by layers()/layer()
  uint32_t pins = 0;
};

struct ImageRecord {
  std::string name;
  std::string version;
  std::vector<std::string> parts;  // top first: sha256:<hex> | image:<name>[:<version>]
  ImageDefaults defaults;
  std::string source;
  int64_t created_ms = 0;
};

struct ResolvedLayers {
  std::vector<std::string> digests;  // top first, de-duplicated
  std::vector<std::string> paths;    // lower directories, top first
  ImageDefaults defaults;
  std::shared_ptr<void> pin;  // holds every layer above against gc
};

struct GcReport {
  std::vector<std::string> removed;
  uint64_t freed_bytes = 0;
  uint32_t kept = 0;
  uint32_t pinned_unreferenced = 0;  // unreferenced but in use: kept
};

// A reference split: name and version ("" = latest).
Result<std::pair<std::string, std::string>> parse_image_ref(const std::string& ref);
bool valid_image_name(const std::string& s);
bool valid_image_version(const std::string& s);
bool valid_layer_digest(const std::string& s);

class ImageStore : public std::enable_shared_from_this<ImageStore> {
 public:
  // Creates the layout, removes unfinished unpacks and loads records.
  static Result<std::shared_ptr<ImageStore>> open(StoreOptions opts);

  // Unpacks a layer (any tar, compressed or not) unless expect_diff_id names
  // a stored layer. The returned layer is pinned in *pins (if given) until
  // the caller drops it.
  Result<LayerInfo> add_layer_stream(const ByteSource& src, const std::string& expect_diff_id,
                                     const std::string& source,
                                     std::vector<std::shared_ptr<void>>* pins);
  Result<LayerInfo> add_layer_file(const std::string& path, const std::string& source,
                                   std::vector<std::shared_ptr<void>>* pins);
  // A host directory as a layer: its owners are taken as ids inside the sandbox.
  Result<LayerInfo> add_layer_dir(const std::string& dir, const std::string& source,
                                  std::vector<std::shared_ptr<void>>* pins);

  // Imports a docker-save or OCI archive, or a tar as a single layer, as
  // name:version (version "" = next integer; name "" = from the archive's tag).
  Result<ImageRecord> import_archive(const std::string& path, std::string name, std::string version,
                                     ArchiveKind kind);

  // Creates or replaces an image record; every part must exist.
  Result<ImageRecord> put_image(ImageRecord r);
  Result<ImageRecord> get_image(const std::string& ref);
  std::vector<ImageRecord> images();
  // Fails with kConflict when another image is composed of it.
  Result<void> remove_image(const std::string& ref);

  // name[:version] or layers:... to lower directories, pinned.
  Result<ResolvedLayers> resolve(const std::string& ref);

  Result<LayerInfo> layer(const std::string& digest);
  std::vector<LayerInfo> layers();
  Result<GcReport> gc();

  const std::string& root() const { return root_; }
  std::string layer_path(const std::string& digest) const;  // lower dir of a digest
  std::string next_version(const std::string& name);
  uint64_t used_bytes();

 private:
  explicit ImageStore(StoreOptions o);
  Result<void> load();
  Result<void> save_records_locked();
  Result<ImageRecord> find_locked(const std::string& ref);
  Result<void> expand_locked(const ImageRecord& r, int depth, std::vector<std::string>* digests,
                             ImageDefaults* d);
  std::shared_ptr<void> pin_locked(const std::vector<std::string>& digests);
  std::map<std::string, uint32_t> refs_locked();
  std::string make_tmp_dir(const std::string& prefix);

  StoreOptions opts_;
  std::string root_;  // <data_dir>/images

  std::mutex mu_;
  std::map<std::string, LayerInfo> layers_;                           // by digest
  std::map<std::string, std::map<std::string, ImageRecord>> images_;  // name -> version -> record
  std::map<std::string, uint32_t> pins_;
};

}  // namespace tp::image
