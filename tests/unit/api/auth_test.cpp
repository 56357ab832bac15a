#include "api/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/json_util.h"
#include "common/sha256.h"

namespace tp::api {
namespace {

namespace fs = std::filesystem;

struct Answer : Responder {
  int status = 0;
  std::string body, headers;
  void send(int s, std::string, std::string b) override {
    status = s;
    body = std::move(b);
  }
  void start_stream(int s, std::string) override { status = s; }
  void write_chunk(std::string) override {}
  void end_stream() override {}
  void abort_stream() override {}
  void set_on_abort(std::function<void()>) override {}
  void add_header(std::string n, std::string v) override { headers += n + ": " + v + "\n"; }
};

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/tp-auth-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string keys() const { return KeyFile::in_data_dir(dir_); }
  static Request tcp(const std::string& method, const std::string& path,
                     const std::string& key = "") {
    Request r;
    r.method = method;
    r.path = path;
    if (!key.empty()) r.headers["authorization"] = "Bearer " + key;
    return r;
  }
  std::string dir_;
};

TEST(Sha256, KnownVector) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(AuthTest, KeysAreStoredHashedInAPrivateFile) {
  KeyFile f(keys());
  auto k = f.create("admin", "ci");
  ASSERT_TRUE(k) << k.error().message();
  EXPECT_EQ(k->first.scope, "admin");
  EXPECT_TRUE(k->second.starts_with("tpk_" + k->first.id + "_"));
  struct stat st {};
  ASSERT_EQ(::stat(keys().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream in(keys());
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text.find(k->second), std::string::npos);  // never the key itself
  EXPECT_NE(text.find(sha256_hex(k->second)), std::string::npos);
  auto list = f.load();
  ASSERT_TRUE(list);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "ci");
  EXPECT_FALSE(f.create("root", ""));
  EXPECT_EQ(f.revoke("nope").error().code, Code::kNotFound);
}

TEST_F(AuthTest, TcpNeedsAKeyExceptHealthAndVersion) {
  Auth auth({keys(), false, {}});
  auto r = tcp("GET", "/v1/sandboxes");
  auto e = auth.authenticate(r);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Code::kUnauthenticated);
  EXPECT_NE(e.error().message().find("API key"), std::string::npos);
  auto h = tcp("GET", "/health");
  EXPECT_TRUE(auth.authenticate(h));
  auto v = tcp("GET", "/version");
  EXPECT_TRUE(auth.authenticate(v));
  auto post_health = tcp("POST", "/health");
  EXPECT_FALSE(auth.authenticate(post_health));
  auto bad = tcp("GET", "/v1/sandboxes", "tpk_nothing");
  EXPECT_EQ(auth.authenticate(bad).error().code, Code::kUnauthenticated);

  // The handler answers 401 itself and never calls the next one.
  auto ans = std::make_shared<Answer>();
  bool called = false;
  Request r2 = tcp("GET", "/v1/sandboxes");
  auth.handle(r2, ans, [&](Request&, std::shared_ptr<Responder>) { called = true; });
  EXPECT_FALSE(called);
  EXPECT_EQ(ans->status, 401);
  EXPECT_NE(ans->body.find("\"unauthenticated\""), std::string::npos);
}

TEST_F(AuthTest, KeysAreReadAgainWhenTheFileChanges) {
  Auth auth({keys(), false, {"/srv/import"}});
  KeyFile f(keys());
  auto user = f.create("user", "u");
  ASSERT_TRUE(user);
  auto r = tcp("GET", "/v1/sandboxes", user->second);
  ASSERT_TRUE(auth.authenticate(r));
  EXPECT_EQ(r.caller.scope, "user");
  EXPECT_EQ(r.caller.key_id, user->first.id);
  EXPECT_FALSE(host_reader(r).refused.empty());  // a user key names no host path

  auto admin = f.create("admin", "a");  // created while "the daemon" runs
  ASSERT_TRUE(admin);
  Request a = tcp("POST", "/v1/images", "");
  a.headers["x-api-key"] = admin->second;
  ASSERT_TRUE(auth.authenticate(a));
  EXPECT_EQ(a.caller.scope, "admin");
  auto hr = host_reader(a);
  EXPECT_TRUE(hr.refused.empty());
  EXPECT_FALSE(hr.uid);
  EXPECT_EQ(hr.roots, std::vector<std::string>{"/srv/import"});

  ASSERT_TRUE(f.revoke(user->first.id));
  auto again = tcp("GET", "/v1/sandboxes", user->second);
  EXPECT_EQ(auth.authenticate(again).error().code, Code::kUnauthenticated);
  auto still = tcp("GET", "/v1/sandboxes", admin->second);
  EXPECT_TRUE(auth.authenticate(still));
}

