// Resolves an image's default user (OCI config "User") to the uid and gid that
// commands run as inside the sandbox.
//
// Accepted forms: "" (root), "uid", "uid:gid", "name", "name:group" (and mixes).
// Names are looked up in etc/passwd and etc/group of the image's layers, top
// layer first, each resolved inside its layer (never following a link out of it).
// Thread rules: pure function of its arguments and the layer files.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace tp::image {

Result<std::pair<uint32_t, uint32_t>> resolve_user(const std::string& user,
                                                   const std::vector<std::string>& layers);

}  // namespace tp::image
