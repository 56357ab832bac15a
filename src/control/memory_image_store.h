// MemoryImageRecordStore: an ImageRecordStore in memory (unit tests). Same
// contract as the SQLite store, nothing durable.
//
// Thread rules: any thread; one mutex inside. fail_writes() makes every later
// put/remove fail with kInternal (to test what callers do on a full disk).
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "control/image_record_store.h"

namespace tp::control {

class MemoryImageRecordStore : public ImageRecordStore {
 public:
  Result<uint64_t> put(const ImageRecord& r) override;
  Result<std::optional<ImageRecord>> get(const std::string& name,
                                         const std::string& version) override;
  Result<std::optional<ImageRecord>> latest(const std::string& name) override;
  Result<std::vector<ImageRecord>> list(const ImageQuery& q) override;
  Result<void> remove(const std::string& name, const std::string& version,
                      uint64_t row_version) override;
  Result<std::map<std::string, uint32_t>> part_counts() override;

  void fail_writes(bool on);

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, ImageRecord> rows_;  // (name, version)
  bool fail_writes_ = false;
};

}  // namespace tp::control
