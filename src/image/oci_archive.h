// Parsing of image archives as `docker save` (manifest.json) and OCI image
// layouts (`skopeo copy ... oci-archive:`: oci-layout, index.json, blobs/)
// write them. Pure functions over the archive's small JSON members; the
// layers themselves are streamed by ImageStore::import_archive.
// Thread rules: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "control/image_record_store.h"

namespace tp::image {

enum class ArchiveKind { kAuto, kDocker, kOci, kLayer };
Result<ArchiveKind> parse_archive_kind(const std::string& s);  // auto|docker|oci|layer|tar

// Env, workdir, user and command of an image: part of its record.
using ImageDefaults = control::ImageDefaults;

struct LayerSource {
  std::string member;   // archive member holding the layer blob (normalized, no leading ./)
  std::string diff_id;  // expected sha256:<hex> of the uncompressed tar, "" if unknown
};

struct ImagePlan {
  std::vector<LayerSource> layers;  // bottom first, as manifests list them
  ImageDefaults defaults;
  std::vector<std::string> tags;  // RepoTags / org.opencontainers.image.ref.name
};

// Normalizes an archive member name ("./a//b" -> "a/b").
std::string normalize_member(const std::string& name);

// members: small members of the archive by normalized name (JSON files and blobs).
Result<ImagePlan> plan_docker(const std::map<std::string, std::string>& members);
Result<ImagePlan> plan_oci(const std::map<std::string, std::string>& members);
// Reads Env, WorkingDir, User, Entrypoint, Cmd and rootfs.diff_ids of an image config.
Result<ImageDefaults> parse_image_config(const std::string& json,
                                         std::vector<std::string>* diff_ids);

}  // namespace tp::image
