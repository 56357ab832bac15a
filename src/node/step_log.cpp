#include "node/step_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_set>

#include "common/ids.h"
#include "common/log.h"

namespace tp::node {

namespace fs = std::filesystem;

namespace {

constexpr char kFileMagic[8] = {'T', 'P', 'S', 'T', 'E', 'P', 'S', '\n'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFileHeader = 16;
constexpr uint32_t kRecordMagic = 0x52535054;  // "TPSR" little-endian
constexpr size_t kRecordHeader = 12;
constexpr uint32_t kMaxRecord = 256u << 20;  // sanity bound on len
constexpr uint8_t kKindAnswered = 1;

enum Tag : uint16_t {
  kKey = 1,
  kMethod = 2,
  kTarget = 3,
  kBodySha = 4,
  kBodyLen = 5,
  kRequestBody = 6,
  kStatus = 10,
  kContentType = 11,
  kAnswer = 12,
  kAnswerSide = 13,
  kAnswerLen = 14,
  kAnswerCrc = 15,
  kStarted = 20,
  kFinished = 21,
};

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
void field(std::string& s, uint16_t tag, std::string_view v) {
  s.push_back(static_cast<char>(tag));
  s.push_back(static_cast<char>(tag >> 8));
  put_u32(s, static_cast<uint32_t>(v.size()));
  s.append(v);
}
void field_u64(std::string& s, uint16_t tag, uint64_t v) {
  std::string b;
  put_u64(b, v);
  field(s, tag, b);
}

std::string encode(const StepRecord& r, bool answer_inline, const std::string& answer) {
  std::string p;
  p.push_back(static_cast<char>(kKindAnswered));
  field(p, kKey, r.key);
  field(p, kMethod, r.request.method);
  field(p, kTarget, r.request.target);
  field(p, kBodySha, r.request.body_sha256);
  field_u64(p, kBodyLen, r.request.body_len);
  if (r.request_body) field(p, kRequestBody, *r.request_body);
  std::string st;
  put_u32(st, static_cast<uint32_t>(r.status));
  field(p, kStatus, st);
  field(p, kContentType, r.content_type);
  if (answer_inline)
    field(p, kAnswer, answer);
  else
    field(p, kAnswerSide, r.answer_side);
  field_u64(p, kAnswerLen, r.answer_len);
  std::string crc;
  put_u32(crc, r.answer_crc);
  field(p, kAnswerCrc, crc);
  field_u64(p, kStarted, static_cast<uint64_t>(r.started_us));
  field_u64(p, kFinished, static_cast<uint64_t>(r.finished_us));
  std::string rec;
  rec.reserve(kRecordHeader + p.size());
  put_u32(rec, kRecordMagic);
  put_u32(rec, static_cast<uint32_t>(p.size()));
  put_u32(rec, crc32c(crc32c(0, rec.data() + 4, 4), p.data(), p.size()));
  rec += p;
  return rec;
}

Result<StepRecord> decode(std::string_view p) {
  if (p.empty() || static_cast<uint8_t>(p[0]) != kKindAnswered)
    return fail(Code::kInternal, "step record of an unknown kind");
  StepRecord r;
  size_t i = 1;
  while (i < p.size()) {
    if (p.size() - i < 6) return fail(Code::kInternal, "step record field cut short");
    uint16_t tag = static_cast<uint16_t>(static_cast<unsigned char>(p[i]) |
                                         (static_cast<unsigned char>(p[i + 1]) << 8));
    uint32_t n = get_u32(p.data() + i + 2);
    i += 6;
    if (p.size() - i < n) return fail(Code::kInternal, "step record field cut short");
    std::string_view v = p.substr(i, n);
    i += n;
    auto u64 = [&] { return v.size() == 8 ? get_u64(v.data()) : 0; };
    switch (tag) {
      case kKey:
        r.key = v;
        break;
      case kMethod:
        r.request.method = v;
        break;
      case kTarget:
        r.request.target = v;
        break;
      case kBodySha:
        r.request.body_sha256 = v;
        break;
      case kBodyLen:
        r.request.body_len = u64();
        break;
      case kRequestBody:
        r.request_body = std::string(v);
        break;
      case kStatus:
        r.status = v.size() == 4 ? static_cast<int>(get_u32(v.data())) : 0;
        break;
      case kContentType:
        r.content_type = v;
        break;
      case kAnswer:
        r.answer = v;
        break;
      case kAnswerSide:
        r.answer_side = v;
        break;
      case kAnswerLen:
        r.answer_len = u64();
        break;
      case kAnswerCrc:
        r.answer_crc = v.size() == 4 ? get_u32(v.data()) : 0;
        break;
      case kStarted:
        r.started_us = static_cast<int64_t>(u64());
        break;
      case kFinished:
        r.finished_us = static_cast<int64_t>(u64());
        break;
      default:
        break;  // a field of a later version
    }
  }
  return r;
}

int64_t now_us() {
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

std::string file_header() {
  std::string h(kFileMagic, sizeof kFileMagic);
  put_u32(h, kVersion);
  put_u32(h, 0);
  return h;
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  static const auto kTable = make_table();
  auto p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n--) crc = kTable[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string StepFingerprint::describe() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string h;
  for (unsigned char c : body_sha256.substr(0, 8)) {
    h.push_back(kHex[c >> 4]);
    h.push_back(kHex[c & 15]);
  }
  return fmt::format("{} {} (body sha256:{}..., {} bytes)", method, target, h, body_len);
}

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
  uint64_t size = 0;
  std::string dir, path;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

struct StepLog::Pending {
  uint32_t log = 0;
  StepRecord rec;
  std::string answer;
  std::unique_ptr<StepSideFile> side;
  Done done;
};

StepLog::StepLog(Options opts) : opts_(std::move(opts)) {}

StepLog::~StepLog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

Result<std::unique_ptr<StepLog>> StepLog::open(Options opts) {
  std::unique_ptr<StepLog> log(new StepLog(std::move(opts)));
  TP_TRY(ensure_dir(log->opts_.data_dir + "/sandboxes", nullptr));
  TP_TRY(ensure_dir(log->opts_.data_dir + "/steps", nullptr));
  log->scopes_.push_back("");
  log->scope_ids_[""] = 0;
  log->is_live_ = log->opts_.is_live;
  log->sweep();
  TP_TRY(log->load_all());
  log->writer_ = std::thread([p = log.get()] { p->run(); });
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

namespace {
std::string log_name(const std::string& scope) {
  return scope.empty() ? "global.log" : "steps.log";
}
}  // namespace

uint32_t StepLog::log_id_locked(const std::string& scope) {
  auto [it, fresh] = scope_ids_.try_emplace(scope, static_cast<uint32_t>(scopes_.size()));
  if (fresh) scopes_.push_back(scope);
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
  TP_TRY(load(0));
  for (const auto& s : found) {
    uint32_t id;
    {
      std::lock_guard lk(mu_);
      id = log_id_locked(s);
    }
    if (auto r = load(id); !r) spdlog::error("step log of {}: {}", s, r.error().message());
  }
  return {};
}

// Reads one log back into the index (see the header: torn tails, damage, side files).
Result<void> StepLog::load(uint32_t log) {
  std::string scope;
  {
    std::lock_guard lk(mu_);
    scope = scopes_[log];
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
  char hb[kFileHeader];
  if (size < kFileHeader) {
    torn = true;  // a crash while the file was being created
    end = 0;
  } else if (auto r = pread_all(fd, hb, kFileHeader, 0);
             !r || std::memcmp(hb, kFileMagic, sizeof kFileMagic) != 0) {
    damaged = true;
    end = 0;
    spdlog::error("step log {}: bad file header", path);
  } else {
    std::string payload;
    while (end < size) {
      uint64_t left = size - end;
      char rh[kRecordHeader];
      if (left < kRecordHeader) {
        torn = true;
        break;
      }
      TP_TRY(pread_all(fd, rh, kRecordHeader, end));
      uint32_t magic = get_u32(rh), len = get_u32(rh + 4), crc = get_u32(rh + 8);
      if (magic == kRecordMagic && len <= kMaxRecord && len > left - kRecordHeader) {
        torn = true;  // its length reaches past the end: cut short by a crash
        break;
      }
      bool ok = magic == kRecordMagic && len <= kMaxRecord;
      if (ok) {
        payload.resize(len);
        TP_TRY(pread_all(fd, payload.data(), len, end + kRecordHeader));
        ok = crc32c(crc32c(0, rh + 4, 4), payload.data(), len) == crc;
      }
      Result<StepRecord> rec = ok ? decode(payload) : fail(Code::kInternal, "bad record");
      if (!rec) {
        // The last record, or zeros to the end (blocks allocated but never written),
        // is a torn tail; anything else is damage in the middle.
        bool last =
            ok || (magic == kRecordMagic && len <= kMaxRecord && end + kRecordHeader + len == size);
        if (!last && magic == 0) {
          std::string rest(left, '\0');
          TP_TRY(pread_all(fd, rest.data(), left, end));
          last = rest.find_first_not_of('\0') == std::string::npos;
        }
        if (last)
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
      r = pread_all(fd, buf.data(), g.len, g.off);
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
      std::string aside = fmt::format("{}.damaged-{}", path, now_us() / 1000000);
      if (::rename(path.c_str(), aside.c_str()) != 0)
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
  } else if (torn) {
    spdlog::warn("step log {}: torn final record at offset {} truncated ({} bytes)", path, end,
                 size - end);
    if (::ftruncate(fd, static_cast<off_t>(end)) != 0 || ::fdatasync(fd) != 0)
      return sys_fail("truncate " + path);
  }
  f->size = end;

  // Side files that no record names were left by a crash before their record.
  std::set<std::string> named;
  for (const auto& g : good)
    if (!g.rec.answer_side.empty()) named.insert(g.rec.answer_side);
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
    for (const auto& g : good)
      if (!g.rec.key.empty()) index_[g.rec.key] = StepLocation{log, g.off, g.rec.finished_us};
  }
  if (log == 0) {  // only the node-wide log stays open (see commit)
    std::lock_guard lk(files_mu_);
    files_[log] = std::move(f);
  }
  return {};
}

std::optional<StepLocation> StepLog::find(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

size_t StepLog::size() {
  std::lock_guard lk(mu_);
  return index_.size();
}

bool StepLog::full() {
  std::lock_guard lk(mu_);
  return index_.size() >= opts_.max_keys;
}

Result<StepRecord> StepLog::read(const StepLocation& loc, bool with_answer) {
  std::string scope;
  {
    std::lock_guard lk(mu_);
    if (loc.log >= scopes_.size()) return fail(Code::kInternal, "no such step log");
    scope = scopes_[loc.log];
  }
  std::string dir = dir_of(scope);
  std::string path = dir + "/" + log_name(scope);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_fail("open " + path);
  auto close_fd = [fd] { ::close(fd); };
  char rh[kRecordHeader];
  auto r = pread_all(fd, rh, kRecordHeader, loc.offset);
  if (!r) return close_fd(), std::unexpected(r.error());
  uint32_t len = get_u32(rh + 4);
  if (get_u32(rh) != kRecordMagic || len > kMaxRecord)
    return close_fd(), fail(Code::kInternal, "step log " + path + ": bad record header");
  std::string payload(len, '\0');
  r = pread_all(fd, payload.data(), len, loc.offset + kRecordHeader);
  close_fd();
  if (!r) return std::unexpected(r.error());
  if (crc32c(crc32c(0, rh + 4, 4), payload.data(), len) != get_u32(rh + 8))
    return fail(Code::kInternal, "step log " + path + ": bad record checksum");
  auto rec = decode(payload);
  if (!rec) return rec;
  if (!with_answer) {
    rec->answer.clear();
    return rec;
  }
  if (!rec->answer_side.empty()) {
    std::string sp = dir + "/steps.d/" + rec->answer_side;
    int sfd = ::open(sp.c_str(), O_RDONLY | O_CLOEXEC);
    if (sfd < 0) return sys_fail("open " + sp);
    rec->answer.resize(rec->answer_len);
    auto rr = pread_all(sfd, rec->answer.data(), rec->answer_len, 0);
    ::close(sfd);
    if (!rr) return std::unexpected(rr.error());
  }
  if (rec->answer.size() != rec->answer_len ||
      crc32c(0, rec->answer.data(), rec->answer.size()) != rec->answer_crc)
    return fail(Code::kInternal,
                "step log " + path + ": answer of key does not match its checksum");
  return rec;
}

Result<std::unique_ptr<StepSideFile>> StepLog::new_side(const std::string& scope) {
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
  s->name_ = fmt::format("{:x}-{:x}.body", now_us(), seq);
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
                     std::unique_ptr<StepSideFile> side, Done done) {
  {
    std::lock_guard lk(mu_);
    Pending p;
    p.log = log_id_locked(scope);
    p.rec = std::move(rec);
    p.answer = std::move(answer);
    p.side = std::move(side);
    p.done = std::move(done);
    pending_.push_back(std::move(p));
  }
  cv_.notify_all();
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

Result<StepLog::File*> StepLog::file_for(uint32_t log) {
  auto& f = files_[log];
  if (f && f->fd >= 0) return f.get();
  std::string scope;
  {
    std::lock_guard lk(mu_);
    scope = scopes_[log];
  }
  f = std::make_unique<File>();
  f->dir = dir_of(scope);
  f->path = f->dir + "/" + log_name(scope);
  bool created_dir = false;
  // The sandbox manager removes a sandbox's directory when it ends, if it is empty by
  // then (rmdir): between our mkdir and open it may have, so make it again. Once the
  // log is in it, the directory stays.
  for (int attempt = 0; attempt < 3; ++attempt) {
    TP_TRY(ensure_dir(f->dir, &created_dir));
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (f->fd >= 0 || errno != ENOENT) break;
  }
  if (f->fd < 0) return sys_fail("open " + f->path);
  struct stat st {};
  if (::fstat(f->fd, &st) != 0) return sys_fail("stat " + f->path);
  f->size = static_cast<uint64_t>(st.st_size);
  if (f->size < kFileHeader) {
    auto h = file_header();
    TP_TRY(pwrite_all(f->fd, h.data(), h.size(), 0));
    if (::ftruncate(f->fd, kFileHeader) != 0) return sys_fail("truncate " + f->path);
    f->size = kFileHeader;
    TP_TRY(sync_dir(f->dir));  // the new file's name
    if (created_dir) TP_TRY(sync_dir(fs::path(f->dir).parent_path().string()));
  }
  return f.get();
}

void StepLog::commit(std::vector<Pending>& batch) {
  std::vector<Result<void>> results(batch.size());
  std::vector<uint64_t> offsets(batch.size(), 0);
  {
    std::lock_guard fl(files_mu_);
    // 1. Answers too big to go inline go to side files, made durable before any
    //    record that names them.
    std::set<std::string> side_dirs;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& p = batch[i];
      if (!p.side && p.answer.size() > opts_.inline_max) {
        std::string scope;
        {
          std::lock_guard lk(mu_);
          scope = scopes_[p.log];
        }
        auto s = new_side(scope);
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
        else if (::fdatasync(p.side->fd_) != 0)
          results[i] = sys_fail("fdatasync side file");
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
    for (const auto& d : side_dirs) {
      auto r = sync_dir(d);
      if (!r)
        for (size_t i = 0; i < batch.size(); ++i)
          if (batch[i].side && batch[i].side->dir_ == d && results[i]) results[i] = r;
    }
    // 2. The records, then one fdatasync per log touched.
    std::set<File*> touched;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& p = batch[i];
      if (!results[i]) continue;
      auto f = file_for(p.log);
      if (!f) {
        results[i] = std::unexpected(f.error());
        continue;
      }
      std::string bytes = encode(p.rec, !p.side, p.answer);
      if (auto r = pwrite_all((*f)->fd, bytes.data(), bytes.size(), (*f)->size); !r) {
        // Leave no partial record behind for the next append to follow.
        if (::ftruncate((*f)->fd, static_cast<off_t>((*f)->size)) != 0)
          spdlog::error("step log {}: cannot cut a failed append: {}", (*f)->path, strerror(errno));
        results[i] = r;
        continue;
      }
      offsets[i] = (*f)->size;
      (*f)->size += bytes.size();
      touched.insert(*f);
    }
    for (File* f : touched) {
      if (::fdatasync(f->fd) == 0) continue;
      auto err = sys_fail("fdatasync " + f->path);
      for (size_t i = 0; i < batch.size(); ++i)
        if (results[i] && files_[batch[i].log].get() == f) results[i] = err;
    }
    // A sandbox's log is opened per batch: no descriptor stays open per sandbox
    // (the open costs little next to the fdatasync).
    std::erase_if(files_, [](auto& kv) { return kv.first != 0; });
  }
  {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!results[i]) continue;
      if (batch[i].side) batch[i].side->kept_ = true;
      if (!batch[i].rec.key.empty())
        index_[batch[i].rec.key] = StepLocation{batch[i].log, offsets[i], batch[i].rec.finished_us};
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!results[i])
      spdlog::error("step log: key {}: {}", batch[i].rec.key, results[i].error().message());
    batch[i].side.reset();
    if (batch[i].done) batch[i].done(std::move(results[i]), std::move(batch[i].answer));
  }
}

void StepLog::run() {
  auto interval = std::clamp<std::chrono::seconds>(opts_.retention / 2, std::chrono::seconds(1),
                                                   std::chrono::seconds(60));
  auto next_sweep = std::chrono::steady_clock::now() + interval;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait_until(lk, next_sweep, [&] { return stop_ || !pending_.empty(); });
    if (!pending_.empty()) {
      std::vector<Pending> batch;
      while (!pending_.empty()) {
        batch.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      lk.unlock();
      commit(batch);
      lk.lock();
      continue;  // commit everything queued before stopping
    }
    if (stop_) return;
    if (std::chrono::steady_clock::now() >= next_sweep) {
      lk.unlock();
      sweep();
      lk.lock();
      next_sweep = std::chrono::steady_clock::now() + interval;
    }
  }
}

void StepLog::sandbox_ended(const std::string& sandbox_id) {
  if (!ids::valid_sandbox_id(sandbox_id)) return;
  std::string path = dir_of(sandbox_id) + "/steps.log";
  // The log's mtime is when its retention starts.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  std::lock_guard fl(files_mu_);
  std::lock_guard lk(mu_);
  auto it = scope_ids_.find(sandbox_id);
  if (it != scope_ids_.end()) files_.erase(it->second);
}

void StepLog::set_is_live(IsLive f) {
  std::lock_guard lk(mu_);
  is_live_ = std::move(f);
}

void StepLog::sweep() {
  IsLive live;
  {
    std::lock_guard lk(mu_);
    live = is_live_;
  }
  auto now = std::chrono::system_clock::now();
  std::vector<std::string> expired;
  std::string top = opts_.data_dir + "/sandboxes";
  if (DIR* d = ::opendir(top.c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (!ids::valid_sandbox_id(n)) continue;
      struct stat st {};
      std::string p = top + "/" + n + "/steps.log";
      if (::stat(p.c_str(), &st) != 0 && ::stat((top + "/" + n + "/steps.d").c_str(), &st) != 0)
        continue;
      auto mtime = std::chrono::system_clock::time_point(std::chrono::seconds(st.st_mtim.tv_sec));
      if (now - mtime < opts_.retention) continue;
      if (live && live(n)) continue;
      expired.push_back(n);
    }
    ::closedir(d);
  }
  int64_t horizon =
      now_us() - std::chrono::duration_cast<std::chrono::microseconds>(opts_.retention).count();
  std::lock_guard fl(files_mu_);
  std::unordered_set<uint32_t> gone;
  {
    std::lock_guard lk(mu_);
    for (const auto& n : expired) {
      auto it = scope_ids_.find(n);
      if (it == scope_ids_.end()) continue;
      gone.insert(it->second);
      files_.erase(it->second);
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
}

}  // namespace tp::node
