#include "runtime/registry.h"

namespace tp::runtime {

Result<void> Registry::add(std::unique_ptr<Backend> b) {
  if (!b) return fail(Code::kInvalidArgument, "no backend");
  std::string t = b->tier();
  if (backends_.count(t)) return fail(Code::kConflict, "tier " + t + " registered twice");
  backends_[t] = std::move(b);
  return {};
}

Backend* Registry::find(const std::string& tier) const {
  auto it = backends_.find(tier);
  return it == backends_.end() ? nullptr : it->second.get();
}

std::vector<std::string> Registry::tiers() const {
  std::vector<std::string> out;
  for (const auto& [t, b] : backends_) out.push_back(t);
  return out;
}

std::vector<Backend*> Registry::all() const {
  std::vector<Backend*> out;
  for (const auto& [t, b] : backends_) out.push_back(b.get());
  return out;
}

}  // namespace tp::runtime
