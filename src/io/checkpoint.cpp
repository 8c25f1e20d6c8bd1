// Checkpoint directories: binary shard files, then a JSON index that names them with
// sizes and checksums. The index is the commit point of a save.
#include "io/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/file.h"
#include "model/model.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;
  uint32_t world_size;
  uint32_t units;
  uint64_t floats;  // payload length in floats
};
static_assert(sizeof(ShardHeader) == 32);

std::string shard_name(int64_t step, int rank) {
  return fmt::format("step-{:08d}-rank{}.bin", step, rank);
}

nlohmann::json read_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  TD_CHECK(fs::is_directory(dir), "checkpoint '{}' is not a directory", dir);
  TD_CHECK(fs::exists(path), "checkpoint '{}' has no index.json (incomplete or not a checkpoint)",
           dir);
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    TD_THROW("checkpoint index '{}' is not valid JSON: {}", path, e.what());
  }
}

}  // namespace

void checkpoint_save(const std::string& dir, const Checkpoint& ckpt) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TD_CHECK(fs::is_directory(dir), "cannot create checkpoint directory '{}': {}", dir, ec.message());
  const ModelLayout layout(ckpt.model);
  TD_CHECK(ckpt.units.size() == static_cast<size_t>(layout.num_units()),
           "checkpoint of {} units for a model of {}", ckpt.units.size(), layout.num_units());

  const std::string name = shard_name(ckpt.step, 0);
  AtomicFile file((fs::path(dir) / name).string());
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.rank = 0;
  h.world_size = 1;
  h.units = static_cast<uint32_t>(ckpt.units.size());
  nlohmann::json units = nlohmann::json::array();
  uint64_t floats = 0;
  for (size_t u = 0; u < ckpt.units.size(); ++u) {
    const auto& cu = ckpt.units[u];
    const size_t n = static_cast<size_t>(layout.unit(static_cast<int>(u)).numel);
    TD_CHECK(cu.params.size() == n && cu.m.size() == n && cu.v.size() == n,
             "checkpoint unit {} holds {} values, the model needs {}", u, cu.params.size(), n);
    units.push_back({{"name", layout.unit(static_cast<int>(u)).name}, {"numel", n}});
    floats += 3 * n;
  }
  h.floats = floats;
  file.write(&h, sizeof h);
  for (const auto& cu : ckpt.units) {
    file.write(cu.params.data(), cu.params.size() * sizeof(float));
    file.write(cu.m.data(), cu.m.size() * sizeof(float));
    file.write(cu.v.data(), cu.v.size() * sizeof(float));
  }
  file.commit();

  nlohmann::json index = {
      {"format", "tandem-checkpoint"},
      {"version", kVersion},
      {"model", model_config_to_json(ckpt.model)},
      {"step", ckpt.step},
      {"seed", ckpt.seed},
      {"world_size", ckpt.world_size},
      {"strategy", ckpt.strategy},
      {"train", ckpt.train},
      {"data", ckpt.data},
      {"units", units},
      {"files",
       {{{"rank", 0},
         {"name", name},
         {"bytes", file.bytes()},
         {"checksum", checksum_hex(file.checksum())}}}},
  };
  const std::string text = index.dump(2) + "\n";
  file_write_atomic((fs::path(dir) / "index.json").string(), text.data(), text.size());

  // The new index is durable: files of earlier checkpoints are garbage now.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind("step-", 0) == 0 && f != name) fs::remove(entry.path(), ec);
  }
}

