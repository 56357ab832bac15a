#include "cli/parse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/commands.h"

namespace tp::cli {
namespace {

TEST(CliParseSize, PlainNumberIsMiB) {
  EXPECT_EQ(parse_size_mb("512").value(), 512);
  EXPECT_EQ(parse_size_mb("0").value(), 0);
  EXPECT_EQ(parse_size_mb(" 64 ").value(), 64);
}

TEST(CliParseSize, BinarySuffixes) {
  EXPECT_EQ(parse_size_mb("512M").value(), 512);
  EXPECT_EQ(parse_size_mb("512m").value(), 512);
  EXPECT_EQ(parse_size_mb("512MiB").value(), 512);
  EXPECT_EQ(parse_size_mb("512MB").value(), 512);
  EXPECT_EQ(parse_size_mb("1G").value(), 1024);
  EXPECT_EQ(parse_size_mb("1.5G").value(), 1536);
  EXPECT_EQ(parse_size_mb("2Gi").value(), 2048);
  EXPECT_EQ(parse_size_mb("1T").value(), 1024 * 1024);
  EXPECT_EQ(parse_size_mb("2048K").value(), 2);
  EXPECT_EQ(parse_size_mb("1048576B").value(), 1);
}

TEST(CliParseSize, PartialMiBRoundsUp) {
  EXPECT_EQ(parse_size_mb("1K").value(), 1);
  EXPECT_EQ(parse_size_mb("1500K").value(), 2);
  EXPECT_EQ(parse_size_mb("0.1").value(), 1);
}

TEST(CliParseSize, RejectsBadInput) {
  for (const char* bad : {"", "  ", "M", "-1G", "12X", "1GG", "1 G B", "1e3", "+5", "0x10", "1..5",
                          ".", "G1", "99999999999999999999T"}) {
    auto r = parse_size_mb(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find("invalid size"), std::string::npos) << bad;
  }
}

TEST(CliParseDuration, UnitsAndPlainSeconds) {
  EXPECT_DOUBLE_EQ(parse_duration_seconds("30").value(), 30);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("0.5").value(), 0.5);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("10s").value(), 10);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("10m").value(), 600);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("1h").value(), 3600);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("1h30m").value(), 5400);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("2d").value(), 172800);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("250ms").value(), 0.25);
  EXPECT_DOUBLE_EQ(parse_duration_seconds("1M").value(), 60);  // units are case-insensitive
  EXPECT_DOUBLE_EQ(parse_duration_seconds("0").value(), 0);
}

TEST(CliParseDuration, RejectsBadInput) {
  for (const char* bad : {"", "s", "-5", "-5m", "10x", "1h30", "10 m m", "1e2s", "m10", "1w"}) {
    auto r = parse_duration_seconds(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument) << bad;
  }
}

TEST(CliParseKeyValue, SplitsAtFirstEquals) {
  auto kv = parse_key_value("a=b=c").value();
  EXPECT_EQ(kv.first, "a");
  EXPECT_EQ(kv.second, "b=c");
  EXPECT_EQ(parse_key_value("k=").value().second, "");
  EXPECT_FALSE(parse_key_value("novalue").has_value());
  EXPECT_FALSE(parse_key_value("=v").has_value());
  EXPECT_FALSE(parse_key_value("").has_value());
}

TEST(CliBase64, KnownVectors) {
  // RFC 4648 section 10.
  const std::vector<std::pair<std::string, std::string>> v = {{"", ""},
                                                              {"f", "Zg=="},
                                                              {"fo", "Zm8="},
                                                              {"foo", "Zm9v"},
                                                              {"foob", "Zm9vYg=="},
                                                              {"fooba", "Zm9vYmE="},
                                                              {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, enc] : v) {
    EXPECT_EQ(base64_encode(plain), enc);
    EXPECT_EQ(base64_decode(enc).value(), plain);
  }
}

TEST(CliBase64, RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    std::string part = all.substr(0, n);
    EXPECT_EQ(base64_decode(base64_encode(part)).value(), part);
  }
}

TEST(CliBase64, RejectsBadInput) {
  for (const char* bad :
       {"Zg=", "Zg", "Z===", "=Zg=", "Zg==Zg==", "Zm9v!A==", "Zm 9v", "Zm9v\n", "Zg=a"}) {
    auto r = base64_decode(bad);
    EXPECT_FALSE(r.has_value()) << bad;
  }
}

TEST(CliUrlEncode, KeepsUnreservedAndSlash) {
  EXPECT_EQ(url_encode("/tmp/a b.txt"), "/tmp/a%20b.txt");
  EXPECT_EQ(url_encode("k=v&x"), "k%3Dv%26x");
  EXPECT_EQ(url_encode("\xff"), "%FF");
  EXPECT_EQ(url_encode("a-b_c.d~e"), "a-b_c.d~e");
}

