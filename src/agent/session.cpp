#include "agent/session.h"

#include <unistd.h>

#include <cerrno>

namespace tp::agent {

using proto::Message;
using proto::MsgType;
using proto::Tag;

void Session::note_exec(uint32_t id, std::string_view meta) {
  if (id > high_id_) high_id_ = id;
  Record& r = cmds_[id];
  r.meta.assign(meta);
  r.ended = false;
}

size_t Session::held_bytes(uint32_t id) const {
  auto it = cmds_.find(id);
  return it == cmds_.end() ? 0 : it->second.held;
}

void Session::send(Message m, bool exec) {
  if (!exec) {
    if (!connected_) return;  // an answer to a node that is gone
    std::string bytes = proto::encode(m);
    transient_bytes_ += bytes.size();
    transient_.push_back(std::move(bytes));
    return;
  }
  Record& r = cmds_[m.id];
  if (m.type == MsgType::kExit || m.type == MsgType::kError) r.ended = true;
  // Its pid, for a node that resumes the session later (kResumed PID).
  if ((m.type == MsgType::kStarted || m.type == MsgType::kExit) && m.has(Tag::kPid))
    r.pid = m.u64(Tag::kPid);
  uint64_t seq = next_seq_++;
  m.add_u64(Tag::kSeq, seq);
  std::string bytes = proto::encode(m);
  r.held += bytes.size();
  unsent_held_ += bytes.size();
  held_.push_back(Held{seq, m.id, std::move(bytes)});
}

void Session::begin(uint64_t pid) {
  transient_.clear();
  transient_bytes_ = 0;
  cur_ = Src::kNone;
  cur_off_ = 0;
  connected_ = true;
  // A reconnecting node is one that acknowledges.
  if (sessions_ > 0) acks_ = true;
  ++sessions_;
  if (epoch_) prev_epoch_ = epoch_;
  epoch_ = 0;
  uint64_t listed = 0;
  for (const auto& [id, r] : cmds_) {
    Message m(MsgType::kResumed, id);
    m.add(Tag::kMeta, r.meta);
    m.add_bool(Tag::kRunning, !r.ended);
    if (r.pid) m.add_u64(Tag::kPid, r.pid);
    send(std::move(m), false);
    ++listed;
  }
  Message ready(MsgType::kReady, 0);
  ready.add_u64(Tag::kVersion, proto::kVersion);
  ready.add_u64(Tag::kPid, pid);
  ready.add_u64(Tag::kHighId, high_id_);
  ready.add_u64(Tag::kSession, sessions_);
  ready.add_u64(Tag::kPrevEpoch, prev_epoch_);
  ready.add_u64(Tag::kResumedCount, listed);
  ready.add_u64(Tag::kFeatures, proto::kFeatureCredit | proto::kFeatureStdinWrite);
  send(std::move(ready), false);
  // Everything not acknowledged goes again, in order.
  send_seq_ = held_.empty() ? next_seq_ : held_.front().seq;
  unsent_held_ = 0;
  for (const auto& h : held_) unsent_held_ += h.bytes.size();
}

void Session::end() {
  connected_ = false;
  transient_.clear();
  transient_bytes_ = 0;
  cur_ = Src::kNone;
  cur_off_ = 0;
}

void Session::hello(uint64_t epoch) {
  acks_ = true;
  epoch_ = epoch;
}

void Session::release(uint32_t owner, size_t bytes) {
  auto it = cmds_.find(owner);
  if (it == cmds_.end()) return;
  it->second.held -= bytes;
  if (it->second.ended && it->second.held == 0) cmds_.erase(it);
}

void Session::drop_front() {
  Held& h = held_.front();
  release(h.owner, h.bytes.size());
  held_.pop_front();
}

void Session::ack(uint64_t seq) {
  // Only what this session has written completely can be acknowledged.
  if (seq >= send_seq_) seq = send_seq_ - 1;
  while (!held_.empty() && held_.front().seq <= seq) drop_front();
}

bool Session::want_write() const {
  if (!connected_) return false;
  if (cur_ != Src::kNone || !transient_.empty()) return true;
  return !held_.empty() && held_.back().seq >= send_seq_;
}

bool Session::flush(int fd) {
  if (!connected_) return true;
  for (;;) {
    if (cur_ == Src::kNone) {
      cur_off_ = 0;
      if (!transient_.empty()) {
        cur_ = Src::kTransient;
      } else if (!held_.empty() && held_.back().seq >= send_seq_) {
        cur_ = Src::kHeld;
      } else {
        return true;
      }
    }
    const std::string& b =
        cur_ == Src::kTransient ? transient_.front() : held_[send_seq_ - held_.front().seq].bytes;
    ssize_t n = ::write(fd, b.data() + cur_off_, b.size() - cur_off_);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;
      return false;
    }
    cur_off_ += static_cast<size_t>(n);
    if (cur_off_ < b.size()) continue;
    if (cur_ == Src::kTransient) {
      transient_bytes_ -= b.size();
      transient_.pop_front();
    } else {
      unsent_held_ -= b.size();
      ++send_seq_;
      // A node that never said kHello does not acknowledge: written is done.
      if (!acks_) ack(send_seq_ - 1);
    }
    cur_ = Src::kNone;
  }
}

}  // namespace tp::agent
