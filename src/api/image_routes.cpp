#include "api/image_routes.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/json.hpp>
#include <ctime>

#include "api/auth.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "image/builder.h"
#include "image/layer_unpack.h"
#include "sys/fd.h"
#include "sys/host_reader.h"

namespace tp::api {

namespace json = boost::json;
using image::ImageRecord;

namespace {

json::object image_json(image::ImageStore& store, const ImageRecord& r) {
  json::object o;
  o["name"] = r.name;
  o["version"] = r.version;
  o["ref"] = r.name + ":" + r.version;
  json::array parts;
  for (const auto& p : r.parts) parts.emplace_back(p);
  o["parts"] = std::move(parts);
  json::array layers;
  uint64_t size = 0;
  json::object d;
  auto res = store.resolve(r.name + ":" + r.version);
  if (res) {
    for (const auto& l : res->digests) layers.emplace_back(l);
    size = res->bytes;
    json::object env;
    for (const auto& [k, v] : res->defaults.env) env[k] = v;
    d["env"] = std::move(env);
    d["workdir"] = res->defaults.workdir;
    d["user"] = res->defaults.user;
    json::array cmd;
    for (const auto& c : res->defaults.cmd) cmd.emplace_back(c);
    d["cmd"] = std::move(cmd);
  } else {
    o["error"] = res.error().message();
  }
  o["layers"] = std::move(layers);
  o["defaults"] = std::move(d);
  o["size_bytes"] = size;
  o["source"] = r.source;
  o["created_at"] = json_util::rfc3339(r.created_ms);
  return o;
}

json::object layer_json(const image::LayerInfo& l) {
  json::object o;
  o["digest"] = l.digest;
  o["size_bytes"] = l.bytes;
  o["entries"] = l.entries;
  o["source"] = l.source;
  o["created_at"] = json_util::rfc3339(l.created_ms);
  o["image_refs"] = l.image_refs;
  o["pins"] = l.pins;
  return o;
}

// A host directory (or file) as a layer, read by `who` (never by the daemon
// itself: see sys/host_reader.h). The reader's own failure (e.g. permission
// denied) wins over what the unpacker made of its partial output.
Result<image::LayerInfo> layer_from_host(image::ImageStore& store, const sys::HostReader& who,
                                         const std::string& dir,
                                         std::vector<std::shared_ptr<void>>* pins) {
  auto rd = sys::read_host_tar(who, dir);
  if (!rd) return std::unexpected(rd.error());
  auto li = store.add_layer_stream(image::fd_source(rd->fd()), "", "dir:" + dir, pins);
  auto done = rd->finish();
  // A refused stream (too large, a bad entry) ends the reader with a broken
  // pipe: then the unpacker's error is the one that explains.
  if (!done && (li || done.error().code == Code::kPermissionDenied ||
                done.error().code == Code::kNotFound)) {
    spdlog::info("image from host path {} refused: {}", dir, done.error().message());
    return std::unexpected(done.error());
  }
  return li;
}

// POST /v1/images body -> record (blocking: may store a directory layer).
Result<ImageRecord> create_image(image::ImageStore& store, const sys::HostReader& who,
                                 const std::string& body) {
  auto o = json_util::parse_object(body);
  if (!o) return std::unexpected(o.error());
  TP_TRY(json_util::only_keys(
      *o, {"name", "version", "parts", "dir", "env", "workdir", "user", "cmd"}));
  ImageRecord r;
  auto name = json_util::get_string(*o, "name", "");
  auto version = json_util::get_string(*o, "version", "");
  auto dir = json_util::get_string(*o, "dir", "");
  auto workdir = json_util::get_string(*o, "workdir", "");
  auto user = json_util::get_string(*o, "user", "");
  auto env = json_util::get_string_map(*o, "env");
  auto parts = json_util::get_string_list(*o, "parts");
  auto cmd = json_util::get_string_list(*o, "cmd");
  for (const Error* e : {name ? nullptr : &name.error(), version ? nullptr : &version.error(),
                         dir ? nullptr : &dir.error(), workdir ? nullptr : &workdir.error(),
                         user ? nullptr : &user.error(), env ? nullptr : &env.error(),
                         parts ? nullptr : &parts.error(), cmd ? nullptr : &cmd.error()})
    if (e) return std::unexpected(*e);
  if (!image::valid_image_name(*name))
    return fail(Code::kInvalidArgument, "field 'name': invalid image name '" + *name + "'");
  r.name = *name;
  r.parts = *parts;
  r.defaults.env = *env;
  r.defaults.workdir = *workdir;
  r.defaults.user = *user;
  r.defaults.cmd = *cmd;
  r.source = "compose";
  std::vector<std::shared_ptr<void>> pins;  // held until the record exists
  if (!dir->empty()) {
    if ((*dir)[0] != '/')
      return fail(Code::kInvalidArgument, "field 'dir' must be an absolute host path");
    auto li = layer_from_host(store, who, *dir, &pins);
    if (!li) return std::unexpected(li.error());
    r.parts.insert(r.parts.begin(), li->digest);
    r.source = "dir:" + *dir;
  }
  r.version = *version;  // "" = the next integer
  // An explicit version replaces an existing image of that name:version (the
  // API's "create or replace").
  return store.put_image(std::move(r), image::PutMode::kReplace);
}

struct Route {
  const char* method;
  const char* pattern;
};
const std::vector<Route> kRoutes = {
    {"GET", "/v1/images"},          {"POST", "/v1/images"},    {"POST", "/v1/images/import"},
    {"POST", "/v1/images/build"},   {"POST", "/v1/images/gc"}, {"GET", "/v1/images/{ref}"},
    {"DELETE", "/v1/images/{ref}"}, {"GET", "/v1/layers"},
};

}  // namespace

ImageRoutes::ImageRoutes(std::shared_ptr<image::ImageStore> store, size_t threads)
    : store_(std::move(store)), pool_(threads) {}

ImageRoutes::~ImageRoutes() {
  pool_.stop();
  pool_.join();
}

std::vector<RouteInfo> ImageRoutes::routes() {
  std::vector<RouteInfo> out;
  for (const auto& r : kRoutes) out.push_back({r.method, r.pattern});
  return out;
}

bool ImageRoutes::handle(Request& req, std::shared_ptr<Responder> res) {
  const std::string& p = req.path;
  const std::string& m = req.method;
  auto store = store_;
  auto blocking = [this](auto fn) { boost::asio::post(pool_, std::move(fn)); };

  if (p == "/v1/layers") {
    if (m != "GET") return false;
    auto ls = store->layers();
    if (!ls) {
      res->send_error(ls.error());
      return true;
    }
    json::array arr;
    for (const auto& l : *ls) arr.emplace_back(layer_json(l));
    json::object o;
    o["layers"] = std::move(arr);
    o["used_bytes"] = store->used_bytes();
    res->send_json(200, o);
    return true;
  }
  if (p == "/v1/images" || p == "/v1/images/") {
    if (m == "GET") {
      auto imgs = store->images();
      if (!imgs) {
        res->send_error(imgs.error());
        return true;
      }
      json::array arr;
      for (const auto& r : *imgs) arr.emplace_back(image_json(*store, r));
      json::object o;
      o["images"] = std::move(arr);
      res->send_json(200, o);
      return true;
    }
    if (m == "POST") {
      blocking([store, res, who = host_reader(req), body = std::move(req.body)] {
        auto r = create_image(*store, who, body);
        if (!r) return res->send_error(r.error());
        res->send_json(201, image_json(*store, *r));
      });
      return true;
    }
    return false;
  }
  if (p == "/v1/images/import" && m == "POST") {
    auto kind = image::parse_archive_kind(req.q("kind") ? *req.q("kind") : "auto");
    if (!kind) {
      res->send_error(kind.error());
      return true;
    }
    std::string name = req.q("name") ? *req.q("name") : "";
    std::string version = req.q("version") ? *req.q("version") : "";
    if (req.body_size() == 0) {
      res->send_error(Error{Code::kInvalidArgument, 0, "the request body must be the archive"});
      return true;
    }
    blocking(
        [store, res, body = std::move(req.body), spooled = req.upload, name, version, k = *kind] {
          // A spooled upload is read from its file where it is; a small one is written out.
          std::string tmp = spooled ? spooled->proc_path()
                                    : store->root() + "/tmp/upload-" + ids::random_hex(8) + ".tar";
          if (!spooled) {
            sys::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
            size_t off = 0;
            while (fd && off < body.size()) {
              ssize_t w = ::write(fd.get(), body.data() + off, body.size() - off);
              if (w <= 0) break;
              off += static_cast<size_t>(w);
            }
            if (!fd || off != body.size()) {
              ::unlink(tmp.c_str());
              return res->send_error(Error{Code::kInsufficientStorage, errno, "write " + tmp});
            }
          }
          // An explicit (or tagged) version replaces that name:version, as it always did.
          auto r = store->import_archive(tmp, name, version, k, image::PutMode::kReplace);
          if (!spooled) ::unlink(tmp.c_str());
          if (!r) {
            spdlog::warn("image import refused: {}", r.error().message());
            return res->send_error(r.error());
          }
          res->send_json(201, image_json(*store, *r));
        });
    return true;
  }
  if (p == "/v1/images/build" && m == "POST") {
    auto spec = image::parse_build_spec(req.body);
    if (!spec) {
      res->send_error(spec.error());
      return true;
    }
    // The spec's local files (and a file:// mirror) are read as the caller could.
    blocking([store, res, s = std::move(*spec), who = host_reader(req)] {
      auto r = image::build_image(*store, s, who);
      if (!r) return res->send_error(r.error());
      json::object o = image_json(*store, r->image);
      o["cached"] = r->cached;
      o["log_tail"] = r->log_tail;
      res->send_json(201, o);
    });
    return true;
  }
  if (p == "/v1/images/gc" && m == "POST") {
    blocking([store, res] {
      auto r = store->gc();
      if (!r) return res->send_error(r.error());
      json::object o;
      json::array removed;
      for (const auto& d : r->removed) removed.emplace_back(d);
      o["removed"] = std::move(removed);
      o["freed_bytes"] = r->freed_bytes;
      o["kept"] = r->kept;
      o["pinned_unreferenced"] = r->pinned_unreferenced;
      res->send_json(200, o);
    });
    return true;
  }
  const std::string prefix = "/v1/images/";
  if (p.rfind(prefix, 0) == 0 && p.find('/', prefix.size()) == std::string::npos) {
    std::string ref = p.substr(prefix.size());
    if (m == "GET") {
      auto r = store->get_image(ref);
      if (!r)
        res->send_error(r.error());
      else
        res->send_json(200, image_json(*store, *r));
      return true;
    }
    if (m == "DELETE") {
      auto r = store->get_image(ref);
      if (!r) {
        res->send_error(r.error());
        return true;
      }
      json::object before = image_json(*store, *r);
      auto d = store->remove_image(r->name + ":" + r->version);
      if (!d)
        res->send_error(d.error());
      else
        res->send_json(200, before);
      return true;
    }
  }
  return false;
}

}  // namespace tp::api
