#include "node/pools.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/log.h"

namespace tp::node {

using control::SandboxRecord;
using control::TemplateRecord;

namespace {

bool valid_template_name(const std::string& n) {
  if (n.empty() || n.size() > 63) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return std::isalnum(static_cast<unsigned char>(n[0]));
}

}  // namespace

CreateParams apply_template(const TemplateRecord& t, const CreateParams& p) {
  CreateParams out = p;
  auto unset = [&](const char* f) { return !p.given.count(f); };
  if (unset("image")) out.image = t.image;
  if (unset("tier")) out.tier = t.tier;
  if (unset("memory_mb")) out.memory_mb = t.memory_mb;
  if (unset("cpus")) out.cpus = t.cpus;
  if (unset("pids")) out.pids = t.pids;
  if (unset("disk_mb")) out.disk_mb = t.disk_mb;
  if (unset("ttl_seconds")) out.ttl_seconds = t.ttl_seconds;
  if (unset("idle_timeout_seconds")) out.idle_timeout_seconds = t.idle_timeout_seconds;
  if (unset("priority")) out.priority = t.priority;
  out.labels = t.labels;
  for (const auto& [k, v] : p.labels) out.labels[k] = v;
  out.env = t.env;
  for (const auto& [k, v] : p.env) out.env[k] = v;
  out.template_name = t.name;
  return out;
}

bool same_shape(const TemplateRecord& t, const CreateParams& p) {
  return t.image == p.image && t.tier == p.tier && t.memory_mb == p.memory_mb && t.cpus == p.cpus &&
         t.pids == p.pids && t.disk_mb == p.disk_mb && t.priority == p.priority;
}

uint32_t pool_target(double rate, double cold_s, uint32_t min, uint32_t max) {
  double want = std::ceil(std::max(0.0, rate) * std::max(0.0, cold_s));
  return static_cast<uint32_t>(
      std::clamp<double>(want, min, static_cast<double>(std::max(min, max))));
}

Result<void> validate_template(const TemplateRecord& t) {
  if (!valid_template_name(t.name))
    return fail(Code::kInvalidArgument,
                "template name '" + t.name +
                    "' must be 1-63 letters, digits, '-', '_' or '.', starting with a letter or "
                    "digit");
  if (t.image.empty()) return fail(Code::kInvalidArgument, "template image must not be empty");
  if (t.priority != "normal" && t.priority != "best-effort")
    return fail(Code::kInvalidArgument,
                "priority must be 'normal' or 'best-effort', not '" + t.priority + "'");
  if (t.pool_min > t.pool_max)
    return fail(Code::kInvalidArgument, "pool_min (" + std::to_string(t.pool_min) +
                                            ") must not exceed pool_max (" +
                                            std::to_string(t.pool_max) + ")");
  if (t.pool_max > 100000) return fail(Code::kInvalidArgument, "pool_max is at most 100000");
  return {};
}

WarmPools::WarmPools(Service& svc, control::TemplateStore& templates, Metrics& metrics,
                     Options opts)
    : svc_(svc), store_(templates), metrics_(metrics), opts_(std::move(opts)) {
  if (!opts_.now_s)
    opts_.now_s = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  metrics_.add_source([this, alive = std::weak_ptr<bool>(alive_)](std::string* out) {
    if (alive.lock()) render(out);
  });
}

WarmPools::~WarmPools() {
  shutdown();
  alive_.reset();  // the metrics source no longer calls in
}

double WarmPools::now() const { return opts_.now_s(); }

Result<void> WarmPools::start() {
  auto all = store_.list();
  if (!all) return std::unexpected(all.error());
  std::vector<std::string> stale;
  {
    std::lock_guard lk(mu_);
    for (auto& t : *all) {
      auto p = std::make_shared<Pool>();
      p->tpl = t;
      p->target = t.pool_min;
      p->rate_at = now();
      pools_[t.name] = p;
    }
    // What a previous run left pooled: back in its pool if its shape still holds.
    for (const auto& r : svc_.pooled()) {
      auto it = pools_.find(r.template_name);
      CreateParams shape;
      shape.image = r.image;
      shape.tier = r.tier;
      shape.memory_mb = r.memory_mb;
      shape.cpus = r.cpus;
      shape.pids = r.pids;
      shape.disk_mb = r.disk_mb;
      shape.priority = r.priority;
      if (it != pools_.end() && same_shape(it->second->tpl, shape))
        it->second->ready.push_back(r.id);
      else
        stale.push_back(r.id);
    }
  }
  drain(stale);
  schedule();
  return {};
}

void WarmPools::shutdown() {
  std::lock_guard lk(mu_);
  stopped_ = true;
}

void WarmPools::schedule() {
  svc_.after(opts_.tick, [this, alive = std::weak_ptr<bool>(alive_)] {
    if (!alive.lock()) return;
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
    }
    tick();
    schedule();
  });
}

