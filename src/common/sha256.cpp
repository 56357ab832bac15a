#include "common/sha256.h"

#include <openssl/evp.h>

namespace tp {

namespace {

// Fetched once and kept for the life of the process (never freed: digests may
// run in static destructors' time too).
const EVP_MD* sha256_md() {
  static const EVP_MD* md = [] {
    const EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return m ? m : EVP_sha256();
  }();
  return md;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  ok_ = ctx_ && EVP_DigestInit_ex(ctx_, sha256_md(), nullptr) == 1;
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(const void* data, size_t n) {
  if (ok_ && n) ok_ = EVP_DigestUpdate(ctx_, data, n) == 1;
}

std::string Sha256::digest() {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!ok_ || EVP_DigestFinal_ex(ctx_, d, &len) != 1) {
    ok_ = false;
    return "";
  }
  ok_ = false;  // finished: a context must be initialised again before reuse
  return std::string(reinterpret_cast<const char*>(d), len);
}

std::string Sha256::hex_digest() { return hex_encode(digest()); }

std::string sha256(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.digest();
}

std::string sha256_hex(std::string_view data) { return hex_encode(sha256(data)); }

std::string hex_encode(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace tp
