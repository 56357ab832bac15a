#include "node/step_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_set>

#include "common/ids.h"
#include "common/log.h"
#include "common/parallel.h"
#include "sys/mountinfo.h"

namespace tp::node {

namespace fs = std::filesystem;
using namespace step_format;

namespace {

constexpr size_t kMaxPrealloc = 1 << 20;
// A new log's first piece: one block, which holds a short-lived sandbox's whole log
// (its created event, a few calls, its end), so that a sandbox that ends soon never
// allocates, writes and at its end frees (with a discard, on such mounts) the 64 KiB
// that a long-lived one grows by.
constexpr uint64_t kFirstPiece = 4096;
constexpr size_t kSyncThreads = 7;  // with the writer: 8 logs synced at once
// Descriptors of the most recently written sandbox logs kept open between commits: an
// exec loop does not pay an open and a close per record, and the daemon's descriptors
// stay a constant, however many sandboxes there are.
constexpr size_t kOpenLogs = 32;

// True when an fdatasync of a file just created under `dir` also makes its name (and
// the names of the directories made for it) durable, so that fsyncs of the directories
// would only add a flush each. ext4 does: without a journal its fsync writes the new
// entries' parents up the tree (ext4_sync_parent); with one, the create and the mkdir
// are in the journal transaction the fsync commits. So does XFS (the fsync forces the
// log up to the inode's create). tmpfs keeps nothing across a reboot anyway. Any other
// file system (or one this cannot tell) gets the directory fsyncs.
bool names_durable_with_file_sync(const std::string& dir) {
  struct statfs sf {};
  if (::statfs(dir.c_str(), &sf) != 0) return false;
  if (sf.f_type == TMPFS_MAGIC || sf.f_type == XFS_SUPER_MAGIC) return true;
  if (sf.f_type != EXT4_SUPER_MAGIC) return false;
  // ext2 and ext3 share the magic: only the ext4 driver's mount counts.
  std::error_code ec;
  std::string real = fs::canonical(dir, ec).string();
  if (ec) return false;
  std::ifstream in("/proc/self/mountinfo");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto m = sys::mount_of(sys::parse_mountinfo(text), real);
  return m && m->fs_type == "ext4";
}

// ext4 without a journal under `dir`: its device has an ext4 entry in /proc/fs/ext4 and
// none in /proc/fs/jbd2 (which is absent when no journal was ever loaded).
bool ext4_without_journal(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return false;
  std::error_code ec;
  const auto dev =
      fs::read_symlink(fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev)), ec)
          .filename()
          .string();
  if (ec || dev.empty() || !fs::exists("/proc/fs/ext4/" + dev, ec)) return false;
  for (fs::directory_iterator it("/proc/fs/jbd2", ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().starts_with(dev + "-")) return false;
  return !ec || ec == std::errc::no_such_file_or_directory;
}

// The clock the kernel stamps a file's mtime with: a write moves the mtime (and dirties
// the inode) only when this has moved since the file's last write.
int64_t coarse_now_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t system_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<void> pread_all(int fd, char* buf, size_t n, uint64_t off) {
  while (n) {
    ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sys_fail("read step log");
    if (r == 0) return fail(Code::kInternal, "step log shorter than its index says");
    buf += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return {};
}

Result<void> pwrite_all(int fd, const char* buf, size_t n, uint64_t off) {
  while (n) {
    ssize_t r = ::pwrite(fd, buf, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sys_fail("write step log");
    buf += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return {};
}

Result<void> sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_fail("open " + dir);
  int r = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (r != 0) return sys_fail("fsync " + dir, e);
  return {};
}

Result<void> ensure_dir(const std::string& dir, bool* created) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    if (created) *created = true;
    return {};
  }
  if (errno == EEXIST) return {};
  return sys_fail("mkdir " + dir);
}

// True when the file holds only zeros from `from` to its end (blocks allocated, or
// preallocated, but never written).
Result<bool> zeros_to_end(int fd, uint64_t from, uint64_t size) {
  std::string buf;
  while (from < size) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(size - from, 1 << 20));
    buf.resize(n);
    TP_TRY(pread_all(fd, buf.data(), n, from));
    if (buf.find_first_not_of('\0') != std::string::npos) return false;
    from += n;
  }
  return true;
}

// A log file being read back at open. A file up to kWholeMax is read in one go and its
// records are parsed from memory: a restart reads back every log the retention keeps
// (thousands of small files on a busy node), and one read per file costs it less than
// two per record (header, payload). A larger file is read piece by piece.
class LogReader {
 public:
  static constexpr uint64_t kWholeMax = 4 << 20;
  LogReader(int fd, uint64_t size) : fd_(fd), size_(size) {}
  Result<void> init() {
    if (size_ > kWholeMax) return {};
    whole_.resize(static_cast<size_t>(size_));
    TP_TRY(pread_all(fd_, whole_.data(), whole_.size(), 0));
    in_memory_ = true;
    return {};
  }
  // [off, off + n) lies within the file's size (the caller checks).
  Result<void> read(char* buf, size_t n, uint64_t off) const {
    if (!in_memory_) return pread_all(fd_, buf, n, off);
    std::memcpy(buf, whole_.data() + off, n);
    return {};
  }
  // Whether everything from `from` to the end is zeros (a preallocated tail).
  Result<bool> zeros_to_end(uint64_t from) const {
    if (!in_memory_) return tp::node::zeros_to_end(fd_, from, size_);
    return from >= size_ ||
           whole_.find_first_not_of('\0', static_cast<size_t>(from)) == std::string::npos;
  }

 private:
  int fd_;
  uint64_t size_;
  std::string whole_;
  bool in_memory_ = false;
};

void set_mtime(const std::string& path, int64_t us) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = us / 1000000;
  ts[0].tv_nsec = ts[1].tv_nsec = (us % 1000000) * 1000;
  ::utimensat(AT_FDCWD, path.c_str(), ts, 0);
}

std::string log_name(const std::string& scope) {
  return scope.empty() ? "global.log" : "steps.log";
}

}  // namespace

// ---- side files ---------------------------------------------------------------

StepSideFile::~StepSideFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!kept_ && !name_.empty()) ::unlink((dir_ + "/" + name_).c_str());
}

Result<void> StepSideFile::write(std::string_view data) {
  if (failed_) return fail(Code::kInternal, "side file failed before");
  if (auto r = pwrite_all(fd_, data.data(), data.size(), size_); !r) {
    failed_ = true;
    return r;
  }
  size_ += data.size();
  crc_ = crc32c(crc_, data.data(), data.size());
  return {};
}

// ---- the log ------------------------------------------------------------------

struct StepLog::File {
  int fd = -1;
  uint64_t allocated = 0;  // the file's size: records, then preallocated zeros
  std::string dir, path;
  // Made by this commit: its header is written but not synced; its name and its
  // directory's name are synced after the records, in the same commit.
  bool fresh = false;
  uint64_t used = 0;  // commit count when last written (the least recent is closed first)
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

// fdatasync of several files at once: concurrent flushes are merged by the block layer,
// so a batch that touched N sandboxes' logs costs about one flush, not N in a row.
class StepLog::SyncPool {
 public:
  explicit SyncPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~SyncPool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // errno of each fd's fdatasync (0: synced), in the order given.
  std::vector<int> sync(const std::vector<int>& fds) {
    std::vector<int> err(fds.size(), 0);
    auto one = [](int fd) { return ::fdatasync(fd) == 0 ? 0 : errno; };
    if (fds.size() <= 1 || threads_.empty()) {
      for (size_t i = 0; i < fds.size(); ++i) err[i] = one(fds[i]);
      return err;
    }
    size_t left = fds.size() - 1;
    std::mutex m;
    std::condition_variable done;
    {
      std::lock_guard lk(mu_);
      for (size_t i = 1; i < fds.size(); ++i)
        jobs_.push_back([&, i] {
          int e = one(fds[i]);
          std::lock_guard l(m);
          err[i] = e;
          if (--left == 0) done.notify_all();
        });
    }
    cv_.notify_all();
    err[0] = one(fds[0]);
    std::unique_lock l(m);
    done.wait(l, [&] { return left == 0; });
    return err;
  }
  // fdatasync of `fd` ahead of need, off the caller's thread: only a hint (whoever needs
  // the file durable still syncs it), so it is dropped when kMaxAhead are waiting (a
  // burst of new logs must not queue in front of a commit's syncs).
  void ahead(int fd) {
    std::lock_guard lk(mu_);
    if (threads_.empty() || ahead_ >= kMaxAhead) return;
    const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the log may close its fd meanwhile
    if (dup < 0) return;
    ahead_++;
    jobs_.push_back([this, dup] {
      ::fdatasync(dup);
      ::close(dup);
      std::lock_guard l(mu_);
      ahead_--;
    });
    cv_.notify_one();
  }

