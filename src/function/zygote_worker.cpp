#include "function/zygote_worker.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <future>
#include <map>
#include <mutex>
#include <optional>

#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "node/agent_client.h"

namespace tp::function {

namespace asio = boost::asio;
using zygote::Out;

namespace {

class ZygoteWorker final : public Worker, public std::enable_shared_from_this<ZygoteWorker> {
 public:
  ZygoteWorker(asio::io_context& io, std::string id, std::unique_ptr<runtime::SandboxInstance> inst,
               std::shared_ptr<node::UidRanges> ranges, uint32_t base, std::shared_ptr<void> pin)
      : io_(io),
        id_(std::move(id)),
        inst_(std::move(inst)),
        ranges_(std::move(ranges)),
        base_(base),
        pin_(std::move(pin)) {}
  ~ZygoteWorker() override { destroy(); }

  const std::string& id() const override { return id_; }

  Result<void> boot(const WorkerHostOptions& opts) {
    agent_ = node::AgentClient::create(io_, inst_->agent_fd(), id_);
    inst_->close_agent_fd();
    std::promise<Result<void>> agent_ready;
    agent_->start([&agent_ready](Result<void> r) { agent_ready.set_value(std::move(r)); });
    auto f = agent_ready.get_future();
    if (f.wait_for(opts.start_timeout) != std::future_status::ready)
      return fail(Code::kUnavailable, "function worker " + id_ + ": the agent did not answer");
    TP_TRY(f.get());
    std::weak_ptr<ZygoteWorker> weak = shared_from_this();
    agent_->set_on_closed([weak](const Error& e) {
      if (auto self = weak.lock()) self->lose(e);
    });
    node::ExecRequest req;
    req.argv = {"/usr/bin/python3", "-c", opts.zygote_source};
    req.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
               "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"};
    req.cwd = "/";
    req.output_limit = UINT64_MAX;  // the zygote's stdout carries every call's output
    req.stdin_open = true;
    req.stdin_data = zygote::encode_frame(zygote::In::kInit, 0, zygote::encode_init(opts.init), "");
    req.meta = "tidepool-fn-zygote";
    node::ExecHandlers h;
    h.on_output = [weak](int stream, std::string_view data) {
      if (auto self = weak.lock()) self->on_output(stream, data);
    };
    h.on_done = [weak](Result<node::ExecResult> r) {
      auto self = weak.lock();
      if (!self) return;
      std::string why = r ? "the zygote exited (status " + std::to_string(r->exit_code) +
                                ", signal " + std::to_string(r->signal) + ")"
                          : "the zygote's command failed: " + r.error().message();
      self->lose(Error{Code::kUnavailable, 0, "function worker " + self->id_ + ": " + why});
    };
    auto ready = ready_.get_future();
    exec_id_ = agent_->exec(req, std::move(h));
    if (ready.wait_for(opts.start_timeout) != std::future_status::ready)
      return fail(Code::kUnavailable, "function worker " + id_ +
                                          ": the zygote did not start within " +
                                          std::to_string(opts.start_timeout.count()) + " s");
    return ready.get();
  }

  uint32_t start(const zygote::CallMeta& meta, std::string payload, Done done) override {
    uint32_t call;
    {
      std::lock_guard lock(mu_);
      call = next_call_++;
      if (lost_) {
        asio::post(io_, [done = std::move(done), e = *lost_] { done(std::unexpected(e)); });
        return call;
      }
      Call c;
      c.done = std::move(done);
      c.output_bytes = meta.output_bytes;
      calls_.emplace(call, std::move(c));
    }
    agent_->send_stdin(
        exec_id_, zygote::encode_frame(zygote::In::kCall, call, zygote::encode_meta(meta), payload),
        false);
    return call;
  }

  void cancel(uint32_t call) override {
    {
      std::lock_guard lock(mu_);
      if (lost_ || !calls_.count(call)) return;
    }
    agent_->send_stdin(exec_id_, zygote::encode_frame(zygote::In::kKill, call, "", ""), false);
  }

  void set_on_lost(std::function<void(const Error&)> cb) override {
    std::optional<Error> already;
    {
      std::lock_guard lock(mu_);
      on_lost_ = std::move(cb);
      if (lost_) already = lost_;
    }
    if (already)
      asio::post(io_, [self = shared_from_this(), e = *already] {
        std::function<void(const Error&)> f;
        {
          std::lock_guard lock(self->mu_);
          f = std::move(self->on_lost_);
        }
        if (f) f(e);
      });
  }

