#include "api/step_summary.h"

#include <boost/json.hpp>
#include <boost/json/basic_parser_impl.hpp>

namespace tp::api {

namespace json = boost::json;

namespace {

constexpr size_t kMaxString = 300;

bool base64_field(std::string_view key) {
  return key == "stdout" || key == "stderr" || key == "data";
}

// SAX handler: depth 1 is the answer object, depth 2 its nested objects.
struct Scan {
  static constexpr std::size_t max_array_size = -1;
  static constexpr std::size_t max_object_size = -1;
  static constexpr std::size_t max_string_size = -1;
  static constexpr std::size_t max_key_size = -1;

  json::object out;
  json::object* nested = nullptr;  // the depth-2 object being read
  int depth = 0;                   // objects and arrays
  int arrays = 0;                  // arrays open
  bool top_is_object = false;
  std::string key, parent_key, str;
  uint64_t str_len = 0;
  char tail[2] = {0, 0};  // last two characters of the string (base64 padding)

  json::object* target() {
    if (arrays) return nullptr;
    if (depth == 1) return &out;
    if (depth == 2) return nested;
    return nullptr;
  }
  void put(json::value v) {
    if (auto* t = target()) (*t)[key] = std::move(v);
  }

  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_array_begin(boost::system::error_code&) {
    ++depth;
    ++arrays;
    return true;
  }
  bool on_array_end(std::size_t, boost::system::error_code&) {
    --depth;
    --arrays;
    return true;
  }
  bool on_object_begin(boost::system::error_code&) {
    ++depth;
    if (depth == 1) top_is_object = true;
    if (depth == 2 && !arrays) {
      parent_key = key;
      nested = &out[parent_key].emplace_object();
    }
    return true;
  }
  bool on_object_end(std::size_t, boost::system::error_code&) {
    if (depth == 2 && !arrays) {
      if (nested && nested->empty()) out.erase(parent_key);
      nested = nullptr;
    }
    --depth;
    return true;
  }
  void string_piece(std::string_view s) {
    if (s.size() >= 2) {
      tail[0] = s[s.size() - 2];
      tail[1] = s[s.size() - 1];
    } else if (s.size() == 1) {
      tail[0] = tail[1];
      tail[1] = s[0];
    }
    str_len += s.size();
    if (str.size() < kMaxString + 1) str.append(s.substr(0, kMaxString + 1 - str.size()));
  }
  bool on_string_part(json::string_view s, std::size_t, boost::system::error_code&) {
    string_piece(std::string_view(s.data(), s.size()));
    return true;
  }
  bool on_string(json::string_view s, std::size_t, boost::system::error_code&) {
    string_piece(std::string_view(s.data(), s.size()));
    if (auto* t = target()) {
      if (base64_field(key)) {
        uint64_t pad = str_len >= 2 ? (tail[1] == '=') + (tail[0] == '=' && tail[1] == '=') : 0;
        (*t)[key + "_bytes"] = str_len / 4 * 3 - pad;
      } else if (str.size() > kMaxString) {
        (*t)[key] = json::string(str.substr(0, kMaxString) + "...");
      } else {
        (*t)[key] = json::string(str);
      }
    }
    str.clear();
    str_len = 0;
    tail[0] = tail[1] = 0;
    return true;
  }
  bool key_complete = true;
  bool on_key_part(json::string_view s, std::size_t, boost::system::error_code&) {
    if (key_complete) key.clear();
    key_complete = false;
    key.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, boost::system::error_code&) {
    if (key_complete) key.clear();
    key_complete = true;
    key.append(s.data(), s.size());
    return true;
  }
  bool on_number_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_int64(int64_t i, json::string_view, boost::system::error_code&) {
    put(json::value(i));
    return true;
  }
  bool on_uint64(uint64_t u, json::string_view, boost::system::error_code&) {
    put(json::value(u));
    return true;
  }
  bool on_double(double d, json::string_view, boost::system::error_code&) {
    put(json::value(d));
    return true;
  }
  bool on_bool(bool b, boost::system::error_code&) {
    put(json::value(b));
    return true;
  }
  bool on_null(boost::system::error_code&) {
    put(json::value(nullptr));
    return true;
  }
  bool on_comment_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(json::string_view, boost::system::error_code&) { return true; }
};

}  // namespace

std::string summarize_json(std::string_view body) {
  size_t i = body.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos || body[i] != '{') return "";
  json::basic_parser<Scan> p(json::parse_options{});
  boost::system::error_code ec;
  p.write_some(false, body.data(), body.size(), ec);
  if (ec || !p.handler().top_is_object) return "";
  return json::serialize(p.handler().out);
}

void StreamSummary::feed(std::string_view lines) {
  while (!lines.empty()) {
    size_t nl = lines.find('\n');
    std::string_view line = lines.substr(0, nl);
    lines = nl == std::string_view::npos ? std::string_view() : lines.substr(nl + 1);
    if (line.empty()) continue;
    std::string s = summarize_json(line);
    if (s.empty()) continue;
    boost::system::error_code ec;
    auto v = json::parse(s, ec);
    if (ec || !v.is_object()) continue;
    auto& o = v.as_object();
    const auto* type = o.if_contains("type");
    if (!type || !type->is_string()) continue;
    const auto* n = o.if_contains("data_bytes");
    uint64_t bytes = n && n->is_uint64() ? n->as_uint64() : n && n->is_int64() ? n->as_int64() : 0;
    if (type->as_string() == "stdout")
      out_ += bytes;
    else if (type->as_string() == "stderr")
      err_ += bytes;
    else if (type->as_string() == "exit" || type->as_string() == "error")
      last_ = std::move(s);
  }
}

std::string StreamSummary::json() const {
  json::object o;
  if (!last_.empty()) {
    boost::system::error_code ec;
    auto v = json::parse(last_, ec);
    if (!ec && v.is_object()) o = std::move(v.as_object());
  }
  o["stdout_bytes"] = out_;
  o["stderr_bytes"] = err_;
  return json::serialize(o);
}

}  // namespace tp::api
