#include "function/compile_cache.h"

#include <gtest/gtest.h>

namespace tp::function {
namespace {

LanguageDef cpp() {
  LanguageDef d;
  d.name = "cpp";
  d.file = "main.cpp";
  d.compile = {"g++", "{file}", "-o", "test"};
  d.binary = "test";
  d.run = {"./test"};
  return d;
}

CompileCache::EntryPtr entry(Verdict v, std::string binary, size_t stderr_size = 0) {
  auto e = std::make_shared<CompileCache::Entry>();
  e->compile.verdict = v;
  e->compile.exit_code = v == Verdict::kOk ? 0 : 1;
  e->compile.timed_out = v == Verdict::kTimeLimit;
  e->compile.stderr_data.assign(stderr_size, 'e');
  e->binary = std::move(binary);
  return e;
}

TEST(CompileCache, KeyDependsOnWhatTheCompilerReads) {
  LanguageDef d = cpp();
  std::vector<File> ab = {{"a.h", "1", 0644}, {"b.h", "2", 0644}};
  std::vector<File> ba = {{"b.h", "2", 0644}, {"a.h", "1", 0644}};
  EXPECT_EQ(CompileCache::key(d, "int main(){}", ab), CompileCache::key(d, "int main(){}", ba));
  EXPECT_NE(CompileCache::key(d, "int main(){}", ab), CompileCache::key(d, "int main(){ }", ab));
  EXPECT_NE(CompileCache::key(d, "x", {{"a.h", "1", 0644}}),
            CompileCache::key(d, "x", {{"a.h", "2", 0644}}));
  LanguageDef o2 = d;
  o2.compile.push_back("-O2");
  EXPECT_NE(CompileCache::key(d, "x", {}), CompileCache::key(o2, "x", {}));
  // Field boundaries count: "ab"+"c" is not "a"+"bc".
  EXPECT_NE(CompileCache::key(d, "ab", {{"c", "", 0644}}),
            CompileCache::key(d, "a", {{"bc", "", 0644}}));
}

TEST(CompileCache, OneCompileForManyCallers) {
  CompileCache c(1 << 20);
  int runs = 0;
  auto w = [&](Result<CompileCache::EntryPtr> r, bool) {
    ASSERT_TRUE(r);
    ++runs;
  };
  CompileCache::EntryPtr hit;
  EXPECT_EQ(c.lookup("k", w, &hit), CompileCache::Lookup::kLead);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(c.lookup("k", w, &hit), CompileCache::Lookup::kWait);
  auto waiters = c.finish("k", entry(Verdict::kOk, "BIN"));
  EXPECT_EQ(waiters.size(), 10u);
  for (auto& f : waiters) f(entry(Verdict::kOk, "BIN"), false);
  EXPECT_EQ(runs, 10);
  EXPECT_EQ(c.lookup("k", w, &hit), CompileCache::Lookup::kHit);
  EXPECT_EQ(hit->binary, "BIN");
  auto s = c.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 1u);
}

TEST(CompileCache, KeepsCleanFailuresNotLimitsOrErrors) {
  CompileCache c(1 << 20);
  CompileCache::EntryPtr hit;
  auto w = [](Result<CompileCache::EntryPtr>, bool) {};
  ASSERT_EQ(c.lookup("bad", w, &hit), CompileCache::Lookup::kLead);
  c.finish("bad", entry(Verdict::kRuntimeError, "", 100));
  EXPECT_EQ(c.lookup("bad", w, &hit), CompileCache::Lookup::kHit);
  EXPECT_FALSE(hit->ok());
  ASSERT_EQ(c.lookup("slow", w, &hit), CompileCache::Lookup::kLead);
  c.finish("slow", entry(Verdict::kTimeLimit, ""));
  EXPECT_EQ(c.lookup("slow", w, &hit), CompileCache::Lookup::kLead);  // tried again
  c.finish("slow", fail(Code::kUnavailable, "worker lost"));
  EXPECT_EQ(c.lookup("slow", w, &hit), CompileCache::Lookup::kLead);
}

TEST(CompileCache, EvictsLeastRecentlyUsedWithinItsBudget) {
  CompileCache c(3000);
  CompileCache::EntryPtr hit;
  auto w = [](Result<CompileCache::EntryPtr>, bool) {};
  for (const char* k : {"a", "b"}) {
    ASSERT_EQ(c.lookup(k, w, &hit), CompileCache::Lookup::kLead);
    c.finish(k, entry(Verdict::kOk, std::string(1000, 'x')));
  }
  ASSERT_EQ(c.lookup("a", w, &hit), CompileCache::Lookup::kHit);  // a is now the most recent
  ASSERT_EQ(c.lookup("c", w, &hit), CompileCache::Lookup::kLead);
  c.finish("c", entry(Verdict::kOk, std::string(1000, 'x')));
  EXPECT_LE(c.stats().bytes, 3000u);
  EXPECT_EQ(c.lookup("a", w, &hit), CompileCache::Lookup::kHit);
  EXPECT_EQ(c.lookup("b", w, &hit), CompileCache::Lookup::kLead);  // evicted
  // Bigger than the whole budget: never kept.
  ASSERT_EQ(c.lookup("huge", w, &hit), CompileCache::Lookup::kLead);
  c.finish("huge", entry(Verdict::kOk, std::string(5000, 'x')));
  EXPECT_EQ(c.lookup("huge", w, &hit), CompileCache::Lookup::kLead);
}

}  // namespace
}  // namespace tp::function
