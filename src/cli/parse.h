// Parsing and formatting helpers of the `tidepool` CLI: sizes, durations, k=v pairs,
// base64, NDJSON line splitting, URL query encoding, timestamps.
//
// Promises: pure functions (NdjsonSplitter keeps only its own buffer); bad input is an
// invalid_argument Error whose context is a short human message, never an exception.
// Thread rules: free functions are safe from any thread; an NdjsonSplitter belongs to one
// thread at a time.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/result.h"

namespace tp::cli {

// A size in whole MiB. Suffixes are binary and case-insensitive: B, K, M, G, T (also
// KB/KiB/Ki, MB/MiB/Mi, ...); a plain number means MiB. Decimals are allowed ("1.5G");
// anything that is not a whole MiB is rounded up. Negative or malformed input fails.
Result<int64_t> parse_size_mb(std::string_view text);

// A duration in seconds: a plain number (seconds) or a sequence of number+unit parts
// with units ms, s, m, h, d ("10m", "1h30m", "0.5s"). Negative or malformed input fails.
Result<double> parse_duration_seconds(std::string_view text);

// "key=value" split at the first '='; the key must be non-empty, the value may be empty
// and may itself contain '='.
Result<std::pair<std::string, std::string>> parse_key_value(std::string_view text);

// Standard base64 (RFC 4648, with padding). decode rejects characters outside the
// alphabet and bad padding; whitespace is not allowed.
std::string base64_encode(std::string_view data);
Result<std::string> base64_decode(std::string_view text);

// Percent-encodes everything except RFC 3986 unreserved characters and '/'.
std::string url_encode(std::string_view text);

// Parses an RFC 3339 timestamp ("2024-05-01T12:00:00Z", fractional seconds and
// "+hh:mm" offsets allowed) into seconds since the epoch.
std::optional<std::time_t> parse_rfc3339(std::string_view text);

// Compact human duration: "45s", "12m", "3h", "2d" (the largest whole unit).
std::string format_duration_short(int64_t seconds);

// Memory in MiB as the CLI prints it: "512M", "2G", "1536M".
std::string format_mb(int64_t mb);

// Splits a byte stream into lines ('\n'-terminated; a trailing '\r' is dropped).
// Bytes may arrive in arbitrary pieces; a line longer than max_line is an error, so a
// misbehaving server cannot make the client buffer without bound.
class NdjsonSplitter {
 public:
  explicit NdjsonSplitter(size_t max_line = size_t{64} << 20) : max_line_(max_line) {}

  // Calls on_line for every complete non-empty line in order. Stops and returns the
  // first error on_line returns.
  Result<void> feed(std::string_view bytes,
                    const std::function<Result<void>(std::string_view line)>& on_line);

  // Any bytes after the last newline (a final line without a terminator).
  const std::string& pending() const { return buf_; }

 private:
  size_t max_line_;
  std::string buf_;
};

}  // namespace tp::cli
