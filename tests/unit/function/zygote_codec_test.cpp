#include "function/zygote_codec.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace tp::function::zygote {
namespace {

std::string out_frame(Out t, uint32_t call, std::string_view data) {
  std::string s;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(static_cast<uint32_t>(t), 4);
  put(call, 4);
  put(data.size(), 8);
  s += data;
  return s;
}

std::string record(uint8_t kind, std::string_view name, std::string_view data) {
  std::string s(1, static_cast<char>(kind));
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(name.size(), 4);
  put(data.size(), 8);
  s += name;
  s += data;
  return s;
}

TEST(ZygoteCodec, InFrameLayout) {
  std::string f = encode_frame(In::kCall, 7, "{}", "PAY");
  ASSERT_EQ(f.size(), kInHeader + 2 + 3);
  EXPECT_EQ(f[0], 2);
  EXPECT_EQ(f[4], 7);
  EXPECT_EQ(f[8], 3);   // payload length
  EXPECT_EQ(f[16], 2);  // meta length
  EXPECT_EQ(f.substr(kInHeader), "{}PAY");
}

TEST(ZygoteCodec, PayloadPutsStdinLast) {
  ChildRequest r;
  r.argv = {"python3", "/tmp/main.py"};
  r.files = {{"main.py", "print(1)", 0644}, {"d/x", "XY", 0600}};
  r.stdin_data = "IN";
  std::string p = encode_payload(r);
  uint32_t n = static_cast<unsigned char>(p[0]) | static_cast<unsigned char>(p[1]) << 8;
  auto head = boost::json::parse(p.substr(4, n)).as_object();
  EXPECT_EQ(head.at("files").as_array().size(), 2u);
  EXPECT_EQ(head.at("files").as_array()[1].as_object().at("size").as_int64(), 2);
  EXPECT_EQ(p.substr(4 + n), "print(1)XYIN");
}

TEST(ZygoteCodec, DecoderTakesAnyPieces) {
  std::string all = out_frame(Out::kStdout, 3, "hello") + out_frame(Out::kExit, 3, "{}") +
                    out_frame(Out::kLog, 0, "");
  std::vector<std::tuple<Out, uint32_t, std::string>> got;
  FrameDecoder d;
  for (char c : all)
    ASSERT_TRUE(d.feed(std::string_view(&c, 1), [&](Out t, uint32_t call, std::string_view b) {
      got.emplace_back(t, call, std::string(b));
    }));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(std::get<2>(got[0]), "hello");
  EXPECT_EQ(std::get<0>(got[1]), Out::kExit);
  EXPECT_EQ(std::get<0>(got[2]), Out::kLog);
}

TEST(ZygoteCodec, DecoderRefusesUnknownTypesAndHugeFrames) {
  FrameDecoder d;
  auto sink = [](Out, uint32_t, std::string_view) {};
  std::string bad = out_frame(static_cast<Out>(99), 1, "x");
  EXPECT_FALSE(d.feed(bad, sink));
  EXPECT_FALSE(d.feed(out_frame(Out::kStdout, 1, "x"), sink));  // stays broken
  FrameDecoder d2;
  std::string huge = out_frame(Out::kStdout, 1, "");
  huge[8] = 0;
  huge[11] = 0x7f;  // 2^31 and more
  EXPECT_FALSE(d2.feed(huge, sink));
}

TEST(ZygoteCodec, ParsesExit) {
  auto e = parse_exit(
      R"({"exit_code":null,"signal":9,"wall_us":5,"cpu_us":4,"peak_bytes":3,"oom_kills":1,"timed_out":false,"output_limit":true})");
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->exit_code);
  EXPECT_EQ(e->signal, 9);
  EXPECT_EQ(e->oom_kills, 1u);
  EXPECT_TRUE(e->output_limit);
  EXPECT_FALSE(parse_exit("[1]"));
}

TEST(ZygoteCodec, ParsesFilesStream) {
  std::string s = record(1, "out.txt", "data") + record(2, "nope", "") +
                  record(3, "", R"({"exit_code":3,"signal":0})") +
                  record(4, "", "execve x: No such file");
  auto f = parse_files(s);
  ASSERT_TRUE(f) << f.error().message();
  ASSERT_EQ(f->files.size(), 1u);
  EXPECT_EQ(f->files[0].data, "data");
  EXPECT_EQ(f->missing, std::vector<std::string>{"nope"});
  EXPECT_TRUE(f->has_status);
  EXPECT_EQ(f->status_exit_code, 3);
  EXPECT_EQ(f->error, "execve x: No such file");
}

TEST(ZygoteCodec, MalformedFilesStreamKeepsWhatCameBefore) {
  std::string s = record(1, "a", "1") + record(1, "b", "2");
  s.resize(s.size() - 1);
  FilesStream partial;
  auto f = parse_files(s, &partial);
  ASSERT_FALSE(f);
  EXPECT_EQ(partial.files.size(), 1u);
  EXPECT_FALSE(parse_files(record(9, "x", "")));
  EXPECT_FALSE(parse_files(std::string(5, '\1')));
}

TEST(ZygoteCodec, VerdictPrecedence) {
  StepResult s;
  s.exit_code = 0;
  EXPECT_EQ(verdict_of(s), Verdict::kOk);
  s.exit_code = 1;
  EXPECT_EQ(verdict_of(s), Verdict::kRuntimeError);
  s.exit_code.reset();
  s.signal = 11;
  EXPECT_EQ(verdict_of(s), Verdict::kRuntimeError);
  s.output_limit = true;
  EXPECT_EQ(verdict_of(s), Verdict::kOutputLimit);
  s.oom_killed = true;
  EXPECT_EQ(verdict_of(s), Verdict::kMemoryLimit);
  s.timed_out = true;
  EXPECT_EQ(verdict_of(s), Verdict::kTimeLimit);
  StepResult e;
  e.exit_code = 0;
  e.error = "execve: ENOENT";
  EXPECT_EQ(verdict_of(e), Verdict::kRuntimeError);
}

TEST(ZygoteCodec, SupervisedStatusWinsUnlessPidOneWasKilled) {
  ExitInfo ex;
  ex.exit_code = 0;
  FilesStream fs;
  fs.has_status = true;
  fs.status_signal = 6;
  auto s = step_result(ex, "o", "e", false, false, fs);
  EXPECT_EQ(s.signal, 6);
  EXPECT_EQ(s.verdict, Verdict::kRuntimeError);
  ex.exit_code.reset();
  ex.signal = 9;
  ex.timed_out = true;
  s = step_result(ex, "", "", false, false, fs);
  EXPECT_EQ(s.signal, 9);
  EXPECT_EQ(s.verdict, Verdict::kTimeLimit);
}

}  // namespace
}  // namespace tp::function::zygote
