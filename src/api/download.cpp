#include "api/download.h"

#include <vector>

#include "common/log.h"
#include "protocol/wire.h"

namespace tp::api {

namespace {

constexpr size_t kMaxStderr = 4096;

Error too_large(const std::string& what, uint64_t size, uint64_t max) {
  return Error{Code::kPayloadTooLarge, 0,
               what + " is " + std::to_string(size) + " bytes, over the download limit of " +
                   std::to_string(max) +
                   " bytes (--max-download-mb; the apparent size counts: a sparse file's holes "
                   "are sent as zeros)"};
}

}  // namespace

// ---- FileDownload --------------------------------------------------------------------

void FileDownload::start(std::string path, uint64_t max_bytes, ReadFn read,
                         std::shared_ptr<Responder> res) {
  auto d = std::make_shared<FileDownload>(std::move(path), max_bytes, std::move(read), res);
  // Weak: the responder keeps its abort callback, which must not keep us.
  res->set_on_abort([w = std::weak_ptr<FileDownload>(d)] {
    if (auto d = w.lock()) d->stop();
  });
  d->pump();
}

void FileDownload::stop() {
  std::lock_guard lk(mu_);
  done_ = true;
  slots_.clear();
}

// Hands on what is due (the next piece in order, when the socket is free) and
// issues the reads there is room for. Reads and writes are started outside the
// lock: a read may answer inline.
void FileDownload::pump() {
  std::string data;
  bool write = false;
  std::vector<uint64_t> reads;
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    if (!writing_ && !slots_.empty() && slots_.front().got) write = handle_front(&data);
    if (done_) return;
    // Before the first piece the size is unknown: one read. After it, reads go
    // ahead up to the size reported; a file that reports none (/proc) is read
    // one piece at a time to its end.
    auto room = [&] {
      if (last_ || slots_.size() + (writing_ ? 1 : 0) >= kDepth) return false;
      if (!sized_) return next_ == 0;
      if (size_ == 0) return slots_.empty() && !writing_;
      return next_ < size_;
    };
    while (room()) {
      slots_.push_back(Slot{next_, std::nullopt});
      reads.push_back(next_);
      next_ += kPiece;
    }
  }
  if (write)
    res_->write_chunk(std::move(data),
                      [self = shared_from_this()](bool ok) { self->on_written(ok); });
  for (uint64_t off : reads)
    read_(off, kPiece, [self = shared_from_this(), off](Result<node::FileChunk> r) {
      self->on_piece(off, std::move(r));
    });
}

void FileDownload::on_piece(uint64_t offset, Result<node::FileChunk> r) {
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    for (auto& s : slots_)
      if (s.offset == offset) s.got.emplace(std::move(r));
  }
  pump();
}

bool FileDownload::handle_front(std::string* out) {
  Slot s = std::move(slots_.front());
  slots_.pop_front();
  auto finish = [&] {
    done_ = true;
    slots_.clear();
    return false;
  };
  Result<node::FileChunk>& r = *s.got;
  if (!r) {
    if (!started_) {
      res_->send_error(r.error());
    } else {
      spdlog::warn("download of {} cut off after {} bytes: {}", path_, sent_, r.error().message());
      res_->abort_stream();
    }
    return finish();
  }
  uint64_t n = r->data.size();
  size_ = r->size;
  // Checked from the first piece's answer, before any byte goes out.
  if (!sized_ && r->size > max_) {
    res_->send_error(too_large("file " + path_, r->size, max_));
    return finish();
  }
  sized_ = true;
  if (sent_ + n > max_) {
    // Grew past the limit meanwhile (or reports no size, as /proc files do).
    if (!started_) {
      res_->send_error(too_large("file " + path_, sent_ + n, max_));
    } else {
      spdlog::warn("download of {} cut off: it grew past {} bytes", path_, max_);
      res_->abort_stream();
    }
    return finish();
  }
  // The end: a short piece, or the size the agent reported (files that report
  // 0 but have content, as in /proc, are read to their end).
  last_ = n < kPiece || (r->size > 0 && s.offset + n >= r->size);
  sent_ += n;
  if (!started_ && last_) {
    res_->send(200, "application/octet-stream", std::move(r->data));
    return finish();
  }
  if (!started_) {
    started_ = true;
    res_->start_stream(200, "application/octet-stream");
  }
  if (n == 0) {
    res_->end_stream();
    return finish();
  }
  if (last_) slots_.clear();  // reads beyond the end (the file shrank) are not needed
  writing_ = true;
  *out = std::move(r->data);
  return true;
}

