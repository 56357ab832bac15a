// Identifiers. A sandbox id names its node so that an api can route without a
// lookup (docs/architecture.md): "<node>-<12 hex>", e.g. "n0-3fa9c21b7e04".
// It is also the sandbox's hostname, so it is short and DNS-label safe.
// Thread rules: safe from any thread.
#pragma once

#include <string>
#include <string_view>

namespace tp::ids {

std::string new_sandbox_id(std::string_view node);
// Node part of a sandbox id, empty when the id is malformed.
std::string_view node_of(std::string_view sandbox_id);
// True for ids this module could have produced (charset and length checks).
bool valid_sandbox_id(std::string_view id);
// Random hex string of n bytes of entropy.
std::string random_hex(size_t n_bytes);

}  // namespace tp::ids