 private:
  void work() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      job();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  static constexpr size_t kMaxAhead = 2;
  size_t ahead_ = 0;  // ahead() jobs queued or running
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

struct StepLog::Pending {
  enum class Op { kRecord, kTrim };
  Op op = Op::kRecord;
  uint32_t log = 0;
  StepRecord rec;
  std::string answer;
  std::unique_ptr<StepSideFile> side;
  std::unique_ptr<StepSideFile> request_side;
  Done done;
  // Written, but made durable by the log's next synced record (an event nobody's
  // promise rests on: see append_event).
  bool lazy = false;
};

struct StepLog::Log {
  std::string scope;
  bool loaded = false;   // read at open, or created since
  bool later = false;    // left by open() to the background reader, and not read yet
  bool reading = false;  // (later) a thread reads it now
  uint64_t end = 0;      // where the next record goes; 0 = no file yet
  uint64_t next_seq = 1;
  std::vector<std::pair<uint64_t, uint64_t>> seqs;  // (seq, offset), ascending
  uint64_t side_bytes = 0;
  uint64_t allocated = 0;       // the file's size when this writer last wrote it (0: unknown)
  size_t grow = 0;              // next preallocated piece
  bool ended = false;           // its "ended" event is in it
  bool closed = false;          // its sandbox ended and everything queued before was written
  bool unusable = false;        // a newer format (or unreadable): left alone, never written
  bool names_unsynced = false;  // a new file written lazily: its directories not yet fsync'ed
  int64_t mtime_tick = 0;       // coarse_now_ns() when last written or touched (0: unknown)
  int holds = 0;
  std::vector<Pending> deferred;  // after_calls events (and trims) waiting for holds == 0
  std::vector<std::function<void()>> waiters;
};

StepLog::StepLog(Options opts)
    : opts_(std::move(opts)), sync_pool_(std::make_unique<SyncPool>(kSyncThreads)) {}

StepLog::~StepLog() {
  {
    std::lock_guard lk(mu_);
    read_stop_ = true;
  }
  read_cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  {
    std::lock_guard lk(spare_mu_);
    spare_stop_ = true;
  }
  spare_cv_.notify_all();
  if (spare_thread_.joinable()) spare_thread_.join();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    // Deferred events of sandboxes still held go now: the writer drains everything queued.
    for (auto& l : logs_)
      for (auto& p : l->deferred) pending_.push_back(std::move(p));
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  // Spares not used (ready, or handed out to a sandbox that never wrote a record): a
  // clean stop leaves none behind (after a crash, open removes them).
  {
    std::lock_guard lk(spare_mu_);
    std::error_code ec;
    for (const auto& id : spares_) fs::remove_all(spare_dir() + "/" + id, ec);
    for (const auto& id : spares_taken_) fs::remove_all(spare_dir() + "/" + id, ec);
    spares_.clear();
    spares_taken_.clear();
  }
  // A clean stop leaves no preallocated zeros behind (after a crash, open cuts them).
  files_.clear();
  for (auto& l : logs_) {
    if (!l->loaded || l->unusable || l->end < kFileHeader) continue;
    std::string path = dir_of(l->scope) + "/" + log_name(l->scope);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) > l->end &&
        ::truncate(path.c_str(), static_cast<off_t>(l->end)) == 0) {
      // Its mtime is its retention clock: the trim does not move it.
      struct timespec ts[2] = {st.st_atim, st.st_mtim};
      ::utimensat(AT_FDCWD, path.c_str(), ts, 0);
    }
  }
}

int64_t StepLog::now_us() const { return opts_.clock ? opts_.clock() : system_now_us(); }

Result<std::unique_ptr<StepLog>> StepLog::open(Options opts) {
  std::unique_ptr<StepLog> log(new StepLog(std::move(opts)));
  TP_TRY(ensure_dir(log->opts_.data_dir + "/sandboxes", nullptr));
  TP_TRY(ensure_dir(log->opts_.data_dir + "/steps", nullptr));
  log->logs_.push_back(std::make_unique<Log>());
  log->scope_ids_[""] = 0;
  log->is_live_ = log->opts_.is_live;
  log->sync_dirs_ = log->opts_.always_sync_dirs ||
                    !names_durable_with_file_sync(log->opts_.data_dir + "/sandboxes");
  const bool no_journal = ext4_without_journal(log->opts_.data_dir);
  log->sync_each_spare_ = !log->sync_dirs_ && no_journal;
  log->touch_ahead_ = log->opts_.touch_ahead.value_or(no_journal);
  TP_TRY(ensure_dir(log->spare_dir(), nullptr));
  log->recover_spares();
  // With a background reader, that reader deletes the expired logs first (before it reads
  // the rest), so the stat of every log the retention keeps is not part of a restart.
  if (!log->opts_.read_first) log->sweep();
  TP_TRY(log->load_all());
  log->writer_ = std::thread([p = log.get()] { p->run(); });
  if (!log->read_later_.empty())
    log->reader_ = std::thread(
        [p = log.get(), ids = std::move(log->read_later_)] { p->load_rest(std::move(ids)); });
  if (log->opts_.spares > 0 && log->opts_.make_id)
    log->spare_thread_ = std::thread([p = log.get()] { p->make_spares(); });
  return log;
}

std::string StepLog::scope_of(std::string_view path) {
  std::vector<std::string_view> seg;
  while (!path.empty() && seg.size() < 3) {
    if (path[0] == '/') {
      path.remove_prefix(1);
      continue;
    }
    auto s = path.find('/');
    seg.push_back(path.substr(0, s));
    if (s == std::string_view::npos) break;
    path.remove_prefix(s);
  }
  if (seg.size() == 3 && seg[0] == "v1" && seg[1] == "sandboxes" && ids::valid_sandbox_id(seg[2]))
    return std::string(seg[2]);
  return "";
}

Result<std::chrono::seconds> StepLog::parse_duration(std::string_view s) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9' && v < (1ull << 40); ++i)
    v = v * 10 + (s[i] - '0');
  std::string_view unit = s.substr(i);
  uint64_t mul = unit.empty() || unit == "s" ? 1
                 : unit == "m"               ? 60
                 : unit == "h"               ? 3600
                 : unit == "d"               ? 86400
                                             : 0;
  if (i == 0 || mul == 0 || v >= (1ull << 40))
    return fail(Code::kInvalidArgument,
                "duration must be a number with s, m, h or d: " + std::string(s));
  return std::chrono::seconds(static_cast<int64_t>(v * mul));
}

std::string StepLog::dir_of(const std::string& scope) const {
  return scope.empty() ? opts_.data_dir + "/steps" : opts_.data_dir + "/sandboxes/" + scope;
}

uint32_t StepLog::log_id_locked(const std::string& scope) {
  auto [it, fresh] = scope_ids_.try_emplace(scope, static_cast<uint32_t>(logs_.size()));
  if (fresh) {
    logs_.push_back(std::make_unique<Log>());
    logs_.back()->scope = scope;
  }
  return it->second;
}

Result<void> StepLog::load_all() {
  std::vector<std::string> found;
  if (DIR* d = ::opendir((opts_.data_dir + "/sandboxes").c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (ids::valid_sandbox_id(n)) found.push_back(n);
    }
    ::closedir(d);
  }
  TP_TRY(load(0, &interrupted_));
  std::vector<uint32_t> ids;
  {
    std::lock_guard lk(mu_);
    for (const auto& s : found) {
      const uint32_t id = log_id_locked(s);
      if (!opts_.read_first || opts_.read_first(s)) {
        ids.push_back(id);
      } else {
        logs_[id]->later = true;
        read_later_.push_back(id);
      }
    }
    if (!read_later_.empty()) {
      unread_ = read_later_.size();
      all_read_ = false;
    }
  }
  // Several at a time: reading back is mostly waiting on the file system, and the
  // daemon serves nothing before these (all logs, or those of read_first) are read. Each
  // load() touches its own log and file; what they share (the index, the list of
  // interrupted calls) is under mu_.
  parallel_for(ids.size(), kLoaders, [&](size_t i) {
    std::vector<std::pair<uint32_t, StepRecord>> lost;
    Result<void> r;
    try {
      r = load(ids[i], &lost);
    } catch (const std::exception& e) {  // e.g. bad_alloc: never past a joinable thread
      r = fail(Code::kInternal, e.what());
    }
    std::lock_guard lk(mu_);
    if (!r) {
      spdlog::error("step log of {}: {}; it is left as it is and not written", logs_[ids[i]]->scope,
                    r.error().message());
      logs_[ids[i]]->unusable = true;
    }
    for (auto& x : lost) interrupted_.push_back(std::move(x));
  });
  return {};
}

