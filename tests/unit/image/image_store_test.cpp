// ImageStore (src/image/image_store.h), archive manifests (oci_archive.h) and
// build specs (builder.h). Store tests need root (layers are chowned); they
// run over both image record stores (SQLite, memory).
#include "image/image_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "control/memory_image_store.h"
#include "control/sqlite/image_record_store.h"
#include "image/builder.h"
#include "image/oci_archive.h"
#include "tar_builder.h"

namespace tp::image {
namespace {

namespace fs = std::filesystem;
using namespace tp::image::testing;

// -- manifests -------------------------------------------------------------------

const char* kConfig = R"({"config":{"Env":["PATH=/bin","A=b=c"],"WorkingDir":"/w","User":"1000",
  "Entrypoint":["/bin/sh","-c"],"Cmd":["echo"]},
  "rootfs":{"type":"layers","diff_ids":["sha256:1111111111111111111111111111111111111111111111111111111111111111",
  "sha256:2222222222222222222222222222222222222222222222222222222222222222"]}})";

TEST(OciArchive, DockerManifest) {
  std::map<std::string, std::string> m = {
      {"manifest.json",
       R"([{"Config":"c.json","RepoTags":["lib/x:3"],"Layers":["./a/layer.tar","b/layer.tar"]}])"},
      {"c.json", kConfig}};
  auto p = plan_docker(m);
  ASSERT_TRUE(p) << p.error().message();
  ASSERT_EQ(p->layers.size(), 2u);
  EXPECT_EQ(p->layers[0].member, "a/layer.tar");
  EXPECT_EQ(p->layers[1].diff_id.substr(0, 9), "sha256:22");
  EXPECT_EQ(p->defaults.env.at("A"), "b=c");
  EXPECT_EQ(p->defaults.workdir, "/w");
  EXPECT_EQ(p->defaults.user, "1000");
  EXPECT_EQ(p->defaults.cmd, (std::vector<std::string>{"/bin/sh", "-c", "echo"}));
  EXPECT_EQ(p->tags, std::vector<std::string>{"lib/x:3"});
}

TEST(OciArchive, DockerManifestErrors) {
  EXPECT_FALSE(plan_docker({}));
  EXPECT_FALSE(plan_docker({{"manifest.json", "{"}}));
  EXPECT_FALSE(plan_docker({{"manifest.json", "[]"}}));
  EXPECT_FALSE(plan_docker({{"manifest.json", R"([{"Config":"missing.json","Layers":[]}])"}}));
  // diff_ids and layers disagree.
  auto r = plan_docker(
      {{"manifest.json", R"([{"Config":"c.json","Layers":["a"]}])"}, {"c.json", kConfig}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("diff_ids"), std::string::npos);
  auto bad = plan_docker({{"manifest.json", R"([{"Config":"c.json","Layers":["a"]}])"},
                          {"c.json", R"({"rootfs":{"diff_ids":["sha256:zz"]}})"}});
  EXPECT_FALSE(bad);
}

TEST(OciArchive, OciLayoutWithNestedIndex) {
  std::string h1(64, '1'), h2(64, '2'), hc(64, 'c'), hm(64, 'a'), hi(64, 'b');
  std::string cfg = R"({"config":{"Env":["X=1"]},"rootfs":{"diff_ids":["sha256:)" +
                    std::string(64, '3') + R"(","sha256:)" + std::string(64, '4') + R"("]}})";
  std::map<std::string, std::string> m = {
      {"index.json", R"({"manifests":[{"digest":"sha256:)" + hi +
                         R"(","annotations":{"org.opencontainers.image.ref.name":"v9"}}]})"},
      {"blobs/sha256/" + hi, R"({"manifests":[{"digest":"sha256:)" + hm + R"("}]})"},
      {"blobs/sha256/" + hm,
       R"({"config":{"digest":"sha256:)" + hc +
           R"("},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:)" +
           h1 + R"("},{"digest":"sha256:)" + h2 + R"("}]})"},
      {"blobs/sha256/" + hc, cfg}};
  auto p = plan_oci(m);
  ASSERT_TRUE(p) << p.error().message();
  ASSERT_EQ(p->layers.size(), 2u);
  EXPECT_EQ(p->layers[0].member, "blobs/sha256/" + h1);
  EXPECT_EQ(p->layers[1].diff_id, "sha256:" + std::string(64, '4'));
  EXPECT_EQ(p->defaults.env.at("X"), "1");
  EXPECT_EQ(p->tags, std::vector<std::string>{"v9"});
  m["blobs/sha256/" + hm] = R"({"config":{"digest":"sha256:../../etc"},"layers":[]})";
  EXPECT_FALSE(plan_oci(m)) << "digests are validated before they become member names";
}

