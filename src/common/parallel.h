// parallel_for: one loop over independent items on a few threads, for work that is
// mostly waiting (reading files back, answering agents) at daemon start.
//
// Thread rules: fn(i) runs exactly once for every i in [0, n), on the calling thread
// or on one of up to threads - 1 helpers; fn must not throw (catch inside it) and
// must guard what the items share. A helper that cannot be started leaves its share
// to the others. Returns once every item is done.
#pragma once

#include <cstddef>
#include <functional>

namespace tp {

// Returns how many threads it used: the caller plus the helpers that started.
size_t parallel_for(size_t n, size_t threads, const std::function<void(size_t)>& fn);

}  // namespace tp
