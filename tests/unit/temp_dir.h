// A directory under /tmp for one test, removed with everything in it when the
// object goes. path() is empty when it could not be made.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace tp::test {

class TempDir {
 public:
  explicit TempDir(const char* prefix = "tp-test") {
    std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
    if (char* p = ::mkdtemp(tmpl.data())) path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tp::test