void FileDownload::on_written(bool ok) {
  {
    std::lock_guard lk(mu_);
    writing_ = false;
    if (done_) return;
    if (!ok) {  // the client is gone (or HEAD): nothing more to read
      done_ = true;
      slots_.clear();
      return;
    }
    if (last_) {
      done_ = true;
      res_->end_stream();
      return;
    }
  }
  pump();
}

// ---- CommandDownload -----------------------------------------------------------------

node::ExecCallbacks CommandDownload::callbacks() {
  res_->set_on_abort([w = weak_from_this()] {
    if (auto d = w.lock()) d->on_abort();
  });
  node::ExecCallbacks cb;
  cb.on_output = [self = shared_from_this()](int stream, std::string_view data) {
    self->on_output(stream, data);
  };
  cb.on_done = [self = shared_from_this()](Result<node::ExecOutcome> r) {
    self->on_done(std::move(r));
  };
  return cb;
}

void CommandDownload::stop(Actions& a) {
  stopped_ = true;
  a.kill = true;
  std::string().swap(head_);
}

void CommandDownload::write(std::string data) {
  uint64_t n = data.size();
  unwritten_ += n;
  res_->write_chunk(std::move(data), [w = weak_from_this(), n](bool ok) {
    if (auto d = w.lock()) d->on_written(n, ok);
  });
}

void CommandDownload::on_output(int stream, std::string_view data) {
  Actions a;
  {
    std::lock_guard lk(mu_);
    if (stream == 2) {
      // Kept for the error message only; its window is given back at once.
      if (err_.size() < kMaxStderr) err_.append(data.substr(0, kMaxStderr - err_.size()));
      a.credit = data.size();
    } else if (!stopped_) {
      total_ += data.size();
      if (opts_.max_bytes && total_ > opts_.max_bytes) {
        if (started_) {
          spdlog::warn("{}: cut off at the download limit of {} bytes", opts_.what,
                       opts_.max_bytes);
          res_->abort_stream();
        } else {
          res_->send_error(too_large(opts_.what, total_, opts_.max_bytes));
        }
        stop(a);
      } else if (!started_) {
        head_.append(data);
        // The window is used up: what was held goes out, and its credit comes
        // back as it is written.
        if (head_.size() >= opts_.window) {
          started_ = true;
          res_->start_stream(200, opts_.content_type);
          write(std::exchange(head_, {}));
        }
      } else {
        write(std::string(data));
      }
      if (!stopped_ && unwritten_ > kMaxUnwritten) {
        spdlog::warn(
            "{}: cut off: {} bytes wait for the client, more than the window allows "
            "(an agent without flow control?)",
            opts_.what, unwritten_);
        res_->abort_stream();
        stop(a);
      }
    }
  }
  apply(a);
}

void CommandDownload::on_done(Result<node::ExecOutcome> r) {
  std::lock_guard lk(mu_);
  if (stopped_) return;  // answered already, or killed because the download ended
  stopped_ = true;
  bool failed = !r || r->result.exit_code != 0 || r->result.stdout_truncated;
  if (!failed) {
    if (started_)
      res_->end_stream();
    else
      res_->send(200, opts_.content_type, std::move(head_));
    return;
  }
  if (!started_) {
    if (!r) return res_->send_error(r.error());
    if (r->result.exit_code != 0) return res_->send_error(opts_.failure(*r, err_));
    return res_->send_error(too_large(opts_.what, total_, opts_.max_bytes));
  }
  spdlog::warn(
      "{}: failed after its answer started; cut off: {}", opts_.what,
      !r ? r.error().message()
         : "exit code " + std::to_string(r->result.exit_code) + ": " + err_.substr(0, 300));
  res_->abort_stream();
}

void CommandDownload::on_written(uint64_t n, bool ok) {
  Actions a;
  {
    std::lock_guard lk(mu_);
    unwritten_ -= n;
    if (stopped_) return;
    if (ok)
      a.credit = n;
    else
      stop(a);  // the client is gone
  }
  apply(a);
}

void CommandDownload::on_abort() {
  Actions a;
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    stop(a);
  }
  apply(a);
}

}  // namespace tp::api
