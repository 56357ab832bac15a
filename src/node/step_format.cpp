#include "node/step_format.h"

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "common/sha256.h"

namespace tp::node {

namespace {

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(uint32_t crc, const unsigned char* p, size_t n) {
  static const auto kTable = make_table();
  while (n--) crc = kTable[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// SSE4.2 has CRC32C as an instruction: about 20x the table's speed, which matters
// for multi-MiB answers checksummed on the way to disk and back.
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t crc, const unsigned char* p,
                                                     size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
void field(std::string& s, uint16_t tag, std::string_view v) {
  s.push_back(static_cast<char>(tag));
  s.push_back(static_cast<char>(tag >> 8));
  put_u32(s, static_cast<uint32_t>(v.size()));
  s.append(v);
}
void field_u64(std::string& s, uint16_t tag, uint64_t v) {
  std::string b;
  put_u64(b, v);
  field(s, tag, b);
}
void field_u32(std::string& s, uint16_t tag, uint32_t v) {
  std::string b;
  put_u32(b, v);
  field(s, tag, b);
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  auto p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool kHw = __builtin_cpu_supports("sse4.2");
  if (kHw) return ~crc32c_hw(~crc, p, n);
#endif
  return ~crc32c_table(~crc, p, n);
}

std::string bytes_of_hex(std::string_view h) {
  auto v = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string raw;
  for (size_t i = 0; i + 1 < h.size() && v(h[i]) >= 0 && v(h[i + 1]) >= 0; i += 2)
    raw.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
  return raw;
}

std::string StepFingerprint::describe() const {
  return fmt::format("{} {} (body sha256:{}..., {} bytes)", method, target,
                     hex_encode(std::string_view(body_sha256).substr(0, 8)), body_len);
}

StepRecord intent_of(const StepRecord& call) {
  StepRecord r;
  r.kind = StepKind::kEvent;
  r.event = kIntentEvent;
  r.key = call.key;
  r.request = call.request;
  r.caller = call.caller;
  r.started_us = r.finished_us = call.started_us;
  return r;
}

namespace step_format {

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string file_header(uint32_t version) {
  std::string h(kFileMagic, sizeof kFileMagic);
  put_u32(h, version);
  put_u32(h, 0);
  return h;
}

Result<uint32_t> parse_file_header(std::string_view h) {
  if (h.size() < kFileHeader || std::memcmp(h.data(), kFileMagic, sizeof kFileMagic) != 0)
    return fail(Code::kInternal, "bad file header");
  uint32_t v = get_u32(h.data() + 8);
  if (v == 0 || v > kVersion)
    return fail(Code::kInternal,
                fmt::format("file version {} (this daemon reads 1 to {})", v, kVersion));
  return v;
}

uint32_t record_crc(std::string_view payload) {
  std::string len;
  put_u32(len, static_cast<uint32_t>(payload.size()));
  return crc32c(crc32c(0, len.data(), 4), payload.data(), payload.size());
}

std::string encode(const StepRecord& r, bool answer_inline, std::string_view answer) {
  std::string p;
  p.push_back(static_cast<char>(r.kind));
  if (is_intent(r)) {
    // No seq (it is no entry of the log) and no detail: the call's key and request.
    field(p, kEvent, r.event);
    field(p, kKey, r.key);
    field(p, kMethod, r.request.method);
    field(p, kTarget, r.request.target);
    field(p, kBodySha, r.request.body_sha256);
    field_u64(p, kBodyLen, r.request.body_len);
    if (!r.caller.empty()) field(p, kCaller, r.caller);
    field_u64(p, kStarted, static_cast<uint64_t>(r.started_us));
  } else if (r.kind == StepKind::kEvent) {
    field_u64(p, kSeq, r.seq);
    field(p, kEvent, r.event);
    field(p, kDetail, r.detail);
  } else {
    field_u64(p, kSeq, r.seq);
    field(p, kKey, r.key);
    field(p, kMethod, r.request.method);
    field(p, kTarget, r.request.target);
    field(p, kBodySha, r.request.body_sha256);
    field_u64(p, kBodyLen, r.request.body_len);
    if (r.request_body && r.request_side.empty()) field(p, kRequestBody, *r.request_body);
    if (!r.request_side.empty()) field(p, kRequestSide, r.request_side);
    if (!r.caller.empty()) field(p, kCaller, r.caller);
    field_u32(p, kStatus, static_cast<uint32_t>(r.status));
    field(p, kContentType, r.content_type);
    if (answer_inline)
      field(p, kAnswer, answer);
    else
      field(p, kAnswerSide, r.answer_side);
    field_u64(p, kAnswerLen, r.answer_len);
    field_u32(p, kAnswerCrc, r.answer_crc);
    if (!r.summary.empty()) field(p, kSummary, r.summary);
    field_u64(p, kStarted, static_cast<uint64_t>(r.started_us));
  }
  field_u64(p, kFinished, static_cast<uint64_t>(r.finished_us));
  std::string rec;
  rec.reserve(kRecordHeader + p.size());
  put_u32(rec, kRecordMagic);
  put_u32(rec, static_cast<uint32_t>(p.size()));
  put_u32(rec, record_crc(p));
  rec += p;
  return rec;
}

Result<StepRecord> decode(std::string_view p) {
  if (p.empty()) return fail(Code::kInternal, "empty step record");
  auto kind = static_cast<uint8_t>(p[0]);
  if (kind != static_cast<uint8_t>(StepKind::kCall) &&
      kind != static_cast<uint8_t>(StepKind::kEvent))
    return fail(Code::kInternal, fmt::format("step record of an unknown kind {}", kind));
  StepRecord r;
  r.kind = static_cast<StepKind>(kind);
  size_t i = 1;
  while (i < p.size()) {
    if (p.size() - i < 6) return fail(Code::kInternal, "step record field cut short");
    uint16_t tag = static_cast<uint16_t>(static_cast<unsigned char>(p[i]) |
                                         (static_cast<unsigned char>(p[i + 1]) << 8));
    uint32_t n = get_u32(p.data() + i + 2);
    i += 6;
    if (p.size() - i < n) return fail(Code::kInternal, "step record field cut short");
    std::string_view v = p.substr(i, n);
    i += n;
    auto u64 = [&] { return v.size() == 8 ? get_u64(v.data()) : 0; };
    auto u32 = [&] { return v.size() == 4 ? get_u32(v.data()) : 0; };
    switch (tag) {
      case kKey:
        r.key = v;
        break;
      case kMethod:
        r.request.method = v;
        break;
      case kTarget:
        r.request.target = v;
        break;
      case kBodySha:
        r.request.body_sha256 = v;
        break;
      case kBodyLen:
        r.request.body_len = u64();
        break;
      case kRequestBody:
        r.request_body = std::string(v);
        break;
      case kRequestSide:
        r.request_side = v;
        break;
      case kCaller:
        r.caller = v;
        break;
      case kStatus:
        r.status = static_cast<int>(u32());
        break;
      case kContentType:
        r.content_type = v;
        break;
      case kAnswer:
        r.answer = v;
        break;
      case kAnswerSide:
        r.answer_side = v;
        break;
      case kAnswerLen:
        r.answer_len = u64();
        break;
      case kAnswerCrc:
        r.answer_crc = u32();
        break;
      case kSummary:
        r.summary = v;
        break;
      case kStarted:
        r.started_us = static_cast<int64_t>(u64());
        break;
      case kFinished:
        r.finished_us = static_cast<int64_t>(u64());
        break;
      case kSeq:
        r.seq = u64();
        break;
      case kEvent:
        r.event = v;
        break;
      case kDetail:
        r.detail = v;
        break;
      default:
        break;  // a field of a later version
    }
  }
  return r;
}

}  // namespace step_format
}  // namespace tp::node
