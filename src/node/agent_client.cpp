// AgentClient over boost::asio: one stream_descriptor on a dup of the agent's
// fd, one strand that owns all state, a write queue, and a FrameReader.
// See agent_client.h for the promises; src/protocol/README.md for the protocol.
#include "node/agent_client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>

#include "node/agent_client_codec.h"
#include "protocol/wire.h"
#include "sys/fd.h"

namespace tp::node {
namespace {

namespace asio = boost::asio;
using proto::Message;
using proto::MsgType;
using proto::Tag;

constexpr size_t kReadChunk = 64u << 10;
// How long replayed answers of a resumed command wait for attach(): after it,
// nobody wants them; they are dropped and acknowledged.
constexpr auto kAttachWait = std::chrono::seconds(10);

// This process's session epoch (kHello EPOCH): the wall clock at first use,
// so that an agent can tell the sessions of different daemon runs apart.
uint64_t session_epoch() {
  static const uint64_t epoch = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v =
        static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
    return v ? v : 1;
  }();
  return epoch;
}

class AgentClientImpl final : public AgentClient {
 public:
  AgentClientImpl(asio::io_context& io, int fd, std::string sandbox_id)
      : strand_(asio::make_strand(io)),
        sd_(strand_),
        attach_timer_(strand_),
        sandbox_id_(std::move(sandbox_id)) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0) {
      dup_errno_ = errno;
      closed_ = true;
      return;
    }
    boost::system::error_code ec;
    sd_.assign(d, ec);
    boost::system::error_code nb_ec;
    sd_.non_blocking(true, nb_ec);  // do_read() drains with read(2) until EAGAIN
    if (ec) {
      ::close(d);
      dup_errno_ = ec.value();
      closed_ = true;
    }
  }

  void start(std::function<void(Result<void>)> on_ready) override {
    asio::post(strand_, [self = self(), cb = std::move(on_ready)]() mutable {
      if (self->closed_) {
        cb(std::unexpected(self->closed_error()));
        return;
      }
      self->on_ready_ = std::move(cb);
      Message hello(MsgType::kHello, 0);
      hello.add_u64(Tag::kEpoch, session_epoch());
      self->send(proto::encode(hello));
      self->do_read();
    });
  }

  void set_on_closed(std::function<void(const Error&)> cb) override {
    asio::post(strand_, [self = self(), cb = std::move(cb)]() mutable {
      if (self->closed_ && !self->closed_notified_) {
        self->closed_notified_ = true;
        cb(self->closed_error());
        return;
      }
      if (!self->closed_) self->on_closed_ = std::move(cb);
    });
  }

  uint32_t exec(const ExecRequest& req, ExecHandlers handlers) override {
    uint32_t id = new_id();
    pending_count_.fetch_add(1);
    asio::post(strand_, [self = self(), id, req = req, h = std::move(handlers)]() mutable {
      // A window the agent cannot honour is not asked for (credit() is then a no-op).
      if (!(self->features_ & proto::kFeatureCredit)) req.window = 0;
      // An agent that does not know the flag sends kStarted anyway: ignored then.
      req.quiet_start = !h.on_started;
      auto frames = codec::exec_frames(req, id);
      if (self->closed_ || !frames) {
        self->pending_count_.fetch_sub(1);
        h.on_done(std::unexpected(frames ? self->closed_error() : frames.error()));
        return;
      }
      Pending p;
      p.is_exec = true;
      p.exec = std::move(h);
      p.out_limit = req.output_limit;
      self->pending_.emplace(id, std::move(p));
      for (auto& f : *frames) self->send(std::move(f));
    });
    return id;
  }

  void send_stdin(uint32_t exec_id, std::string data, bool eof) override {
    asio::post(strand_, [self = self(), exec_id, data = std::move(data), eof] {
      if (self->closed_) return;
      for (auto& f : codec::stdin_frames(exec_id, data, eof)) self->send(std::move(f));
    });
  }

  void credit(uint32_t exec_id, uint64_t bytes) override {
    asio::post(strand_, [self = self(), exec_id, bytes] {
      // An agent without the feature would answer the unknown type with a
      // kError under this id, which would end the command.
      if (self->closed_ || !(self->features_ & proto::kFeatureCredit) || bytes == 0) return;
      auto it = self->pending_.find(exec_id);
      if (it == self->pending_.end() || !it->second.is_exec) return;
      Message m(MsgType::kCredit, exec_id);
      m.add_u64(Tag::kLength, bytes);
      self->send(proto::encode(m));
    });
  }

  void signal(uint32_t exec_id, int signo) override {
    asio::post(strand_, [self = self(), exec_id, signo] {
      if (self->closed_) return;
      Message m(MsgType::kSignal, exec_id);
      m.add_u64(Tag::kSigno, static_cast<uint64_t>(signo));
      self->send(proto::encode(m));
    });
  }

  void write_file(std::string path, std::string data, uint32_t mode, bool parents,
                  std::function<void(Result<uint64_t>)> cb) override {
    pending_count_.fetch_add(1);
    auto st = std::make_shared<WriteState>();
    st->path = std::move(path);
    st->data = std::move(data);
    st->mode = mode;
    st->parents = parents;
    st->cb = std::move(cb);
    asio::post(strand_, [self = self(), st] { self->write_step(st); });
  }

  void write_file_from(std::string path, ByteSource src, uint32_t mode, bool parents,
                       std::function<void(Result<uint64_t>)> cb) override {
    pending_count_.fetch_add(1);
    auto st = std::make_shared<WriteState>();
    st->path = std::move(path);
    st->src = std::move(src);
    st->mode = mode;
    st->parents = parents;
    st->cb = std::move(cb);
    asio::post(strand_, [self = self(), st] { self->write_step(st); });
  }

  void write_stdin(uint32_t exec_id, std::string data, bool eof,
                   std::function<void(Result<void>)> cb) override {
    pending_count_.fetch_add(1);
    asio::post(strand_,
               [self = self(), exec_id, data = std::move(data), eof, cb = std::move(cb)]() mutable {
                 auto done = [self, cb = std::move(cb)](Result<void> r) {
                   self->pending_count_.fetch_sub(1);
                   cb(std::move(r));
                 };
                 if (self->closed_) return done(std::unexpected(self->closed_error()));
                 if (!(self->features_ & proto::kFeatureStdinWrite)) {
                   for (auto& f : codec::stdin_frames(exec_id, data, eof)) self->send(std::move(f));
                   return done({});
                 }
                 Message m(MsgType::kStdinWrite, 0);
                 m.add_u64(Tag::kExecId, exec_id);
                 if (!data.empty()) m.add(Tag::kData, data);
                 if (eof) m.add_bool(Tag::kEof, true);
                 self->request(std::move(m), [done = std::move(done)](Result<Message> r) mutable {
                   if (!r) return done(std::unexpected(r.error()));
                   done({});
                 });
               });
  }

  void read_file(std::string path, uint64_t max_bytes,
                 std::function<void(Result<std::string>)> cb) override {
    pending_count_.fetch_add(1);
    auto st = std::make_shared<ReadState>();
    st->path = std::move(path);
    st->max = max_bytes;
    st->cb = std::move(cb);
    asio::post(strand_, [self = self(), st] { self->read_step(st); });
  }

  void read_chunk(std::string path, uint64_t offset, uint64_t length,
                  std::function<void(Result<FileChunk>)> cb) override {
    Message m(MsgType::kFileRead, 0);
    m.add(Tag::kPath, path);
    m.add_u64(Tag::kOffset, offset);
    m.add_u64(Tag::kLength, std::min<uint64_t>(length, proto::kMaxChunk));
    simple(std::move(m), [cb = std::move(cb)](Result<Message> r) {
      if (!r) return cb(std::unexpected(r.error()));
      FileChunk c;
      c.size = r->u64(Tag::kSize);
      // Moved out of the answer: a chunk is held once.
      for (auto& [tag, v] : r->fields)
        if (tag == Tag::kData) {
          c.data = std::move(v);
          break;
        }
      cb(std::move(c));
    });
  }

  void stat(std::string path, std::function<void(Result<FileEntry>)> cb) override {
    Message m(MsgType::kFileStat, 0);
    m.add(Tag::kPath, path);
    simple(std::move(m), [path, cb = std::move(cb)](Result<Message> r) {
      if (!r) return cb(std::unexpected(r.error()));
      cb(codec::entry_from(r->fields, path));
    });
  }

  void list(std::string path, std::function<void(Result<std::vector<FileEntry>>)> cb) override {
    Message m(MsgType::kFileList, 0);
    m.add(Tag::kPath, path);
    simple(std::move(m), [path, cb = std::move(cb)](Result<Message> r) {
      if (!r) return cb(std::unexpected(r.error()));
      std::vector<FileEntry> out;
      std::string base = path;
      while (base.size() > 1 && base.back() == '/') base.pop_back();
      for (auto v : r->all(Tag::kEntry)) {
        std::vector<std::pair<Tag, std::string>> fields;
        if (!proto::decode_fields(v, &fields))
          return cb(fail(Code::kInternal, "agent: malformed directory entry"));
        Message e;
        e.fields = fields;
        std::string name = e.str(Tag::kName);
        std::string fallback = base == "/" ? "/" + name : base + "/" + name;
        out.push_back(codec::entry_from(fields, fallback));
      }
      cb(std::move(out));
    });
  }

  void remove(std::string path, bool recursive, std::function<void(Result<void>)> cb) override {
    Message m(MsgType::kFileRemove, 0);
    m.add(Tag::kPath, path);
    if (recursive) m.add_bool(Tag::kRecursive, true);
    simple(std::move(m), void_answer(std::move(cb)));
  }

  void mkdir(std::string path, uint32_t mode, bool parents,
             std::function<void(Result<void>)> cb) override {
    Message m(MsgType::kMkdir, 0);
    m.add(Tag::kPath, path);
    if (mode) m.add_u64(Tag::kMode, mode);
    if (parents) m.add_bool(Tag::kParents, true);
    simple(std::move(m), void_answer(std::move(cb)));
  }

  void ping(std::function<void(Result<void>)> cb) override {
    simple(Message(MsgType::kPing, 0), void_answer(std::move(cb)));
  }

  void close() override {
    // From here on nothing the agent sends is handed to a handler, so nothing
    // more is acknowledged: it all goes to the agent's next session. A frame
    // being handled on another thread right now is waited for (its ack still goes
    // out), so once close() returns no answer handler of this client runs again;
    // only the final on_done/reply callbacks with kUnavailable follow, on the strand.
    // From a handler of this client (on the strand) the rest of its batch is skipped.
    closing_.store(true);
    if (!strand_.running_in_this_thread()) {
      std::lock_guard wait_for_handler(handler_mu_);
    }
    asio::post(strand_, [self = self()] {
      // What was handled before close() is acknowledged (the read loop posts its ack,
      // which may come after this).
      self->maybe_ack();
      self->fail_all(Error{Code::kUnavailable, 0, "agent connection closed by the node"});
    });
  }

  size_t pending() const override { return pending_count_.load(); }

  std::vector<ResumedCommand> resumed() const override {
    std::lock_guard lock(resumed_mu_);
    return resumed_list_;
  }

  Result<void> attach(uint32_t exec_id, ExecHandlers handlers) override {
    {
      std::lock_guard lock(resumed_mu_);
      auto it = std::find_if(resumed_list_.begin(), resumed_list_.end(),
                             [&](const ResumedCommand& c) { return c.id == exec_id; });
      if (it == resumed_list_.end() || attachable_.erase(exec_id) == 0)
        return fail(Code::kNotFound, "command " + std::to_string(exec_id) + " of " + sandbox_id_ +
                                         " was not resumed, or was attached or abandoned already");
    }
    pending_count_.fetch_add(1);
    asio::post(strand_, [self = self(), exec_id, h = std::move(handlers)]() mutable {
      auto it = self->unattached_.find(exec_id);
      std::vector<Message> backlog;
      if (it != self->unattached_.end()) {
        backlog = std::move(it->second);
        self->unattached_.erase(it);
      }
      if (self->closed_) {
        self->pending_count_.fetch_sub(1);
        if (h.on_done) h.on_done(std::unexpected(self->closed_error()));
        return;
      }
      Pending p;
      p.is_exec = true;
      p.exec = std::move(h);
      self->pending_.emplace(exec_id, std::move(p));
      for (auto& m : backlog) {
        uint64_t seq = m.u64(Tag::kSeq);
        self->buffered_seqs_.erase(seq);
        {
          std::lock_guard lk(self->handler_mu_);
          // Closed meanwhile: the rest is not handled, so not acknowledged.
          if (self->closed_ || self->closing_.load()) break;
          self->dispatch(std::move(m));
        }
        // Handled now, so acknowledged below: an agent at its cap of
        // unacknowledged output sends nothing more that would carry the ack.
        if (seq > self->last_seq_) self->last_seq_ = seq;
      }
      self->maybe_ack();
    });
    return {};
  }

 private:
  using Reply = std::function<void(Result<Message>)>;
  struct Pending {
    bool is_exec = false;
    ExecHandlers exec;
    Reply reply;
    // An exec's output limit per stream (unknown for a resumed command) and what
    // arrived of stdout and stderr.
    uint64_t out_limit = UINT64_MAX;
    uint64_t out[2] = {0, 0};
  };
  struct WriteState {
    std::string path, data;
    ByteSource src;  // set: the chunks come from it instead of `data`
    uint32_t mode = 0;
    bool parents = false;
    size_t off = 0;
    std::function<void(Result<uint64_t>)> cb;
    uint64_t size() const { return src.read ? src.size : data.size(); }
  };
  struct ReadState {
    std::string path, data;
    uint64_t max = 0;
    std::function<void(Result<std::string>)> cb;
  };

  std::shared_ptr<AgentClientImpl> self() {
    return std::static_pointer_cast<AgentClientImpl>(shared_from_this());
  }

  // Ids continue above every id the agent still knows (kReady HIGH_ID).
  void ids_above(uint64_t high) {
    if (high >= 0xffffffffull) return;
    uint32_t want = static_cast<uint32_t>(high) + 1;
    uint32_t cur = next_id_.load();
    while (cur < want && !next_id_.compare_exchange_weak(cur, want)) {
    }
  }

  uint32_t new_id() {
    for (;;) {
      uint32_t id = next_id_.fetch_add(1);
      if (id != 0) return id;  // 0 is the agent's kReady
    }
  }

  Error closed_error() const {
    if (dup_errno_) return Error{Code::kUnavailable, dup_errno_, "agent fd of " + sandbox_id_};
    return close_reason_.context.empty()
               ? Error{Code::kUnavailable, 0, "agent connection of " + sandbox_id_ + " closed"}
               : close_reason_;
  }

  static std::function<void(Result<Message>)> void_answer(std::function<void(Result<void>)> cb) {
    return [cb = std::move(cb)](Result<Message> r) {
      if (!r) return cb(std::unexpected(r.error()));
      cb({});
    };
  }

  // A request with one answer (kOk or kError); counted in pending() until answered.
  void simple(Message m, Reply cb) {
    pending_count_.fetch_add(1);
    asio::post(strand_, [self = self(), m = std::move(m), cb = std::move(cb)]() mutable {
      self->request(std::move(m), [self, cb = std::move(cb)](Result<Message> r) {
        self->pending_count_.fetch_sub(1);
        cb(std::move(r));
      });
    });
  }

  // On the strand: registers `cb` under a new id and sends `m`. The callback
  // runs on the strand, exactly once (answer, or failure of the connection).
  void request(Message m, Reply cb) {
    if (closed_) return cb(std::unexpected(closed_error()));
    m.id = new_id();
    std::string bytes = proto::encode(m);
    if (bytes.size() > proto::kMaxFrame)
      return cb(fail(Code::kPayloadTooLarge, "request exceeds one frame"));
    Pending p;
    p.reply = std::move(cb);
    pending_.emplace(m.id, std::move(p));
    send(std::move(bytes));
  }

  void write_step(std::shared_ptr<WriteState> st) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(st->size() - st->off, proto::kMaxChunk));
    Message m(MsgType::kFileWrite, 0);
    m.add(Tag::kPath, st->path);
    if (st->src.read) {
      auto piece = st->src.read(st->off, n);
      if (!piece || piece->size() != n) {
        pending_count_.fetch_sub(1);
        return st->cb(piece ? fail(Code::kInternal, "upload source ended early")
                            : std::unexpected(piece.error()));
      }
      m.add(Tag::kData, *piece);
    } else {
      m.add(Tag::kData, std::string_view(st->data).substr(st->off, n));
    }
    if (st->mode) m.add_u64(Tag::kMode, st->mode);
    if (st->off == 0) {
      if (st->parents) m.add_bool(Tag::kParents, true);
    } else {
      m.add_bool(Tag::kAppend, true);
    }
    // Chunks go one at a time: an append after a failed chunk must not land.
    request(std::move(m), [self = self(), st, n](Result<Message> r) {
      if (!r) {
        self->pending_count_.fetch_sub(1);
        return st->cb(std::unexpected(r.error()));
      }
      st->off += n;
      if (st->off >= st->size()) {
        self->pending_count_.fetch_sub(1);
        return st->cb(r->u64(Tag::kSize));
      }
      self->write_step(st);
    });
  }

  void read_step(std::shared_ptr<ReadState> st) {
    Message m(MsgType::kFileRead, 0);
    m.add(Tag::kPath, st->path);
    m.add_u64(Tag::kOffset, st->data.size());
    m.add_u64(Tag::kLength, proto::kMaxChunk);
    request(std::move(m), [self = self(), st](Result<Message> r) {
      auto done = [&](Result<std::string> v) {
        self->pending_count_.fetch_sub(1);
        st->cb(std::move(v));
      };
      if (!r) return done(std::unexpected(r.error()));
      uint64_t size = r->u64(Tag::kSize);
      auto data = r->get(Tag::kData).value_or("");
      if (size > st->max || st->data.size() + data.size() > st->max)
        return done(fail(Code::kPayloadTooLarge,
                         "file " + st->path + " exceeds " + std::to_string(st->max) + " bytes"));
      st->data.append(data);
      // Stop at EOF (a short or empty chunk) or at the size the agent reported;
      // files that report size 0 but have content (/proc) are read to EOF.
      bool eof = data.size() < proto::kMaxChunk || (size > 0 && st->data.size() >= size);
      if (eof) return done(std::move(st->data));
      self->read_step(st);
    });
  }

  void send(std::string bytes) {
    if (closed_) return;
    wq_.push_back(std::move(bytes));
    do_write();
  }

  void do_write() {
    if (writing_ || wq_.empty() || closed_) return;
    writing_ = true;
    asio::async_write(
        sd_, asio::buffer(wq_.front()),
        asio::bind_executor(strand_, [self = self()](boost::system::error_code ec, size_t) {
          self->writing_ = false;
          if (ec) {
            if (!self->closed_)
              self->fail_all(
                  Error{Code::kUnavailable, ec.value(), "write to agent of " + self->sandbox_id_});
            return;
          }
          self->wq_.pop_front();
          self->do_write();
        }));
  }

  // Waits for readability, then drains the socket into a per-thread buffer: an
  // idle connection holds no read buffer of its own (thousands of idle sandboxes).
  void do_read() {
    if (closed_) return;
    sd_.async_wait(
        asio::posix::stream_descriptor::wait_read,
        asio::bind_executor(strand_, [self = self()](boost::system::error_code ec) {
          if (self->closed_) return;
          if (ec) {
            self->fail_all(
                Error{Code::kUnavailable, ec.value(), "wait on agent of " + self->sandbox_id_});
            return;
          }
          thread_local std::vector<char> buf(kReadChunk);
          for (;;) {
            ssize_t n = ::read(self->sd_.native_handle(), buf.data(), buf.size());
            if (n > 0) {
              self->reader_.feed(buf.data(), static_cast<size_t>(n));
              if (static_cast<size_t>(n) < buf.size()) break;
              continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            Error e = n == 0 ? Error{Code::kUnavailable, 0,
                                     "agent of " + self->sandbox_id_ + " closed the connection"}
                             : Error{Code::kUnavailable, errno,
                                     "read from agent of " + self->sandbox_id_};
            // Deliver what arrived before the end, then fail the rest.
            while (auto m = self->reader_.next())
              if (!self->deliver(std::move(*m))) break;
            if (!self->closed_) self->fail_all(e);
            return;
          }
          while (!self->closed_ && !self->violation_) {
            auto m = self->reader_.next();
            if (!m || !self->deliver(std::move(*m))) break;
          }
          if (self->closed_) return;
          if (self->violation_) {
            self->fail_all(Error{
                Code::kUnavailable, 0,
                "protocol error from agent of " + self->sandbox_id_ + ": " + *self->violation_});
            return;
          }
          // After the handlers returned: the agent may drop these answers and
          // read more of the commands' output (its back-pressure reaches the node).
          // Posted, so that what the handlers queued on this io_context (an answer
          // to the HTTP client) goes out before the ack wakes the agent.
          asio::post(self->strand_, [self] { self->maybe_ack(); });
          if (self->reader_.failed()) {
            self->fail_all(Error{Code::kUnavailable, 0,
                                 "protocol error from agent of " + self->sandbox_id_ + ": " +
                                     self->reader_.error()});
            return;
          }
          self->do_read();
        }));
  }

  // Acknowledges every held frame handled so far, up to the first one still
  // buffered for a resumed command not attached yet.
  void maybe_ack() {
    if (closed_) return;
    uint64_t to = last_seq_;
    if (!buffered_seqs_.empty()) to = std::min(to, *buffered_seqs_.begin() - 1);
    if (to <= acked_) return;
    acked_ = to;
    Message a(MsgType::kAck, 0);
    a.add_u64(Tag::kSeq, to);
    send(proto::encode(a));
  }

  // Nobody attached to these resumed commands in time: drop what they had
  // (unless close() was called: then they are left to the next session).
  void abandon_unattached() {
    if (closing_.load()) return;
    {
      std::lock_guard lock(resumed_mu_);
      attachable_.clear();
    }
    for (auto& [id, msgs] : unattached_)
      for (auto& m : msgs) {
        uint64_t seq = m.u64(Tag::kSeq);
        buffered_seqs_.erase(seq);
        if (seq > last_seq_) last_seq_ = seq;  // dropped is handled (see attach)
      }
    unattached_.clear();
    maybe_ack();
  }

  // Hands one frame to on_message() unless close() was called or the agent broke the
  // protocol: false then, and nothing after it is handled (or acknowledged) in this
  // session.
  bool deliver(Message m) {
    std::lock_guard lk(handler_mu_);
    // Nothing after a frame the agent had no right to send (violation_) is handled.
    if (closing_.load() || violation_) return false;
    on_message(std::move(m));
    return !violation_;
  }

  void on_message(Message m) {
    uint64_t seq = m.u64(Tag::kSeq, 0);
    if (seq) {
      auto u = unattached_.find(m.id);
      if (u != unattached_.end()) {
        buffered_seqs_.insert(seq);
        u->second.push_back(std::move(m));
        return;
      }
    }
    dispatch(std::move(m));
    if (seq > last_seq_) last_seq_ = seq;
  }

  void dispatch(Message m) {
    if (m.type == MsgType::kResumed) {
      if (ready_) return;
      ResumedCommand c;
      c.id = m.id;
      c.meta = m.str(Tag::kMeta);
      c.running = m.flag(Tag::kRunning);
      c.pid = static_cast<uint32_t>(m.u64(Tag::kPid));
      unattached_[c.id];
      std::lock_guard lock(resumed_mu_);
      attachable_.insert(c.id);
      resumed_list_.push_back(std::move(c));
      return;
    }
    if (m.type == MsgType::kReady) {
      if (!ready_) {
        ready_ = true;
        features_ = m.u64(Tag::kFeatures, 0);
        ids_above(m.u64(Tag::kHighId, 0));
        if (!unattached_.empty()) {
          attach_timer_.expires_after(kAttachWait);
          attach_timer_.async_wait(
              asio::bind_executor(strand_, [self = self()](boost::system::error_code ec) {
                if (!ec) self->abandon_unattached();
              }));
        }
        if (auto cb = std::exchange(on_ready_, nullptr)) cb({});
      }
      return;
    }
    auto it = pending_.find(m.id);
    if (it == pending_.end()) return;  // abandoned or unknown: ignore
    Pending& p = it->second;
    if (p.is_exec) {
      switch (m.type) {
        case MsgType::kStarted:
          if (p.exec.on_started) p.exec.on_started(static_cast<uint32_t>(m.u64(Tag::kPid)));
          return;
        case MsgType::kOutput: {
          const int stream = static_cast<int>(m.u64(Tag::kStream, 1));
          const std::string_view data = m.get(Tag::kData).value_or("");
          // The agent forwards at most the command's limit per stream. More is an agent
          // the node cannot trust (one a microVM's guest took over, say): the session
          // ends (after this frame, outside the handlers) instead of the daemon holding
          // whatever it sends.
          uint64_t& got = p.out[stream == 2 ? 1 : 0];
          got += data.size();
          if (got > p.out_limit) {
            violation_ =
                "more output than the command's limit of " + std::to_string(p.out_limit) + " bytes";
            return;
          }
          if (p.exec.on_output) p.exec.on_output(stream, data);
          return;
        }
        case MsgType::kExit:
        case MsgType::kError: {
          auto done = std::move(p.exec.on_done);
          pending_.erase(it);
          pending_count_.fetch_sub(1);
          if (m.type == MsgType::kExit) {
            done(codec::exec_result_from(m));
          } else {
            done(std::unexpected(codec::error_from(m)));
          }
          return;
        }
        default:
          return;
      }
    }
    if (m.type != MsgType::kOk && m.type != MsgType::kError) return;
    auto reply = std::move(p.reply);
    pending_.erase(it);
    if (m.type == MsgType::kOk) {
      reply(std::move(m));
    } else {
      reply(std::unexpected(codec::error_from(m)));
    }
  }

  // Ends the connection: every pending request fails with `why` (kUnavailable),
  // then on_ready (if still waiting) and on_closed are told.
  void fail_all(Error why) {
    if (closed_) return;
    closed_ = true;
    close_reason_ = why;
    boost::system::error_code ignored;
    sd_.close(ignored);
    attach_timer_.cancel();
    unattached_.clear();
    buffered_seqs_.clear();
    {
      std::lock_guard lock(resumed_mu_);
      attachable_.clear();
    }
    if (!writing_) wq_.clear();
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, p] : pending) {
      if (p.is_exec) {
        pending_count_.fetch_sub(1);
        if (p.exec.on_done) p.exec.on_done(std::unexpected(why));
      } else if (p.reply) {
        p.reply(std::unexpected(why));
      }
    }
    if (auto cb = std::exchange(on_ready_, nullptr)) cb(std::unexpected(why));
    if (auto cb = std::exchange(on_closed_, nullptr)) {
      closed_notified_ = true;
      cb(why);
    }
  }

  asio::strand<asio::io_context::executor_type> strand_;
  asio::posix::stream_descriptor sd_;
  asio::steady_timer attach_timer_;
  std::string sandbox_id_;
  int dup_errno_ = 0;
  // Everything below is touched only on strand_.
  proto::FrameReader reader_;
  std::deque<std::string> wq_;
  bool writing_ = false;
  bool closed_ = false;
  bool closed_notified_ = false;
  bool ready_ = false;
  uint64_t features_ = 0;  // kReady FEATURES
  Error close_reason_;
  std::function<void(Result<void>)> on_ready_;
  std::function<void(const Error&)> on_closed_;
  std::map<uint32_t, Pending> pending_;
  // Sessions: answers of resumed commands not attached yet, and acks.
  std::map<uint32_t, std::vector<Message>> unattached_;
  std::set<uint64_t> buffered_seqs_;
  uint64_t last_seq_ = 0;  // highest SEQ handled
  uint64_t acked_ = 0;     // highest SEQ acknowledged
  // Guarded by resumed_mu_ (read from any thread).
  mutable std::mutex resumed_mu_;
  std::vector<ResumedCommand> resumed_list_;
  std::set<uint32_t> attachable_;
  // Touched from any thread.
  std::atomic<bool> closing_{false};  // close() was called
  // Set (on strand_) by a frame the agent had no right to send; the reader ends the
  // session after the frame's handler returns.
  std::optional<std::string> violation_;
  // Held while a frame is handled (deliver(), attach()'s backlog): close() from
  // another thread takes it to wait for that handler.
  std::mutex handler_mu_;
  std::atomic<uint32_t> next_id_{1};
  std::atomic<size_t> pending_count_{0};
};

}  // namespace

