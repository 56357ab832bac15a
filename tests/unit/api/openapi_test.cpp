// The contract test: the routes tidepoold serves and api/openapi.yaml must agree.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>

#include "api/auth.h"
#include "api/function_routes.h"
#include "api/image_routes.h"
#include "api/lifecycle_routes.h"
#include "api/log_routes.h"
#include "api/routes.h"
#include "api/sandbox_fusion.h"

namespace tp::api {
namespace {

// Reads "METHOD /path" pairs from the spec: paths are two-space-indented keys
// under `paths:`, methods four-space-indented keys under a path.
std::set<std::string> spec_routes() {
  std::ifstream in(std::string(TP_SOURCE_DIR) + "/api/openapi.yaml");
  EXPECT_TRUE(in.good());
  std::set<std::string> out;
  std::string line, path;
  bool in_paths = false;
  std::regex path_re("^  (/[^:]*):\\s*$"), method_re("^    (get|put|post|delete|patch):.*$");
  std::smatch m;
  while (std::getline(in, line)) {
    if (line == "paths:") {
      in_paths = true;
      continue;
    }
    if (in_paths && !line.empty() && line[0] != ' ') in_paths = false;
    if (!in_paths) continue;
    if (std::regex_match(line, m, path_re)) {
      path = m[1];
    } else if (std::regex_match(line, m, method_re)) {
      std::string meth = m[1];
      for (auto& c : meth) c = static_cast<char>(std::toupper(c));
      out.insert(meth + " " + path);
    }
  }
  return out;
}

TEST(OpenApi, ServedRoutesMatchTheContract) {
  std::set<std::string> served;
  for (const auto& r : Api::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : ImageRoutes::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : LogRoutes::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : LifecycleRoutes::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : Auth::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : FunctionRoutes::routes()) served.insert(r.method + " " + r.pattern);
  for (const auto& r : SandboxFusionRoutes::routes()) served.insert(r.method + " " + r.pattern);
  std::set<std::string> spec = spec_routes();
  ASSERT_FALSE(spec.empty());
  for (const auto& s : served)
    EXPECT_TRUE(spec.count(s)) << "served but not in openapi.yaml: " << s;
  for (const auto& s : spec)
    EXPECT_TRUE(served.count(s)) << "in openapi.yaml but not served: " << s;
}

}  // namespace
}  // namespace tp::api
