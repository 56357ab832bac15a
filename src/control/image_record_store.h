// ImageRecordStore: durable image records ("name:version" -> parts and
// defaults), behind an interface so that nothing above it depends on the
// database. The embedded default is control::sqlite::SqliteImageRecordStore
// (the data directory's state.db, next to the sandbox records);
// control::MemoryImageRecordStore is the in-memory one for tests. The layers
// themselves are not records: image::ImageStore keeps them on disk.
//
// Contract (tests/unit/control/image_record_store_contract_test.cpp runs it
// against every implementation):
//   - put() with r.row_version == 0 stores a new ref at row version 1 and
//     fails with kConflict if name:version exists.
//   - put() with r.row_version == N replaces the stored record only if its row
//     version is N (compare-and-set) and answers N + 1; a stale N fails with
//     kConflict, an unknown ref with kNotFound. There is no blind
//     insert-or-replace: a caller that means "replace" reads the record first.
//   - remove() is the same compare-and-set on the row version.
//   - latest() is the most recently created version of a name (ties: the
//     greatest version string).
//   - list() filters in the store (by name, by an exact part: which images are
//     made of a layer or of another image), ordered by name then version.
//   - part_counts() answers, for every part some record lists, how many
//     records list it (layer reference counts for gc).
//   - writes survive a crash of the daemon once the call returns.
//
// The store checks no image semantics (that parts exist, names are valid):
// image::ImageStore does, under its own lock.
//
// Thread rules: every method may be called from any thread; implementations
// serialise internally.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::control {

// What a sandbox of the image gets unless it says otherwise.
struct ImageDefaults {
  std::map<std::string, std::string> env;
  std::string workdir;
  std::string user;
  std::vector<std::string> cmd;  // Entrypoint + Cmd
};

struct ImageRecord {
  std::string name;
  std::string version;
  std::vector<std::string> parts;  // top first: sha256:<hex> | image:<name>[:<version>]
  ImageDefaults defaults;
  std::string source;
  int64_t created_ms = 0;
  uint64_t row_version = 0;  // the store's row version (0 = never stored)
};

struct ImageQuery {
  std::string name;  // "" = any
  std::string part;  // "" = any; else records whose parts include exactly this string
};

class ImageRecordStore {
 public:
  virtual ~ImageRecordStore() = default;
  // Creates (row_version 0) or compare-and-set replaces; answers the new row version.
  virtual Result<uint64_t> put(const ImageRecord& r) = 0;
  virtual Result<std::optional<ImageRecord>> get(const std::string& name,
                                                 const std::string& version) = 0;
  virtual Result<std::optional<ImageRecord>> latest(const std::string& name) = 0;
  virtual Result<std::vector<ImageRecord>> list(const ImageQuery& q) = 0;
  // Deletes name:version if its row version is row_version.
  virtual Result<void> remove(const std::string& name, const std::string& version,
                              uint64_t row_version) = 0;
  virtual Result<std::map<std::string, uint32_t>> part_counts() = 0;
};

}  // namespace tp::control