TEST(OciArchive, KindsAndNames) {
  EXPECT_EQ(*parse_archive_kind("docker"), ArchiveKind::kDocker);
  EXPECT_EQ(*parse_archive_kind(""), ArchiveKind::kAuto);
  EXPECT_FALSE(parse_archive_kind("zip"));
  EXPECT_EQ(normalize_member("./a//b/"), "a/b");
  EXPECT_TRUE(parse_image_ref("py:3.11"));
  EXPECT_EQ(parse_image_ref("py")->second, "");
  EXPECT_FALSE(parse_image_ref("host:1"));
  EXPECT_FALSE(parse_image_ref("a b"));
  EXPECT_FALSE(parse_image_ref("x:"));
  EXPECT_FALSE(parse_image_ref("../x"));
}

// -- the store ---------------------------------------------------------------------

class ImageStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    char tmpl[] = "/tmp/tp-store-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    reopen();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // The record store as a restarted daemon finds it: the same database file
  // opened again, or the same object in memory.
  std::shared_ptr<control::ImageRecordStore> records() {
    if (GetParam() == "memory") {
      if (!memory_) memory_ = std::make_shared<control::MemoryImageRecordStore>();
      return memory_;
    }
    auto r = control::sqlite::SqliteImageRecordStore::open(dir_ + "/state.db");
    EXPECT_TRUE(r) << r.error().message();
    return r ? std::shared_ptr<control::ImageRecordStore>(std::move(*r)) : nullptr;
  }
  Result<std::shared_ptr<ImageStore>> open_store(uint64_t budget = 0) {
    StoreOptions o;
    o.data_dir = dir_;
    o.limits.reserve_bytes = 0;
    o.budget_bytes = budget;
    return ImageStore::open(o, records());
  }
  void reopen() {
    store_.reset();
    auto s = open_store();
    ASSERT_TRUE(s) << s.error().message();
    store_ = *s;
  }
  std::string write(const std::string& name, const std::string& data) {
    std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << data;
    return p;
  }
  LayerInfo add(const std::vector<TarEntry>& es) {
    auto l = store_->add_layer_file(write("l.tar", make_tar(es)), "test", nullptr);
    EXPECT_TRUE(l) << l.error().message();
    return l ? *l : LayerInfo{};
  }
  ImageRecord put(const std::string& name, const std::string& version,
                  std::vector<std::string> parts) {
    ImageRecord r;
    r.name = name;
    r.version = version;
    r.parts = std::move(parts);
    auto p = store_->put_image(r, PutMode::kCreate);
    EXPECT_TRUE(p) << p.error().message();
    return p ? *p : r;
  }
  std::string dir_;
  std::shared_ptr<control::MemoryImageRecordStore> memory_;
  std::shared_ptr<ImageStore> store_;
};

TEST_P(ImageStoreTest, LayersAreStoredOnceAndOwnedForTheSandbox) {
  auto a = add({file("f", "one")});
  auto b = add({file("f", "one")});
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(store_->layers()->size(), 1u);
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/images/layers/sha256/" + a.digest.substr(7)).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 100000u);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "host users cannot reach layer contents";
  EXPECT_TRUE(fs::is_empty(dir_ + "/images/tmp"));
  EXPECT_EQ(a.path, dir_ + "/images/layers/sha256/" + a.digest.substr(7) + "/root");
}

TEST_P(ImageStoreTest, FailedUnpacksLeaveNothing) {
  auto r = store_->add_layer_file(write("bad.tar", make_tar({file("/abs", "x")})), "test", nullptr);
  ASSERT_FALSE(r);
  EXPECT_TRUE(fs::is_empty(dir_ + "/images/tmp"));
  EXPECT_TRUE(fs::is_empty(dir_ + "/images/layers/sha256"));
}