Checkpoint checkpoint_load(const std::string& dir) {
  const nlohmann::json index = read_index(dir);
  Checkpoint ckpt;
  std::string name;
  size_t bytes = 0;
  std::string checksum;
  try {
    TD_CHECK(index.is_object() && index.value("format", "") == "tandem-checkpoint",
             "'{}' is not a tandem checkpoint (its index has no format 'tandem-checkpoint')",
             dir);
    TD_CHECK(index.at("version") == kVersion,
             "checkpoint '{}' has version {} (this build reads {})", dir,
             index.at("version").dump(), kVersion);
    ckpt.model = model_config_from_json(index.at("model"));
    ckpt.step = index.at("step").get<int64_t>();
    TD_CHECK(ckpt.step >= 0, "checkpoint '{}' has a negative step {}", dir, ckpt.step);
    ckpt.seed = index.at("seed").get<uint64_t>();
    ckpt.world_size = index.at("world_size").get<int>();
    ckpt.strategy = index.at("strategy").get<std::string>();
    ckpt.train = index.value("train", nlohmann::json::object());
    ckpt.data = index.value("data", nlohmann::json::object());
    TD_CHECK(ckpt.world_size == 1,
             "checkpoint '{}' was written by {} ranks; this build loads single-rank checkpoints",
             dir, ckpt.world_size);
    const nlohmann::json& files = index.at("files");
    TD_CHECK(files.is_array() && files.size() == 1,
             "checkpoint '{}' lists {} rank files; a single-rank checkpoint has one", dir,
             files.is_array() ? files.size() : 0);
    name = files.at(0).at("name").get<std::string>();
    bytes = files.at(0).at("bytes").get<size_t>();
    checksum = files.at(0).at("checksum").get<std::string>();
    TD_CHECK(name.find('/') == std::string::npos && !name.empty(),
             "checkpoint '{}' names a bad file '{}'", dir, name);
  } catch (const nlohmann::json::exception& e) {
    TD_THROW("checkpoint index of '{}' is malformed: {}", dir, e.what());
  } catch (const Error& e) {
    if (e.message().find(dir) != std::string::npos) throw;
    TD_THROW("checkpoint '{}': {}", dir, e.message());
  }
  const ModelLayout layout(ckpt.model);
  const std::string path = (fs::path(dir) / name).string();
  TD_CHECK(fs::exists(path), "checkpoint '{}' is missing its file '{}'", dir, path);
  const std::vector<char> buf = file_read_all(path);
  TD_CHECK(buf.size() == bytes,
           "checkpoint file '{}' holds {} bytes, the index says {} (truncated?)", path,
           buf.size(), bytes);
  TD_CHECK(checksum_hex(checksum_update(checksum_init(), buf.data(), buf.size())) == checksum,
           "checkpoint file '{}' fails its checksum (corrupted)", path);
  ShardHeader h;
  TD_CHECK(buf.size() >= sizeof h, "checkpoint file '{}' is shorter than its header", path);
  std::memcpy(&h, buf.data(), sizeof h);
  TD_CHECK(std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion,
           "checkpoint file '{}' has a bad header", path);
  TD_CHECK(h.units == static_cast<uint32_t>(layout.num_units()),
           "checkpoint file '{}' holds {} units, its model has {}", path, h.units,
           layout.num_units());
  const float* data = reinterpret_cast<const float*>(buf.data() + sizeof h);
  const size_t floats = (buf.size() - sizeof h) / sizeof(float);
  size_t at = 0;
  for (const auto& u : layout.units()) {
    const size_t n = static_cast<size_t>(u.numel);
    TD_CHECK(at + 3 * n <= floats, "checkpoint file '{}' is truncated at unit {}", path, u.name);
    CheckpointUnit cu;
    cu.params.assign(data + at, data + at + n);
    cu.m.assign(data + at + n, data + at + 2 * n);
    cu.v.assign(data + at + 2 * n, data + at + 3 * n);
    at += 3 * n;
    ckpt.units.push_back(std::move(cu));
  }
  TD_CHECK(at == floats && h.floats == floats, "checkpoint file '{}' has {} values, expected {}",
           path, floats, at);
  return ckpt;
}

void checkpoint_check_model(const Checkpoint& ckpt, const ModelConfig& expected) {
  ModelConfig a = ckpt.model, b = expected;
  a.name = b.name = "";
  TD_CHECK(a == b, "checkpoint holds model '{}' ({}), but the run asks for '{}' ({})",
           ckpt.model.name, model_config_to_json(ckpt.model).dump(), expected.name,
           model_config_to_json(expected).dump());
}

}  // namespace tandem
