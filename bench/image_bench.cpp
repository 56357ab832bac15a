// image_bench: (1) import throughput of the layer store in MB/s and (2) time to
// start a container sandbox from a 3-layer image whose layers are cached, for
// a small and a large image. Start time must not grow with image size: the
// layers are overlay lower directories, nothing is copied at start.
//
// Layers (base 60%, toolkit 30%, workspace 10% of the size) are tars of
// incompressible pseudo-random 4 MiB files generated here (no sparse files).
//
// usage: image_bench [--sizes-mb 10,1024] [--starts N] [--agent PATH] [--dir DIR] [--json]
// Needs root. Everything it creates is removed at the end.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/ids.h"
#include "common/log.h"
#include "control/memory_image_store.h"
#include "image/image_store.h"
#include "runtime/container/container_backend.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A layer tar of `bytes` of random data in 4 MiB files under prefix/.
bool write_layer_tar(const std::string& path, const std::string& prefix, uint64_t bytes,
                     uint64_t seed) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) return false;
  const uint64_t kFile = 4ull << 20;
  std::vector<uint64_t> buf(kFile / 8);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, prefix.c_str());
  archive_entry_set_filetype(e, AE_IFDIR);
  archive_entry_set_perm(e, 0755);
  archive_write_header(a, e);
  if (prefix == "base") {  // a shell so the sandbox's agent has a minimal world
    archive_entry_clear(e);
    archive_entry_set_pathname(e, "bin");
    archive_entry_set_filetype(e, AE_IFDIR);
    archive_entry_set_perm(e, 0755);
    archive_write_header(a, e);
  }
  for (uint64_t done = 0, i = 0; done < bytes; ++i) {
    uint64_t n = std::min(kFile, bytes - done);
    for (auto& w : buf) {  // xorshift64*: incompressible, fast
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      w = x * 2685821657736338717ull;
    }
    archive_entry_clear(e);
    archive_entry_set_pathname(e, (prefix + "/f" + std::to_string(i)).c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(n));
    archive_write_header(a, e);
    archive_write_data(a, buf.data(), n);
    done += n;
  }
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
  return true;
}

