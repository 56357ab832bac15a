// The agent's side of a session with the node: what the agent has to send,
// and what it keeps until the node has acknowledged it, so that a node that
// goes away (the daemon restarts) and comes back through the listening socket
// gets every answer of every command exactly once (src/protocol/README.md,
// "Sessions").
//
// Two kinds of frames:
//  - held: the answers of a kExec (kStarted, kOutput, kExit, and a kError for
//    an exec). Each gets a SEQ field (one counter for the agent's whole life)
//    and stays here until a kAck with a SEQ at or above it arrives, or, before
//    the node said kHello in any session (a node that does not acknowledge),
//    until it was written. A new session writes them all again, in order.
//  - transient: every other answer (files, ping, kReady). Written once, dropped
//    with the session that asked for it.
// The held bytes of each command are counted (held_bytes), so that the agent
// stops reading a command's pipes while the node is behind: memory stays
// bounded and the command blocks instead of losing output.
//
// It also keeps the command records a resumed session lists: for every exec
// id that is running or still has held frames, its META and whether it ended
// (its kExit or kError is held).
//
// No file descriptor is owned here: flush() writes to the fd it is given.
// Thread rules: single-threaded (the agent's poll loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "protocol/wire.h"

namespace tp::agent {

class Session {
 public:
  // A kExec for `id` arrived (before it was spawned): remembers its META.
  void note_exec(uint32_t id, std::string_view meta);
  // True while `id` is a running command's or has held frames (a new kExec
  // with that id must be refused).
  bool holds(uint32_t id) const { return cmds_.count(id) != 0; }
  // Unacknowledged bytes of command `id`'s frames.
  size_t held_bytes(uint32_t id) const;
  // Highest kExec id this agent has seen (0 = none).
  uint32_t high_id() const { return high_id_; }

  // Queues one answer: held when `exec` (an answer of a kExec: kStarted,
  // kOutput, kExit, kError), else transient. A held kExit or kError marks its
  // command ended. Transient frames are dropped while no session is connected.
  void send(proto::Message m, bool exec);

  // A new connection: drops what was queued for the previous one, then queues
  // one kResumed per command record (id, META, RUNNING, and PID once its kStarted
  // or kExit was sent), kReady (VERSION,
  // PID, HIGH_ID, SESSION, PREV_EPOCH, RESUMED = the number of kResumed) and
  // every held frame, in SEQ order.
  void begin(uint64_t pid);
  // The connection ended: nothing is written until the next begin().
  void end();
  bool connected() const { return connected_; }
  // kHello from the node: from now on held frames wait for acks.
  void hello(uint64_t epoch);
  // EPOCH of this session's kHello (0: none yet).
  uint64_t epoch() const { return epoch_; }
  // kAck: drops held frames up to `seq` (never beyond what was written in
  // this session).
  void ack(uint64_t seq);

  // Writes what `fd` (non-blocking) takes now. False when the stream broke.
  bool flush(int fd);
  bool want_write() const;
  // Bytes queued for this session and not yet written (held ones included).
  size_t unsent_bytes() const { return transient_bytes_ + unsent_held_; }
  // Nothing queued, held or recorded: the agent may give memory back.
  bool idle() const { return transient_.empty() && held_.empty() && cmds_.empty(); }

 private:
  struct Held {
    uint64_t seq;
    uint32_t owner;
    std::string bytes;
  };
  struct Record {
    std::string meta;
    bool ended = false;
    uint64_t pid = 0;  // from its kStarted (or kExit); 0 until then
    size_t held = 0;
  };
  void drop_front();
  void release(uint32_t owner, size_t bytes);

  std::map<uint32_t, Record> cmds_;
  std::deque<Held> held_;  // SEQ ascending, contiguous
  std::deque<std::string> transient_;
  size_t transient_bytes_ = 0;
  size_t unsent_held_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t send_seq_ = 1;  // SEQ of the next held frame to write in this session
  enum class Src { kNone, kTransient, kHeld } cur_ = Src::kNone;
  size_t cur_off_ = 0;
  uint32_t high_id_ = 0;
  bool connected_ = false;
  bool acks_ = false;
  uint64_t sessions_ = 0;
  uint64_t epoch_ = 0;       // EPOCH of this session's kHello
  uint64_t prev_epoch_ = 0;  // EPOCH of the last kHello of an earlier session
};

}  // namespace tp::agent