void StepLog::load_locked(std::unique_lock<std::mutex>& lk, uint32_t log) {
  for (;;) {
    const Log& l = *logs_[log];
    if (!l.later) return;
    if (!l.reading) break;
    reader_waiters_.fetch_add(1, std::memory_order_relaxed);
    read_cv_.wait(lk);
    reader_waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  logs_[log]->reading = true;
  const std::string scope = logs_[log]->scope;
  lk.unlock();
  std::vector<std::pair<uint32_t, StepRecord>> lost;
  Result<void> r;
  try {
    r = load(log, &lost);
  } catch (const std::exception& e) {
    r = fail(Code::kInternal, e.what());
  }
  if (!r)
    spdlog::error("step log of {}: {}; it is left as it is and not written", scope,
                  r.error().message());
  lk.lock();
  Log& l = *logs_[log];
  if (!r) l.unusable = true;
  l.later = l.reading = false;
  for (auto& x : lost) lost_later_.push_back(std::move(x));
  unread_.fetch_sub(1, std::memory_order_release);
  read_cv_.notify_all();
}

void StepLog::ensure_loaded(const std::string& scope) {
  if (unread_.load(std::memory_order_acquire) == 0) return;
  std::unique_lock lk(mu_);
  auto it = scope_ids_.find(scope);
  if (it != scope_ids_.end()) load_locked(lk, it->second);
}

// The background reader runs at the lowest priority while no call waits for it: a
// restart's first requests, and the recovery before them, do not share the CPU with the
// reading of a long history. A call that waits for it (find() of a key not found yet, a
// log it is reading) raises it back to normal until the next log.
void StepLog::reader_priority() {
  thread_local int nice = -1;  // not set yet: a new thread inherits its creator's
  const int want = reader_waiters_.load(std::memory_order_relaxed) > 0 ? 0 : 19;
  // Failing (no CAP_SYS_NICE to raise it again) leaves it where it is.
  if (want != nice && ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), want) == 0)
    nice = want;
}

void StepLog::load_rest(std::vector<uint32_t> logs) {
  reader_priority();
  remove_expired(true);
  parallel_for(logs.size(), kLoaders, [&](size_t i) {
    reader_priority();
    std::unique_lock lk(mu_);
    if (!read_stop_) load_locked(lk, logs[i]);
  });
  std::vector<std::pair<uint32_t, StepRecord>> lost;
  bool stopping;
  {
    std::lock_guard lk(mu_);
    lost.swap(lost_later_);
    stopping = read_stop_;
  }
  // Closing: their intents stay unanswered in the logs, and the next open finds them.
  if (!stopping) answer_lost(std::move(lost));
  {
    std::lock_guard lk(mu_);
    all_read_ = true;
  }
  read_cv_.notify_all();
}

void StepLog::wait_all_loaded(std::unique_lock<std::mutex>& lk) {
  if (all_read_ || read_stop_) return;
  reader_waiters_.fetch_add(1, std::memory_order_relaxed);
  read_cv_.wait(lk, [&] { return all_read_ || read_stop_; });
  reader_waiters_.fetch_sub(1, std::memory_order_relaxed);
}

// Reads one log back into the index (see the header: torn tails, damage, side files).
Result<void> StepLog::load(uint32_t log, std::vector<std::pair<uint32_t, StepRecord>>* lost) {
  std::string scope;
  {
    std::lock_guard lk(mu_);
    scope = logs_[log]->scope;
    logs_[log]->loaded = true;
  }
  std::string dir = dir_of(scope);
  std::string path = dir + "/" + log_name(scope);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return {};
    return sys_fail("open " + path);
  }
  auto f = std::make_unique<File>();
  f->fd = fd;
  f->dir = dir;
  f->path = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return sys_fail("stat " + path);
  uint64_t size = static_cast<uint64_t>(st.st_size);

  struct Good {
    uint64_t off, len;
    StepRecord rec;
  };
  std::vector<Good> good;
  uint64_t end = kFileHeader;  // end of the last good record
  bool damaged = false, torn = false;
  std::string hb(kFileHeader, '\0');
  LogReader in(fd, size);
  if (size < kFileHeader) {
    torn = true;  // a crash while the file was being created
    end = 0;
  } else if (auto r = in.init(); !r) {
    return r;
  } else if (r = in.read(hb.data(), kFileHeader, 0); !r) {
    return r;
  } else if (auto v = parse_file_header(hb); !v) {
    if (std::memcmp(hb.data(), kFileMagic, sizeof kFileMagic) == 0)
      return std::unexpected(v.error());  // a newer format: not ours to repair
    damaged = true;
    end = 0;
    spdlog::error("step log {}: bad file header", path);
  } else {
    if (*v < kVersion) {
      // Version 1 records are valid version 2 records: only the header changes.
      auto h = file_header();
      if (auto w = pwrite_all(fd, h.data(), h.size(), 0); !w) return w;
      if (::fdatasync(fd) != 0) return sys_fail("fdatasync " + path);
      spdlog::info("step log {}: version {} read and marked version {}", path, *v, kVersion);
    }
    std::string payload;
    while (end < size) {
      uint64_t left = size - end;
      char rh[kRecordHeader];
      if (left < kRecordHeader) {
        auto z = in.zeros_to_end(end);
        if (!z) return std::unexpected(z.error());
        if (!*z) torn = true;  // else: the preallocated tail (the log ends here)
        break;
      }
      TP_TRY(in.read(rh, kRecordHeader, end));
      uint32_t magic = get_u32(rh), len = get_u32(rh + 4), crc = get_u32(rh + 8);
      if (magic == 0 && len == 0 && crc == 0) {
        auto z = in.zeros_to_end(end);
        if (!z) return std::unexpected(z.error());
        if (*z) break;  // the preallocated tail
      }
      bool sane = magic == kRecordMagic && len <= kMaxRecord;
      if (sane && len > left - kRecordHeader) {
        torn = true;  // its length reaches past the end: cut short by a crash
        break;
      }
      bool ok = sane;
      if (ok) {
        payload.resize(len);
        TP_TRY(in.read(payload.data(), len, end + kRecordHeader));
        ok = record_crc(payload) == crc;
      }
      Result<StepRecord> rec = ok ? decode(payload) : fail(Code::kInternal, "bad record");
      if (!rec && ok) {
        // Whole (its checksum holds) but not readable by this build (a kind a newer one
        // wrote, say): left in place and skipped, never cut away with what follows it.
        spdlog::warn("step log {}: record at offset {} skipped: {}", path, end,
                     rec.error().message());
        end += kRecordHeader + len;
        continue;
      }
      if (!rec) {
        // The last record, or one followed only by zeros (a preallocated tail, or blocks
        // allocated but never written), is a torn tail; anything else is damage.
        auto zeros = in.zeros_to_end(sane ? end + kRecordHeader + len : end);
        if (!zeros) return std::unexpected(zeros.error());
        if (*zeros)
          torn = true;
        else
          damaged = true;
        if (damaged)
          spdlog::error("step log {}: bad record at offset {}; reading stops there", path, end);
        break;
      }
      good.push_back({end, kRecordHeader + len, std::move(*rec)});
      end += kRecordHeader + len;
    }
  }

  // Records the node-wide log keeps (the others are past retention).
  int64_t horizon =
      now_us() - std::chrono::duration_cast<std::chrono::microseconds>(opts_.retention).count();
  size_t kept = good.size();
  if (scope.empty()) {
    kept = 0;
    for (const auto& g : good)
      if (g.rec.finished_us >= horizon) ++kept;
  }
  if (damaged || kept != good.size() || end == 0) {
    // Rewrite: a fresh file with the header and the kept records.
    std::string tmp = path + ".tmp";
    int nfd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (nfd < 0) return sys_fail("create " + tmp);
    auto hdr = file_header();
    uint64_t off = 0;
    auto r = pwrite_all(nfd, hdr.data(), hdr.size(), 0);
    off = hdr.size();
    std::string buf;
    for (auto& g : good) {
      if (!r) break;
      if (scope.empty() && g.rec.finished_us < horizon) {
        g.len = 0;  // dropped
        continue;
      }
      buf.resize(g.len);
      r = in.read(buf.data(), g.len, g.off);
      if (r) r = pwrite_all(nfd, buf.data(), g.len, off);
      g.off = off;
      off += g.len;
    }
    if (r && ::fdatasync(nfd) != 0) r = sys_fail("fdatasync " + tmp);
    if (!r) {
      ::close(nfd);
      ::unlink(tmp.c_str());
      return r;
    }
    if (damaged) {
      // A second name, then the new file over the first: a crash between the two
      // leaves the damaged log in place (read, and set aside, again), never no log.
      std::string aside = fmt::format("{}.damaged-{}", path, system_now_us() / 1000000);
      if (::link(path.c_str(), aside.c_str()) != 0)
        spdlog::error("keep {}: {}", aside, strerror(errno));
      else
        spdlog::error("step log {}: kept as {}; {} good records carried over", path, aside,
                      good.size());
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      ::close(nfd);
      return sys_fail("rename " + tmp);
    }
    ::close(fd);
    f->fd = nfd;
    TP_TRY(sync_dir(dir));
    size = end = off;
    std::erase_if(good, [](const Good& g) { return g.len == 0; });
  } else if (torn || end < size) {
    if (torn)
      spdlog::warn("step log {}: torn final record at offset {} cut away ({} bytes to the end)",
                   path, end, size - end);
    if (::ftruncate(f->fd, static_cast<off_t>(end)) != 0 || ::fdatasync(f->fd) != 0)
      return sys_fail("truncate " + path);
  }
  f->allocated = end;

  // Side files that no record names were left by a crash before their record.
  std::set<std::string> named;
  uint64_t side_bytes = 0;
  for (const auto& g : good) {
    if (!g.rec.answer_side.empty()) {
      named.insert(g.rec.answer_side);
      side_bytes += g.rec.answer_len;
    }
    if (!g.rec.request_side.empty()) {
      named.insert(g.rec.request_side);
      side_bytes += g.rec.request.body_len;
    }
  }
  if (DIR* d = ::opendir((dir + "/steps.d").c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.ends_with(".body") && !named.count(n))
        ::unlink((dir + "/steps.d/" + n).c_str());
    }
    ::closedir(d);
  }
  {
    std::lock_guard lk(mu_);
    Log& l = *logs_[log];
    l.end = end;
    l.side_bytes = side_bytes;
    l.seqs.clear();
    uint64_t seq = 0;
    // Keys whose intent has no call record after it: key -> the intent's place in good.
    std::unordered_map<std::string, size_t> open;
    for (size_t i = 0; i < good.size(); ++i) {
      auto& g = good[i];
      if (is_intent(g.rec)) {  // no entry of the log
        if (!g.rec.key.empty()) open[g.rec.key] = i;
        continue;
      }
      if (g.rec.kind == StepKind::kCall && !g.rec.key.empty()) open.erase(g.rec.key);
      // Version 1 records carry no seq: it is their place in the file.
      if (g.rec.seq <= seq) g.rec.seq = seq + 1;
      seq = g.rec.seq;
      l.seqs.emplace_back(seq, g.off);
      if (g.rec.kind == StepKind::kEvent && g.rec.event == "ended") l.ended = l.closed = true;
      if (g.rec.kind == StepKind::kCall && !g.rec.key.empty())
        index_[g.rec.key] = StepLocation{log, g.off, g.rec.finished_us};
    }
    l.next_seq = seq + 1;
    for (size_t i = 0; i < good.size(); ++i) {  // in the log's order
      auto it = is_intent(good[i].rec) ? open.find(good[i].rec.key) : open.end();
      if (it != open.end() && it->second == i) lost->emplace_back(log, std::move(good[i].rec));
    }
  }
  if (log == 0) {  // only the node-wide log stays open (see commit)
    std::lock_guard lk(files_mu_);
    files_[log] = std::move(f);
  }
  return {};
}