TEST(CliRfc3339, Parses) {
  EXPECT_EQ(parse_rfc3339("1970-01-01T00:00:00Z").value(), 0);
  EXPECT_EQ(parse_rfc3339("1970-01-01T00:01:40.123456Z").value(), 100);
  EXPECT_EQ(parse_rfc3339("1970-01-01T01:00:00+01:00").value(), 0);
  EXPECT_EQ(parse_rfc3339("2024-05-01T12:00:00Z").value(), 1714564800);
  EXPECT_FALSE(parse_rfc3339("").has_value());
  EXPECT_FALSE(parse_rfc3339("2024-05-01").has_value());
  EXPECT_FALSE(parse_rfc3339("2024-13-01T00:00:00Z").has_value());
  EXPECT_FALSE(parse_rfc3339("2024-05-01T00:00:00").has_value());
  EXPECT_FALSE(parse_rfc3339("2024-05-01T00:00:00Zjunk").has_value());
}

TEST(CliFormat, DurationsAndSizes) {
  EXPECT_EQ(format_duration_short(5), "5s");
  EXPECT_EQ(format_duration_short(-3), "0s");
  EXPECT_EQ(format_duration_short(600), "10m");
  EXPECT_EQ(format_duration_short(3 * 3600), "3h");
  EXPECT_EQ(format_duration_short(3 * 86400), "3d");
  EXPECT_EQ(format_mb(512), "512M");
  EXPECT_EQ(format_mb(2048), "2G");
  EXPECT_EQ(format_mb(1536), "1536M");
  EXPECT_EQ(format_mb(0), "0M");
}

std::vector<std::string> split_all(const std::vector<std::string>& pieces, NdjsonSplitter& s) {
  std::vector<std::string> lines;
  for (const auto& p : pieces) {
    auto r = s.feed(p, [&](std::string_view line) -> Result<void> {
      lines.emplace_back(line);
      return {};
    });
    EXPECT_TRUE(r.has_value());
  }
  return lines;
}

TEST(CliNdjson, SplitsAcrossArbitraryPieces) {
  NdjsonSplitter s;
  auto lines = split_all({"{\"a\":1}\n{\"b\"", ":2}\r\n\n", "{\"c\"", ":3", "}\n{\"d\":4}"}, s);
  EXPECT_EQ(lines, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"}));
  EXPECT_EQ(s.pending(), "{\"d\":4}");
}

TEST(CliNdjson, ByteAtATime) {
  NdjsonSplitter s;
  std::string text = "one\ntwo\nthree\n";
  std::vector<std::string> pieces;
  for (char c : text) pieces.emplace_back(1, c);
  EXPECT_EQ(split_all(pieces, s), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(s.pending(), "");
}

TEST(CliNdjson, LineTooLongFails) {
  NdjsonSplitter s(8);
  auto ok = [](std::string_view) -> Result<void> { return {}; };
  EXPECT_TRUE(s.feed("1234\n", ok).has_value());
  EXPECT_TRUE(s.feed("12345", ok).has_value());
  EXPECT_FALSE(s.feed("6789", ok).has_value());
}

TEST(CliNdjson, CallbackErrorStopsFeeding) {
  NdjsonSplitter s;
  int calls = 0;
  auto r = s.feed("a\nb\nc\n", [&](std::string_view line) -> Result<void> {
    ++calls;
    if (line == "b") return fail(Code::kInternal, "stop");
    return {};
  });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "stop");
  EXPECT_EQ(calls, 2);
}

TEST(CliExitStatus, MapsLikeAShell) {
  EXPECT_EQ(exit_status_for(0, 0, false), 0);
  EXPECT_EQ(exit_status_for(3, 0, false), 3);
  EXPECT_EQ(exit_status_for(255, 0, false), 255);
  EXPECT_EQ(exit_status_for(-1, 9, false), 137);
  EXPECT_EQ(exit_status_for(-1, 15, false), 143);
  EXPECT_EQ(exit_status_for(-1, 9, true), 124);  // the timeout killed it: coreutils timeout(1)
  EXPECT_EQ(exit_status_for(0, 0, true), 124);
  EXPECT_EQ(exit_status_for(-1, 0, false), 1);  // no code, no signal: still a failure
  EXPECT_EQ(exit_status_for(300, 0, false), 1);
}

TEST(CliSandboxPath, EncodesTheId) {
  EXPECT_EQ(sandbox_path("n0-3fa9c21b7e04"), "/v1/sandboxes/n0-3fa9c21b7e04");
  EXPECT_EQ(sandbox_path("a/../b"), "/v1/sandboxes/a%2F..%2Fb");
  EXPECT_EQ(sandbox_path("a b?"), "/v1/sandboxes/a%20b%3F");
}

}  // namespace
}  // namespace tp::cli
