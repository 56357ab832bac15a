// StepFormat: the bytes of the trajectory log (docs/trajectory-log.md), with no I/O:
// the file header, the record envelope, and the tagged fields of each record kind.
//
//   file header   "TPSTEPS\n" (8 bytes) | u32 version | u32 flags (=0)
//   record        u32 magic 0x52535054 ("TPSR") | u32 len | u32 crc | payload[len]
//                 crc = CRC32C over the 4 bytes of len, then the payload
//   payload       u8 kind, then fields until the end: u16 tag | u32 size | value[size]
//
// All integers are little-endian. Version 2 is written; version 1 (the step log of
// keyed answers only: kind 1 without seq, caller, summary) is read, and its records
// are valid version 2 records. Readers skip fields whose tag they do not know.
//
// An intent (is_intent) is an event record named "intent" without a seq: a keyed call
// began (its key, request, caller and start), written before its handler runs and not
// synced; it is no entry of the log (never listed, no seq), only what tells a restarted
// daemon that a call with that key was being answered when it stopped.
//
// Thread rules: pure functions, any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace tp::node {

uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// Raw bytes of lower-case hex (the inverse of common/sha256.h's hex_encode; invalid
// input: what parses).
std::string bytes_of_hex(std::string_view hex);

enum class StepKind : uint8_t {
  kCall = 1,   // an answered state-changing call (keyed or not)
  kEvent = 2,  // something the node did: created, process_exit, ended, replay, ...
               // (or the intent of a keyed call: see is_intent)
};

// What identifies a call: a repeat with the same key must match all of it.
struct StepFingerprint {
  std::string method;
  std::string target;       // path and query
  std::string body_sha256;  // 32 raw bytes
  uint64_t body_len = 0;
  bool operator==(const StepFingerprint&) const = default;
  // "POST /v1/x (body sha256:ab12..., 17 bytes)"
  std::string describe() const;
};

struct StepRecord {
  StepKind kind = StepKind::kCall;
  uint64_t seq = 0;  // its place in its log, from 1 (assigned when appended)
  // kCall
  std::string key;  // the Idempotency-Key, empty for a call without one
  StepFingerprint request;
  std::optional<std::string> request_body;  // inline when small (replay input)
  std::string request_side;                 // else the side file holding it, if kept
  std::string caller;                       // JSON object: transport, uid / key_id
  int status = 0;
  std::string content_type;
  uint64_t answer_len = 0;
  uint32_t answer_crc = 0;
  std::string answer_side;  // side file name, empty when inline
  std::string answer;       // the body (read(): when asked for)
  std::string summary;      // JSON object: the result in a few fields (exit_code, ...)
  // kEvent
  std::string event;        // created, process_exit, ended, replay_started, replay_finished
  std::string detail;       // JSON object
  int64_t started_us = 0;   // unix microseconds: when the request arrived
  int64_t finished_us = 0;  // when its answer was complete; an event's time
};

// The event name of an intent record.
inline constexpr std::string_view kIntentEvent = "intent";
// A keyed call began: kind kEvent, event "intent", with key, request, caller and
// started_us (= finished_us) of the call, and no seq.
inline bool is_intent(const StepRecord& r) {
  return r.kind == StepKind::kEvent && r.event == kIntentEvent;
}
// The intent of a keyed call whose record is `call` (its answer not yet known).
StepRecord intent_of(const StepRecord& call);

namespace step_format {

constexpr char kFileMagic[8] = {'T', 'P', 'S', 'T', 'E', 'P', 'S', '\n'};
constexpr uint32_t kVersion = 2;
constexpr size_t kFileHeader = 16;
constexpr uint32_t kRecordMagic = 0x52535054;  // "TPSR" little-endian
constexpr size_t kRecordHeader = 12;
constexpr uint32_t kMaxRecord = 256u << 20;  // sanity bound on len

enum Tag : uint16_t {
  kKey = 1,
  kMethod = 2,
  kTarget = 3,
  kBodySha = 4,
  kBodyLen = 5,
  kRequestBody = 6,
  kRequestSide = 7,  // v2
  kCaller = 8,       // v2
  kStatus = 10,
  kContentType = 11,
  kAnswer = 12,
  kAnswerSide = 13,
  kAnswerLen = 14,
  kAnswerCrc = 15,
  kSummary = 16,  // v2
  kStarted = 20,
  kFinished = 21,
  kSeq = 22,     // v2
  kEvent = 30,   // v2
  kDetail = 31,  // v2
};

std::string file_header(uint32_t version = kVersion);
// The version of a file header, or an error (not a step log, or newer than kVersion).
Result<uint32_t> parse_file_header(std::string_view header);

uint32_t get_u32(const char* p);
// The whole record (envelope and payload). A call's answer goes inline when
// answer_inline, else the record names rec.answer_side.
std::string encode(const StepRecord& rec, bool answer_inline, std::string_view answer);
// The crc a record header must carry for this payload.
uint32_t record_crc(std::string_view payload);
Result<StepRecord> decode(std::string_view payload);

}  // namespace step_format
}  // namespace tp::node