std::optional<StepLocation> StepLog::find(const std::string& key) {
  std::unique_lock lk(mu_);
  auto it = index_.find(key);
  if (it == index_.end() && !all_read_) {
    // It may be in a log not read yet.
    wait_all_loaded(lk);
    it = index_.find(key);
  }
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

size_t StepLog::size() {
  std::unique_lock lk(mu_);
  wait_all_loaded(lk);
  return index_.size();
}

bool StepLog::full() {
  std::unique_lock lk(mu_);
  wait_all_loaded(lk);
  return index_.size() >= opts_.max_keys;
}

Result<StepRecord> StepLog::read_at(int fd, const std::string& path, uint64_t offset) {
  char rh[kRecordHeader];
  TP_TRY(pread_all(fd, rh, kRecordHeader, offset));
  uint32_t len = get_u32(rh + 4);
  if (get_u32(rh) != kRecordMagic || len > kMaxRecord)
    return fail(Code::kInternal, "step log " + path + ": bad record header");
  std::string payload(len, '\0');
  TP_TRY(pread_all(fd, payload.data(), len, offset + kRecordHeader));
  if (record_crc(payload) != get_u32(rh + 8))
    return fail(Code::kInternal, "step log " + path + ": bad record checksum");
  return decode(payload);
}

Result<void> StepLog::read_side(const std::string& dir, const std::string& name, uint64_t len,
                                std::string* out) {
  std::string sp = dir + "/steps.d/" + name;
  int sfd = ::open(sp.c_str(), O_RDONLY | O_CLOEXEC);
  if (sfd < 0) return sys_fail("open " + sp);
  out->resize(len);
  auto rr = pread_all(sfd, out->data(), len, 0);
  ::close(sfd);
  return rr;
}

Result<StepRecord> StepLog::read(const StepLocation& loc, bool with_answer) {
  std::string scope;
  {
    std::lock_guard lk(mu_);
    if (loc.log >= logs_.size()) return fail(Code::kInternal, "no such step log");
    scope = logs_[loc.log]->scope;
  }
  std::string dir = dir_of(scope);
  std::string path = dir + "/" + log_name(scope);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_fail("open " + path);
  auto rec = read_at(fd, path, loc.offset);
  ::close(fd);
  if (!rec) return rec;
  if (!with_answer) {
    rec->answer.clear();
    return rec;
  }
  if (!rec->answer_side.empty())
    TP_TRY(read_side(dir, rec->answer_side, rec->answer_len, &rec->answer));
  if (rec->answer.size() != rec->answer_len ||
      crc32c(0, rec->answer.data(), rec->answer.size()) != rec->answer_crc)
    return fail(Code::kInternal,
                "step log " + path + ": answer of key does not match its checksum");
  return rec;
}

StepLogInfo StepLog::info(const std::string& scope) {
  ensure_loaded(scope);
  std::lock_guard lk(mu_);
  StepLogInfo i;
  auto it = scope_ids_.find(scope);
  if (it == scope_ids_.end()) return i;
  const Log& l = *logs_[it->second];
  i.exists = l.end >= kFileHeader;
  i.last_seq = l.seqs.empty() ? 0 : l.seqs.back().first;
  i.records = l.seqs.size();
  i.bytes = (i.exists ? l.end : 0) + l.side_bytes;
  i.ended = l.ended;
  i.closed = l.closed;
  i.busy = l.holds > 0 || !l.deferred.empty();
  return i;
}

Result<std::vector<StepRecord>> StepLog::list(const std::string& scope, uint64_t after,
                                              size_t limit, bool with_answer,
                                              uint64_t max_answer_bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> want;
  ensure_loaded(scope);
  {
    std::lock_guard lk(mu_);
    auto it = scope_ids_.find(scope);
    if (it == scope_ids_.end()) return std::vector<StepRecord>{};
    const Log& l = *logs_[it->second];
    auto from = std::upper_bound(l.seqs.begin(), l.seqs.end(),
                                 std::make_pair(after, std::numeric_limits<uint64_t>::max()));
    for (; from != l.seqs.end() && want.size() < limit; ++from) want.push_back(*from);
  }
  std::vector<StepRecord> out;
  if (want.empty()) return out;
  std::string dir = dir_of(scope);
  std::string path = dir + "/" + log_name(scope);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_fail("open " + path);
  uint64_t answers = 0;
  for (const auto& [seq, off] : want) {
    auto rec = read_at(fd, path, off);
    if (!rec) {
      ::close(fd);
      return std::unexpected(rec.error());
    }
    rec->seq = seq;
    if (with_answer) {
      answers += rec->answer_len;
      if (answers > max_answer_bytes && !out.empty()) break;
    }
    if (with_answer && !rec->answer_side.empty()) {
      if (auto r = read_side(dir, rec->answer_side, rec->answer_len, &rec->answer); !r) {
        ::close(fd);
        return std::unexpected(r.error());
      }
    }
    out.push_back(std::move(*rec));
  }
  ::close(fd);
  return out;
}

Result<std::optional<std::string>> StepLog::request_body(const std::string& scope,
                                                         const StepRecord& rec) {
  if (rec.request_body) return rec.request_body;
  if (rec.request_side.empty()) {
    if (rec.request.body_len == 0) return std::optional<std::string>(std::string());
    return std::optional<std::string>();
  }
  std::string body;
  TP_TRY(read_side(dir_of(scope), rec.request_side, rec.request.body_len, &body));
  return std::optional<std::string>(std::move(body));
}

void StepLog::when_after(const std::string& scope, uint64_t after, std::function<void()> cb) {
  ensure_loaded(scope);
  {
    std::lock_guard lk(mu_);
    Log& l = *logs_[log_id_locked(scope)];
    bool now = l.closed || l.ended || (!l.seqs.empty() && l.seqs.back().first > after);
    if (!now) {
      l.waiters.push_back(std::move(cb));
      return;
    }
  }
  cb();
}

void StepLog::drop_waiters() {
  std::vector<std::function<void()>> gone;
  {
    std::lock_guard fl(fire_mu_);
    std::lock_guard lk(mu_);
    for (auto& l : logs_) fire_waiters_locked(*l, &gone);
  }
}

void StepLog::fire(std::vector<std::function<void()>>& wake) {
  if (wake.empty()) return;
  std::lock_guard fl(fire_mu_);
  for (auto& w : wake) w();
  wake.clear();
}

void StepLog::fire_waiters_locked(Log& l, std::vector<std::function<void()>>* out) {
  for (auto& w : l.waiters) out->push_back(std::move(w));
  l.waiters.clear();
}

Result<std::unique_ptr<StepSideFile>> StepLog::new_side(const std::string& scope) {
  ensure_loaded(scope);  // reading it back deletes the side files its records do not name
  std::string dir = dir_of(scope);
  TP_TRY(ensure_dir(dir, nullptr));
  TP_TRY(ensure_dir(dir + "/steps.d", nullptr));
  uint64_t seq;
  {
    std::lock_guard lk(mu_);
    seq = ++side_seq_;
  }
  auto s = std::unique_ptr<StepSideFile>(new StepSideFile);
  s->dir_ = dir + "/steps.d";
  s->name_ = fmt::format("{:x}-{:x}.body", system_now_us(), seq);
  s->fd_ =
      ::open((s->dir_ + "/" + s->name_).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (s->fd_ < 0) {
    int e = errno;
    s->name_.clear();
    return sys_fail("create side file in " + s->dir_, e);
  }
  return s;
}

void StepLog::append(const std::string& scope, StepRecord rec, std::string answer,
                     std::unique_ptr<StepSideFile> side, Done done, bool release_hold) {
  std::vector<Pending> ps(1);
  Pending& p = ps.front();
  p.rec = std::move(rec);
  p.answer = std::move(answer);
  p.side = std::move(side);
  p.done = std::move(done);
  ensure_loaded(scope);
  std::unique_lock lk(mu_);
  p.log = log_id_locked(scope);
  if (release_hold) {
    // The events (and the trim) that waited for this call follow its record in the
    // same commit: one sync for both, and no hand-off to the writer.
    Log& l = *logs_[p.log];
    if (l.holds > 0) l.holds--;
    if (l.holds == 0) {
      for (auto& d : l.deferred) ps.push_back(std::move(d));
      l.deferred.clear();
    }
  }
  submit_locked(lk, std::move(ps), true);
}

void StepLog::submit_locked(std::unique_lock<std::mutex>& lk, std::vector<Pending> ps,
                            bool may_inline) {
  std::vector<Pending> batch;
  const bool idle = pending_.empty();
  for (auto& p : ps) pending_.push_back(std::move(p));
  if (may_inline && opts_.inline_commit && !busy_ && !stop_ && idle) {
    busy_ = true;
    while (!pending_.empty()) {
      batch.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }
  lk.unlock();
  if (batch.empty()) {
    cv_.notify_all();
    return;
  }
  commit(batch);
  bool more;
  {
    std::lock_guard lk(mu_);
    busy_ = false;
    more = !pending_.empty() || stop_ || sweep_waits_;
  }
  // What queued meanwhile is the writer's (this thread does not stay on to commit it).
  if (more) cv_.notify_all();
}

Result<void> StepLog::append_sync(const std::string& scope, StepRecord rec, std::string answer) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Result<void>> out;
  append(scope, std::move(rec), std::move(answer), nullptr, [&](Result<void> r, std::string) {
    std::lock_guard lk(m);
    out = std::move(r);
    cv.notify_all();
  });
  std::unique_lock lk(m);
  cv.wait(lk, [&] { return out.has_value(); });
  return *out;
}

void StepLog::append_event(const std::string& scope, std::string event, std::string detail_json,
                           bool after_calls, Done done, bool lazy) {
  Pending p;
  p.lazy = lazy;
  p.rec.kind = StepKind::kEvent;
  p.rec.event = std::move(event);
  p.rec.detail = std::move(detail_json);
  p.rec.finished_us = now_us();
  // Only an event someone waits for (the create's "created") is committed inline:
  // the others come from hooks that may hold the caller's locks, and nobody waits.
  const bool may_inline = static_cast<bool>(done) && !after_calls;
  p.done = std::move(done);
  ensure_loaded(scope);
  std::unique_lock lk(mu_);
  p.log = log_id_locked(scope);
  Log& l = *logs_[p.log];
  if (after_calls && l.holds > 0 && !stop_) {
    l.deferred.push_back(std::move(p));
    return;
  }
  std::vector<Pending> ps;
  ps.push_back(std::move(p));
  submit_locked(lk, std::move(ps), may_inline);
}

void StepLog::append_intent(const std::string& scope, const StepRecord& call) {
  std::vector<Pending> ps(1);
  Pending& p = ps.front();
  p.rec = intent_of(call);
  p.lazy = true;  // durable with the call's answer, which is synced
  ensure_loaded(scope);
  std::unique_lock lk(mu_);
  p.log = log_id_locked(scope);
  submit_locked(lk, std::move(ps), true);
}

size_t StepLog::answer_interrupted() {
  std::vector<std::pair<uint32_t, StepRecord>> lost;
  {
    std::lock_guard lk(mu_);
    lost.swap(interrupted_);
  }
  return answer_lost(std::move(lost));
}

size_t StepLog::answer_lost(std::vector<std::pair<uint32_t, StepRecord>> lost) {
  static constexpr std::string_view kLost =
      R"({"code":"unavailable","message":"the daemon restarted while this call was being )"
      R"(answered: its outcome is unknown"})";
  std::vector<Pending> ps;
  {
    std::lock_guard lk(mu_);
    std::unordered_set<std::string> seen;
    for (auto& [log, in] : lost) {
      // A key recorded since open (a keyed command's own outcome) keeps that record.
      if (index_.count(in.key) || !seen.insert(in.key).second) continue;
      Pending p;
      p.log = log;
      p.rec.key = in.key;
      p.rec.request = in.request;
      p.rec.caller = in.caller;
      p.rec.status = 503;
      p.rec.content_type = "application/json";
      p.rec.summary = kLost;
      p.rec.started_us = in.started_us;
      p.rec.finished_us = now_us();
      p.answer = std::string(kLost) + "\n";
      ps.push_back(std::move(p));
    }
  }
  if (ps.empty()) return 0;
  std::mutex m;
  std::condition_variable cv;
  size_t left = ps.size(), recorded = 0;
  for (auto& p : ps) {
    spdlog::warn(
        "step log: keyed call {} ({}) was being answered when the daemon stopped: "
        "recorded as 503",
        p.rec.key, p.rec.request.describe());
    p.done = [&](Result<void> r, std::string) {
      std::lock_guard l(m);
      if (r) recorded++;
      if (--left == 0) cv.notify_all();
    };
  }
  {
    std::unique_lock lk(mu_);
    submit_locked(lk, std::move(ps), true);
  }
  std::unique_lock l(m);
  cv.wait(l, [&] { return left == 0; });
  return recorded;
}