TEST_P(ImageStoreTest, ImagesComposeResolveAndPersist) {
  auto base = add({file("base", "b")});
  auto tool1 = add({file("tool", "1")});
  auto tool2 = add({file("tool", "2")});
  auto ws = add({file("ws", "w")});
  put("base", "1", {base.digest});
  put("tool", "1", {tool1.digest});
  ImageRecord env;
  env.name = "task";
  env.version = "1";
  env.parts = {ws.digest, "image:tool", "image:base:1"};
  env.defaults.workdir = "/ws";
  ASSERT_TRUE(store_->put_image(env, PutMode::kCreate));
  auto r = store_->resolve("task:1");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->digests, (std::vector<std::string>{ws.digest, tool1.digest, base.digest}));
  EXPECT_EQ(r->paths[0], ws.path);
  EXPECT_EQ(r->defaults.workdir, "/ws");
  put("tool", "2", {tool2.digest});  // the newest version is "latest"
  r = store_->resolve("task");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->digests[1], tool2.digest);
  // Records survive a restart.
  r->pin.reset();
  reopen();
  r = store_->resolve("task:1");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->digests.size(), 3u);
  // Explicit layer stacks.
  auto e = store_->resolve("layers:" + ws.digest + "," + base.digest);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->digests, (std::vector<std::string>{ws.digest, base.digest}));
  EXPECT_EQ(store_->resolve("layers:sha256:" + std::string(64, '9')).error().code, Code::kNotFound);
  EXPECT_EQ(store_->resolve("layers:nonsense").error().code, Code::kInvalidArgument);
  EXPECT_EQ(store_->resolve("nope").error().code, Code::kNotFound);
  // A part in use cannot be removed; self and missing parts are refused.
  EXPECT_EQ(store_->remove_image("base:1").error().code, Code::kConflict);
  ImageRecord self;
  self.name = "loop";
  self.version = "1";
  self.parts = {"image:loop:1"};
  EXPECT_FALSE(store_->put_image(self, PutMode::kCreate));
  self.parts = {"sha256:" + std::string(64, '8')};
  EXPECT_EQ(store_->put_image(self, PutMode::kCreate).error().code, Code::kNotFound);
}

TEST_P(ImageStoreTest, GcNeverRemovesAPinnedLayer) {
  auto keep = add({file("k", "k")});
  auto used = add({file("u", "u")});
  auto loose = add({file("l", "l")});
  put("keep", "1", {keep.digest});
  put("used", "1", {used.digest});
  auto pin = store_->resolve("used:1");
  ASSERT_TRUE(pin);
  ASSERT_TRUE(store_->remove_image("used:1"));
  auto g = store_->gc();
  ASSERT_TRUE(g);
  EXPECT_EQ(g->removed, std::vector<std::string>{loose.digest});
  EXPECT_EQ(g->pinned_unreferenced, 1u);
  EXPECT_TRUE(fs::exists(used.path));
  EXPECT_TRUE(fs::exists(keep.path));
  EXPECT_FALSE(fs::exists(loose.path));
  EXPECT_EQ(store_->layer(used.digest)->pins, 1u);
  pin->pin.reset();  // the sandbox ended
  g = store_->gc();
  ASSERT_TRUE(g);
  EXPECT_EQ(g->removed, std::vector<std::string>{used.digest});
  EXPECT_FALSE(fs::exists(used.path));
  EXPECT_TRUE(fs::is_empty(dir_ + "/images/tmp"));
  // Pins keep working after the store handle is gone.
  auto p2 = store_->resolve("keep:1");
  ASSERT_TRUE(p2);
  store_.reset();
  p2->pin.reset();
  reopen();
}

