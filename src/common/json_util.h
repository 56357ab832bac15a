// Helpers to validate JSON request bodies with precise error messages.
// Every getter returns kInvalidArgument naming the field when the value has the
// wrong type or range; a missing or null field yields the default.
// Thread rules: pure functions.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::json_util {

Result<boost::json::object> parse_object(std::string_view body);
// Fails when `o` has a key outside `allowed`.
Result<void> only_keys(const boost::json::object& o,
                       std::initializer_list<std::string_view> allowed);
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
// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

}  // namespace tp::json_util