void StepLog::hold(const std::string& scope) {
  ensure_loaded(scope);
  uint32_t log;
  bool touch = false;
  {
    std::lock_guard lk(mu_);
    log = log_id_locked(scope);
    Log& l = *logs_[log];
    l.holds++;
    // Only after a pause: a log written moments ago may not have ticked at all, and in
    // a busy loop a call seldom ends in the tick it began, so a touch would add a flush.
    if (touch_ahead_ && log != 0 && l.end >= kFileHeader && l.allocated >= l.end && !l.unusable &&
        !l.closed) {
      const int64_t now = coarse_now_ns();
      const int64_t pause = std::chrono::nanoseconds(opts_.touch_after).count();
      if (l.mtime_tick == 0 || now - l.mtime_tick >= pause) {
        l.mtime_tick = now;  // one touch, however many calls begin at once
        touch = true;
      }
    }
  }
  if (touch) touch_ahead(log);
}

void StepLog::touch_ahead(uint32_t log) {
  // Only a hint: skipped while a commit runs (it owns the descriptors).
  std::unique_lock fl(files_mu_, std::try_to_lock);
  if (!fl.owns_lock()) return;
  // Nor does it open a descriptor past the cap: only a commit closes the least recent.
  auto open_now = files_.find(log);
  if ((open_now == files_.end() || !open_now->second || open_now->second->fd < 0) &&
      files_.size() > kOpenLogs)
    return;
  auto f = file_for(log, /*existing_only=*/true);
  if (!f) return;
  const struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  if (::futimens((*f)->fd, times) != 0) return;
  (*f)->used = commits_;
  sync_pool_->ahead((*f)->fd);
}

