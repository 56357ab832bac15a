// libFuzzer harness for the tp-agent wire protocol (src/protocol/wire.h).
//
// Each input is a byte stream as one side of the agent connection would see it.
// Three consumers of hostile frames are exercised, all free of side effects:
//  1. proto::FrameReader fed in arbitrary chunk sizes, decode_fields on nested
//     kEntry values, and an encode -> decode round trip of every message;
//  2. the node's decoding of agent answers (codec::error_from, exec_result_from,
//     entry_from) and the node's AgentClient itself, driven over a socketpair
//     by a forged agent that sends the input (a sandbox that took over its
//     agent can send anything), with requests 1..5 pending;
//  3. the agent's read-only file requests (kFileStat, kFileList, kFileRead)
//     answered by FileService inside a private fixture root. Mutating file
//     requests are not run: the harness runs as root on the host.
// Oracles: no crash or sanitizer report; every AgentClient callback runs
// exactly once; the round trip reproduces the message.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "agent/file_ops.h"
#include "agent/resolver.h"
#include "node/agent_client.h"
#include "node/agent_client_codec.h"
#include "protocol/wire.h"

namespace {

using tp::proto::Message;
using tp::proto::MsgType;
using tp::proto::Tag;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "wire_fuzz: oracle failed: %s\n", what);
    std::abort();
  }
}

// A small fixed tree the read-only file requests resolve in: a file, a
// directory, a symlink escaping upwards and one to a host file.
struct Fixture {
  std::string root;
  std::optional<tp::agent::FileService> files;
  Fixture() {
    char tmpl[] = "/tmp/tp-wire-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    root = tmpl;
    std::filesystem::create_directories(root + "/dir/sub");
    std::ofstream(root + "/dir/file") << "hello\n";
    std::ofstream(root + "/big") << std::string(70000, 'x');
    std::filesystem::create_symlink("../../..", root + "/dir/up");
    std::filesystem::create_symlink("/etc/passwd", root + "/abs");
    ::mkfifo((root + "/fifo").c_str(), 0644);
    auto r = tp::agent::Resolver::open_root(root);
    if (!r) std::abort();
    files.emplace(std::move(*r));
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

Fixture& fixture() {
  static Fixture f;  // removed at exit
  return f;
}

void exercise_message(const Message& m) {
  // Accessors on every tag present.
  for (const auto& [tag, val] : m.fields) {
    (void)m.str(tag);
    (void)m.u64(tag);
    (void)m.i64(tag);
    (void)m.all(tag);
  }
  // Round trip: what we decoded re-encodes to a frame that decodes the same.
  std::string bytes = tp::proto::encode(m);
  if (bytes.size() <= tp::proto::kMaxFrame) {
    tp::proto::FrameReader r;
    r.feed(bytes.data(), bytes.size());
    auto back = r.next();
    check(back.has_value() && !r.failed(), "re-encoded frame does not decode");
    check(back->type == m.type && back->id == m.id && back->fields == m.fields,
          "round trip changed the message");
    check(r.buffered() == 0, "round trip left bytes");
  }
  // Node-side decoding of answers.
  (void)tp::node::codec::error_from(m);
  (void)tp::node::codec::exec_result_from(m);
  (void)tp::node::codec::entry_from(m.fields, "/fallback");
  for (auto v : m.all(Tag::kEntry)) {
    std::vector<std::pair<Tag, std::string>> nested;
    if (tp::proto::decode_fields(v, &nested)) {
      (void)tp::node::codec::entry_from(nested, "/x");
      check(tp::proto::encode_fields(nested) == v, "nested field list round trip");
    }
  }
  // Agent-side read-only file requests.
  if (m.type == MsgType::kFileStat || m.type == MsgType::kFileList ||
      m.type == MsgType::kFileRead) {
    Message answer = fixture().files->handle(m);
    check(answer.id == m.id, "file answer id");
    check(answer.type == MsgType::kOk || answer.type == MsgType::kError, "file answer type");
  }
}

// Feeds `data` into a FrameReader in chunks whose sizes come from `sizes`.
void run_reader(const uint8_t* data, size_t size, uint8_t sizes) {
  tp::proto::FrameReader r;
  size_t off = 0;
  size_t step = 1 + (sizes % 17);
  while (off < size && !r.failed()) {
    size_t n = std::min(step, size - off);
    r.feed(reinterpret_cast<const char*>(data + off), n);
    off += n;
    step = step * 3 % 61 + 1;
    while (auto m = r.next()) exercise_message(*m);
  }
}

// A forged agent: the input is what the node reads from the agent's fd.
void run_client(const uint8_t* data, size_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  boost::asio::io_context io;
  auto client = tp::node::AgentClient::create(io, sv[0], "fuzz");
  ::close(sv[0]);
  int callbacks = 0, expected = 0;
  bool closed = false;
  client->set_on_closed([&](const tp::Error&) { closed = true; });
  client->start([&](tp::Result<void>) { ++callbacks; });
  ++expected;
  tp::node::ExecRequest req;
  req.argv = {"true"};
  req.stdin_open = true;
  tp::node::ExecHandlers h;
  h.on_started = [](uint32_t) {};
  h.on_output = [](int, std::string_view) {};
  h.on_done = [&](tp::Result<tp::node::ExecResult>) { ++callbacks; };
  client->exec(req, std::move(h));  // id 1
  ++expected;
  client->read_file("/f", 1 << 20, [&](tp::Result<std::string>) { ++callbacks; });          // id 2
  client->stat("/f", [&](tp::Result<tp::node::FileEntry>) { ++callbacks; });                // id 3
  client->list("/d/", [&](tp::Result<std::vector<tp::node::FileEntry>>) { ++callbacks; });  // id 4
  client->write_file("/w", std::string(10, 'a'), 0644, true,
                     [&](tp::Result<uint64_t>) { ++callbacks; });
  expected += 4;
  // The node writes requests to sv[1]; drain them so that writes never block.
  // Send the forged bytes, then EOF: every pending request must complete.
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::send(sv[1], data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) off += static_cast<size_t>(n);
    char sink[65536];
    while (::recv(sv[1], sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    io.poll();
    io.restart();
    if (n < 0 && errno != EAGAIN) break;
  }
  ::shutdown(sv[1], SHUT_WR);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((callbacks < expected || !closed) && std::chrono::steady_clock::now() < deadline) {
    char sink[65536];
    while (::recv(sv[1], sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    io.run_for(std::chrono::milliseconds(5));
    io.restart();
  }
  check(closed, "AgentClient did not notice EOF");
  check(callbacks == expected, "a request was not completed exactly once after EOF");
  check(client->pending() == 0, "pending() not 0 after EOF");
  ::close(sv[1]);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::signal(SIGPIPE, SIG_IGN);
  (void)fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 20)) return -1;
  uint8_t mode = data[0];
  ++data;
  --size;
  run_reader(data, size, mode >> 1);
  // The socket round trip is slower: only for inputs that ask for it.
  if (mode & 1) run_client(data, size);
  return 0;
}
