// Spooled request bodies: an upload above a threshold is written to an
// unlinked file under the data directory as it arrives (never held whole in
// memory), hashed on the way (SHA-256, for idempotency fingerprints), and
// handed to the route as a BodyFile that it reads in pieces.
//
// The files are O_TMPFILE (or unlinked at once where the file system lacks
// it): they have no name, so nothing is left behind by a crash, and they go
// away when the last BodyFile owner closes them. Their bytes on disk, over all
// connections, are bounded by a BodyBudget of their own (--max-spool-mb).
//
// Thread rules: a SpoolBody value is written by one connection's strand while
// its body arrives; the BodyFile it yields is immutable and safe to read from
// any thread (pread).
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::api {

class BodyBudget;

// A complete request body in a file.
class BodyFile {
 public:
  // `hold` is released with the file (the spool budget it takes).
  BodyFile(sys::UniqueFd fd, uint64_t size, std::string sha256, std::shared_ptr<void> hold = {})
      : fd_(std::move(fd)), size_(size), sha256_(std::move(sha256)), hold_(std::move(hold)) {}
  int fd() const { return fd_.get(); }
  uint64_t size() const { return size_; }
  const std::string& sha256() const { return sha256_; }  // 32 raw bytes
  // Up to n bytes at offset off (fewer only at the end of the body).
  Result<std::string> read(uint64_t off, size_t n) const;
  // The whole body (old agents without paced stdin; small bodies only).
  Result<std::string> read_all() const { return read(0, size_); }
  // A path that opens this file (/proc/self/fd/N), for code that takes a path.
  std::string proc_path() const { return "/proc/self/fd/" + std::to_string(fd_.get()); }

 private:
  sys::UniqueFd fd_;
  uint64_t size_;
  std::string sha256_;
  std::shared_ptr<void> hold_;
};

// Where and how bodies are spooled (ServerOptions::spool).
struct SpoolOptions {
  std::string dir;                   // the spool directory (root-only); "" = never spool
  uint64_t threshold = 1ull << 20;   // bodies larger than this (or chunked) are spooled
  std::shared_ptr<BodyBudget> disk;  // bytes of spooled bodies at once; null = unbounded
};

// Why a spooled body could not be taken in (the connection answers with it).
enum class SpoolFailure { kNone, kBudget, kWrite };

// Beast body type that writes what arrives into a spool file.
struct SpoolBody {
  struct State;
  class value_type {
   public:
    value_type() = default;
    // Opens a fresh file in opts.dir; false (and `why`) on failure.
    bool open(const SpoolOptions& opts, std::string* why);
    // The complete body, once the parser is done; null before (or after a failure).
    std::shared_ptr<const BodyFile> finish();
    SpoolFailure failure() const;
    const std::string& failure_message() const;
    uint64_t size() const;

   private:
    friend struct SpoolBody;
    std::shared_ptr<State> st_;
  };

  static uint64_t size(const value_type& v) { return v.size(); }

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& b) : body_(b) {}
    void init(const boost::optional<uint64_t>&, boost::beast::error_code& ec) { ec = {}; }
    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      size_t n = 0;
      for (auto it = boost::asio::buffer_sequence_begin(buffers);
           it != boost::asio::buffer_sequence_end(buffers); ++it) {
        boost::asio::const_buffer b(*it);
        if (!write(b.data(), b.size(), ec)) return n;
        n += b.size();
      }
      return n;
    }
    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    bool write(const void* data, size_t n, boost::beast::error_code& ec);
    value_type& body_;
  };
};

}  // namespace tp::api
