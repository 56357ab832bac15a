// Registry: the isolation tiers this node offers, by name ("container", ...).
// The daemon registers each Backend once at start; the node's sandbox manager
// looks tiers up for create and for adopting sandboxes after a restart.
//
// Thread rules: add() before the registry is shared; find()/tiers()/all() from
// any thread afterwards (the map no longer changes).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace tp::runtime {

class Registry {
 public:
  // Registers a backend under its tier() name; kConflict if the name is taken.
  Result<void> add(std::unique_ptr<Backend> b);
  // The backend of a tier, or nullptr.
  Backend* find(const std::string& tier) const;
  std::vector<std::string> tiers() const;
  std::vector<Backend*> all() const;

 private:
  std::map<std::string, std::unique_ptr<Backend>> backends_;
};

}  // namespace tp::runtime
