#include "function/language.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace tp::function {
namespace {

const std::map<std::string, std::string> kAssets = {{"boot.js", "BOOT"}};

TEST(Language, BuiltInsServeTheIssuesLanguages) {
  auto set = LanguageSet::load("");
  ASSERT_TRUE(set) << set.error().message();
  for (const char* n : {"python", "bash", "c", "cpp", "nodejs"})
    EXPECT_NE((*set)->find(n), nullptr) << n;
  const LanguageDef* py = (*set)->find("Python3");
  ASSERT_NE(py, nullptr);
  EXPECT_EQ(py->name, "python");
  EXPECT_EQ(py->mode, RunMode::kPython);
  EXPECT_FALSE(py->preload.empty());
  const LanguageDef* cpp = (*set)->find_sandbox_fusion("cpp");
  ASSERT_NE(cpp, nullptr);
  EXPECT_TRUE(cpp->compiled());
  EXPECT_EQ(cpp->binary, "test");
  const LanguageDef* node = (*set)->find_extension(".js");
  ASSERT_NE(node, nullptr);
  EXPECT_TRUE(node->prestarted());
  // {bootstrap:...} resolved to the bundled program's text.
  bool has_boot = false;
  for (const auto& a : node->prestart)
    has_boot = has_boot || a.find("Module.runMain") != std::string::npos;
  EXPECT_TRUE(has_boot);
  EXPECT_EQ((*set)->find("cobol"), nullptr);
  EXPECT_EQ((*set)->find_sandbox_fusion("go"), nullptr);
}

TEST(Language, ParsesAMinimalDefinition) {
  auto d = parse_language(
      R"({"name":"lua","file":"main.lua","run":["lua","{file}"],"extensions":[".lua"]})", "t",
      kAssets);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->image, "host");
  EXPECT_EQ(d->mode, RunMode::kExec);
  EXPECT_FALSE(d->compiled());
}

TEST(Language, RefusesBadDefinitionsNamingTheField) {
  struct Case {
    const char* json;
    const char* says;
  } cases[] = {
      {R"({"file":"a","run":["x"]})", "'name'"},
      {R"({"name":"Bad Name","file":"a","run":["x"]})", "'name'"},
      {R"({"name":"x","run":["x"]})", "'file'"},
      {R"({"name":"x","file":"../a","run":["x"]})", "'file'"},
      {R"({"name":"x","file":"a"})", "'run'"},
      {R"({"name":"x","file":"a","run":["x"],"mode":"jit"})", "'mode'"},
      {R"({"name":"x","file":"a","run":["x"],"compile":["cc"]})", "'binary'"},
      {R"({"name":"x","file":"a","run":["x"],"binary":"b"})", "'compile'"},
      {R"({"name":"x","file":"a","run":["x"],"mode":"python","compile":["cc"],"binary":"b"})",
       "python"},
      {R"({"name":"x","file":"a","run":["x"],"prestart":["n","{bootstrap:nope.js}"]})", "nope.js"},
      {R"({"name":"x","file":"a","run":["x"],"extensions":["py"]})", "extension"},
      {R"({"name":"x","file":"a","run":["x"],"color":"red"})", "color"},
      {R"({"name":"x","file":"a","run":"x"})", "run"},
      {R"(not json)", "t"},
  };
  for (const auto& c : cases) {
    auto d = parse_language(c.json, "t", kAssets);
    ASSERT_FALSE(d) << c.json;
    EXPECT_EQ(d.error().code, Code::kInvalidArgument);
    EXPECT_NE(d.error().message().find(c.says), std::string::npos)
        << c.json << " -> " << d.error().message();
  }
}

TEST(Language, ResolvesBootstraps) {
  auto d = parse_language(
      R"({"name":"x","file":"a","run":["x"],"prestart":["n","-e","{bootstrap:boot.js}"]})", "t",
      kAssets);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->prestart, (std::vector<std::string>{"n", "-e", "BOOT"}));
}

TEST(Language, NamesMustBeUnique) {
  auto a = parse_language(R"({"name":"a","aliases":["x"],"file":"f","run":["r"]})", "t", kAssets);
  auto b = parse_language(R"({"name":"b","aliases":["X"],"file":"f","run":["r"]})", "t", kAssets);
  ASSERT_TRUE(a && b);
  auto s = LanguageSet::from({*a, *b});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("'x'"), std::string::npos);
  auto c = parse_language(R"({"name":"c","sandbox_fusion":["python"],"file":"f","run":["r"]})", "t",
                          kAssets);
  auto d = parse_language(R"({"name":"d","sandbox_fusion":["python"],"file":"f","run":["r"]})", "t",
                          kAssets);
  EXPECT_FALSE(LanguageSet::from({*c, *d}));
}

TEST(Language, ADirectoryAddsAndReplacesDefinitions) {
  auto dir = std::filesystem::temp_directory_path() / ("tp-lang-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "lua.json") << R"({"name":"lua","file":"main.lua","run":["lua","{file}"]})";
  std::ofstream(dir / "bash.json") << R"({"name":"bash","file":"s.sh","run":["/bin/sh","{file}"]})";
  auto set = LanguageSet::load(dir.string());
  ASSERT_TRUE(set) << set.error().message();
  ASSERT_NE((*set)->find("lua"), nullptr);
  EXPECT_EQ((*set)->find("bash")->file, "s.sh");
  EXPECT_EQ((*set)->find("bash")->source, (dir / "bash.json").string());
  std::ofstream(dir / "broken.json") << "{";
  auto bad = LanguageSet::load(dir.string());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("broken.json"), std::string::npos);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(LanguageSet::load("/nonexistent/tp-languages"));
}

TEST(Language, SandboxFusionNamesAreItsLiteral) {
  const auto& all = sandbox_fusion_languages();
  for (const char* n : {"python", "cpp", "nodejs", "bash", "go", "java", "R", "D_ut", "python_gpu"})
    EXPECT_NE(std::find(all.begin(), all.end(), n), all.end()) << n;
  EXPECT_EQ(std::find(all.begin(), all.end(), "c"), all.end());
}

}  // namespace
}  // namespace tp::function