void StepLog::release(const std::string& scope) {
  ensure_loaded(scope);
  {
    std::lock_guard lk(mu_);
    Log& l = *logs_[log_id_locked(scope)];
    if (l.holds > 0) l.holds--;
    if (l.holds > 0 || l.deferred.empty()) return;
    for (auto& p : l.deferred) pending_.push_back(std::move(p));
    l.deferred.clear();
  }
  cv_.notify_all();
}

Result<StepLog::File*> StepLog::file_for(uint32_t log, bool existing_only) {
  auto& f = files_[log];
  if (f && f->fd >= 0) return f.get();
  std::string scope;
  uint64_t end, allocated;
  {
    std::lock_guard lk(mu_);
    const Log& l = *logs_[log];
    if (l.unusable)
      return fail(Code::kInternal, "this step log is not written (see the error at start)");
    scope = l.scope;
    end = l.end;
    allocated = l.allocated;
  }
  f = std::make_unique<File>();
  f->dir = dir_of(scope);
  f->path = f->dir + "/" + log_name(scope);
  if (end >= kFileHeader && allocated >= end) {
    // The usual case: a log this writer wrote before, of a known size.
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CLOEXEC);
    if (f->fd >= 0) {
      f->allocated = allocated;
      return f.get();
    }
  }
  if (existing_only) {
    files_.erase(log);
    return fail(Code::kNotFound, "step log " + scope + " has no file to open");
  }
  // A log that starts now: its first record goes right after the header.
  auto starts = [&] {
    std::lock_guard lk(mu_);
    Log& l = *logs_[log];
    l.end = kFileHeader;
    l.next_seq = l.seqs.empty() ? 1 : l.seqs.back().first + 1;
    l.loaded = true;
  };
  if (end < kFileHeader && !scope.empty() && place_spare(scope, f->dir)) {
    // A spare: header and first block on disk already, so this log's first record is
    // an overwrite (see "Spare logs" in the header).
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st {};
    if (f->fd >= 0 && ::fstat(f->fd, &st) == 0 &&
        static_cast<uint64_t>(st.st_size) >= kFileHeader) {
      f->allocated = static_cast<uint64_t>(st.st_size);
      starts();
      return f.get();
    }
    spdlog::warn("step log {}: the spare placed there cannot be used ({}); made afresh", f->path,
                 strerror(errno));
    if (f->fd >= 0) ::close(f->fd);
    f->fd = -1;
  }
  // The sandbox manager removes a sandbox's directory when it ends, if it is empty by
  // then (rmdir): between our mkdir and open it may have, so make it again. Once the
  // log is in it, the directory stays.
  for (int attempt = 0; attempt < 3; ++attempt) {
    TP_TRY(ensure_dir(f->dir, nullptr));
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (f->fd >= 0 || errno != ENOENT) break;
  }
  if (f->fd < 0) return sys_fail("open " + f->path);
  struct stat st {};
  if (::fstat(f->fd, &st) != 0) return sys_fail("stat " + f->path);
  f->allocated = static_cast<uint64_t>(st.st_size);
  if (end < kFileHeader || f->allocated < kFileHeader) {
    // A new log (or one removed by retention since): a fresh file. Its header goes to
    // disk with its first records, in the commit's one fdatasync (a crash before that
    // leaves a file shorter than a header, started afresh at open, or a header and
    // zeros, cut).
    auto h = file_header();
    TP_TRY(pwrite_all(f->fd, h.data(), h.size(), 0));
    if (::ftruncate(f->fd, kFileHeader) != 0) return sys_fail("truncate " + f->path);
    f->allocated = kFileHeader;
    f->fresh = true;
    starts();
  }
  return f.get();
}