TEST_P(ImageStoreTest, ImportsDockerSaveArchivesAndDirectories) {
  std::string l1 = make_tar({dir("etc"), file("etc/a", "a"), file("etc/b", "b")});
  std::string l2 = make_tar({dir("etc"), file("etc/.wh.a", "")}, "gzip");
  auto hex = [](const std::string& s) {
    LayerInfo none;
    (void)none;
    return s;
  };
  (void)hex;
  // diff_ids left out of the config: the store computes them.
  std::string cfg = R"({"config":{"Env":["K=V"],"Cmd":["sh"]}})";
  std::string man =
      R"([{"Config":"c.json","RepoTags":["demo:5"],"Layers":["l1/layer.tar","l2/layer.tar"]}])";
  std::string arch = write(
      "img.tar",
      make_archive(
          {{"manifest.json", man}, {"c.json", cfg}, {"l1/layer.tar", l1}, {"l2/layer.tar", l2}}));
  auto r = store_->import_archive(arch, "", "", ArchiveKind::kAuto, PutMode::kCreate);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->name, "demo");
  EXPECT_EQ(r->version, "5");
  ASSERT_EQ(r->parts.size(), 2u);
  EXPECT_EQ(r->defaults.env.at("K"), "V");
  auto top = store_->layer(r->parts[0]);
  ASSERT_TRUE(top);
  struct stat st {};
  ASSERT_EQ(lstat((top->path + "/etc/a").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // A second import of the same archive reuses every layer.
  auto again = store_->import_archive(arch, "demo", "6", ArchiveKind::kDocker, PutMode::kCreate);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->parts, r->parts);
  EXPECT_EQ(store_->layers()->size(), 2u);
  // A wrong diff_id in the config is refused.
  std::string bad_cfg = R"({"rootfs":{"diff_ids":["sha256:)" + std::string(64, '0') + R"("]}})";
  std::string bad = write(
      "bad.tar", make_archive({{"manifest.json", R"([{"Config":"c.json","Layers":["x.tar"]}])"},
                               {"c.json", bad_cfg},
                               {"x.tar", make_tar({file("z", "z")})}}));
  auto b = store_->import_archive(bad, "bad", "1", ArchiveKind::kAuto, PutMode::kCreate);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("config says"), std::string::npos) << b.error().message();
  // A directory as a layer: owners and hard links survive.
  std::string src = dir_ + "/src";
  fs::create_directories(src + "/sub");
  std::ofstream(src + "/sub/f") << "dir file";
  ASSERT_EQ(::link((src + "/sub/f").c_str(), (src + "/g").c_str()), 0);
  ASSERT_EQ(::chown((src + "/sub/f").c_str(), 1000, 1000), 0);
  auto d = store_->add_layer_dir(src, "", nullptr);
  ASSERT_TRUE(d) << d.error().message();
  ASSERT_EQ(stat((d->path + "/sub/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 101000u);
  struct stat g {};
  ASSERT_EQ(stat((d->path + "/g").c_str(), &g), 0);
  EXPECT_EQ(g.st_ino, st.st_ino);
}

TEST_P(ImageStoreTest, BudgetIsEnforced) {
  store_.reset();
  auto s = open_store(1000);
  ASSERT_TRUE(s);
  auto r = (*s)->add_layer_file(write("big.tar", make_tar({file("f", std::string(5000, 'x'))})),
                                "t", nullptr);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  EXPECT_TRUE(fs::is_empty(dir_ + "/images/tmp"));
}

TEST_P(ImageStoreTest, PuttingAnExistingRefConflictsUnlessReplacing) {
  auto a = add({file("a", "1")});
  auto b = add({file("b", "2")});
  put("app", "1", {a.digest});
  ImageRecord r;
  r.name = "app";
  r.version = "1";
  r.parts = {b.digest};
  auto c = store_->put_image(r, PutMode::kCreate);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::kConflict);
  EXPECT_NE(c.error().message().find("app:1 already exists"), std::string::npos)
      << c.error().message();
  EXPECT_EQ(store_->get_image("app:1")->parts, std::vector<std::string>{a.digest});
  auto rep = store_->put_image(r, PutMode::kReplace);
  ASSERT_TRUE(rep) << rep.error().message();
  EXPECT_EQ(rep->row_version, 2u);
  EXPECT_EQ(store_->get_image("app:1")->parts, std::vector<std::string>{b.digest});
  // Without a version: the next integer, never an existing one, whatever the mode.
  r.version = "";
  auto n = store_->put_image(r, PutMode::kReplace);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(n->version, "2");
  n = store_->put_image(r, PutMode::kCreate);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(n->version, "3");
  EXPECT_EQ(store_->images()->size(), 3u);
  // A failed put stores nothing.
  r.version = "9";
  r.parts = {"sha256:" + std::string(64, '5')};
  EXPECT_EQ(store_->put_image(r, PutMode::kReplace).error().code, Code::kNotFound);
  EXPECT_EQ(store_->get_image("app:9").error().code, Code::kNotFound);
}

TEST_P(ImageStoreTest, RemovalIsRefusedWhileAnotherImageIsComposedOfIt) {
  auto a = add({file("a", "1")});
  auto b = add({file("b", "2")});
  put("base", "1", {a.digest});
  put("base", "2", {b.digest});
  put("app", "1", {"image:base"});  // the latest base: base:2
  put("pinned", "1", {"image:base:1"});
  auto e = store_->remove_image("base:2");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Code::kConflict);
  EXPECT_NE(e.error().message().find("app:1"), std::string::npos) << e.error().message();
  EXPECT_EQ(store_->remove_image("base:1").error().code, Code::kConflict);
  ASSERT_TRUE(store_->remove_image("pinned:1"));
  ASSERT_TRUE(store_->remove_image("base:1"));  // not the latest: app does not use it
  ASSERT_TRUE(store_->remove_image("app"));
  ASSERT_TRUE(store_->remove_image("base"));
  EXPECT_TRUE(store_->images()->empty());
  EXPECT_EQ(store_->remove_image("base").error().code, Code::kNotFound);
}