  bool alive() const override {
    std::lock_guard lock(mu_);
    return !lost_;
  }

  void destroy() override {
    {
      std::lock_guard lock(mu_);
      if (destroyed_) return;
      destroyed_ = true;
    }
    lose(Error{Code::kUnavailable, 0, "function worker " + id_ + " is shutting down"});
    if (agent_) agent_->close();
    if (inst_) {
      if (auto r = inst_->destroy(); !r) {
        // Its uid range stays held: something of the sandbox may still run in it.
        TP_SB_ERROR(id_, "destroying function worker: {}", r.error().message());
        return;
      }
    }
    if (ranges_ && base_) ranges_->release(base_, id_);
    TP_SB_INFO(id_, "function worker removed");
  }

 private:
  struct Call {
    Done done;
    std::string out, err, files;
    uint64_t output_bytes = 0;
  };

  // On the agent client's strand.
  void on_output(int stream, std::string_view data) {
    if (stream == 2) {  // the zygote's own stderr: a crash of the zygote says why here
      zygote_err_.append(data.substr(0, 8192 - std::min<size_t>(zygote_err_.size(), 8192)));
      size_t nl;
      while ((nl = zygote_err_.find('\n')) != std::string::npos) {
        TP_SB_WARN(id_, "zygote: {}", json_util::to_valid_utf8(zygote_err_.substr(0, nl)));
        zygote_err_.erase(0, nl + 1);
      }
      return;
    }
    auto r = decoder_.feed(data, [this](Out type, uint32_t call, std::string_view body) {
      on_frame(type, call, body);
    });
    if (!r)
      lose(Error{Code::kUnavailable, 0, "function worker " + id_ + ": " + r.error().message()});
  }

  void on_frame(Out type, uint32_t call, std::string_view body) {
    switch (type) {
      case Out::kReady:
        if (!ready_set_.exchange(true)) {
          TP_SB_INFO(id_, "function zygote ready: {}", json_util::to_valid_utf8(body));
          ready_.set_value(Result<void>{});
        }
        return;
      case Out::kLog: {
        auto o = json_util::parse_object(body);
        std::string level = "info", msg(body);
        if (o) {
          if (const auto* l = o->if_contains("level"); l && l->is_string()) level = l->as_string();
          if (const auto* m = o->if_contains("message"); m && m->is_string()) msg = m->as_string();
        }
        msg = json_util::to_valid_utf8(msg);
        if (level == "error")
          TP_SB_ERROR(id_, "zygote: {}", msg);
        else if (level == "warn")
          TP_SB_WARN(id_, "zygote: {}", msg);
        else
          TP_SB_INFO(id_, "zygote: {}", msg);
        return;
      }
      default:
        break;
    }
    Done done;
    Result<StepResult> result = fail(Code::kInternal, "");
    {
      std::lock_guard lock(mu_);
      auto it = calls_.find(call);
      if (it == calls_.end()) return;  // a call that already failed (cancelled)
      Call& c = it->second;
      // The zygote bounds each stream at its limit; a little slack for the frame in flight.
      auto append = [&](std::string* s, size_t cap) {
        size_t room = cap > s->size() ? cap - s->size() : 0;
        s->append(body.substr(0, room));
      };
      switch (type) {
        case Out::kStdout:
          append(&c.out, c.output_bytes);
          return;
        case Out::kStderr:
          append(&c.err, c.output_bytes);
          return;
        case Out::kFiles:
          c.files.append(body);
          return;
        case Out::kExit: {
          auto exit = zygote::parse_exit(body);
          zygote::FilesStream files;
          if (auto parsed = zygote::parse_files(c.files, &files); !parsed)
            files.error = files.error.empty() ? parsed.error().message() : files.error;
          else
            files = std::move(*parsed);
          if (!exit) {
            result = fail(Code::kInternal,
                          "function worker " + id_ + ": bad exit frame: " + exit.error().message());
          } else {
            bool out_cut = exit->output_limit && c.out.size() >= c.output_bytes;
            bool err_cut = exit->output_limit && c.err.size() >= c.output_bytes;
            result = zygote::step_result(*exit, std::move(c.out), std::move(c.err), out_cut,
                                         err_cut, files);
          }
          break;
        }
        case Out::kFailed: {
          std::string msg = "the call did not run";
          if (auto o = json_util::parse_object(body); o)
            if (const auto* m = o->if_contains("message"); m && m->is_string())
              msg = std::string(m->as_string());
          result = fail(Code::kUnavailable, "function worker " + id_ + ": " + msg);
          break;
        }
        default:
          return;
      }
      done = std::move(c.done);
      calls_.erase(it);
    }
    if (done) done(std::move(result));
  }