void StepLog::commit(std::vector<Pending>& batch) {
  std::vector<Result<void>> results(batch.size());
  std::vector<uint64_t> offsets(batch.size(), 0);
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard fl(files_mu_);
    // 1. Bodies too big to go inline go to side files, made durable before any record
    //    that names them.
    std::set<std::string> side_dirs;
    auto scope_of_log = [&](uint32_t log) {
      std::lock_guard lk(mu_);
      return logs_[log]->scope;
    };
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& p = batch[i];
      if (p.op != Pending::Op::kRecord) continue;
      if (p.rec.kind == StepKind::kCall && p.rec.request_body &&
          p.rec.request_body->size() > opts_.inline_max) {
        auto s = new_side(scope_of_log(p.log));
        if (s && (*s)->write(*p.rec.request_body)) {
          side_dirs.insert((*s)->dir_);
          p.rec.request_side = (*s)->name_;
          p.request_side = std::move(*s);
        } else {
          results[i] = s ? sys_fail("write the request's side file") : std::unexpected(s.error());
          continue;
        }
      }
      if (p.rec.kind != StepKind::kCall) continue;
      if (!p.side && p.answer.size() > opts_.inline_max) {
        auto s = new_side(scope_of_log(p.log));
        if (!s) {
          results[i] = std::unexpected(s.error());
          continue;
        }
        if (auto r = (*s)->write(p.answer); !r) {
          results[i] = r;
          continue;
        }
        p.side = std::move(*s);
      }
      if (p.side) {
        if (p.side->failed_)
          results[i] = fail(Code::kInternal, "writing the answer's side file failed");
        side_dirs.insert(p.side->dir_);
        p.rec.answer_side = p.side->name_;
        p.rec.answer_len = p.side->size_;
        p.rec.answer_crc = p.side->crc_;
      } else {
        p.rec.answer_side.clear();
        p.rec.answer_len = p.answer.size();
        p.rec.answer_crc = crc32c(0, p.answer.data(), p.answer.size());
      }
    }
    {
      // The side files' data, all at once; then their directories' names.
      std::vector<int> fds;
      std::vector<size_t> of;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!results[i]) continue;
        for (auto* side : {batch[i].side.get(), batch[i].request_side.get()})
          if (side) {
            fds.push_back(side->fd_);
            of.push_back(i);
          }
      }
      auto err = sync_pool_->sync(fds);
      for (size_t k = 0; k < fds.size(); ++k)
        if (err[k] && results[of[k]]) results[of[k]] = sys_fail("fdatasync side file", err[k]);
    }
    for (const auto& d : side_dirs) {
      if (!sync_dirs_) break;  // their names went with their fdatasync
      auto r = sync_dir(d);
      if (!r)
        for (size_t i = 0; i < batch.size(); ++i)
          if (results[i] && ((batch[i].side && batch[i].side->dir_ == d) ||
                             (batch[i].request_side && batch[i].request_side->dir_ == d)))
            results[i] = r;
    }
    // 2. The records at each log's end (growing its preallocated space as needed), then
    //    one fdatasync per log touched. State changes only once that succeeded.
    struct Tentative {
      File* f = nullptr;
      uint64_t start = 0, end = 0, seq = 0;
      size_t grow = 0;
      bool sync = false;   // some record of it must be durable now (not all lazy)
      bool names = false;  // a new file: its directories to fsync after it (sync_dirs_)
      std::vector<size_t> items;
      Result<void> synced;
      int64_t written_tick = 0;  // coarse_now_ns() at its last write
    };
    std::map<uint32_t, Tentative> touched;
    const int64_t tick = touch_ahead_ ? coarse_now_ns() : 0;  // the writes' (hold() reads it)
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& p = batch[i];
      if (!results[i] || p.op != Pending::Op::kRecord) continue;
      auto f = file_for(p.log);
      if (!f) {
        results[i] = std::unexpected(f.error());
        continue;
      }
      auto [it, fresh] = touched.try_emplace(p.log);
      Tentative& t = it->second;
      if (fresh) {
        std::lock_guard lk(mu_);
        const Log& l = *logs_[p.log];
        t.f = *f;
        t.start = t.end = l.end;
        t.seq = l.next_seq;
        t.grow = l.grow ? l.grow : opts_.prealloc;
        t.names = sync_dirs_ && (t.f->fresh || l.names_unsynced);
      }
      if (!p.lazy) t.sync = true;
      const bool intent = is_intent(p.rec);  // no seq: no entry of the log
      p.rec.seq = intent ? 0 : t.seq;
      std::string bytes = encode(p.rec, !p.side, p.answer);
      if (t.end + bytes.size() > t.f->allocated && opts_.prealloc > 0) {
        // Zeros, written once: later appends overwrite allocated blocks. A new file
        // starts with its first piece (rounded up to whole blocks), then grows by
        // prealloc, doubling.
        const uint64_t need = t.end + bytes.size();
        uint64_t want = std::max<uint64_t>(need, t.f->allocated + t.grow);
        if (t.f->fresh) want = (std::max<uint64_t>(need, kFirstPiece) + 4095) / 4096 * 4096;
        std::string zeros(static_cast<size_t>(want - t.f->allocated), '\0');
        if (pwrite_all(t.f->fd, zeros.data(), zeros.size(), t.f->allocated)) t.f->allocated = want;
        if (!t.f->fresh) t.grow = std::min(t.grow * 2, kMaxPrealloc);
      }
      if (auto r = pwrite_all(t.f->fd, bytes.data(), bytes.size(), t.end); !r) {
        results[i] = r;
        continue;
      }
      t.f->allocated = std::max(t.f->allocated, t.end + bytes.size());
      t.written_tick = tick;
      offsets[i] = t.end;
      t.end += bytes.size();
      if (!intent) t.seq++;
      t.items.push_back(i);
    }
    std::vector<int> fds;
    for (auto& [log, t] : touched)
      if (t.sync) fds.push_back(t.f->fd);
    auto err = sync_pool_->sync(fds);
    size_t k = 0;
    for (auto& [log, t] : touched) {
      if (!t.sync) {
        // Lazy records only: synced with the log's next record. A new file's first
        // fdatasync (its block, inode and names) costs about two of an overwrite's:
        // started now, in the background, it is done by the time the sandbox's first
        // call is recorded (the create's "created" event is what makes most logs).
        if (t.f->fresh) sync_pool_->ahead(t.f->fd);
        continue;
      }
      if (err[k++] == 0) {
        // A new file's name, then its new directory's, once its bytes are on disk.
        if (t.names) {
          t.synced = sync_dir(t.f->dir);
          if (t.synced) t.synced = sync_dir(fs::path(t.f->dir).parent_path().string());
        }
        if (t.synced) continue;
      } else {
        t.synced = sys_fail("fdatasync " + t.f->path, err[k - 1]);
      }
      // Nothing of the batch counts: the next append overwrites it (a new file is made
      // again, its names synced then).
      std::string zeros(static_cast<size_t>(t.end - t.start), '\0');
      (void)pwrite_all(t.f->fd, zeros.data(), zeros.size(), t.start);
      for (size_t i : t.items) results[i] = t.synced;
    }
    {
      std::lock_guard lk(mu_);
      for (auto& [log, t] : touched) {
        if (t.written_tick) logs_[log]->mtime_tick = t.written_tick;
        if (!t.synced) {
          if (t.f->fresh) {
            logs_[log]->end = 0;  // made afresh by the next commit
            t.f->fresh = false;
            ::close(t.f->fd);
            t.f->fd = -1;
          }
          continue;
        }
        Log& l = *logs_[log];
        if (t.sync)
          l.names_unsynced = false;
        else if (t.names)
          l.names_unsynced = true;
        t.f->fresh = false;
        l.end = t.end;
        l.next_seq = t.seq;
        l.grow = t.grow;
        l.allocated = t.f->allocated;
        bool entries = false;
        for (size_t i : t.items) {
          auto& p = batch[i];
          if (is_intent(p.rec)) continue;
          entries = true;
          l.seqs.emplace_back(p.rec.seq, offsets[i]);
          if (p.side) l.side_bytes += p.rec.answer_len;
          if (p.request_side) l.side_bytes += p.rec.request.body_len;
          if (p.rec.kind == StepKind::kEvent && p.rec.event == "ended") l.ended = true;
        }
        if (entries) fire_waiters_locked(l, &wake);
      }
    }
    ++commits_;
    for (auto& [log, t] : touched) t.f->used = commits_;  // (the trims below may close t.f)
    // Trims: a sandbox that ended gives back its preallocated tail; its followers may end.
    for (auto& p : batch) {
      if (p.op != Pending::Op::kTrim) continue;
      std::lock_guard lk(mu_);
      Log& l = *logs_[p.log];
      if (l.end >= kFileHeader && !l.unusable) {
        std::string path = dir_of(l.scope) + "/" + log_name(l.scope);
        if (::truncate(path.c_str(), static_cast<off_t>(l.end)) != 0 && errno != ENOENT)
          spdlog::warn("step log {}: truncate: {}", path, strerror(errno));
        set_mtime(path, p.rec.finished_us);  // its retention starts when its sandbox ended
        l.allocated = l.end;
      }
      l.closed = true;
      fire_waiters_locked(l, &wake);
    }
    {
      // An ended sandbox's log keeps no descriptor (what comes after its end, a
      // background process's exit or a call refused, opens it again for a moment).
      std::lock_guard lk(mu_);
      std::erase_if(files_, [&](auto& kv) { return kv.first != 0 && logs_[kv.first]->closed; });
    }
    while (files_.size() > kOpenLogs + 1) {  // + the node-wide log, which stays open
      auto oldest = files_.end();
      for (auto it = files_.begin(); it != files_.end(); ++it)
        if (it->first != 0 && (oldest == files_.end() || it->second->used < oldest->second->used))
          oldest = it;
      files_.erase(oldest);
    }
  }
  {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& p = batch[i];
      if (!results[i] || p.op != Pending::Op::kRecord) continue;
      if (p.side) p.side->kept_ = true;
      if (p.request_side) p.request_side->kept_ = true;
      if (p.rec.kind == StepKind::kCall && !p.rec.key.empty())
        index_[p.rec.key] = StepLocation{p.log, offsets[i], p.rec.finished_us};
    }
  }
  fire(wake);
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = batch[i];
    if (!results[i])
      spdlog::error("step log: {} {}: {}", p.rec.kind == StepKind::kEvent ? "event" : "key",
                    p.rec.kind == StepKind::kEvent ? p.rec.event : p.rec.key,
                    results[i].error().message());
    p.side.reset();
    p.request_side.reset();
    if (p.done) p.done(std::move(results[i]), std::move(p.answer));
  }
}

