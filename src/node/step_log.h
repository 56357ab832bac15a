// StepLog: the durable record of every answered call that carried an
// Idempotency-Key, one append-only file per sandbox (the start of the
// per-sandbox trajectory log) plus one node-wide file for calls about no single
// sandbox (create, batch, images). docs/step-log.md describes the same format.
//
// Layout under <data_dir>:
//   sandboxes/<id>/steps.log         records of calls on sandbox <id>
//   sandboxes/<id>/steps.d/<n>.body  answers larger than inline_max (side files)
//   steps/global.log, steps/steps.d/ the node-wide log and its side files
//
// File = a 16-byte file header, then records back to back:
//   file header   "TPSTEPS\n" (8 bytes) | u32 version (=1) | u32 flags (=0)
//   record        u32 magic 0x52535054 ("TPSR") | u32 len | u32 crc | payload[len]
//                 crc = CRC32C over the 4 bytes of len, then the payload
//   payload       u8 kind (1 = an answered call), then fields until the end:
//                 u16 tag | u32 size | value[size]
// All integers are little-endian. Readers skip fields whose tag they do not know,
// so later versions add fields (the full trajectory log: request headers, calls
// without a key, replay markers) without breaking old files. Tags of kind 1:
//    1 key            bytes (empty for a call without a key, once they are logged)
//    2 method         bytes            3 target   bytes (path and query, as sent)
//    4 body_sha256    32 bytes         5 body_len u64
//    6 request_body   bytes, present when body_len <= inline_max (replay input)
//   10 status         u32              11 content_type bytes
//   12 answer         bytes, the answer body when it is <= inline_max
//   13 answer_side    bytes, the side file's name (in steps.d/) otherwise
//   14 answer_len     u64              15 answer_crc u32 (CRC32C of the answer body)
//   20 started_us     i64 (unix us)    21 finished_us i64 (unix us)
//
// Durability: a side file is written and fdatasync'ed (and its directory
// fsync'ed) before the record naming it is appended; a record is appended and
// the log fdatasync'ed before append()'s callback runs, i.e. before the caller
// sends the answer. One writer thread does every append: the records that
// arrive while it syncs are written and synced together (group commit).
//
// Recovery (open): each log is read record by record. A final record cut short
// (crash mid-write: too few bytes for its header or its len, or a bad crc on the
// last record) is truncated away and never returned. A bad record in the middle
// (or a bad file header) stops the reading there: the error is logged, the file
// is kept as steps.log.damaged-<unix s> for inspection, and a fresh steps.log
// holds the good records before the damage (later ones are lost to the index).
// Side files no record names (a crash between side file and record) are deleted.
//
// Memory: only an index key -> (log, offset, finish time) is kept, at most
// max_keys entries; answers are read from disk when asked for.
//
// Retention: a sandbox's log is deleted once the sandbox is not live (the
// is_live callback) and its log was last written or ended (sandbox_ended())
// more than `retention` ago; checked at open and then periodically by the
// writer thread. Keys of the node-wide log are forgotten after `retention`;
// the file itself is compacted at open (records older than retention dropped).
//
// Thread rules: every method is safe from any thread. Callbacks of append() run
// on the writer thread and must not block for long.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace tp::node {

uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// What identifies a call: a repeat with the same key must match all of it.
struct StepFingerprint {
  std::string method;
  std::string target;       // path and query
  std::string body_sha256;  // 32 raw bytes
  uint64_t body_len = 0;
  bool operator==(const StepFingerprint&) const = default;
  // "POST /v1/x (body sha256:ab12..., 17 bytes)"
  std::string describe() const;
};

struct StepRecord {
  std::string key;
  StepFingerprint request;
  std::optional<std::string> request_body;  // kept when small
  int status = 0;
  std::string content_type;
  uint64_t answer_len = 0;
  uint32_t answer_crc = 0;
  std::string answer_side;  // side file name, empty when inline
  std::string answer;       // the body (read(): when asked for)
  int64_t started_us = 0;
  int64_t finished_us = 0;
};

