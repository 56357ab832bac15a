#include "api/exec_control.h"

#include <utility>

namespace tp::api {

void ExecControl::attach(uint32_t exec_id) {
  uint64_t credit;
  bool kill;
  {
    std::lock_guard lk(mu_);
    id_ = exec_id;
    credit = std::exchange(owed_credit_, 0);
    kill = std::exchange(kill_wanted_, false);
  }
  if (kill)
    fns_.kill(exec_id);
  else if (credit)
    fns_.credit(exec_id, credit);
}

void ExecControl::send(uint64_t credit, bool kill) {
  if (!kill && !credit) return;
  uint32_t id;
  {
    std::lock_guard lk(mu_);
    if (!id_) {
      owed_credit_ += credit;
      kill_wanted_ = kill_wanted_ || kill;
      return;
    }
    id = *id_;
  }
  if (kill)
    fns_.kill(id);
  else
    fns_.credit(id, credit);
}

}  // namespace tp::api
