#include "common/json_util.h"

#include <algorithm>
#include <boost/beast/core/detail/base64.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <new>

namespace tp::json_util {
namespace json = boost::json;
namespace b64 = boost::beast::detail::base64;

namespace {
std::unexpected<Error> bad(std::string_view key, std::string_view what) {
  return fail(Code::kInvalidArgument, "field '" + std::string(key) + "' " + std::string(what));
}
const json::value* find(const json::object& o, std::string_view key) {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return nullptr;
  return &it->value();
}
}  // namespace

namespace {
// Counts live bytes against a budget and throws std::bad_alloc past it, which
// stops the parser at once. Used by one parse on one thread.
class BudgetResource final : public json::memory_resource {
 public:
  explicit BudgetResource(size_t budget) : left_(budget) {}

 private:
  // Only over-aligned requests take the aligned operators; the others the plain
  // ones, on both sides (an aligned new of a default alignment freed by the
  // aligned delete was reported as a new/delete mismatch by AddressSanitizer).
  void* do_allocate(std::size_t n, std::size_t align) override {
    if (n > left_) throw std::bad_alloc();
    void* p = align > __STDCPP_DEFAULT_NEW_ALIGNMENT__ ? ::operator new(n, std::align_val_t(align))
                                                       : ::operator new(n);
    left_ -= n;
    return p;
  }
  void do_deallocate(void* p, std::size_t n, std::size_t align) override {
    if (align > __STDCPP_DEFAULT_NEW_ALIGNMENT__)
      ::operator delete(p, n, std::align_val_t(align));
    else
      ::operator delete(p, n);
    left_ += n;
  }
  bool do_is_equal(const json::memory_resource& o) const noexcept override { return this == &o; }
  size_t left_;
};
}  // namespace

size_t ParseLimits::budget(size_t text_size) const {
  size_t b = text_size > (SIZE_MAX - slack_bytes) / std::max<size_t>(1, bytes_per_input_byte)
                 ? SIZE_MAX
                 : text_size * bytes_per_input_byte + slack_bytes;
  return std::min(b, max_budget_bytes);
}

Result<json::value> parse_bounded(std::string_view text, const ParseLimits& limits) {
  BudgetResource budget(limits.budget(text.size()));
  json::storage_ptr sp(&budget);
  json::parse_options opt;
  opt.max_depth = limits.max_depth;
  boost::system::error_code ec;
  try {
    // The parser's temporary stack and the values it builds both draw on the budget.
    json::stream_parser p(sp, opt);
    p.reset(sp);
    p.write(text.data(), text.size(), ec);
    if (!ec) p.finish(ec);
    if (ec == json::error::too_deep)
      return fail(Code::kInvalidArgument, "malformed JSON: nested deeper than " +
                                              std::to_string(limits.max_depth) + " levels");
    if (ec) return fail(Code::kInvalidArgument, "malformed JSON: " + ec.message());
    json::value v = p.release();
    return json::value(v, json::storage_ptr());
  } catch (const std::bad_alloc&) {
    return fail(Code::kPayloadTooLarge,
                "JSON body of " + std::to_string(text.size()) + " bytes needs more than " +
                    std::to_string(limits.budget(text.size())) +
                    " bytes of memory to parse (too many elements for its size)");
  }
}

Result<json::object> parse_object(std::string_view body, const ParseLimits& limits) {
  if (body.empty()) return fail(Code::kInvalidArgument, "request body must be a JSON object");
  auto v = parse_bounded(body, limits);
  if (!v) return std::unexpected(v.error());
  if (!v->is_object()) return fail(Code::kInvalidArgument, "request body must be a JSON object");
  return std::move(v->as_object());
}

Result<void> only_keys(const json::object& o, std::initializer_list<std::string_view> allowed) {
  return only_keys(o, std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

Result<void> only_keys(const json::object& o, std::span<const std::string_view> allowed) {
  for (const auto& kv : o) {
    bool ok = false;
    for (auto a : allowed) ok = ok || kv.key() == a;
    if (!ok) return fail(Code::kInvalidArgument, "unknown field '" + std::string(kv.key()) + "'");
  }
  return {};
}

Result<int64_t> get_int(const json::object& o, std::string_view key, int64_t dflt, int64_t min,
                        int64_t max) {
  const json::value* v = find(o, key);
  if (!v) return dflt;
  int64_t r;
  if (v->is_int64()) {
    r = v->as_int64();
  } else if (v->is_uint64()) {
    if (v->as_uint64() > static_cast<uint64_t>(max)) return bad(key, "is too large");
    r = static_cast<int64_t>(v->as_uint64());
  } else if (v->is_double() && std::floor(v->as_double()) == v->as_double() &&
             std::abs(v->as_double()) < 9e15) {
    r = static_cast<int64_t>(v->as_double());
  } else {
    return bad(key, "must be an integer");
  }
  if (r < min) return bad(key, "must be at least " + std::to_string(min));
  if (r > max) return bad(key, "must be at most " + std::to_string(max));
  return r;
}

Result<double> get_number(const json::object& o, std::string_view key, double dflt, double min,
                          double max) {
  const json::value* v = find(o, key);
  if (!v) return dflt;
  if (!v->is_number()) return bad(key, "must be a number");
  double d = v->to_number<double>();
  if (!std::isfinite(d) || d < min) return bad(key, "must be at least " + std::to_string(min));
  if (d > max) return bad(key, "must be at most " + std::to_string(max));
  return d;
}

Result<std::string> get_string(const json::object& o, std::string_view key, std::string dflt) {
  const json::value* v = find(o, key);
  if (!v) return dflt;
  if (!v->is_string()) return bad(key, "must be a string");
  return std::string(v->as_string());
}

Result<bool> get_bool(const json::object& o, std::string_view key, bool dflt) {
  const json::value* v = find(o, key);
  if (!v) return dflt;
  if (!v->is_bool()) return bad(key, "must be true or false");
  return v->as_bool();
}

Result<std::map<std::string, std::string>> get_string_map(const json::object& o,
                                                          std::string_view key) {
  std::map<std::string, std::string> out;
  const json::value* v = find(o, key);
  if (!v) return out;
  if (!v->is_object()) return bad(key, "must be an object of strings");
  for (const auto& kv : v->as_object()) {
    if (!kv.value().is_string()) return bad(key, "must be an object of strings");
    out[std::string(kv.key())] = std::string(kv.value().as_string());
  }
  return out;
}

Result<std::vector<std::string>> get_string_list(const json::object& o, std::string_view key) {
  std::vector<std::string> out;
  const json::value* v = find(o, key);
  if (!v) return out;
  if (!v->is_array()) return bad(key, "must be a list of strings");
  for (const auto& x : v->as_array()) {
    if (!x.is_string()) return bad(key, "must be a list of strings");
    out.emplace_back(x.as_string());
  }
  return out;
}

std::string rfc3339(int64_t ms) {
  if (ms <= 0) return "";
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

Result<std::vector<std::string>> get_command(const json::object& o, std::string_view key) {
  const json::value* v = find(o, key);
  if (!v) return bad(key, "is required");
  if (v->is_string()) {
    if (v->as_string().empty()) return bad(key, "must not be empty");
    return std::vector<std::string>{"/bin/sh", "-c", std::string(v->as_string())};
  }
  if (!v->is_array() || v->as_array().empty())
    return bad(key, "must be a non-empty list of strings or a string");
  std::vector<std::string> argv;
  for (const auto& a : v->as_array()) {
    if (!a.is_string()) return bad(key, "must be a non-empty list of strings or a string");
    argv.emplace_back(a.as_string());
  }
  if (argv[0].empty()) return bad(key, "must not start with an empty string");
  return argv;
}

std::string base64_encode(std::string_view in) {
  std::string out(b64::encoded_size(in.size()), '\0');
  out.resize(b64::encode(out.data(), in.data(), in.size()));
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  // The decoder stops at the first '=' or invalid byte: everything before the
  // (at most two) padding characters must be consumed.
  std::string_view body = in;
  for (int i = 0; i < 2 && !body.empty() && body.back() == '='; ++i) body.remove_suffix(1);
  // Room for a partial last group too: unpadded input ("YWI") decodes into more
  // than decoded_size(), which rounds down (writing past it overflowed the heap).
  std::string out((body.size() + 3) / 4 * 3, '\0');
  auto [written, read] = b64::decode(out.data(), body.data(), body.size());
  if (read != body.size() || body.size() % 4 == 1)
    return fail(Code::kInvalidArgument, "invalid base64");
  out.resize(written);
  return out;
}

namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no
// overlongs, no surrogates, at most U+10FFFF), 0 when there is none.
size_t utf8_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf   ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (c == 0xe0 && b(i + 1) < 0xa0) return 0;  // overlong
  if (c == 0xed && b(i + 1) > 0x9f) return 0;  // surrogate
  if (c == 0xf0 && b(i + 1) < 0x90) return 0;  // overlong
  if (c == 0xf4 && b(i + 1) > 0x8f) return 0;  // beyond U+10FFFF
  return n;
}

void fix_strings(boost::json::value& v) {
  if (v.is_string()) {
    auto& str = v.as_string();
    if (!valid_utf8(str)) str = to_valid_utf8(str);
  } else if (v.is_array()) {
    for (auto& e : v.as_array()) fix_strings(e);
  } else if (v.is_object()) {
    boost::json::object fixed;
    for (auto& [k, e] : v.as_object()) {
      fix_strings(e);
      fixed[valid_utf8(k) ? std::string(k) : to_valid_utf8(k)] = std::move(e);
    }
    v.as_object() = std::move(fixed);
  }
}

}  // namespace

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_len(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string serialize_utf8(const boost::json::value& v) {
  std::string out = boost::json::serialize(v);
  if (valid_utf8(out)) return out;  // JSON escapes are ASCII: only string bytes can be invalid
  boost::json::value copy = v;
  fix_strings(copy);
  return boost::json::serialize(copy);
}

}  // namespace tp::json_util
