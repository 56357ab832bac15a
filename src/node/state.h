// The sandbox state machine: states, events and end reasons as types, and one
// pure transition function (no I/O, no locks) that every state change of a
// Sandbox goes through.
//
//   creating --created--> running --pause--> paused --resume--> running
//   creating --create_failed--> stopped
//   creating|running|paused --stop--> stopping --stopped--> stopped
//   adopting --adopted--> running          (live restore after a daemon restart)
//   adopting --adopt_failed--> stopped
//   running|paused --release--> released   (daemon exits, the sandbox keeps running)
//   running|paused --lose--> lost          (the node lost track of it, e.g. its store row)
//
// Stored records and the API keep the strings they always had: creating,
// running, paused, stopped, lost. stopping, adopting and released are states of
// the daemon's view only: while in them the record keeps the string of the
// state it came from (stored_name() returns nothing), so a stored record is
// never "stopping" and a sandbox another daemon run adopts is "running".
//
// Thread rules: pure functions, callable from anywhere.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tp::node {

enum class State { kCreating, kRunning, kPaused, kStopping, kStopped, kLost, kAdopting, kReleased };

enum class Event {
  kCreated,       // backend created it and its agent reported ready
  kCreateFailed,  // backend or agent failed before it ever ran
  kPause,
  kResume,
  kStop,         // a destroy was requested (delete, ttl, idle, shutdown, agent loss)
  kStopped,      // its instance is destroyed
  kAdopted,      // a restarted daemon took it over again
  kAdoptFailed,  // ... or could not
  kRelease,      // the daemon exits and leaves it running
  kLose,
};

enum class EndReason {
  kNone,
  kDeleted,         // DELETE by a client
  kTtl,             // its ttl elapsed
  kIdle,            // idle longer than its idle timeout
  kFailed,          // creation failed, or its agent connection broke while it ran
  kDaemonShutdown,  // the daemon stopped it on exit (--stop-sandboxes-on-exit, or not adoptable)
  kDaemonRestart,   // a restarted daemon found it gone
  kAgentLost,       // a restarted daemon found it but could not reach its agent
  kLeaseExpired,    // its job's lease lapsed and the grace period ran out
  kJobEnded,        // its job was ended (DELETE /v1/jobs/{id})
  kStepEnded,       // its job's step was ended
  kPoolDrained,     // a warm-pool sandbox never handed out: its template changed or left
};

// The state after `e` in `s`, or nothing when `e` is not allowed in `s`.
std::optional<State> next_state(State s, Event e);

// The record string of a state, or nothing for the states that keep the
// string of the state they came from (stopping, adopting, released).
std::optional<std::string_view> stored_name(State s);
// Parses a stored record string (creating, running, paused, stopped, lost).
std::optional<State> state_from_stored(std::string_view s);

std::string_view name(State s);  // for logs: every state, "stopping" included
std::string_view name(Event e);
std::string_view to_string(EndReason r);  // "" for kNone
std::optional<EndReason> end_reason_from_string(std::string_view s);

// Terminal: nothing follows (stopped, lost, released).
bool is_final(State s);

// Whether a state string as the API shows it (Service::get) is of a sandbox that has
// not ended: creating, running, paused or stopping.
bool shown_live(std::string_view state);

}  // namespace tp::node