void StepLog::run() {
  auto interval = std::clamp<std::chrono::seconds>(opts_.retention / 2, std::chrono::seconds(1),
                                                   std::chrono::seconds(60));
  auto next_sweep = std::chrono::steady_clock::now() + interval;
  std::unique_lock lk(mu_);
  for (;;) {
    // An inline commit (append on its caller's thread) that runs is waited for: one
    // commit at a time keeps the queue's order.
    cv_.wait_until(lk, next_sweep, [&] { return !busy_ && (stop_ || !pending_.empty()); });
    if (busy_) {  // the sweep's time came during an inline commit: wait for its end
      sweep_waits_ = true;
      cv_.wait(lk, [&] { return !busy_; });
      sweep_waits_ = false;
      continue;
    }
    if (!pending_.empty()) {
      std::vector<Pending> batch;
      while (!pending_.empty()) {
        batch.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      busy_ = true;
      lk.unlock();
      commit(batch);
      lk.lock();
      busy_ = false;
      continue;  // commit everything queued before stopping
    }
    if (stop_) return;
    if (std::chrono::steady_clock::now() >= next_sweep && !all_read_) {
      next_sweep = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    } else if (std::chrono::steady_clock::now() >= next_sweep) {
      busy_ = true;  // no inline commit while the sweep removes logs
      lk.unlock();
      sweep();
      lk.lock();
      busy_ = false;
      next_sweep = std::chrono::steady_clock::now() + interval;
    }
  }
}

void StepLog::sandbox_ended(const std::string& sandbox_id) {
  if (!ids::valid_sandbox_id(sandbox_id)) return;
  std::string path = dir_of(sandbox_id) + "/steps.log";
  int64_t now = now_us();
  set_mtime(path, now);  // the log's mtime is when its retention starts
  // Its preallocated tail goes once what is queued for it (its ended event) is written.
  Pending p;
  p.op = Pending::Op::kTrim;
  p.rec.finished_us = now;
  ensure_loaded(sandbox_id);
  {
    std::lock_guard lk(mu_);
    p.log = log_id_locked(sandbox_id);
    Log& l = *logs_[p.log];
    if (l.holds > 0 && !stop_)
      l.deferred.push_back(std::move(p));
    else
      pending_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void StepLog::set_is_live(IsLive f) {
  std::lock_guard lk(mu_);
  is_live_ = std::move(f);
}

void StepLog::sweep() {
  {
    std::unique_lock lk(mu_);
    wait_all_loaded(lk);
  }
  remove_expired(false);
}

void StepLog::remove_expired(bool from_reader) {
  IsLive live;
  {
    std::lock_guard lk(mu_);
    live = is_live_;
  }
  int64_t now = now_us();
  int64_t retention_us =
      std::chrono::duration_cast<std::chrono::microseconds>(opts_.retention).count();
  std::vector<std::string> expired;
  std::string top = opts_.data_dir + "/sandboxes";
  if (DIR* d = ::opendir(top.c_str())) {
    for (size_t seen = 1; auto* e = ::readdir(d); ++seen) {
      if (from_reader && seen % 256 == 0) reader_priority();
      std::string n = e->d_name;
      if (!ids::valid_sandbox_id(n)) continue;
      struct stat st {};
      std::string p = top + "/" + n + "/steps.log";
      if (::stat(p.c_str(), &st) != 0 && ::stat((top + "/" + n + "/steps.d").c_str(), &st) != 0)
        continue;
      int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000 + st.st_mtim.tv_nsec / 1000;
      if (now - mtime < retention_us) continue;
      if (live && live(n)) continue;
      expired.push_back(n);
    }
    ::closedir(d);
  }
  int64_t horizon = now - retention_us;
  std::vector<std::function<void()>> wake;
  std::lock_guard fl(files_mu_);
  std::unordered_set<uint32_t> gone;
  {
    std::lock_guard lk(mu_);
    std::erase_if(expired, [&](const std::string& n) {
      auto it = scope_ids_.find(n);
      if (it == scope_ids_.end()) return false;
      Log& l = *logs_[it->second];
      // Before every log is read (the reader's own pass): one that a call reads back
      // now stays for a later sweep; one not read yet is never read.
      if (l.reading) return true;
      if (l.later) {
        l.later = false;
        unread_.fetch_sub(1, std::memory_order_release);
      }
      return false;
    });
    for (const auto& n : expired) {
      auto it = scope_ids_.find(n);
      if (it == scope_ids_.end()) continue;
      gone.insert(it->second);
      files_.erase(it->second);
      Log& l = *logs_[it->second];
      l.end = 0;
      l.seqs.clear();
      l.side_bytes = 0;
      l.allocated = 0;
      l.grow = 0;
      l.ended = false;
      l.closed = true;  // removed: its followers stop
      fire_waiters_locked(l, &wake);
    }
    std::erase_if(index_, [&](const auto& kv) {
      return gone.count(kv.second.log) || (kv.second.log == 0 && kv.second.finished_us < horizon);
    });
  }
  // Only the log's own files go; anything else in the directory is another module's.
  for (const auto& n : expired) {
    std::string dir = top + "/" + n;
    std::error_code ec;
    fs::remove(dir + "/steps.log", ec);
    fs::remove_all(dir + "/steps.d", ec);
    if (DIR* d = ::opendir(dir.c_str())) {
      while (auto* e = ::readdir(d)) {
        std::string f = e->d_name;
        if (f.starts_with("steps.log.")) ::unlink((dir + "/" + f).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(dir.c_str());  // fails, and stays, while it holds anything else
    spdlog::info("step log of {} removed (retention)", n);
  }
  fire(wake);
}

// ---- spare logs ---------------------------------------------------------------

std::string StepLog::spare_dir() const { return opts_.data_dir + "/steps/spare"; }

std::optional<std::string> StepLog::take_spare() {
  std::optional<std::string> id;
  bool refill = false;
  {
    std::lock_guard lk(spare_mu_);
    if (!spares_.empty()) {
      id = std::move(spares_.front());
      spares_.pop_front();
      spares_taken_.insert(*id);
    }
    refill = spares_.size() <= opts_.spares / 2;
  }
  if (refill) spare_cv_.notify_all();
  return id;
}

void StepLog::return_spare(const std::string& id, bool reuse) {
  {
    std::lock_guard lk(spare_mu_);
    if (!spares_taken_.erase(id)) return;
    // Handed out next, as the newest spare is as good as the oldest.
    if (reuse && !spare_stop_) return spares_.push_front(id);
  }
  std::error_code ec;
  fs::remove_all(spare_dir() + "/" + id, ec);
}

size_t StepLog::spares_ready() {
  std::lock_guard lk(spare_mu_);
  return spares_.size();
}

bool StepLog::place_spare(const std::string& scope, const std::string& dir) {
  {
    std::lock_guard lk(spare_mu_);
    if (!spares_taken_.erase(scope)) return false;
  }
  const std::string from = spare_dir() + "/" + scope;
  if (::rename(from.c_str(), dir.c_str()) == 0) return true;
  if (errno == EEXIST || errno == ENOTEMPTY) {
    // The sandbox's directory holds another module's files already: the file alone.
    if (::rename((from + "/steps.log").c_str(), (dir + "/steps.log").c_str()) == 0) {
      ::rmdir(from.c_str());
      return true;
    }
  }
  spdlog::warn("step log: spare {} not placed in {}: {}", from, dir, strerror(errno));
  std::error_code ec;
  fs::remove_all(from, ec);
  return false;
}

// At open: a spare with a record in it belonged to a sandbox whose log was not yet
// renamed into place when the daemon stopped (the rename is not synced); it goes there
// now. The others were never used: removed, and their ids never handed out.
void StepLog::recover_spares() {
  std::vector<std::string> found;
  if (DIR* d = ::opendir(spare_dir().c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (ids::valid_sandbox_id(n)) found.push_back(n);
    }
    ::closedir(d);
  }
  for (const auto& n : found) {
    const std::string from = spare_dir() + "/" + n, file = from + "/steps.log";
    bool records = false;
    if (int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      char b[4];
      records = ::pread(fd, b, sizeof b, kFileHeader) == sizeof b && get_u32(b) == kRecordMagic;
      ::close(fd);
    }
    std::error_code ec;
    if (!records) {
      fs::remove_all(from, ec);
      continue;
    }
    const std::string to = dir_of(n);
    bool moved = ::rename(from.c_str(), to.c_str()) == 0;
    if (!moved && (errno == EEXIST || errno == ENOTEMPTY) &&
        ::access((to + "/steps.log").c_str(), F_OK) != 0 &&
        ::rename(file.c_str(), (to + "/steps.log").c_str()) == 0) {
      moved = true;
      ::rmdir(from.c_str());
    }
    if (!moved) {
      spdlog::error("step log: spare {} holds records but cannot go to {}: {}; left there", from,
                    to, strerror(errno));
      continue;
    }
    (void)sync_dir(opts_.data_dir + "/sandboxes");
    spdlog::info("step log of {}: moved into place from its spare", n);
  }
}

// The spare thread: refills to opts_.spares whenever half of them were handed out.
void StepLog::make_spares() {
  std::string block(kFirstPiece, '\0');
  {
    auto h = file_header();
    std::memcpy(block.data(), h.data(), h.size());
  }
  std::unique_lock lk(spare_mu_);
  for (;;) {
    spare_cv_.wait(lk, [&] { return spare_stop_ || spares_.size() <= opts_.spares / 2; });
    if (spare_stop_) return;
    const size_t want = opts_.spares - spares_.size();
    lk.unlock();
    std::vector<std::string> made;
    std::vector<int> fds;
    std::optional<Error> failed;
    for (size_t i = 0; i < want && !failed; ++i) {
      const std::string id = opts_.make_id();
      const std::string dir = spare_dir() + "/" + id;
      if (::mkdir(dir.c_str(), 0700) != 0) {
        failed = sys_fail("mkdir " + dir).error();
        break;
      }
      const std::string path = dir + "/steps.log";
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) {
        failed = sys_fail("create " + path).error();
        ::rmdir(dir.c_str());
        break;
      }
      fds.push_back(fd);
      made.push_back(id);
      if (auto r = pwrite_all(fd, block.data(), block.size(), 0); !r) {
        failed = r.error();
        break;
      }
      // Written back now (delayed allocation allocates its block here), so that the one
      // fdatasync below commits every spare's metadata at once.
      if (::sync_file_range(fd, 0, 0,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        failed = sys_fail("sync_file_range " + path).error();
        break;
      }
    }
    if (!failed && !fds.empty()) {
      // Journalled file systems commit all of them with the last one's metadata; others
      // get each file and directory synced. ext4 without a journal writes a new file's
      // inode and its new parents at its first fsync only: each spare is synced here, so
      // that a sandbox's first call does not wait for those writes (see "Spares" in
      // docs/trajectory-log.md).
      const bool each = sync_dirs_ || sync_each_spare_;
      for (size_t i = each ? 0 : fds.size() - 1; i < fds.size() && !failed; ++i)
        if (::fdatasync(fds[i]) != 0) failed = sys_fail("fdatasync spare log").error();
      for (size_t i = 0; sync_dirs_ && i < made.size() && !failed; ++i)
        if (auto r = sync_dir(spare_dir() + "/" + made[i]); !r) failed = r.error();
      if (sync_dirs_ && !failed)
        if (auto r = sync_dir(spare_dir()); !r) failed = r.error();
    }
    for (int fd : fds) ::close(fd);
    if (failed) {
      std::error_code ec;
      for (const auto& id : made) fs::remove_all(spare_dir() + "/" + id, ec);
      made.clear();
    }
    lk.lock();
    for (auto& id : made) spares_.push_back(std::move(id));
    if (failed) {
      // New logs are made on their own path meanwhile; try again later.
      spdlog::warn("step log: spare logs not made: {}; retrying in 10 s", failed->message());
      spare_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return spare_stop_; });
    }
  }
}

}  // namespace tp::node
