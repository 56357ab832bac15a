#include "cli/parse.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace tp::cli {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Scans an unsigned decimal number ("12", "1.5", ".5") at the front of s. Signs and
// exponents are refused on purpose: "-1G" and "1e3" are more likely typos than intent.
std::optional<double> scan_number(std::string_view& s) {
  size_t i = 0;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    ++i;
    ++digits;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      ++i;
      ++digits;
    }
  }
  if (digits == 0) return std::nullopt;
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + i, v);
  if (ec != std::errc() || ptr != s.data() + i || !std::isfinite(v)) return std::nullopt;
  s.remove_prefix(i);
  return v;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

constexpr std::string_view kB64 =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

Result<int64_t> parse_size_mb(std::string_view text) {
  std::string_view s = trim(text);
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid size '" + std::string(text) + "': " + std::string(why));
  };
  if (s.empty()) return bad("empty");
  if (s.front() == '-') return bad("must not be negative");
  auto num = scan_number(s);
  if (!num) return bad("expected a number with an optional K, M, G or T suffix");
  std::string unit = lower(trim(s));
  double mb = 0;
  if (unit.empty() || unit == "m" || unit == "mb" || unit == "mib" || unit == "mi") {
    mb = *num;
  } else if (unit == "b") {
    mb = *num / (1024.0 * 1024.0);
  } else if (unit == "k" || unit == "kb" || unit == "kib" || unit == "ki") {
    mb = *num / 1024.0;
  } else if (unit == "g" || unit == "gb" || unit == "gib" || unit == "gi") {
    mb = *num * 1024.0;
  } else if (unit == "t" || unit == "tb" || unit == "tib" || unit == "ti") {
    mb = *num * 1024.0 * 1024.0;
  } else {
    return bad("unknown unit '" + std::string(s) + "' (use K, M, G or T)");
  }
  // Round up: asking for 1500K must not silently give less than asked.
  double rounded = std::ceil(mb - 1e-9);
  if (rounded > 9.0e15) return bad("too large");
  return static_cast<int64_t>(rounded);
}

Result<double> parse_duration_seconds(std::string_view text) {
  std::string_view s = trim(text);
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid duration '" + std::string(text) + "': " + std::string(why));
  };
  if (s.empty()) return bad("empty");
  if (s.front() == '-') return bad("must not be negative");
  double total = 0;
  bool first = true;
  while (!s.empty()) {
    auto num = scan_number(s);
    if (!num) return bad("expected e.g. 30, 10s, 5m, 1h30m");
    size_t i = 0;
    while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
    std::string unit = lower(s.substr(0, i));
    s.remove_prefix(i);
    if (unit.empty()) {
      // A bare number is seconds, but only as the whole input ("1h30" is ambiguous).
      if (!first || !s.empty()) return bad("every part needs a unit (ms, s, m, h, d)");
      total += *num;
    } else if (unit == "ms") {
      total += *num / 1000.0;
    } else if (unit == "s" || unit == "sec") {
      total += *num;
    } else if (unit == "m" || unit == "min") {
      total += *num * 60.0;
    } else if (unit == "h") {
      total += *num * 3600.0;
    } else if (unit == "d") {
      total += *num * 86400.0;
    } else {
      return bad("unknown unit '" + unit + "' (use ms, s, m, h, d)");
    }
    first = false;
  }
  if (total > 1.0e12) return bad("too large");
  return total;
}

Result<std::pair<std::string, std::string>> parse_key_value(std::string_view text) {
  size_t eq = text.find('=');
  if (eq == std::string_view::npos) {
    return fail(Code::kInvalidArgument, "expected KEY=VALUE, got '" + std::string(text) + "'");
  }
  if (eq == 0) {
    return fail(Code::kInvalidArgument, "empty key in '" + std::string(text) + "'");
  }
  return std::pair{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
}

std::string base64_encode(std::string_view data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<unsigned char>(data[k]); };
  for (; i + 3 <= data.size(); i += 3) {
    uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  size_t rest = data.size() - i;
  if (rest == 1) {
    uint32_t v = byte(i) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  static const std::array<int8_t, 256> kRev = [] {
    std::array<int8_t, 256> r{};
    r.fill(-1);
    for (size_t k = 0; k < kB64.size(); ++k)
      r[static_cast<unsigned char>(kB64[k])] = static_cast<int8_t>(k);
    return r;
  }();
  if (text.size() % 4 != 0) {
    return fail(Code::kInvalidArgument, "invalid base64: length is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      unsigned char c = static_cast<unsigned char>(text[i + k]);
      if (c == '=') {
        // Padding only in the last quantum, only in its last two places, and only trailing.
        if (!last || k < 2) return fail(Code::kInvalidArgument, "invalid base64: misplaced '='");
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0 || kRev[c] < 0) {
        return fail(Code::kInvalidArgument, "invalid base64: unexpected character");
      }
      v = (v << 6) | static_cast<uint32_t>(kRev[c]);
    }
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::optional<std::time_t> parse_rfc3339(std::string_view text) {
  int y, mo, d, h, mi, sec;
  int n = 0;
  std::string s(text);
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%*[Tt ]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) !=
      6) {
    return std::nullopt;
  }
  std::string_view rest = std::string_view(s).substr(static_cast<size_t>(n));
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front())))
      rest.remove_prefix(1);
  }
  long offset = 0;
  if (rest == "Z" || rest == "z") {
    offset = 0;
  } else if (rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':') {
    int oh = 0, om = 0;
    if (std::sscanf(std::string(rest.substr(1)).c_str(), "%2d:%2d", &oh, &om) != 2)
      return std::nullopt;
    offset = (oh * 3600L + om * 60L) * (rest[0] == '+' ? 1 : -1);
  } else {
    return std::nullopt;
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return timegm(&tm) - offset;
}

std::string format_duration_short(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 120) return std::to_string(seconds) + "s";
  if (seconds < 2 * 3600) return std::to_string(seconds / 60) + "m";
  if (seconds < 2 * 86400) return std::to_string(seconds / 3600) + "h";
  return std::to_string(seconds / 86400) + "d";
}

std::string format_mb(int64_t mb) {
  if (mb > 0 && mb % (1024 * 1024) == 0) return std::to_string(mb / (1024 * 1024)) + "T";
  if (mb > 0 && mb % 1024 == 0) return std::to_string(mb / 1024) + "G";
  return std::to_string(mb) + "M";
}

Result<void> NdjsonSplitter::feed(std::string_view bytes,
                                  const std::function<Result<void>(std::string_view)>& on_line) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      if (buf_.size() + bytes.size() > max_line_) {
        return fail(Code::kInternal,
                    "response line longer than " + std::to_string(max_line_) + " bytes");
      }
      buf_.append(bytes);
      return {};
    }
    std::string_view line;
    if (buf_.empty()) {
      line = bytes.substr(0, nl);
    } else {
      if (buf_.size() + nl > max_line_) {
        return fail(Code::kInternal,
                    "response line longer than " + std::to_string(max_line_) + " bytes");
      }
      buf_.append(bytes.substr(0, nl));
      line = buf_;
    }
    bytes.remove_prefix(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    Result<void> r = line.empty() ? Result<void>{} : on_line(line);
    buf_.clear();
    if (!r) return r;
  }
  return {};
}

}  // namespace tp::cli
