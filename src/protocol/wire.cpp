#include "protocol/wire.h"

#include <cstring>

namespace tp::proto {
namespace {

void put_u16(std::string* out, uint16_t v) {
  char b[2] = {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  out->append(b, 2);
}
void put_u32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 4);
}
uint16_t get_u16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

Message& Message::add(Tag t, std::string_view bytes) {
  fields.emplace_back(t, std::string(bytes));
  return *this;
}
Message& Message::add_moved(Tag t, std::string bytes) {
  fields.emplace_back(t, std::move(bytes));
  return *this;
}
Message& Message::add_u64(Tag t, uint64_t v) {
  fields.emplace_back(t, le64(v));
  return *this;
}
Message& Message::add_i64(Tag t, int64_t v) { return add_u64(t, static_cast<uint64_t>(v)); }

bool Message::has(Tag t) const { return get(t).has_value(); }

std::optional<std::string_view> Message::get(Tag t) const {
  for (const auto& [tag, val] : fields)
    if (tag == t) return std::string_view(val);
  return std::nullopt;
}

std::string Message::str(Tag t, std::string_view dflt) const {
  auto v = get(t);
  return std::string(v ? *v : dflt);
}

uint64_t Message::u64(Tag t, uint64_t dflt) const {
  auto v = get(t);
  if (!v || v->size() != 8) return dflt;
  uint64_t r = 0;
  for (int i = 7; i >= 0; --i) r = (r << 8) | static_cast<uint8_t>((*v)[i]);
  return r;
}

int64_t Message::i64(Tag t, int64_t dflt) const {
  auto v = get(t);
  if (!v || v->size() != 8) return dflt;
  return static_cast<int64_t>(u64(t));
}

std::vector<std::string_view> Message::all(Tag t) const {
  std::vector<std::string_view> out;
  for (const auto& [tag, val] : fields)
    if (tag == t) out.emplace_back(val);
  return out;
}

namespace {
size_t fields_size(const std::vector<std::pair<Tag, std::string>>& fields) {
  size_t n = 0;
  for (const auto& f : fields) n += 6 + f.second.size();
  return n;
}
void put_fields(std::string* out, const std::vector<std::pair<Tag, std::string>>& fields) {
  for (const auto& [tag, val] : fields) {
    put_u16(out, static_cast<uint16_t>(tag));
    put_u32(out, static_cast<uint32_t>(val.size()));
    out->append(val);
  }
}
}  // namespace

std::string encode_fields(const std::vector<std::pair<Tag, std::string>>& fields) {
  std::string out;
  out.reserve(fields_size(fields));
  put_fields(&out, fields);
  return out;
}

bool decode_fields(std::string_view p, std::vector<std::pair<Tag, std::string>>* out) {
  size_t i = 0;
  while (i < p.size()) {
    if (p.size() - i < 6) return false;
    uint16_t tag = get_u16(p.data() + i);
    uint32_t len = get_u32(p.data() + i + 2);
    i += 6;
    if (len > p.size() - i) return false;
    out->emplace_back(static_cast<Tag>(tag), std::string(p.substr(i, len)));
    i += len;
  }
  return true;
}

// One allocation of the frame's exact size: a 1 MiB piece is copied once.
std::string encode(const Message& m) {
  size_t payload = fields_size(m.fields);
  std::string out;
  out.reserve(kHeaderSize + payload);
  put_u32(&out, static_cast<uint32_t>(8 + payload));
  out.push_back(static_cast<char>(m.type));
  out.push_back(0);
  put_u16(&out, 0);
  put_u32(&out, m.id);
  put_fields(&out, m.fields);
  return out;
}

void FrameReader::feed(const char* data, size_t n) {
  if (failed_) return;
  // Compact before growing so that a long-lived stream does not keep consumed bytes.
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 16) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data, n);
}

std::optional<Message> FrameReader::next() {
  if (failed_) return std::nullopt;
  size_t avail = buf_.size() - pos_;
  if (avail < 4) return std::nullopt;
  uint32_t len = get_u32(buf_.data() + pos_);
  if (len < 8 || len > kMaxFrame - 4) {  // (not len + 4: it wraps for len near 2^32)
    failed_ = true;
    error_ = "frame length " + std::to_string(len) + " out of range";
    return std::nullopt;
  }
  if (avail < 4 + static_cast<size_t>(len)) return std::nullopt;
  const char* p = buf_.data() + pos_ + 4;
  Message m;
  m.type = static_cast<MsgType>(static_cast<uint8_t>(p[0]));
  m.id = get_u32(p + 4);
  if (!decode_fields(std::string_view(p + 8, len - 8), &m.fields)) {
    failed_ = true;
    error_ = "malformed field list";
    return std::nullopt;
  }
  pos_ += 4 + len;
  if (pos_ == buf_.size()) {
    // Fully consumed: an idle connection keeps no large buffer.
    buf_.clear();
    pos_ = 0;
    if (buf_.capacity() > (64u << 10)) buf_.shrink_to_fit();
  }
  return m;
}

Message make_error(uint32_t id, std::string_view code, int sys_errno, std::string_view message) {
  Message m(MsgType::kError, id);
  m.add(Tag::kErrCode, code);
  if (sys_errno) m.add_u64(Tag::kErrno, static_cast<uint64_t>(sys_errno));
  m.add(Tag::kMessage, message);
  return m;
}

}  // namespace tp::proto