  void lose(const Error& e) {
    std::map<uint32_t, Call> calls;
    std::function<void(const Error&)> on_lost;
    bool destroying;
    {
      std::lock_guard lock(mu_);
      if (lost_) return;
      lost_ = e;
      calls.swap(calls_);
      on_lost = std::move(on_lost_);
      destroying = destroyed_;
    }
    if (!ready_set_.exchange(true)) ready_.set_value(std::unexpected(e));
    if (!destroying) TP_SB_WARN(id_, "function worker lost: {}", e.message());
    asio::post(io_, [calls = std::move(calls), on_lost = std::move(on_lost), e]() mutable {
      for (auto& [_, c] : calls)
        if (c.done) c.done(std::unexpected(e));
      if (on_lost) on_lost(e);
    });
  }

  asio::io_context& io_;
  const std::string id_;
  std::unique_ptr<runtime::SandboxInstance> inst_;
  std::shared_ptr<node::UidRanges> ranges_;
  const uint32_t base_;
  std::shared_ptr<void> pin_;  // keeps the image's layers from gc while the worker lives
  std::shared_ptr<node::AgentClient> agent_;
  uint32_t exec_id_ = 0;
  zygote::FrameDecoder decoder_;  // strand only
  std::string zygote_err_;        // strand only
  std::promise<Result<void>> ready_;
  std::atomic<bool> ready_set_{false};

  mutable std::mutex mu_;
  std::map<uint32_t, Call> calls_;
  uint32_t next_call_ = 1;
  std::optional<Error> lost_;
  std::function<void(const Error&)> on_lost_;
  bool destroyed_ = false;
};

}  // namespace

Result<std::shared_ptr<Worker>> make_zygote_worker(asio::io_context& io,
                                                   const WorkerHostOptions& opts,
                                                   const std::string& image) {
  if (!opts.backend) return fail(Code::kUnavailable, "the function tier has no container backend");
  runtime::SandboxSpec spec;
  spec.id = opts.node_name + "-fn-" + ids::random_hex(5);
  spec.image = image;
  std::shared_ptr<void> pin;
  if (image != "host") {
    if (!opts.resolve_image)
      return fail(Code::kNotFound, "image '" + image + "' (the function tier has no image store)");
    auto img = opts.resolve_image(image);
    if (!img) return std::unexpected(img.error());
    spec.layers = img->layers;
    pin = img->pin;
  }
  spec.memory_bytes = opts.memory_bytes;
  spec.cpus = opts.cpus;
  spec.pids_max = opts.pids;
  spec.disk_bytes = 64ull << 20;
  spec.tmp_bytes = 16ull << 20;
  spec.nofile = opts.nofile;
  spec.nested_isolation = true;
  uint32_t base = 0;
  if (opts.uid_ranges) {
    auto b = opts.uid_ranges->allocate(spec.id);
    if (!b) return std::unexpected(b.error());
    base = *b;
    spec.uid_base = base;
  }
  auto inst = opts.backend->create(spec);
  if (!inst) {
    if (opts.uid_ranges) opts.uid_ranges->release(base, spec.id);
    return std::unexpected(inst.error());
  }
  auto w = std::make_shared<ZygoteWorker>(io, spec.id, std::move(*inst), opts.uid_ranges, base,
                                          std::move(pin));
  if (auto r = w->boot(opts); !r) {
    TP_SB_WARN(spec.id, "function worker did not start: {}", r.error().message());
    w->destroy();
    return std::unexpected(r.error());
  }
  TP_SB_INFO(spec.id, "function worker ready (image {})", image);
  return std::shared_ptr<Worker>(std::move(w));
}

}  // namespace tp::function
