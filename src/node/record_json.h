// The JSON of a sandbox record: what the API answers for a sandbox (schema Sandbox in
// api/openapi.yaml) and, with its layer digests, what the trajectory log's "created"
// event keeps (node/trajectory_events.h). Pure.
#pragma once

#include <boost/json/object.hpp>

#include "control/sandbox_store.h"

namespace tp::node {

boost::json::object sandbox_json(const control::SandboxRecord& r);

}  // namespace tp::node