// Where a record is: which log, at which offset.
struct StepLocation {
  uint32_t log = 0;
  uint64_t offset = 0;
  int64_t finished_us = 0;
};

// An answer body being written straight to a side file (a streamed answer), so
// that it never sits whole in memory. Owned by one caller at a time.
class StepSideFile {
 public:
  ~StepSideFile();
  Result<void> write(std::string_view data);
  uint64_t size() const { return size_; }

 private:
  friend class StepLog;
  int fd_ = -1;
  std::string dir_, name_;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
  bool failed_ = false;
  bool kept_ = false;  // named by a committed record: not deleted on destruction
};

class StepLog {
 public:
  struct Options {
    std::string data_dir;
    std::chrono::seconds retention{24 * 3600};
    size_t max_keys = 1'000'000;
    size_t inline_max = 64 << 10;
    std::function<bool(const std::string& sandbox_id)> is_live;  // see set_is_live
  };
  using IsLive = std::function<bool(const std::string& sandbox_id)>;

  // Reads every log under data_dir (recovering torn tails), deletes what retention
  // allows, and starts the writer thread.
  static Result<std::unique_ptr<StepLog>> open(Options opts);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Which log a call belongs to: the sandbox id of /v1/sandboxes/<id>[/...], or
  // "" (the node-wide log) for any other path.
  static std::string scope_of(std::string_view path);
  // "90s", "30m", "24h", "7d" or plain seconds.
  static Result<std::chrono::seconds> parse_duration(std::string_view s);

  std::optional<StepLocation> find(const std::string& key);
  // Reads a record; with_answer also reads the answer body (from its side file).
  Result<StepRecord> read(const StepLocation& loc, bool with_answer);
  size_t size();
  bool full();
  size_t inline_max() const { return opts_.inline_max; }

  // Starts a side file for an answer of `scope` (a streamed answer).
  Result<std::unique_ptr<StepSideFile>> new_side(const std::string& scope);
  // Appends rec durably; `answer` is the body when `side` is null (it goes inline
  // or into a new side file by size) and is handed back to `done` with the result.
  using Done = std::function<void(Result<void>, std::string answer)>;
  void append(const std::string& scope, StepRecord rec, std::string answer,
              std::unique_ptr<StepSideFile> side, Done done);
  // Blocking append, for tests and tools.
  Result<void> append_sync(const std::string& scope, StepRecord rec, std::string answer);

  // Sandbox lifecycle hooks. sandbox_ended starts the retention clock of the
  // sandbox's log (no descriptor of a sandbox's log stays open); is_live tells the sweep which
  // sandboxes still run (without it every sandbox counts as ended).
  void sandbox_ended(const std::string& sandbox_id);
  void set_is_live(IsLive f);
  // Deletes what retention allows now (also run periodically).
  void sweep();

 private:
  struct File;
  struct Pending;
  explicit StepLog(Options opts);
  Result<void> load_all();
  Result<void> load(uint32_t log);
  uint32_t log_id_locked(const std::string& scope);
  std::string dir_of(const std::string& scope) const;
  Result<File*> file_for(uint32_t log);
  void run();
  void commit(std::vector<Pending>& batch);

  const Options opts_;
  std::mutex mu_;  // index_, scopes_, pending_, stop_
  std::condition_variable cv_;
  std::unordered_map<std::string, StepLocation> index_;
  std::vector<std::string> scopes_;  // log id -> scope ("" = node-wide)
  std::unordered_map<std::string, uint32_t> scope_ids_;
  std::deque<Pending> pending_;
  IsLive is_live_;
  bool stop_ = false;
  uint64_t side_seq_ = 0;
  // Owned by the writer thread (and load at open, before it starts).
  std::unordered_map<uint32_t, std::unique_ptr<File>> files_;
  std::mutex files_mu_;  // files_ against sandbox_ended/sweep from other threads
  std::thread writer_;
};

}  // namespace tp::node