TEST_F(AuthTest, TheUnixSocketNeedsNoKeyAndReadsAsThePeer) {
  Auth auth({keys(), false, {}});
  Request r = tcp("GET", "/v1/sandboxes");
  r.caller.transport = Caller::Transport::kUnix;
  r.caller.uid = 1000;
  r.caller.gid = 1001;
  r.caller.groups = {27, 1001};
  ASSERT_TRUE(auth.authenticate(r));
  auto hr = host_reader(r);
  ASSERT_TRUE(hr.uid);
  EXPECT_EQ(*hr.uid, 1000u);
  EXPECT_EQ(hr.gid, 1001u);
  EXPECT_EQ(hr.groups, (std::vector<gid_t>{27, 1001}));

  auto ans = std::make_shared<Answer>();
  Request w = r;
  w.path = "/v1/whoami";
  auth.handle(w, ans,
              [](Request&, std::shared_ptr<Responder>) { FAIL() << "whoami is answered by auth"; });
  EXPECT_EQ(ans->status, 200);
  EXPECT_NE(ans->body.find("\"uid\":1000"), std::string::npos) << ans->body;
  EXPECT_NE(ans->body.find("\"transport\":\"unix\""), std::string::npos) << ans->body;
}

TEST_F(AuthTest, InsecureTcpLetsKeylessRequestsInButNotToHostPaths) {
  Auth auth({keys(), true, {"/srv"}});
  Request r = tcp("POST", "/v1/images");
  ASSERT_TRUE(auth.authenticate(r));
  EXPECT_FALSE(host_reader(r).refused.empty());
  // A presented key is still checked.
  Request bad = tcp("GET", "/v1/sandboxes", "tpk_wrong");
  EXPECT_FALSE(auth.authenticate(bad));
}

TEST_F(AuthTest, ABrokenKeyFileAcceptsNoKey) {
  KeyFile f(keys());
  auto k = f.create("admin", "");
  ASSERT_TRUE(k);
  Auth auth({keys(), false, {}});
  auto r = tcp("GET", "/v1/sandboxes", k->second);
  ASSERT_TRUE(auth.authenticate(r));
  std::ofstream(keys(), std::ios::trunc) << "{not json";
  auto again = tcp("GET", "/v1/sandboxes", k->second);
  EXPECT_FALSE(auth.authenticate(again));
}

// Clients that take only a URL (SandboxFusion's, e.g. verl's) send http://user:KEY@host as
// HTTP Basic: the password is the key, the user name is anything.
TEST_F(AuthTest, BasicCredentialsCarryTheKeyAsPassword) {
  KeyFile f(keys());
  auto k = f.create("user", "verl");
  ASSERT_TRUE(k);
  Auth auth({keys(), false, {}});
  auto basic = [](const std::string& userpass) {
    Request r = tcp("POST", "/run_code");
    r.headers["authorization"] = "Basic " + json_util::base64_encode(userpass);
    return r;
  };
  auto ok = basic("anyone:" + k->second);
  ASSERT_TRUE(auth.authenticate(ok));
  EXPECT_EQ(ok.caller.key_id, k->first.id);
  for (const std::string& bad :
       {std::string("anyone:wrong"), std::string("no-colon"), std::string("user:")}) {
    auto r = basic(bad);
    auto e = auth.authenticate(r);
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().code, Code::kUnauthenticated);
  }
  Request garbage = tcp("POST", "/run_code");
  garbage.headers["authorization"] = "Basic !!!";
  EXPECT_FALSE(auth.authenticate(garbage));
}

}  // namespace
}  // namespace tp::api