// ---- templates -------------------------------------------------------------------

Result<TemplateRecord> WarmPools::put_template(TemplateRecord t) {
  TP_TRY(validate_template(t));
  auto v = store_.put(t);
  if (!v) return std::unexpected(v.error());
  t.version = *v;
  std::vector<std::string> old;
  {
    std::lock_guard lk(mu_);
    auto& p = pools_[t.name];
    if (p) {
      // A new shape: what the pool holds is of the old one.
      old.assign(p->ready.begin(), p->ready.end());
      p->ready.clear();
    } else {
      p = std::make_shared<Pool>();
      p->rate_at = now();
    }
    p->tpl = t;
    p->target = std::max(p->target, t.pool_min);
  }
  drain(old);
  return t;
}

Result<TemplateRecord> WarmPools::get_template(const std::string& name) {
  auto t = store_.get(name);
  if (!t) return std::unexpected(t.error());
  if (!*t) return fail(Code::kNotFound, "template '" + name + "' not found");
  return **t;
}

Result<std::vector<TemplateRecord>> WarmPools::templates() { return store_.list(); }

Result<void> WarmPools::remove_template(const std::string& name) {
  auto t = get_template(name);
  if (!t) return std::unexpected(t.error());
  TP_TRY(store_.remove(name, t->version));
  std::vector<std::string> old;
  {
    std::lock_guard lk(mu_);
    if (auto it = pools_.find(name); it != pools_.end()) {
      old.assign(it->second->ready.begin(), it->second->ready.end());
      pools_.erase(it);  // refills in flight find no pool and drain themselves
    }
  }
  drain(old);
  return {};
}

void WarmPools::drain(const std::vector<std::string>& ids) {
  for (const auto& id : ids)
    svc_.destroy(id, EndReason::kPoolDrained, [id](Result<SandboxRecord> r) {
      if (!r) TP_SB_WARN(id, "draining a pooled sandbox: {}", r.error().message());
    });
}

// ---- the create path -------------------------------------------------------------

WarmPools::PoolPtr WarmPools::pool_of_locked(const CreateParams& p, std::string* tpl_name) {
  if (!p.template_name.empty()) {
    auto it = pools_.find(p.template_name);
    if (it == pools_.end()) return nullptr;
    *tpl_name = p.template_name;
    return it->second;
  }
  for (auto& [name, pool] : pools_)
    if (pool->tpl.pool_max > 0 && same_shape(pool->tpl, p)) {
      *tpl_name = name;
      return pool;
    }
  return nullptr;
}

void WarmPools::create(CreateParams p, CreateCb cb) {
  PoolPtr pool;
  std::string name;
  {
    std::lock_guard lk(mu_);
    pool = pool_of_locked(p, &name);
    if (!pool && !p.template_name.empty()) {
      std::string t = p.template_name;
      svc_.after(std::chrono::milliseconds(0),
                 [cb, t] { cb(fail(Code::kNotFound, "template '" + t + "' not found"), false); });
      return;
    }
    if (pool) {
      if (!p.template_name.empty()) p = apply_template(pool->tpl, p);
      p.template_name = name;
      // A request that sets its own image, limits or tier (over its template's) gets
      // what it asked for, made cold: the pool holds the template's shape only.
      if (same_shape(pool->tpl, p))
        pool->requests_since++;
      else
        pool = nullptr;
    }
  }
  if (pool) return serve(pool, std::move(p), std::move(cb));
  client_work(+1);
  svc_.create(std::move(p),
              [this, cb, alive = std::weak_ptr<bool>(alive_)](Result<SandboxRecord> r) {
                if (alive.lock()) client_work(-1);
                cb(std::move(r), false);
              });
}

