// WarmPools: templates (named sandbox shapes) and, per template, a pool of
// fresh sandboxes made ahead of demand, handed out in O(1) by create().
//
// The create path: a request that names a template gets the template's fields
// for every field it did not set itself (CreateParams::given); a request that
// names none but whose shape (image, tier, limits, priority) equals a pooled
// template's is served from that pool too; one that names a template but sets a
// field of the shape to another value than the template's is made cold. A ready
// sandbox of the pool is claimed (Service::claim: it becomes the client's, with
// the request's labels, env, TTL, job and step); with none ready the create goes
// cold. A claim its job refuses (a quota, a lapsed lease) leaves the sandbox in
// the pool and answers the refusal.
//
// A pooled sandbox is never reused: once handed out it leaves the pool for
// good. Pools hold fresh sandboxes only.
//
// Sizing (tick): each pool's target follows demand, the recent request rate
// (an exponentially weighted rate, hits and misses alike) times the time a cold
// create takes (measured on refills and misses), rounded up, between the template's
// pool_min and pool_max. All pools together are held under a node-wide budget
// (Options::budget_mb, each pooled sandbox counted at Options::idle_cost_kb).
// Beyond its target a pool shrinks by draining its oldest sandboxes.
//
// Pacing: refills never compete with clients. At most refills_at_once pooled
// creates run at a time, and none starts while a client's cold create or batch
// is in flight, so a client's create never waits for a refill's thread. Nor does
// one start while clients are busy (a request started or ended in the last
// Options::quiet_s, see client_request()) unless its pool is down to a quarter
// of its target: a refill takes a core for a few milliseconds, and on a small
// node the execs of the sandboxes just handed out would pay for it. A pool that
// low refills anyway, or demand would outrun it and its hits would turn into
// cold creates.
//
// Templates are stored (control/template_store.h); replacing one drains its
// pool (the sandboxes of the old shape end with pool_drained) and deleting one
// drains and forgets it. After a daemon restart the pooled sandboxes the node
// re-adopted go back to their pools (start()).
//
// Thread rules: every method may be called from any thread; one mutex inside;
// callbacks run on the Service's io threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/result.h"
#include "control/template_store.h"
#include "node/service.h"

namespace tp::node {

// Applies a template to a create request: the template's values for every field
// the request did not set (p.given), its labels under the request's, its env
// under the request's.
CreateParams apply_template(const control::TemplateRecord& t, const CreateParams& p);
// Whether a request without a template has exactly a template's shape.
bool same_shape(const control::TemplateRecord& t, const CreateParams& p);
// A pool's target: the sandboxes that demand at `rate` per second uses up while one
// cold create (`cold_s`) runs, rounded up, within [min, max].
uint32_t pool_target(double rate, double cold_s, uint32_t min, uint32_t max);
// Checks a template's fields (name, limits, priority, pool bounds).
Result<void> validate_template(const control::TemplateRecord& t);

struct PoolStatus {
  std::string template_name;
  uint32_t ready = 0;     // made and waiting to be handed out
  uint32_t creating = 0;  // refills in flight
  uint32_t target = 0;    // what the pool aims for now
  uint32_t min = 0, max = 0;
  uint64_t hits = 0, misses = 0;
  double rate = 0;          // requests per second (weighted, recent)
  double cold_seconds = 0;  // time a cold create takes (weighted, recent)
};

class WarmPools {
 public:
  struct Options {
    uint64_t budget_mb = 2048;     // all pooled sandboxes together
    uint64_t idle_cost_kb = 1024;  // one pooled sandbox, idle (kernel objects, agent)
    size_t refills_at_once = 1;
    std::chrono::milliseconds tick{250};
    double rate_half_life_s = 10;  // the request rate's memory
    // What a cold create is assumed to take until one has been measured.
    double cold_guess_s = 0.05;
    // Clients count as busy this long after a request started or ended (see Pacing).
    double quiet_s = 0.01;
    // Monotonic seconds (a seam for tests).
    std::function<double()> now_s;
  };

  WarmPools(Service& svc, control::TemplateStore& templates, Metrics& metrics, Options opts);
  ~WarmPools();
  WarmPools(const WarmPools&) = delete;
  WarmPools& operator=(const WarmPools&) = delete;

  // Loads the templates and takes the pooled sandboxes the node adopted back
  // into their pools (a stale shape is drained); then ticks on a timer.
  Result<void> start();
  // Stops ticking; the pooled sandboxes are left to the node (released with the
  // others, or stopped with them).
  void shutdown();

  // Templates. put(): version 0 creates (kConflict if the name exists), N
  // replaces (compare-and-set) and drains the old pool.
  Result<control::TemplateRecord> put_template(control::TemplateRecord t);
  Result<control::TemplateRecord> get_template(const std::string& name);
  Result<std::vector<control::TemplateRecord>> templates();
  Result<void> remove_template(const std::string& name);

  // A create through the pools (see the header). `from_pool` says which way it went.
  using CreateCb = std::function<void(Result<control::SandboxRecord>, bool from_pool)>;
  void create(CreateParams p, CreateCb cb);
  // A client's cold work in flight (creates, batches): refills wait meanwhile.
  void client_work(int delta);
  // A client's request started or ended (any that uses a sandbox or a function):
  // refills of pools above a quarter of their target wait until clients have been
  // quiet for Options::quiet_s. Lock-free: the API calls it twice per such request.
  void client_request();
  // How long clients still count as busy after the last client_request(), in
  // seconds (<= 0: quiet). The node's deferred teardowns wait for the same.
  double busy_for_s();

  std::vector<PoolStatus> status();
  // One sizing, refill and drain pass (the timer calls it; tests call it).
  void tick();

 private:
  struct Pool {
    control::TemplateRecord tpl;
    std::deque<std::string> ready;  // oldest first
    uint32_t creating = 0;
    uint32_t target = 0;
    uint64_t hits = 0, misses = 0;
    uint64_t requests_since = 0;  // since the last rate update
    double rate = 0, cold_s = 0;
    double rate_at = 0;  // when the rate was last updated
  };
  using PoolPtr = std::shared_ptr<Pool>;
  double now() const;
  PoolPtr pool_of_locked(const CreateParams& p, std::string* tpl_name);
  void serve(PoolPtr pool, CreateParams p, CreateCb cb);
  void refill(PoolPtr pool);
  // A cold create of the pool's shape took `took` seconds (a refill's or a miss's).
  void observe_cold(Pool& pool, double took);
  void observe_cold_locked(Pool& pool, double took);
  void drain(const std::vector<std::string>& ids);
  void schedule();
  void render(std::string* out);

  Service& svc_;
  control::TemplateStore& store_;
  Metrics& metrics_;
  Options opts_;
  Histogram acquire_seconds_;  // pool hit: request to handed out
  std::mutex mu_;
  std::map<std::string, PoolPtr> pools_;  // by template name
  int client_work_ = 0;
  std::atomic<double> last_request_{-1e300};  // now() of the last client_request()
  bool quiet_tick_ = false;                   // a tick is due when clients are quiet
  size_t refilling_ = 0;
  bool stopped_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace tp::node
