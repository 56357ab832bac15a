// ImageStore: content-addressed layers under <data_dir>/images and versioned
// image records in a control::ImageRecordStore (docs/architecture.md).
//
// Layout:
//   images/layers/sha256/<hex>/root        the layer, unpacked once, read-only by
//                                          convention; the overlay lower dir
//   images/layers/sha256/<hex>/layer.json  size, entries, source, creation time:
//                                          stays on disk next to the layer it
//                                          describes (it lives and dies with it)
//   images/tmp/                            unpacks in progress, renamed into place
//                                          only when complete
//   images/images.json.migrated            the image records of daemons before
//                                          the record store, imported once
// Image records live in the record store (the daemon's state.db): open()
// imports an images.json left by an older daemon into it, keeping any record
// the store already has under the same name:version (an import interrupted by
// a crash runs again harmlessly), then renames the file to
// images.json.migrated so that it is never imported twice.
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
// Writes of records: put_image() never replaces a record unless asked
// (PutMode::kReplace); a replace reads the record and writes it back with a
// compare-and-set on its row version, as does remove_image().
//
// Reference counting: a layer is referenced by the image records that list it
// and pinned by every live user (a resolve() pin held by a sandbox, an import
// in progress). gc() removes layers that are neither referenced nor pinned,
// never one in use; it takes them out of the store under the lock before
// deleting them, so a concurrent resolve() either pins a layer or does not
// find it.
//
// Thread rules: every method may be called from any thread concurrently.
// Imports, gc and every record access do blocking I/O (the record store is a
// database): call them from blocking threads. Record writes, layer checks and
// gc are serialised by one mutex, so a layer checked by put_image() cannot be
// collected before its record is stored. Pins keep the store alive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "control/image_record_store.h"
#include "image/layer_resolver.h"
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

// name, version, parts (top first: sha256:<hex> | image:<name>[:<version>]),
// defaults, source, created_ms, row_version.
using ImageRecord = control::ImageRecord;

// What put_image() does with a name:version that exists.
enum class PutMode {
  kCreate,   // fails with kConflict
  kReplace,  // replaces it (POST /v1/images, imports and builds with an explicit version)
};

struct ResolvedLayers {
  std::vector<std::string> digests;  // top first, de-duplicated
  std::vector<std::string> paths;    // lower directories, top first
  ImageDefaults defaults;
  uint64_t bytes = 0;         // of the layers above, unpacked
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

class ImageStore : public LayerResolver, public std::enable_shared_from_this<ImageStore> {
 public:
  // Creates the layout, removes unfinished unpacks, loads the layers and
  // imports an images.json of an older daemon into `records`.
  static Result<std::shared_ptr<ImageStore>> open(
      StoreOptions opts, std::shared_ptr<control::ImageRecordStore> records);

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
                                     ArchiveKind kind, PutMode mode);

  // Stores an image record; every part must exist. An empty r.version takes
  // the next integer version (never an existing one, whatever the mode).
  // Answers the record as stored (row_version set).
  Result<ImageRecord> put_image(ImageRecord r, PutMode mode);
  Result<ImageRecord> get_image(const std::string& ref);
  Result<std::vector<ImageRecord>> images();
  // Fails with kConflict when another image is composed of it.
  Result<void> remove_image(const std::string& ref);

  // name[:version] or layers:... to lower directories, pinned.
  Result<ResolvedLayers> resolve(const std::string& ref);

  Result<LayerInfo> layer(const std::string& digest);
  Result<std::vector<LayerInfo>> layers();
  Result<GcReport> gc();

  // LayerResolver: a stored layer's lower directory (no pin).
  Result<std::string> layer_dir(const std::string& digest) override;

  const std::string& root() const { return root_; }
  std::string layer_path(const std::string& digest) const;  // lower dir of a digest
  Result<std::string> next_version(const std::string& name);
  uint64_t used_bytes();

 private:
  ImageStore(StoreOptions o, std::shared_ptr<control::ImageRecordStore> records);
  Result<void> load_layers();
  Result<void> import_json();
  // `pending` (if given) stands for its name:version as if it were stored:
  // put_image() checks a composition before writing it.
  Result<ImageRecord> find_locked(const std::string& ref, const ImageRecord* pending = nullptr);
  Result<void> expand_locked(const ImageRecord& r, int depth, std::vector<std::string>* digests,
                             ImageDefaults* d, const ImageRecord* pending = nullptr);
  Result<std::string> next_version_locked(const std::string& name);
  std::shared_ptr<void> pin_locked(const std::vector<std::string>& digests);
  std::string make_tmp_dir(const std::string& prefix);

  StoreOptions opts_;
  std::string root_;  // <data_dir>/images
  std::shared_ptr<control::ImageRecordStore> records_;

  std::mutex mu_;
  std::map<std::string, LayerInfo> layers_;  // by digest
  std::map<std::string, uint32_t> pins_;
};

}  // namespace tp::image