void WarmPools::serve(PoolPtr pool, CreateParams p, CreateCb cb) {
  std::string id;
  {
    std::lock_guard lk(mu_);
    if (!pool->ready.empty()) {
      id = pool->ready.front();
      pool->ready.pop_front();
      pool->hits++;
    } else if (pool->tpl.pool_max > 0) {
      pool->misses++;
    }
  }
  if (id.empty()) {
    client_work(+1);
    p.pooled = false;
    const double t0 = now();
    svc_.create(std::move(p),
                [this, pool, t0, cb, alive = std::weak_ptr<bool>(alive_)](Result<SandboxRecord> r) {
                  if (alive.lock()) {
                    client_work(-1);
                    if (r) observe_cold(*pool, now() - t0);
                  }
                  cb(std::move(r), false);
                });
    return;
  }
  double t0 = now();
  svc_.claim(id, p,
             [this, pool, id, p, cb, t0,
              alive = std::weak_ptr<bool>(alive_)](Result<SandboxRecord> r) mutable {
               if (!alive.lock()) return cb(std::move(r), true);
               if (r) {
                 acquire_seconds_.observe(now() - t0);
                 return cb(std::move(r), true);
               }
               // Refused by its job (a quota, a lapsed lease): it is still the pool's, and
               // so would the next one be. Put it back and answer the refusal.
               if (svc_.claimable(id)) {
                 bool kept = false;
                 {
                   std::lock_guard lk(mu_);
                   pool->hits--;
                   auto it = pools_.find(p.template_name);
                   if (it != pools_.end() && it->second == pool) {
                     pool->ready.push_front(id);
                     kept = true;
                   }
                 }
                 if (!kept) drain({id});  // its template was replaced or deleted meanwhile
                 return cb(std::move(r), false);
               }
               // It ended while pooled (its agent died, say): try the next one.
               {
                 std::lock_guard lk(mu_);
                 pool->hits--;
               }
               serve(pool, std::move(p), std::move(cb));
             });
}

void WarmPools::observe_cold(Pool& pool, double took) {
  std::lock_guard lk(mu_);
  observe_cold_locked(pool, took);
}

void WarmPools::observe_cold_locked(Pool& pool, double took) {
  pool.cold_s = pool.cold_s == 0 ? took : 0.8 * pool.cold_s + 0.2 * took;
}

void WarmPools::client_work(int delta) {
  std::lock_guard lk(mu_);
  client_work_ += delta;
}

// ---- sizing and refills ----------------------------------------------------------

void WarmPools::client_request() { last_request_.store(now(), std::memory_order_relaxed); }

double WarmPools::busy_for_s() {
  return last_request_.load(std::memory_order_relaxed) + opts_.quiet_s - now();
}

void WarmPools::tick() {
  std::vector<std::string> surplus;
  std::vector<PoolPtr> to_refill;
  int64_t quiet_ms = -1;  // >= 0: tick again then
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    const double t = now();
    const double half = std::max(0.001, opts_.rate_half_life_s);
    uint64_t held = 0;
    for (auto& [name, p] : pools_) {
      double dt = t - p->rate_at;
      if (dt > 0) {
        // An exponentially weighted rate: the requests since the last update are
        // this interval's rate, weighted by how much of the half-life it spans.
        double w = 1 - std::exp2(-dt / half);
        p->rate = (1 - w) * p->rate + w * (static_cast<double>(p->requests_since) / dt);
        p->requests_since = 0;
        p->rate_at = t;
      }
      p->target = pool_target(p->rate, p->cold_s > 0 ? p->cold_s : opts_.cold_guess_s,
                              p->tpl.pool_min, p->tpl.pool_max);
      held += p->ready.size() + p->creating;
      // Shrink: the oldest beyond the target (what demand no longer needs).
      while (p->ready.size() > p->target) {
        surplus.push_back(p->ready.front());
        p->ready.pop_front();
        held--;
      }
    }
    const uint64_t budget = opts_.budget_mb * 1024 / std::max<uint64_t>(1, opts_.idle_cost_kb);
    // Refills: none while a client's cold work is in flight, a few at a time, the
    // emptiest pool (relative to its target) first, within the budget; while
    // clients are busy, only for pools down to a quarter of their target.
    const double busy_for = busy_for_s();
    bool held_back = false;
    if (client_work_ == 0) {
      std::vector<PoolPtr> short_of;
      for (auto& [name, p] : pools_)
        if (p->ready.size() + p->creating < p->target) short_of.push_back(p);
      std::sort(short_of.begin(), short_of.end(), [](const PoolPtr& a, const PoolPtr& b) {
        auto fill = [](const PoolPtr& p) {
          return static_cast<double>(p->ready.size() + p->creating) / std::max(1u, p->target);
        };
        return fill(a) < fill(b);
      });
      for (auto& p : short_of) {
        if (refilling_ >= opts_.refills_at_once || held >= budget) break;
        if (busy_for > 0 && (p->ready.size() + p->creating) * 4 >= p->target) {
          held_back = true;
          continue;
        }
        refilling_++;
        p->creating++;
        held++;
        to_refill.push_back(p);
      }
    }
    if (held_back && !quiet_tick_) {
      quiet_tick_ = true;
      quiet_ms = 1 + static_cast<int64_t>(busy_for * 1000);
    }
  }
  if (quiet_ms >= 0) {
    // Refill as soon as clients are quiet, not at the next regular tick.
    svc_.after(std::chrono::milliseconds(quiet_ms), [this, alive = std::weak_ptr<bool>(alive_)] {
      if (!alive.lock()) return;
      {
        std::lock_guard lk(mu_);
        quiet_tick_ = false;
      }
      tick();
    });
  }
  drain(surplus);
  for (auto& p : to_refill) refill(p);
}