std::shared_ptr<AgentClient> AgentClient::create(boost::asio::io_context& io, int fd,
                                                 std::string sandbox_id) {
  return std::make_shared<AgentClientImpl>(io, fd, std::move(sandbox_id));
}

Result<std::shared_ptr<AgentClient>> AgentClient::connect(boost::asio::io_context& io,
                                                          const std::string& address,
                                                          std::string sandbox_id) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (address.empty() || address[0] != '/')
    return fail(Code::kInvalidArgument,
                "agent address of " + sandbox_id + " is not an absolute path: " + address);
  std::string path = address;
  sys::UniqueFd dir_fd;
  if (path.size() >= sizeof(sa.sun_path)) {
    // Too long for sun_path: connect through the directory's fd.
    size_t slash = path.rfind('/');
    std::string dir = slash == 0 ? "/" : path.substr(0, slash);
    dir_fd.reset(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd) return sys_fail("open(" + dir + ", O_PATH) for the agent of " + sandbox_id);
    path = "/proc/self/fd/" + std::to_string(dir_fd.get()) + path.substr(slash);
    if (path.size() >= sizeof(sa.sun_path))
      return fail(Code::kInvalidArgument, "agent socket name too long: " + address);
  }
  std::memcpy(sa.sun_path, path.data(), path.size());
  sys::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return sys_fail("socket(AF_UNIX) for " + sandbox_id);
  int rc;
  do rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int e = errno;
    // No listener: the agent (and so the sandbox) is gone.
    Code c = (e == ECONNREFUSED || e == ENOENT) ? Code::kNotFound : Code::kUnavailable;
    return std::unexpected(Error{c, e, "connect(" + address + ") to the agent of " + sandbox_id});
  }
  return std::shared_ptr<AgentClient>(
      std::make_shared<AgentClientImpl>(io, fd.get(), std::move(sandbox_id)));
}

}  // namespace tp::node
