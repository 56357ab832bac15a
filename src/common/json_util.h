// Helpers to validate JSON request bodies with precise error messages.
// Every getter returns kInvalidArgument naming the field when the value has the
// wrong type or range; a missing or null field yields the default.
// Thread rules: pure functions.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::json_util {

// Limits of parse_bounded: request bodies are parsed within memory proportional
// to their size, so a small body cannot expand into gigabytes (a 100 MB
// [0,0,...] array needs about 24 times its size as boost::json values).
struct ParseLimits {
  size_t max_depth = 20;               // nesting of arrays and objects
  size_t bytes_per_input_byte = 8;     // memory budget: this many times the text ...
  size_t slack_bytes = 64 << 10;       // ... plus this
  size_t max_budget_bytes = 64 << 20;  // ... and never more than this
  size_t budget(size_t text_size) const;
};

// Parses `text` with the parser's working memory and the resulting values
// counted against limits.budget(text.size()): too deep nesting fails with
// kInvalidArgument, a budget overrun (too many elements for the size) with
// kPayloadTooLarge, as soon as it happens. The value returned is a copy on the
// default heap (no tie to the budget).
Result<boost::json::value> parse_bounded(std::string_view text, const ParseLimits& limits = {});
// parse_bounded, then requires an object. Every JSON request body goes through here.
Result<boost::json::object> parse_object(std::string_view body, const ParseLimits& limits = {});
// Fails when `o` has a key outside `allowed`.
Result<void> only_keys(const boost::json::object& o,
                       std::initializer_list<std::string_view> allowed);
Result<void> only_keys(const boost::json::object& o, std::span<const std::string_view> allowed);
Result<int64_t> get_int(const boost::json::object& o, std::string_view key, int64_t dflt,
                        int64_t min, int64_t max);
Result<double> get_number(const boost::json::object& o, std::string_view key, double dflt,
                          double min, double max);
Result<std::string> get_string(const boost::json::object& o, std::string_view key,
                               std::string dflt);
Result<bool> get_bool(const boost::json::object& o, std::string_view key, bool dflt);
Result<std::map<std::string, std::string>> get_string_map(const boost::json::object& o,
                                                          std::string_view key);
// A list of strings; missing or null = empty.
Result<std::vector<std::string>> get_string_list(const boost::json::object& o,
                                                 std::string_view key);
// "2026-11-30T01:02:03.456Z" for Unix epoch milliseconds; "" for ms <= 0.
std::string rfc3339(int64_t ms);
// A command: a list of strings (argv) or one string (run by /bin/sh -c).
Result<std::vector<std::string>> get_command(const boost::json::object& o, std::string_view key);

std::string base64_encode(std::string_view in);
Result<std::string> base64_decode(std::string_view in);

// JSON text of `v` that is always valid UTF-8: boost::json copies string bytes as
// they are, so a string holding invalid UTF-8 (a request path, a file name made
// by a sandbox, echoed in a message) would make the whole answer unparseable.
// Invalid bytes become U+FFFD.
std::string serialize_utf8(const boost::json::value& v);
// True when `s` is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);
// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

}  // namespace tp::json_util
