// LayerResolver: layer digest -> the layer's directory on this host. A
// runtime backend is given one at construction and resolves the digests of a
// SandboxSpec through it (runtime/backend.h), so a spec names what a sandbox
// is made of, not where this host keeps it. image::ImageStore implements it;
// tests use a map.
//
// Resolving does not pin: the caller of Backend::create holds the layers
// against gc (ImageStore::resolve's pin) until the sandbox ends.
//
// Thread rules: implementations must allow calls from any thread.
#pragma once

#include <string>

#include "common/result.h"

namespace tp::image {

class LayerResolver {
 public:
  virtual ~LayerResolver() = default;
  // The layer's lower directory (absolute). kInvalidArgument for a digest that
  // is not "sha256:<64 hex>", kNotFound for one that is not stored.
  virtual Result<std::string> layer_dir(const std::string& digest) = 0;
};

}  // namespace tp::image
