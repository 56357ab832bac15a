// SpoolBody and BodyFile (api/spool.h): a request body parsed by Beast into an
// unlinked spool file, hashed on the way, read back in pieces; the spool budget.
#include "api/spool.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/beast/http.hpp>
#include <filesystem>
#include <string>

#include "api/http_server.h"

namespace tp::api {
namespace {

namespace http = boost::beast::http;

std::string sha256(const std::string& s) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(s.data(), s.size(), d, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(d), len);
}

class SpoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-spool-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    opts_.dir = dir_;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Parses `req` (head and body) with the body going to a spool file.
  std::shared_ptr<const BodyFile> parse(const std::string& req, boost::beast::error_code* ec,
                                        SpoolFailure* why = nullptr) {
    http::request_parser<http::empty_body> head;
    size_t used = head.put(boost::asio::buffer(req), *ec);
    EXPECT_FALSE(*ec);
    EXPECT_TRUE(head.is_header_done());
    http::request_parser<SpoolBody> p(std::move(head));
    std::string err;
    EXPECT_TRUE(p.get().body().open(opts_, &err)) << err;
    std::string rest = req.substr(used);
    // In small pieces, as a socket delivers them.
    for (size_t off = 0; off < rest.size() && !*ec;) {
      size_t n = std::min<size_t>(rest.size() - off, 7001);
      off += p.put(boost::asio::buffer(rest.data() + off, n), *ec);
    }
    if (why) *why = p.get().body().failure();
    return *ec ? nullptr : p.get().body().finish();
  }

  std::string dir_;
  SpoolOptions opts_;
};

TEST_F(SpoolTest, BodyGoesToAnUnnamedFileAndIsReadBackInPieces) {
  std::string body;
  for (int i = 0; i < 300000; ++i) body += static_cast<char>('a' + i % 26);
  boost::beast::error_code ec;
  auto f = parse("PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\n\r\n" + body,
                 &ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->size(), body.size());
  EXPECT_EQ(f->sha256(), sha256(body));
  std::string back;
  for (uint64_t off = 0; off < f->size(); off += 65536) back += *f->read(off, 65536);
  EXPECT_EQ(back, body);
  EXPECT_EQ(*f->read(f->size(), 10), "");  // past the end: nothing
  EXPECT_EQ(f->read(f->size() - 3, 10)->size(), 3u);
  // The spool directory holds no name for it.
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(SpoolTest, ChunkedBodiesAreSpooledToo) {
  boost::beast::error_code ec;
  auto f = parse(
      "PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
      &ec);
  ASSERT_TRUE(f) << ec.message();
  EXPECT_EQ(*f->read_all(), "hello world");
  EXPECT_EQ(f->sha256(), sha256("hello world"));
}

TEST_F(SpoolTest, TheBudgetBoundsSpooledBytesAndIsGivenBackWithTheFile) {
  opts_.disk = std::make_shared<BodyBudget>(100000);
  boost::beast::error_code ec;
  const std::string big(150000, 'b');
  SpoolFailure why = SpoolFailure::kNone;
  auto f = parse("PUT /x HTTP/1.1\r\nContent-Length: 150000\r\n\r\n" + big, &ec, &why);
  EXPECT_TRUE(ec);
  EXPECT_FALSE(f);
  EXPECT_EQ(why, SpoolFailure::kBudget);
  EXPECT_EQ(opts_.disk->used(), 0u);  // what the failed body took is back
  ec = {};
  auto g = parse("PUT /x HTTP/1.1\r\nContent-Length: 60000\r\n\r\n" + std::string(60000, 'g'), &ec);
  ASSERT_TRUE(g);
  EXPECT_EQ(opts_.disk->used(), 60000u);  // held while the file lives
  ec = {};
  auto h = parse("PUT /x HTTP/1.1\r\nContent-Length: 60000\r\n\r\n" + std::string(60000, 'h'), &ec,
                 &why);
  EXPECT_FALSE(h);
  EXPECT_EQ(why, SpoolFailure::kBudget);
  g.reset();
  EXPECT_EQ(opts_.disk->used(), 0u);
}

TEST_F(SpoolTest, AMissingSpoolDirectoryFailsToOpen) {
  opts_.dir = dir_ + "/missing";
  SpoolBody::value_type v;
  std::string why;
  EXPECT_FALSE(v.open(opts_, &why));
  EXPECT_NE(why.find("missing"), std::string::npos) << why;
}

}  // namespace
}  // namespace tp::api