bool wait_ready(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 10000) <= 0) return false;
  char buf[256];
  return read(fd, buf, sizeof buf) > 0;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes_mb = {10, 1024};
  int starts = 20;
  bool json = false;
  std::string agent = (fs::read_symlink("/proc/self/exe").parent_path() / "tp-agent").string();
  std::string parent = "/var/tmp";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes-mb" && i + 1 < argc) {
      sizes_mb.clear();
      std::string l = argv[++i];
      for (size_t p = 0; p < l.size();) {
        size_t q = l.find(',', p);
        if (q == std::string::npos) q = l.size();
        sizes_mb.push_back(std::stoull(l.substr(p, q - p)));
        p = q + 1;
      }
    } else if (a == "--starts" && i + 1 < argc) {
      starts = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--agent" && i + 1 < argc) {
      agent = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      parent = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--sizes-mb 10,1024] [--starts N] [--agent PATH] [--dir DIR] [--json]\n",
          argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "image_bench needs root\n");
    return 1;
  }
  spdlog::set_level(spdlog::level::warn);
  std::string dir = parent + "/tp-image-bench-" + tp::ids::random_hex(4);
  fs::create_directories(dir);
  chmod(dir.c_str(), 0755);
  int rc = 0;
  struct Row {
    uint64_t mb;
    double import_s, import_mbps, start_p50, start_p90, start_max;
  };
  std::vector<Row> rows;
  {
    tp::image::StoreOptions so;
    so.data_dir = dir + "/data";
    auto store =
        tp::image::ImageStore::open(so, std::make_shared<tp::control::MemoryImageRecordStore>());
    tp::runtime::ContainerOptions co;
    co.data_dir = dir + "/data";
    co.agent_path = agent;
    co.cgroup_name = "tp-imgbench-" + tp::ids::random_hex(3);
    if (store) co.layers = *store;
    auto backend = store ? tp::runtime::make_container_backend(co) : std::unexpected(store.error());
    if (!store || !backend) {
      std::fprintf(stderr, "setup: %s\n",
                   (!store ? store.error() : backend.error()).message().c_str());
      fs::remove_all(dir);
      return 1;
    }
    uint64_t seed = 1;
    for (uint64_t mb : sizes_mb) {
      const uint64_t total = mb << 20;
      const std::pair<const char*, double> parts[] = {
          {"base", 0.6}, {"toolkit", 0.3}, {"workspace", 0.1}};
      tp::image::ImageRecord rec;
      rec.name = "bench" + std::to_string(mb);
      rec.version = "1";
      double import_s = 0;
      for (const auto& [name, frac] : parts) {
        std::string tar = dir + "/" + name + ".tar";
        if (!write_layer_tar(tar, name, static_cast<uint64_t>(static_cast<double>(total) * frac),
                             seed++)) {
          std::fprintf(stderr, "cannot write %s\n", tar.c_str());
          rc = 1;
          break;
        }
        sync();  // time the import, not the generator's dirty pages
        auto t0 = Clock::now();
        auto l = (*store)->add_layer_file(tar, name, nullptr);
        if (!l) {
          std::fprintf(stderr, "import %s: %s\n", name, l.error().message().c_str());
          rc = 1;
          break;
        }
        if (int sfd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
            sfd >= 0) {  // the layer is on disk
          ::syncfs(sfd);
          ::close(sfd);
        }
        import_s += ms_since(t0) / 1000;
        rec.parts.insert(rec.parts.begin(), l->digest);  // top first
        fs::remove(tar);
      }
      if (rc) break;
      if (auto p = (*store)->put_image(rec, tp::image::PutMode::kReplace); !p) {
        std::fprintf(stderr, "put: %s\n", p.error().message().c_str());
        rc = 1;
        break;
      }
      auto res = (*store)->resolve(rec.name + ":1");
      if (!res) {
        std::fprintf(stderr, "resolve: %s\n", res.error().message().c_str());
        rc = 1;
        break;
      }
      sync();  // no writeback of the import competes with the starts
      std::vector<double> t;
      for (int i = 0; i < starts + 2; ++i) {
        tp::runtime::SandboxSpec s;
        s.id = "ib" + std::to_string(i) + "-" + tp::ids::random_hex(3);
        s.image = rec.name;
        s.layers = res->digests;
        s.disk_bytes = 16 << 20;
        s.tmp_bytes = 16 << 20;
        s.memory_bytes = 64 << 20;
        auto t0 = Clock::now();
        auto inst = (*backend)->create(s);
        if (!inst) {
          std::fprintf(stderr, "create: %s\n", inst.error().message().c_str());
          rc = 1;
          break;
        }
        bool ok = wait_ready((*inst)->agent_fd());
        double dt = ms_since(t0);
        (void)(*inst)->destroy();
        if (!ok) {
          std::fprintf(stderr, "agent not ready\n");
          rc = 1;
          break;
        }
        if (i >= 2) t.push_back(dt);  // two warm-ups
      }
      if (rc) break;
      rows.push_back({mb, import_s, static_cast<double>(mb) / import_s, pct(t, 0.5), pct(t, 0.9),
                      *std::max_element(t.begin(), t.end())});
      res->pin.reset();
      (void)(*store)->remove_image(rec.name + ":1");
      (void)(*store)->gc();
    }
  }
  fs::remove_all(dir);
  if (json) {
    std::printf("[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf(
          "%s{\"image_mb\":%llu,\"import_s\":%.3f,\"import_mb_per_s\":%.1f,\"start_p50_ms\":%.2f,"
          "\"start_p90_ms\":%.2f,\"start_max_ms\":%.2f}",
          i ? "," : "", static_cast<unsigned long long>(rows[i].mb), rows[i].import_s,
          rows[i].import_mbps, rows[i].start_p50, rows[i].start_p90, rows[i].start_max);
    std::printf("]\n");
  } else {
    std::printf(
        "3-layer image (base 60%% / toolkit 30%% / workspace 10%%), %d starts each, layers "
        "cached\n",
        starts);
    std::printf("%10s %10s %12s %14s %14s %14s\n", "image MB", "import s", "import MB/s",
                "start p50 ms", "start p90 ms", "start max ms");
    for (const auto& r : rows)
      std::printf("%10llu %10.2f %12.1f %14.2f %14.2f %14.2f\n",
                  static_cast<unsigned long long>(r.mb), r.import_s, r.import_mbps, r.start_p50,
                  r.start_p90, r.start_max);
  }
  return rc;
}
