// The transition table of node/state.h, every (state, event) pair.
#include "node/state.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>

namespace tp::node {
namespace {

constexpr State kStates[] = {State::kCreating, State::kRunning, State::kPaused,   State::kStopping,
                             State::kStopped,  State::kLost,    State::kAdopting, State::kReleased};
constexpr Event kEvents[] = {
    Event::kCreated, Event::kCreateFailed, Event::kPause,       Event::kResume,  Event::kStop,
    Event::kStopped, Event::kAdopted,      Event::kAdoptFailed, Event::kRelease, Event::kLose};

TEST(StateMachine, TransitionTable) {
  using S = State;
  using E = Event;
  const std::map<std::pair<S, E>, S> allowed = {
      {{S::kCreating, E::kCreated}, S::kRunning}, {{S::kCreating, E::kCreateFailed}, S::kStopped},
      {{S::kCreating, E::kStop}, S::kStopping},   {{S::kRunning, E::kPause}, S::kPaused},
      {{S::kRunning, E::kStop}, S::kStopping},    {{S::kRunning, E::kRelease}, S::kReleased},
      {{S::kRunning, E::kLose}, S::kLost},        {{S::kPaused, E::kResume}, S::kRunning},
      {{S::kPaused, E::kStop}, S::kStopping},     {{S::kPaused, E::kRelease}, S::kReleased},
      {{S::kPaused, E::kLose}, S::kLost},         {{S::kStopping, E::kStopped}, S::kStopped},
      {{S::kAdopting, E::kAdopted}, S::kRunning}, {{S::kAdopting, E::kAdoptFailed}, S::kStopped},
      {{S::kAdopting, E::kStop}, S::kStopping},
  };
  int checked = 0;
  for (S s : kStates) {
    for (E e : kEvents) {
      auto it = allowed.find({s, e});
      auto got = next_state(s, e);
      if (it == allowed.end()) {
        EXPECT_FALSE(got) << name(s) << " --" << name(e) << "--> " << name(*got);
      } else {
        ASSERT_TRUE(got) << name(s) << " --" << name(e) << "--> refused";
        EXPECT_EQ(*got, it->second) << name(s) << " --" << name(e);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 80);
}

TEST(StateMachine, FinalStatesAcceptNoEvent) {
  for (State s : kStates) {
    if (!is_final(s)) continue;
    for (Event e : kEvents) EXPECT_FALSE(next_state(s, e)) << name(s) << " " << name(e);
  }
  EXPECT_TRUE(is_final(State::kStopped));
  EXPECT_TRUE(is_final(State::kReleased));
  EXPECT_FALSE(is_final(State::kStopping));
}

TEST(StateMachine, StoredNamesAreTodaysStrings) {
  EXPECT_EQ(stored_name(State::kCreating), "creating");
  EXPECT_EQ(stored_name(State::kRunning), "running");
  EXPECT_EQ(stored_name(State::kPaused), "paused");
  EXPECT_EQ(stored_name(State::kStopped), "stopped");
  EXPECT_EQ(stored_name(State::kLost), "lost");
  EXPECT_FALSE(stored_name(State::kStopping));
  EXPECT_FALSE(stored_name(State::kAdopting));
  EXPECT_FALSE(stored_name(State::kReleased));
  for (State s : kStates)
    if (auto n = stored_name(s)) {
      EXPECT_EQ(state_from_stored(*n), s);
    }
  EXPECT_FALSE(state_from_stored("stopping"));
}

TEST(StateMachine, ShownLiveUntilTheSandboxEnded) {
  for (const char* s : {"creating", "running", "paused", "stopping"})
    EXPECT_TRUE(shown_live(s)) << s;
  for (const char* s : {"stopped", "lost", "released", "adopting", ""})
    EXPECT_FALSE(shown_live(s)) << s;
}

TEST(StateMachine, EndReasonsRoundTrip) {
  for (auto r : {EndReason::kNone, EndReason::kDeleted, EndReason::kTtl, EndReason::kIdle,
                 EndReason::kFailed, EndReason::kDaemonShutdown, EndReason::kDaemonRestart,
                 EndReason::kAgentLost, EndReason::kLeaseExpired, EndReason::kJobEnded,
                 EndReason::kStepEnded, EndReason::kPoolDrained})
    EXPECT_EQ(end_reason_from_string(to_string(r)), r);
  EXPECT_EQ(to_string(EndReason::kLeaseExpired), "lease_expired");
  EXPECT_EQ(to_string(EndReason::kDeleted), "deleted");
  EXPECT_EQ(to_string(EndReason::kDaemonRestart), "daemon_restart");
  EXPECT_FALSE(end_reason_from_string("bogus"));
}

}  // namespace
}  // namespace tp::node
