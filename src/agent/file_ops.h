// FileService: the agent's answers to kFileWrite/Read/Stat/List/Remove/Mkdir.
//
// Every path is resolved through a Resolver, so no request can touch a file
// outside the sandbox root (see resolver.h). Semantics (also in
// src/protocol/README.md):
//   write  O_CREAT|O_TRUNC, or O_APPEND with APPEND=1; MODE (default 0644) is
//          applied to new files, and to existing ones when given; PARENTS
//          creates missing directories (0755). Only regular files; answers SIZE.
//   read   OFFSET/LENGTH (LENGTH <= kMaxChunk, default kMaxChunk) -> DATA, SIZE.
//          Only regular files: FIFOs, devices and directories are refused
//          (invalid_argument) without blocking.
//   stat   lstat-like (the last component is not followed).
//   list   one ENTRY per directory entry, sorted by name; an answer that would
//          exceed a frame fails with payload_too_large.
//   remove a file, a symlink or an empty directory; RECURSIVE removes a tree
//          without following symlinks. "/" cannot be removed.
//   mkdir  MODE (default 0755); PARENTS = mkdir -p (an existing directory is Ok).
// Failures answer kError with code_name(code_from_errno(errno)), ERRNO and a
// MESSAGE naming the call and path (without the strerror text).
//
// Thread rules: one FileService per thread; handle() blocks on the file system.
#pragma once

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "agent/resolver.h"
#include "common/result.h"
#include "protocol/wire.h"

namespace tp::agent {

class FileService {
 public:
  explicit FileService(Resolver resolver) : resolver_(std::move(resolver)) {}

  // Answers one file request (kOk or kError, same id). Other types: kError.
  proto::Message handle(const proto::Message& req);

  Result<uint64_t> write(const proto::Message& req);
  Result<proto::Message> read(const proto::Message& req);
  Result<proto::Message> stat(const proto::Message& req);
  Result<proto::Message> list(const proto::Message& req);
  Result<void> remove(const proto::Message& req);
  Result<void> mkdir(const proto::Message& req);

  // Creates `path` and its missing parents as directories (mkdir -p).
  Result<void> mkdir_parents(const std::string& path, mode_t mode);

  const Resolver& resolver() const { return resolver_; }

 private:
  Resolver resolver_;
};

// The ENTRY/stat fields of one file (NAME, PATH, TYPE, SIZE, MODE, MTIME_NS,
// UID, GID and LINK_TARGET for symlinks).
std::vector<std::pair<proto::Tag, std::string>> entry_fields(const std::string& name,
                                                             const std::string& path,
                                                             const struct stat& st,
                                                             const std::string& link_target);
// "file", "dir", "symlink" or "other".
const char* file_type_name(mode_t mode);
// `dir` + "/" + `name` without doubling the slash.
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace tp::agent