void WarmPools::refill(PoolPtr pool) {
  CreateParams p;
  uint64_t version = 0;
  {
    std::lock_guard lk(mu_);
    const TemplateRecord& t = pool->tpl;
    p.image = t.image;
    p.tier = t.tier;
    p.memory_mb = t.memory_mb;
    p.cpus = t.cpus;
    p.pids = t.pids;
    p.disk_mb = t.disk_mb;
    p.priority = t.priority;
    p.env = t.env;
    p.template_name = t.name;
    p.pooled = true;
    version = t.version;
  }
  double t0 = now();
  svc_.create(p, [this, pool, version, t0, name = p.template_name,
                  alive = std::weak_ptr<bool>(alive_)](Result<SandboxRecord> r) {
    if (!alive.lock()) return;
    bool keep = false;
    {
      std::lock_guard lk(mu_);
      refilling_--;
      pool->creating--;
      auto it = pools_.find(name);
      // Still this pool, of this shape, and not shut down: it joins the pool.
      keep = r && !stopped_ && it != pools_.end() && it->second == pool &&
             pool->tpl.version == version;
      if (r) observe_cold_locked(*pool, now() - t0);
      if (keep) pool->ready.push_back(r->id);
    }
    if (!r) {
      spdlog::warn("pool {}: refill failed: {}", name, r.error().message());
      return;  // the next tick tries again
    }
    if (!keep) return drain({r->id});
    // The next refill starts now rather than at the next tick (tick() still starts
    // none while a client's cold work is in flight).
    svc_.after(std::chrono::milliseconds(0),
               [this, alive] {  // not alive_: the destructor resets it meanwhile
                 if (alive.lock()) tick();
               });
  });
}

std::vector<PoolStatus> WarmPools::status() {
  std::lock_guard lk(mu_);
  std::vector<PoolStatus> out;
  for (const auto& [name, p] : pools_) {
    PoolStatus s;
    s.template_name = name;
    s.ready = static_cast<uint32_t>(p->ready.size());
    s.creating = p->creating;
    s.target = p->target;
    s.min = p->tpl.pool_min;
    s.max = p->tpl.pool_max;
    s.hits = p->hits;
    s.misses = p->misses;
    s.rate = p->rate;
    s.cold_seconds = p->cold_s;
    out.push_back(std::move(s));
  }
  return out;
}

void WarmPools::render(std::string* out) {
  auto st = status();
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    *out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n", name, help, type);
    for (const auto& s : st)
      *out += fmt::format("{}{{template=\"{}\"}} {}\n", name, s.template_name, value(s));
  };
  family("tidepool_pool_ready", "gauge", "Warm-pool sandboxes ready to hand out.",
         [](const PoolStatus& s) { return s.ready; });
  family("tidepool_pool_target", "gauge", "What each warm pool aims for now.",
         [](const PoolStatus& s) { return s.target; });
  family("tidepool_pool_creating", "gauge", "Warm-pool refills in flight.",
         [](const PoolStatus& s) { return s.creating; });
  family("tidepool_pool_hits_total", "counter", "Creates served from a warm pool.",
         [](const PoolStatus& s) { return s.hits; });
  family("tidepool_pool_misses_total", "counter",
         "Creates of a pooled template that found its pool empty (created cold).",
         [](const PoolStatus& s) { return s.misses; });
  *out +=
      "# HELP tidepool_pool_acquire_seconds Time to hand out a warm-pool sandbox.\n"
      "# TYPE tidepool_pool_acquire_seconds histogram\n";
  acquire_seconds_.render("tidepool_pool_acquire_seconds", out);
}

}  // namespace tp::node
