#include "node/state.h"

namespace tp::node {

std::optional<State> next_state(State s, Event e) {
  using S = State;
  using E = Event;
  switch (e) {
    case E::kCreated:
      return s == S::kCreating ? std::optional(S::kRunning) : std::nullopt;
    case E::kCreateFailed:
      return s == S::kCreating ? std::optional(S::kStopped) : std::nullopt;
    case E::kPause:
      return s == S::kRunning ? std::optional(S::kPaused) : std::nullopt;
    case E::kResume:
      return s == S::kPaused ? std::optional(S::kRunning) : std::nullopt;
    case E::kStop:
      return (s == S::kCreating || s == S::kRunning || s == S::kPaused || s == S::kAdopting)
                 ? std::optional(S::kStopping)
                 : std::nullopt;
    case E::kStopped:
      return s == S::kStopping ? std::optional(S::kStopped) : std::nullopt;
    case E::kAdopted:
      return s == S::kAdopting ? std::optional(S::kRunning) : std::nullopt;
    case E::kAdoptFailed:
      return s == S::kAdopting ? std::optional(S::kStopped) : std::nullopt;
    case E::kRelease:
      return (s == S::kRunning || s == S::kPaused) ? std::optional(S::kReleased) : std::nullopt;
    case E::kLose:
      return (s == S::kRunning || s == S::kPaused) ? std::optional(S::kLost) : std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::string_view> stored_name(State s) {
  switch (s) {
    case State::kCreating:
      return "creating";
    case State::kRunning:
      return "running";
    case State::kPaused:
      return "paused";
    case State::kStopped:
      return "stopped";
    case State::kLost:
      return "lost";
    case State::kStopping:
    case State::kAdopting:
    case State::kReleased:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<State> state_from_stored(std::string_view s) {
  for (State st :
       {State::kCreating, State::kRunning, State::kPaused, State::kStopped, State::kLost})
    if (stored_name(st) == s) return st;
  return std::nullopt;
}

std::string_view name(State s) {
  switch (s) {
    case State::kCreating:
      return "creating";
    case State::kRunning:
      return "running";
    case State::kPaused:
      return "paused";
    case State::kStopping:
      return "stopping";
    case State::kStopped:
      return "stopped";
    case State::kLost:
      return "lost";
    case State::kAdopting:
      return "adopting";
    case State::kReleased:
      return "released";
  }
  return "?";
}

std::string_view name(Event e) {
  switch (e) {
    case Event::kCreated:
      return "created";
    case Event::kCreateFailed:
      return "create_failed";
    case Event::kPause:
      return "pause";
    case Event::kResume:
      return "resume";
    case Event::kStop:
      return "stop";
    case Event::kStopped:
      return "stopped";
    case Event::kAdopted:
      return "adopted";
    case Event::kAdoptFailed:
      return "adopt_failed";
    case Event::kRelease:
      return "release";
    case Event::kLose:
      return "lose";
  }
  return "?";
}

std::string_view to_string(EndReason r) {
  switch (r) {
    case EndReason::kNone:
      return "";
    case EndReason::kDeleted:
      return "deleted";
    case EndReason::kTtl:
      return "ttl";
    case EndReason::kIdle:
      return "idle";
    case EndReason::kFailed:
      return "failed";
    case EndReason::kDaemonShutdown:
      return "daemon_shutdown";
    case EndReason::kDaemonRestart:
      return "daemon_restart";
    case EndReason::kAgentLost:
      return "agent_lost";
    case EndReason::kLeaseExpired:
      return "lease_expired";
    case EndReason::kJobEnded:
      return "job_ended";
    case EndReason::kStepEnded:
      return "step_ended";
    case EndReason::kPoolDrained:
      return "pool_drained";
  }
  return "";
}

std::optional<EndReason> end_reason_from_string(std::string_view s) {
  for (EndReason r : {EndReason::kNone, EndReason::kDeleted, EndReason::kTtl, EndReason::kIdle,
                      EndReason::kFailed, EndReason::kDaemonShutdown, EndReason::kDaemonRestart,
                      EndReason::kAgentLost, EndReason::kLeaseExpired, EndReason::kJobEnded,
                      EndReason::kStepEnded, EndReason::kPoolDrained})
    if (to_string(r) == s) return r;
  return std::nullopt;
}

bool shown_live(std::string_view s) {
  return s == "creating" || s == "running" || s == "paused" || s == "stopping";
}

bool is_final(State s) {
  return s == State::kStopped || s == State::kLost || s == State::kReleased;
}

}  // namespace tp::node