TEST_P(ImageStoreTest, LayerDirResolvesStoredDigestsOnly) {
  auto a = add({file("a", "1")});
  LayerResolver& res = *store_;
  auto d = res.layer_dir(a.digest);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(*d, a.path);
  EXPECT_EQ(res.layer_dir("sha256:" + std::string(64, '4')).error().code, Code::kNotFound);
  EXPECT_EQ(res.layer_dir("/etc").error().code, Code::kInvalidArgument);
  EXPECT_EQ(res.layer_dir("sha256:../../x").error().code, Code::kInvalidArgument);
}

TEST_P(ImageStoreTest, ImportsImagesJsonOnceAndRenamesIt) {
  auto a = add({file("a", "1")});
  store_.reset();
  // What a daemon before the record store wrote.
  const std::string json_path = dir_ + "/images/images.json";
  std::ofstream(json_path) << R"({"images":[
    {"name":"old","version":"1","parts":[")" +
                                  a.digest + R"("],
     "defaults":{"env":{"K":"V"},"workdir":"/w","user":"","cmd":["sh"]},"source":"tar","created_ms":1234},
    {"name":"old","version":"2","parts":["image:old:1"],"defaults":{"env":{},"workdir":"","user":"","cmd":[]},
     "source":"compose","created_ms":1235},
    {"name":"gone","version":"1","parts":["sha256:)" +
                                  std::string(64, '7') + R"("],"created_ms":5},
    {"name":"Bad Name","version":"1","parts":[")" +
                                  a.digest + R"("]}]})";
  reopen();
  auto all = store_->images();
  ASSERT_TRUE(all) << all.error().message();
  EXPECT_EQ(all->size(), 3u) << "the invalid name is skipped";
  auto old1 = store_->get_image("old:1");
  ASSERT_TRUE(old1) << old1.error().message();
  EXPECT_EQ(old1->defaults.env.at("K"), "V");
  EXPECT_EQ(old1->defaults.workdir, "/w");
  EXPECT_EQ(old1->defaults.cmd, std::vector<std::string>{"sh"});
  EXPECT_EQ(old1->source, "tar");
  EXPECT_EQ(old1->created_ms, 1234);
  auto r = store_->resolve("old");  // latest: old:2, composed of old:1
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->digests, std::vector<std::string>{a.digest});
  EXPECT_EQ(r->defaults.env.at("K"), "V");
  r->pin.reset();
  EXPECT_EQ(store_->resolve("gone:1").error().code, Code::kNotFound) << "kept, as before";
  EXPECT_FALSE(fs::exists(json_path));
  EXPECT_TRUE(fs::exists(json_path + ".migrated"));
  // The imported records reference their layer: gc keeps it.
  auto g = store_->gc();
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->removed.empty());
  EXPECT_EQ(store_->layer(a.digest)->image_refs, 1u);
  // Imported once: a record removed since is not brought back by a restart.
  ASSERT_TRUE(store_->remove_image("gone:1"));
  reopen();
  EXPECT_EQ(store_->images()->size(), 2u);
  // An import interrupted before the rename runs again: the store's records win.
  ImageRecord changed = *old1;
  changed.source = "replaced";
  ASSERT_TRUE(store_->put_image(changed, PutMode::kReplace));
  fs::copy_file(json_path + ".migrated", json_path, fs::copy_options::overwrite_existing);
  reopen();
  EXPECT_EQ(store_->get_image("old:1")->source, "replaced");
  EXPECT_EQ(store_->images()->size(), 3u);
  EXPECT_FALSE(fs::exists(json_path));
}

TEST_P(ImageStoreTest, ACorruptImagesJsonStopsTheStoreAndStaysInPlace) {
  store_.reset();
  const std::string json_path = dir_ + "/images/images.json";
  std::ofstream(json_path) << "{\"images\": [";
  auto s = open_store();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("images.json is corrupt"), std::string::npos)
      << s.error().message();
  EXPECT_TRUE(fs::exists(json_path));
  EXPECT_FALSE(fs::exists(json_path + ".migrated"));
}

INSTANTIATE_TEST_SUITE_P(RecordStores, ImageStoreTest, ::testing::Values("sqlite", "memory"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tp::image
