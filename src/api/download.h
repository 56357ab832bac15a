// Downloads that stream: a file read from the agent piece by piece, and a
// command's stdout (the tar of a directory), each forwarded to the HTTP client
// with flow control end to end, so that the daemon holds a bounded amount per
// download whatever the size (apparent size included: a sparse file's holes
// are read as zeros) and however slow the client.
//
//  - FileDownload pulls the file from the agent in pieces (1 MiB), and
//    asks for another only while fewer than kDepth pieces are being read or
//    wait for the client's socket: at most kDepth pieces are held at a time.
//  - CommandDownload starts the command with a window (ExecParams::window): the
//    agent reads no more of the command's output than was granted, and a grant
//    (credit) follows each piece written to the socket. What it holds is
//    bounded by the window; beyond kMaxUnwritten (an agent that ignores
//    windows) the download is cut off rather than buffered.
//
// Both answer small results (the first chunk is the whole file; the command
// ended within its first window) with one body and Content-Length, and errors
// before any byte with their status. Larger ones go as a chunked stream; a
// failure after it started (a read error, the cap reached, the command failing)
// aborts it: the connection closes without the last chunk, which every HTTP
// client reports as an error.
//
// Thread rules: the callbacks may come from any thread (agent strand, HTTP
// strand); each object serialises its own state.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/exec_control.h"
#include "api/http_server.h"
#include "common/result.h"
#include "node/service.h"

namespace tp::api {

class FileDownload : public std::enable_shared_from_this<FileDownload> {
 public:
  // One read: at most this much (kFileRead's limit).
  static constexpr uint64_t kPiece = 1u << 20;
  // Pieces being read or written at once: one goes to the client while the
  // next is read (a round trip to the agent costs more than the bytes on a
  // busy host). So a download holds at most kDepth * kPiece.
  static constexpr size_t kDepth = 2;

  // Reads `length` bytes at `offset`; answers on any thread (or inline).
  using ReadFn = std::function<void(uint64_t offset, uint64_t length,
                                    std::function<void(Result<node::FileChunk>)> done)>;

  // Answers `res` with the file at `path` (for messages) that `read` reads.
  // max_bytes caps the file's size: a file whose size (apparent, from the
  // first piece, before any byte is sent) is larger is answered 413, and one
  // that grows past it while streaming is cut off.
  static void start(std::string path, uint64_t max_bytes, ReadFn read,
                    std::shared_ptr<Responder> res);

  FileDownload(std::string path, uint64_t max_bytes, ReadFn read, std::shared_ptr<Responder> res)
      : path_(std::move(path)), max_(max_bytes), read_(std::move(read)), res_(std::move(res)) {}

 private:
  struct Slot {
    uint64_t offset;
    std::optional<Result<node::FileChunk>> got;
  };
  void pump();
  void on_piece(uint64_t offset, Result<node::FileChunk> r);
  void on_written(bool ok);
  void stop();
  // Under mu_: answers for the piece at the front; true when a write is due.
  bool handle_front(std::string* data);

  const std::string path_;
  const uint64_t max_;
  ReadFn read_;
  std::shared_ptr<Responder> res_;
  std::mutex mu_;
  std::deque<Slot> slots_;  // reads in flight or not handled yet, by offset
  uint64_t next_ = 0;       // offset of the next read
  uint64_t size_ = 0;       // the file's size as the latest piece reported
  uint64_t sent_ = 0;       // bytes handed to the responder
  bool sized_ = false;      // the first piece was handled
  bool started_ = false;    // the stream's head was sent
  bool writing_ = false;    // a piece waits for the socket
  bool last_ = false;       // the piece being written is the last one
  bool done_ = false;       // answered, aborted, or the client is gone
};

class CommandDownload : public std::enable_shared_from_this<CommandDownload> {
 public:
  // Bytes handed to the responder and not written yet beyond which the
  // download is cut off (a window the agent did not honour).
  static constexpr uint64_t kMaxUnwritten = 4u << 20;

  struct Options {
    std::string content_type = "application/octet-stream";
    uint64_t window = 1u << 20;  // also the most of stdout held before the answer starts
    uint64_t max_bytes = 0;      // stdout beyond this is refused (413) or cut off
    std::string what;            // for messages: "the tar of /x"
    // The error for a command that failed (exit code != 0) before the stream started.
    std::function<Error(const node::ExecOutcome&, const std::string& stderr_head)> failure;
  };
  using Control = ExecControl::Fns;

  CommandDownload(std::shared_ptr<Responder> res, Options opts, Control ctl)
      : res_(std::move(res)), opts_(std::move(opts)), ctl_(std::move(ctl)) {}

  // Callbacks for the command's exec (use the same window in its ExecParams).
  node::ExecCallbacks callbacks();
  // The exec started: credits and a kill wanted before are sent now; a client
  // that goes away from now on kills the command.
  void attach(uint32_t exec_id) { ctl_.attach(exec_id); }

  // For tests and metrics: bytes handed to the responder not yet written.
  uint64_t unwritten() {
    std::lock_guard lk(mu_);
    return unwritten_;
  }

 private:
  struct Actions {
    uint64_t credit = 0;
    bool kill = false;
  };
  void on_output(int stream, std::string_view data);
  void on_done(Result<node::ExecOutcome> r);
  void on_written(uint64_t n, bool ok);
  void on_abort();
  // Under mu_: hands `data` to the responder.
  void write(std::string data);
  // Under mu_: ends the download early (the command is killed).
  void stop(Actions& a);
  // Outside mu_: sends what `a` asks for (or keeps it until attach()).
  void apply(const Actions& a) {
    if (a.kill)
      ctl_.kill();
    else
      ctl_.credit(a.credit);
  }

  std::shared_ptr<Responder> res_;
  const Options opts_;
  ExecControl ctl_;
  std::mutex mu_;
  std::string head_;    // stdout held before the stream started
  std::string err_;     // the first 4 KiB of stderr
  uint64_t total_ = 0;  // stdout bytes seen
  uint64_t unwritten_ = 0;
  bool started_ = false;  // the stream's head was sent
  bool stopped_ = false;  // answered, aborted or the client is gone: output is dropped
};

}  // namespace tp::api
