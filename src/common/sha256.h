// SHA-256 digests, through OpenSSL's libcrypto.
//
// The algorithm is fetched from OpenSSL's provider once per process: OpenSSL 3
// otherwise looks `EVP_sha256()` up again on every digest (a lock and a table
// search), which a keyed request or an uploaded body would pay each time.
//
// Thread rules: a Sha256 object is used by one thread at a time; the free
// functions are safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct evp_md_ctx_st;

namespace tp {

// An incremental SHA-256. A digest that OpenSSL cannot set up (out of memory) is
// reported by ok() and then by an empty result from digest()/hex_digest().
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  bool ok() const { return ok_; }
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The 32 raw bytes; ends the digest (a later update starts nothing new).
  std::string digest();
  // The 64 lower-case hex characters; ends the digest.
  std::string hex_digest();

 private:
  evp_md_ctx_st* ctx_;
  bool ok_ = false;
};

// The 32 raw bytes of SHA-256(data).
std::string sha256(std::string_view data);
// Lower-case hex of SHA-256(data).
std::string sha256_hex(std::string_view data);
// Lower-case hex of any bytes.
std::string hex_encode(std::string_view bytes);

}  // namespace tp
