#include "api/spool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "api/http_server.h"
#include "common/ids.h"
#include "common/sha256.h"

namespace tp::api {

Result<std::string> BodyFile::read(uint64_t off, size_t n) const {
  if (off >= size_) return std::string();
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - off));
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd_.get(), out.data() + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sys_fail("pread(spooled body)");
    if (r == 0) return fail(Code::kInternal, "spooled body shorter than received");
    got += static_cast<size_t>(r);
  }
  return out;
}

// The bytes of a body reserved in the spool budget, given back once the file is gone.
struct SpoolHold {
  std::shared_ptr<BodyBudget> budget;
  uint64_t bytes = 0;
  ~SpoolHold() {
    if (budget && bytes) budget->give(bytes);
  }
};

struct SpoolBody::State {
  sys::UniqueFd fd;
  uint64_t size = 0;
  Sha256 sha;
  std::shared_ptr<SpoolHold> hold = std::make_shared<SpoolHold>();
  SpoolFailure failure = SpoolFailure::kNone;
  std::string message;
};

bool SpoolBody::value_type::open(const SpoolOptions& opts, std::string* why) {
  st_ = std::make_shared<State>();
  st_->hold->budget = opts.disk;
  st_->fd.reset(::open(opts.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!st_->fd && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE on this file system: a named file, unlinked at once.
    std::string path = opts.dir + "/body-" + ids::random_hex(8);
    st_->fd.reset(::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (st_->fd) ::unlink(path.c_str());
  }
  if (!st_->fd) {
    *why = "open(" + opts.dir + ", O_TMPFILE): " + std::strerror(errno);
    st_.reset();
    return false;
  }
  if (!st_->sha.ok()) {
    *why = "sha256 of the body: setup failed";
    st_.reset();
    return false;
  }
  return true;
}

std::shared_ptr<const BodyFile> SpoolBody::value_type::finish() {
  if (!st_ || st_->failure != SpoolFailure::kNone) return nullptr;
  std::string digest = st_->sha.digest();
  if (digest.empty()) return nullptr;
  auto f = std::make_shared<const BodyFile>(std::move(st_->fd), st_->size, std::move(digest),
                                            std::shared_ptr<void>(st_->hold));
  st_.reset();
  return f;
}

SpoolFailure SpoolBody::value_type::failure() const {
  return st_ ? st_->failure : SpoolFailure::kNone;
}

const std::string& SpoolBody::value_type::failure_message() const {
  static const std::string none;
  return st_ ? st_->message : none;
}

uint64_t SpoolBody::value_type::size() const { return st_ ? st_->size : 0; }

bool SpoolBody::reader::write(const void* data, size_t n, boost::beast::error_code& ec) {
  auto& st = body_.st_;
  if (!st || !st->fd) {
    ec = boost::asio::error::bad_descriptor;
    return false;
  }
  auto& hold = *st->hold;
  if (hold.budget && !hold.budget->take(n)) {
    st->failure = SpoolFailure::kBudget;
    st->message = "the server is spooling " + std::to_string(hold.budget->used()) +
                  " bytes of uploads already (at most " + std::to_string(hold.budget->max()) +
                  "); retry later";
    ec = boost::asio::error::no_buffer_space;
    return false;
  }
  if (hold.budget) hold.bytes += n;
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(st->fd.get(), p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st->failure = SpoolFailure::kWrite;
      st->message = std::string("write(spooled body): ") + std::strerror(w < 0 ? errno : ENOSPC);
      ec = boost::asio::error::no_buffer_space;
      return false;
    }
    done += static_cast<size_t>(w);
  }
  st->sha.update(data, n);
  st->size += n;
  return true;
}

}  // namespace tp::api
