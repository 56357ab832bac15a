// Private helpers of AgentClient: ExecRequest -> frames, answers -> values.
// Pure functions, kept apart so that they are unit-tested without an agent.
// Thread rules: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "node/agent_client.h"
#include "protocol/wire.h"

namespace tp::node::codec {

// The frames that start `req` as request `id`: one kExec, followed by kStdin
// frames when stdin_data does not fit one chunk (the last one carries EOF
// unless stdin_open). Fails with kPayloadTooLarge when argv/env do not fit a frame.
Result<std::vector<std::string>> exec_frames(const ExecRequest& req, uint32_t id);

// kStdin frames carrying `data` in chunks (at least one frame; EOF on the last).
std::vector<std::string> stdin_frames(uint32_t id, std::string_view data, bool eof);

// The Error a kError answer describes.
Error error_from(const proto::Message& m);

// The result a kExit answer carries.
ExecResult exec_result_from(const proto::Message& m);

// A FileEntry from stat/list fields; `fallback_path` fills PATH when absent.
FileEntry entry_from(const std::vector<std::pair<proto::Tag, std::string>>& fields,
                     std::string_view fallback_path);

// Last component of an absolute path ("/" for the root).
std::string base_name(std::string_view path);

}  // namespace tp::node::codec
