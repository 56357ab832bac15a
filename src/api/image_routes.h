// ImageRoutes: the /v1/images and /v1/layers routes (api/openapi.yaml) over an
// ImageStore. Imports, builds, record writes and gc run on the provider's own
// blocking threads, never on the io threads; the answer comes when they
// finish. Reads (and deletes) of records are short queries of the record store
// and run on the io thread, as the sandbox routes' reads do.
//
//   GET    /v1/images               list image records
//   POST   /v1/images               create/replace an image from parts (layers,
//                                   other images) and/or a host directory layer
//   POST   /v1/images/import        body = docker-save / OCI archive / tar layer
//                                   (?name=&version=&kind=auto|docker|oci|layer)
//   POST   /v1/images/build         body = build spec (src/image/builder.h)
//   POST   /v1/images/gc            remove unreferenced, unpinned layers
//   GET    /v1/images/{ref}         inspect name[:version]
//   DELETE /v1/images/{ref}         remove a record (layers go at the next gc)
//   GET    /v1/layers               stored layers with references and pins
//
// Thread rules: handle() may be called from any io thread concurrently.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <string>
#include <vector>

#include "api/routes.h"
#include "image/image_store.h"

namespace tp::api {

class ImageRoutes : public RouteProvider {
 public:
  explicit ImageRoutes(std::shared_ptr<image::ImageStore> store, size_t threads = 2);
  ~ImageRoutes() override;
  bool handle(Request& req, std::shared_ptr<Responder> res) override;
  // The routes served here (for the contract test).
  static std::vector<RouteInfo> routes();

 private:
  std::shared_ptr<image::ImageStore> store_;
  boost::asio::thread_pool pool_;
};

}  // namespace tp::api
