// StepSummary: an answer in a few fields, for the trajectory log's listing (what a
// step's result was without reading its output): the top-level scalars of a JSON
// answer (exit_code, signal, timed_out, path, size, pid, code, message, ...), the
// scalars of its nested objects one level down (a process's "result"), and for the
// base64 fields stdout, stderr and data their decoded sizes (stdout_bytes, ...).
// Strings are cut at 300 bytes; arrays are left out.
//
// The answer is scanned, never decoded into a DOM: a 16 MiB exec answer costs a
// pass over its bytes.
//
// Thread rules: pure functions; a StreamSummary is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tp::api {

// The summary of a JSON object answer as a JSON object, "" when it is not one.
std::string summarize_json(std::string_view body);

// The summary of an NDJSON exec stream (api/exec_stream.h), fed line by line: the
// fields of its exit (or error) event, plus stdout_bytes and stderr_bytes.
class StreamSummary {
 public:
  // One or more whole lines.
  void feed(std::string_view lines);
  std::string json() const;

 private:
  uint64_t out_ = 0, err_ = 0;
  std::string last_;  // the terminal event's summary
};

}  // namespace tp::api
