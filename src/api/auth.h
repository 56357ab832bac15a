// Authentication of API callers and what they may ask the daemon to read.
//
// Two ways in:
// - the unix socket: the caller is the peer process (SO_PEERCRED); no key is
//   needed, access to the socket (root:tidepool 0660) is the gate. Host paths
//   it names are read with its own uid, gid and groups.
// - TCP: every request except GET /health and GET /version carries an API
//   key (`Authorization: Bearer KEY`, `X-API-Key: KEY`, or HTTP Basic with the
//   key as password, for clients that only take a URL), unless the
//   operator opted in to --insecure-tcp (loopback only). Keys have a scope:
//   "user" (the sandbox and image API) or "admin" (also requests that name a
//   host path, which are read only under the --import-root directories).
//
// Keys live hashed (SHA-256) in <data_dir>/api_keys.json (mode 0600, replaced
// atomically). `tidepoold keys ...` edits the file; a running daemon notices
// the change (inode/mtime/size, checked per request) and reloads it.
//
// Thread rules: KeyFile functions may run from any thread or process (edits
// take an flock). Auth::handle may be called from any io thread concurrently.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "api/http_server.h"
#include "api/routes.h"
#include "common/result.h"
#include "sys/host_reader.h"

namespace tp::api {

struct ApiKey {
  std::string id;      // public id, e.g. "k3f9a1c02"; also the key's prefix
  std::string scope;   // "admin" or "user"
  std::string name;    // operator's label
  std::string sha256;  // hex SHA-256 of the whole key
  int64_t created_ms = 0;
};

// The key file: <data_dir>/api_keys.json.
class KeyFile {
 public:
  explicit KeyFile(std::string path) : path_(std::move(path)) {}
  static std::string in_data_dir(const std::string& data_dir) {
    return data_dir + "/api_keys.json";
  }
  const std::string& path() const { return path_; }

  // All keys; a missing file is no keys.
  Result<std::vector<ApiKey>> load() const;
  // Adds a key; returns it and the secret (shown once, never stored).
  Result<std::pair<ApiKey, std::string>> create(const std::string& scope, const std::string& name);
  // Removes a key by id: kNotFound when there is none.
  Result<ApiKey> revoke(const std::string& id);

 private:
  Result<void> save(const std::vector<ApiKey>& keys) const;
  std::string path_;
};

struct AuthOptions {
  std::string key_file;                   // KeyFile path
  bool insecure_tcp = false;              // TCP without keys (loopback only; checked by the daemon)
  std::vector<std::string> import_roots;  // canonical; host paths admin keys may name
};

class Auth {
 public:
  explicit Auth(AuthOptions opts);
  // Authenticates `req` (fills req.caller's key fields) and passes it on to
  // `next`, or answers 401 itself. Also answers GET /v1/whoami.
  void handle(Request& req, std::shared_ptr<Responder> res, const Handler& next);
  // The checks of handle(), without answering: the error to send, if any.
  Result<void> authenticate(Request& req);
  // The routes answered here (GET /v1/whoami), for the contract test.
  static std::vector<RouteInfo> routes() { return {{"GET", "/v1/whoami"}}; }

 private:
  Result<ApiKey> find_key(const std::string& secret);
  AuthOptions opts_;
  std::mutex mu_;
  std::vector<ApiKey> keys_;
  struct Stamp {
    uint64_t ino = 0, size = 0;
    int64_t mtime_ns = -1;
    bool operator==(const Stamp&) const = default;
  } stamp_;
};

// How host paths named in `req` are read: as the unix-socket peer, under the
// import roots for an admin key, else refused (every host path gets 403).
sys::HostReader host_reader(const Request& req);

// `tidepoold keys create|list|revoke ...`: argv starts after "keys".
int keys_main(int argc, char** argv);

}  // namespace tp::api
