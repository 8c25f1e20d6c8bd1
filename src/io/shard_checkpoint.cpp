// Sharded checkpoints: the writers of shard copy 0 each write one binary file, rank 0
// commits them with index.json once every writer succeeded, and a load of any shard layout
// reads just the byte ranges of the old files that make up the new shard.
#include "io/shard_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/fault.h"
#include "core/json.h"
#include "io/file.h"
#include "model/model.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian and written with raw stores");

constexpr char kFormat[] = "tandem-checkpoint";
constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 2;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;    // shard rank of the file
  uint32_t shards;  // shard count (the checkpoint's shard size)
  uint32_t units;
  uint64_t floats;  // payload length in floats
};
static_assert(sizeof(ShardHeader) == 32);

// [Unique names] A save never writes over a file that the directory's current index names:
// until the new index is durable, the old checkpoint stays whole. A save's files are
// step-<step>-shard<r>-of-<n>.bin, or step-<step>-1-shard<r>-of-<n>.bin when the current
// index already names one of the former (the same step saved again, say by another run
// with --save-overwrite); the index records which ("save_id": "" or "1").
std::string shard_file_name(int64_t step, const std::string& save_id, int rank, int shards) {
  if (save_id.empty()) return fmt::format("step-{:08d}-shard{}-of-{}.bin", step, rank, shards);
  return fmt::format("step-{:08d}-{}-shard{}-of-{}.bin", step, save_id, rank, shards);
}

// The save id for a save of `step` at `shards` into dir (rank 0): "" unless the current
// index names one of those files. An index that cannot be read names nothing worth keeping.
std::string new_save_id(const std::string& dir, int64_t step, int shards) {
  std::set<std::string> named;
  try {
    std::ifstream in(fs::path(dir) / "index.json");
    if (!in) return "";
    const nlohmann::json index = nlohmann::json::parse(in);
    for (const nlohmann::json& f : index.at("files")) named.insert(f.at("name").get<std::string>());
  } catch (const std::exception&) {
    return "";
  }
  for (int r = 0; r < shards; ++r)
    if (named.count(shard_file_name(step, "", r, shards)) != 0) return "1";
  return "";
}

uint64_t payload_floats(const FlatLayout& flat) {
  return 3 * static_cast<uint64_t>(flat.shard_total());
}

uint64_t shard_file_bytes(const FlatLayout& flat) {
  return sizeof(ShardHeader) + payload_floats(flat) * sizeof(float);
}

// ---------------------------------------------------------------------------------------
// Save

// What every rank contributes to the all-gather of a save (and what rank 0 broadcasts for
// its own steps): fixed size, so the gather moves sizeof(SaveRecord) / 4 floats per rank.
enum SaveStatus : uint32_t { kIdle = 0, kWritten = 1, kFailed = 2 };
struct SaveRecord {
  uint32_t status = kIdle;
  uint32_t shard_rank = 0;
  uint32_t shards = 0;  // the shard size this rank saves at
  uint32_t reserved = 0;
  int64_t step = 0;
  char save_id[24] = {};  // rank 0's save id ("" or "1"; see [Unique names]), to all ranks
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  char message[192] = {};  // why it failed, NUL-terminated, truncated to fit
};
static_assert(sizeof(SaveRecord) == 256 && sizeof(SaveRecord) % sizeof(float) == 0);
constexpr size_t kRecordFloats = sizeof(SaveRecord) / sizeof(float);

void record_failure(SaveRecord& r, const std::string& message) {
  r.status = kFailed;
  const size_t n = std::min(message.size(), sizeof r.message - 1);
  std::memcpy(r.message, message.data(), n);
  r.message[n] = '\0';
}

std::string record_message(const SaveRecord& r) {
  return std::string(r.message, strnlen(r.message, sizeof r.message));
}

// Runs f, turning any exception into a failed record.
template <class F>
void record_errors(SaveRecord& r, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    record_failure(r, e.message());
  } catch (const std::exception& e) {
    record_failure(r, e.what());
  }
}

// The checks every rank makes on its own arguments before a save.
void check_save_args(const std::string& dir, const CheckpointMeta& meta, const FlatLayout& flat,
                     int shard_rank, const ShardState& state, const Communicator& world) {
  const int n = meta.shard_size;
  TD_CHECK(n == flat.shard_size() && meta.align == flat.align(),
           "checkpoint meta has shard size {} and alignment {}, the layout {} and {}", n,
           meta.align, flat.shard_size(), flat.align());
  TD_CHECK(n <= world.size(), "shard size {} exceeds the {} ranks of communicator {}", n,
           world.size(), world.name());
  TD_CHECK(meta.step >= 0, "negative step {}", meta.step);
  TD_CHECK(shard_rank >= 0 && shard_rank < n, "shard rank {} is outside [0, {})", shard_rank, n);
  const ModelLayout layout(meta.model);
  TD_CHECK(layout.num_units() == flat.num_units(), "the model has {} units, the layout {}",
           layout.num_units(), flat.num_units());
  for (int u = 0; u < flat.num_units(); ++u)
    TD_CHECK(layout.unit(u).numel == flat.unit(u).numel,
             "unit {} ('{}') has {} parameters, the layout {}", u, layout.unit(u).name,
             layout.unit(u).numel, flat.unit(u).numel);
  if (world.rank() >= n) return;  // not a writer: its state is not saved
  TD_CHECK(shard_rank == world.rank(),
           "world rank {} writes shard {} of the checkpoint but holds shard {}", world.rank(),
           world.rank(), shard_rank);
  const size_t units = static_cast<size_t>(flat.num_units());
  TD_CHECK(state.params.size() == units && state.m.size() == units && state.v.size() == units,
           "the shard state has {}/{}/{} units of params/m/v, the layout {}", state.params.size(),
           state.m.size(), state.v.size(), units);
  for (int u = 0; u < flat.num_units(); ++u) {
    const size_t s = static_cast<size_t>(flat.unit(u).shard);
    const size_t i = static_cast<size_t>(u);
    TD_CHECK(state.params[i].size() == s && state.m[i].size() == s && state.v[i].size() == s,
             "unit {} of the shard state holds {}/{}/{} params/m/v values, its shard is {}", u,
             state.params[i].size(), state.m[i].size(), state.v[i].size(), s);
    // A checkpoint is the run's last good state: one holding NaN or Inf is never committed.
    const char* names[3] = {"parameters", "first moments", "second moments"};
    const std::vector<float>* arrays[3] = {&state.params[i], &state.m[i], &state.v[i]};
    for (int k = 0; k < 3; ++k) {
      const std::vector<float>& a = *arrays[k];
      const auto bad = std::find_if(a.begin(), a.end(), [](float x) { return !std::isfinite(x); });
      TD_CHECK(bad == a.end(),
               "unit {} ('{}') holds non-finite {} at step {} ({} at element {} of shard {}): "
               "refusing to save them",
               u, layout.unit(u).name, names[k], meta.step, *bad,
               flat.shard_begin(u, shard_rank) + (bad - a.begin()), shard_rank);
    }
  }
}

void write_shard_file(const std::string& path, const FlatLayout& flat, int shard_rank,
                      const ShardState& state, SaveRecord& rec) {
  AtomicFile file(path);
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.rank = static_cast<uint32_t>(shard_rank);
  h.shards = static_cast<uint32_t>(flat.shard_size());
  h.units = static_cast<uint32_t>(flat.num_units());
  h.floats = payload_floats(flat);
  file.write(&h, sizeof h);
  for (size_t u = 0; u < state.params.size(); ++u) {
    file.write(state.params[u].data(), state.params[u].size() * sizeof(float));
    file.write(state.m[u].data(), state.m[u].size() * sizeof(float));
    file.write(state.v[u].data(), state.v[u].size() * sizeof(float));
  }
  file.commit();
  fault_point("save", 0);
  rec.status = kWritten;
  rec.bytes = file.bytes();
  rec.checksum = file.checksum();
}

nlohmann::json make_index(const CheckpointMeta& meta, const FlatLayout& flat,
                          const std::string& save_id, const std::vector<SaveRecord>& records) {
  const ModelLayout layout(meta.model);
  nlohmann::json units = nlohmann::json::array();
  for (int u = 0; u < flat.num_units(); ++u) {
    const UnitShards& s = flat.unit(u);
    units.push_back({{"name", layout.unit(u).name},
                     {"numel", s.numel},
                     {"padded", s.padded},
                     {"shard", s.shard}});
  }
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < meta.shard_size; ++r) {
    const SaveRecord& rec = records[static_cast<size_t>(r)];
    files.push_back({{"rank", r},
                     {"name", shard_file_name(meta.step, save_id, r, meta.shard_size)},
                     {"bytes", rec.bytes},
                     {"checksum", checksum_hex(rec.checksum)}});
  }
  return {
      {"format", kFormat},
      {"version", kVersion},
      {"model", model_config_to_json(meta.model)},
      {"step", meta.step},
      {"save_id", save_id},
      {"seed", meta.seed},
      {"world_size", meta.world_size},
      {"strategy", meta.strategy},
      {"shard_size", meta.shard_size},
      {"align", meta.align},
      {"train", meta.train.is_null() ? nlohmann::json::object() : meta.train},
      {"data", meta.data.is_null() ? nlohmann::json::object() : meta.data},
      {"units", units},
      {"files", files},
  };
}

// Rank 0, once every writer succeeded: checks it sees every file as written (a directory
// that is not shared between the ranks' hosts shows here), commits the index, and removes
// files no longer named by it.
void commit_index(const std::string& dir, const CheckpointMeta& meta, const FlatLayout& flat,
                  const std::string& save_id, const std::vector<SaveRecord>& records) {
  std::set<std::string> named;
  for (int r = 0; r < meta.shard_size; ++r) {
    const std::string name = shard_file_name(meta.step, save_id, r, meta.shard_size);
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    TD_CHECK(!ec && size == records[static_cast<size_t>(r)].bytes,
             "file '{}' written by rank {} is not visible to rank 0 with its {} bytes ({}); is "
             "'{}' on a filesystem all ranks share?",
             path, r, records[static_cast<size_t>(r)].bytes,
             ec ? ec.message() : fmt::format("{} bytes", size), dir);
    named.insert(name);
  }
  const std::string text = make_index(meta, flat, save_id, records).dump(2) + "\n";
  file_write_atomic((fs::path(dir) / "index.json").string(), text.data(), text.size());

  // The new index is durable: files of earlier saves (and temporaries of failed ones) are
  // garbage now. Best effort: a file that cannot be removed is left behind.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    std::error_code rm;
    if (f.rfind("step-", 0) == 0 && named.count(f) == 0) fs::remove(entry.path(), rm);
  }
}

void broadcast_record(SaveRecord& rec, Communicator& world, Device& device, Stream& stream,
                      const std::string& label) {
  world.broadcast(stream, &rec, kRecordFloats, DType::f32, 0, label);
  device.stream_sync(stream);
}

// ---------------------------------------------------------------------------------------
// Index

struct FileEntry {
  std::string path;
  uint64_t bytes = 0;
  std::string checksum;  // 16 hex digits
};

struct Index {
  CheckpointMeta meta;
  std::vector<FileEntry> files;  // by shard rank
};

// Flat-buffer alignments beyond this are refused: no writer uses them, and they would let
// a lying index make the padded sizes overflow.
constexpr int64_t kMaxAlign = int64_t{1} << 20;

// [Lying index] The index names a model, and the layout of that model is built before the
// shard files are read; a model far larger than its files (a corrupt or hostile index)
// would make that layout itself enormous. The shard files hold at least 4 bytes per
// parameter (params, m and v, 12 bytes, in fact), so a model that does not fit in the
// files present is refused before anything is sized by it.
void check_model_fits_files(const std::string& dir, const CheckpointMeta& meta,
                            const std::string& save_id) {
  uint64_t on_disk = 0;
  for (int r = 0; r < meta.shard_size; ++r) {
    const std::string path =
        (fs::path(dir) / shard_file_name(meta.step, save_id, r, meta.shard_size)).string();
    std::error_code ec;
    TD_CHECK(fs::exists(path, ec), "checkpoint '{}' is missing its file '{}'", dir, path);
    const uintmax_t size = fs::file_size(path, ec);
    TD_CHECK(!ec, "cannot stat checkpoint file '{}': {}", path, ec.message());
    on_disk += size;
  }
  const int64_t params = meta.model.num_params();
  TD_CHECK(static_cast<uint64_t>(params) <= on_disk / sizeof(float),
           "checkpoint '{}' holds model '{}' of {} parameters, but its {} shard files hold only "
           "{} bytes",
           dir, meta.model.name, params, meta.shard_size, on_disk);
}

// Validates the index of `dir` against its model and the files on disk (names, sizes).
Index read_index(const std::string& dir) {
  TD_CHECK(fs::exists(dir), "checkpoint '{}' does not exist", dir);
  TD_CHECK(fs::is_directory(dir), "checkpoint '{}' is not a directory", dir);
  const std::string path = (fs::path(dir) / "index.json").string();
  TD_CHECK(fs::exists(path), "checkpoint '{}' has no index.json (incomplete or not a checkpoint)",
           dir);
  const nlohmann::json index = json_read_file(path, "checkpoint index");

  Index ix;
  CheckpointMeta& meta = ix.meta;
  try {
    TD_CHECK(index.is_object() && index.value("format", "") == kFormat,
             "'{}' is not a tandem checkpoint (its index has no format '{}')", dir, kFormat);
    TD_CHECK(index.contains("version"), "checkpoint index of '{}' has no key 'version'", dir);
    TD_CHECK(index.at("version") == kVersion,
             "checkpoint '{}' has version {} (this build reads {})", dir,
             index.at("version").dump(), kVersion);
    for (const char* key : {"model", "step", "seed", "world_size", "strategy", "shard_size",
                            "align", "units", "files"})
      TD_CHECK(index.contains(key), "checkpoint index of '{}' has no key '{}'", dir, key);
    try {
      meta.model = model_config_from_json(index.at("model"));
      model_config_validate(meta.model);
    } catch (const Error& e) {
      TD_THROW("checkpoint '{}' has a bad model config: {}", dir, e.message());
    }
    const std::string what = fmt::format("checkpoint index of '{}'", dir);
    meta.step = json_get_int<int64_t>(index, "step", what);
    meta.seed = json_get_int<uint64_t>(index, "seed", what);
    meta.world_size = json_get_int<int>(index, "world_size", what);
    meta.strategy = index.at("strategy").get<std::string>();
    meta.shard_size = json_get_int<int>(index, "shard_size", what);
    meta.align = json_get_int<int64_t>(index, "align", what);
    meta.train = index.value("train", nlohmann::json::object());
    meta.data = index.value("data", nlohmann::json::object());
    TD_CHECK(meta.step >= 0, "checkpoint '{}' has a negative step {}", dir, meta.step);
    TD_CHECK(meta.world_size >= 1, "checkpoint '{}' has world size {}", dir, meta.world_size);
    TD_CHECK(meta.shard_size >= 1 && meta.shard_size <= meta.world_size,
             "checkpoint '{}' has shard size {} for world size {}", dir, meta.shard_size,
             meta.world_size);
    TD_CHECK(meta.align >= 1 && meta.align <= kMaxAlign,
             "checkpoint '{}' has alignment {} (expected 1 to {})", dir, meta.align, kMaxAlign);
    const std::string save_id = index.value("save_id", "");
    TD_CHECK(
        save_id.size() <= 16 && save_id.find_first_not_of("0123456789abcdef") == std::string::npos,
        "checkpoint '{}' has save id '{}' (expected up to 16 hex digits)", dir, save_id);
    const nlohmann::json& files = index.at("files");
    TD_CHECK(files.is_array() && files.size() == static_cast<size_t>(meta.shard_size),
             "checkpoint '{}' lists {} shard files, its shard size is {}", dir,
             files.is_array() ? files.size() : 0, meta.shard_size);
    check_model_fits_files(dir, meta, save_id);

    const ModelLayout layout(meta.model);
    const FlatLayout flat(layout, meta.shard_size, meta.align);
    const nlohmann::json& units = index.at("units");
    TD_CHECK(units.is_array() && units.size() == static_cast<size_t>(layout.num_units()),
             "checkpoint '{}' lists {} units, its model has {}", dir,
             units.is_array() ? units.size() : 0, layout.num_units());
    for (int u = 0; u < layout.num_units(); ++u) {
      const nlohmann::json& j = units.at(static_cast<size_t>(u));
      const UnitShards& s = flat.unit(u);
      const std::string unit_what = fmt::format("checkpoint '{}' unit {}", dir, u);
      TD_CHECK(j.at("name").get<std::string>() == layout.unit(u).name &&
                   json_get_int<int64_t>(j, "numel", unit_what) == s.numel &&
                   json_get_int<int64_t>(j, "padded", unit_what) == s.padded &&
                   json_get_int<int64_t>(j, "shard", unit_what) == s.shard,
               "checkpoint '{}' lists unit {} as {}, its model and shard layout give "
               "name '{}', numel {}, padded {}, shard {}",
               dir, u, j.dump(), layout.unit(u).name, s.numel, s.padded, s.shard);
    }

    const uint64_t expected_bytes = shard_file_bytes(flat);
    for (int r = 0; r < meta.shard_size; ++r) {
      const nlohmann::json& j = files.at(static_cast<size_t>(r));
      const std::string name = j.at("name").get<std::string>();
      const std::string expected = shard_file_name(meta.step, save_id, r, meta.shard_size);
      const std::string file_what = fmt::format("checkpoint '{}' file {}", dir, r);
      TD_CHECK(json_get_int<int>(j, "rank", file_what) == r && name == expected,
               "checkpoint '{}' lists file {} as rank {} '{}', expected rank {} '{}'", dir, r,
               j.at("rank").dump(), name, r, expected);
      FileEntry f;
      f.path = (fs::path(dir) / name).string();
      f.bytes = json_get_int<uint64_t>(j, "bytes", file_what);
      f.checksum = j.at("checksum").get<std::string>();
      TD_CHECK(f.bytes == expected_bytes,
               "checkpoint '{}' lists file '{}' with {} bytes, its layout needs {}", dir, name,
               f.bytes, expected_bytes);
      TD_CHECK(f.checksum.size() == 16 &&
                   f.checksum.find_first_not_of("0123456789abcdef") == std::string::npos,
               "checkpoint '{}' lists file '{}' with checksum '{}' (expected 16 hex digits)", dir,
               name, f.checksum);
      ix.files.push_back(std::move(f));
    }
  } catch (const nlohmann::json::exception& e) {
    TD_THROW("checkpoint index of '{}' is malformed: {}", dir, e.what());
  } catch (const Error& e) {
    if (e.message().find(dir) != std::string::npos) throw;
    TD_THROW("checkpoint '{}': {}", dir, e.message());
  }

  for (const FileEntry& f : ix.files) {
    std::error_code ec;
    TD_CHECK(fs::exists(f.path, ec), "checkpoint '{}' is missing its file '{}'", dir, f.path);
    const uintmax_t size = fs::file_size(f.path, ec);
    TD_CHECK(!ec, "cannot stat checkpoint file '{}': {}", f.path, ec.message());
    TD_CHECK(size == f.bytes, "checkpoint file '{}' holds {} bytes, the index says {} (truncated?)",
             f.path, size, f.bytes);
  }
  return ix;
}

// ---------------------------------------------------------------------------------------
// Load

// One shard file open for positioned reads.
class ShardFile {
 public:
  explicit ShardFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    TD_CHECK(fd_ >= 0, "cannot open checkpoint file '{}': {}", path_, std::strerror(errno));
  }
  ~ShardFile() { ::close(fd_); }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  // Reads up to `bytes` at `offset`; returns the bytes read (fewer only at the end).
  size_t read_some(void* dst, size_t bytes, uint64_t offset) const {
    char* p = static_cast<char*>(dst);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      TD_CHECK(n >= 0, "cannot read checkpoint file '{}': {}", path_, std::strerror(errno));
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }
  void read(void* dst, size_t bytes, uint64_t offset) const {
    TD_CHECK(read_some(dst, bytes, offset) == bytes,
             "checkpoint file '{}' ends before byte {} (truncated?)", path_, offset + bytes);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Reads element ranges of the old shard files, opening and verifying each file (checksum
// over the whole file, then its header) the first time it is needed.
class ShardReader {
 public:
  explicit ShardReader(const Index& ix)
      : ix_(ix),
        layout_(ix.meta.model),
        old_(layout_, ix.meta.shard_size, ix.meta.align),
        files_(ix.files.size()) {
    uint64_t at = sizeof(ShardHeader);
    for (int u = 0; u < old_.num_units(); ++u) {
      unit_offset_.push_back(at);
      at += 3 * static_cast<uint64_t>(old_.unit(u).shard) * sizeof(float);
    }
  }

  const ModelLayout& layout() const { return layout_; }

  // out[0, count) = elements [f0, f0 + count) of array `which` (0 params, 1 m, 2 v) of unit
  // u's flat buffer; elements past the unit's numel are zero.
  void read(int u, int which, int64_t f0, int64_t count, float* out) {
    std::fill(out, out + count, 0.0f);
    const int64_t numel = old_.unit(u).numel, shard = old_.unit(u).shard;
    const int64_t end = std::min(f0 + count, numel);
    for (int64_t f = f0; f < end;) {
      const int64_t k = f / shard, off = f % shard;
      const int64_t len = std::min(end - f, shard - off);
      const uint64_t pos = unit_offset_[static_cast<size_t>(u)] +
                           static_cast<uint64_t>(which * shard + off) * sizeof(float);
      file(static_cast<int>(k)).read(out + (f - f0), static_cast<size_t>(len) * sizeof(float), pos);
      f += len;
    }
  }

 private:
  const ShardFile& file(int k) {
    std::unique_ptr<ShardFile>& slot = files_.at(static_cast<size_t>(k));
    if (!slot) {
      auto f = std::make_unique<ShardFile>(ix_.files[static_cast<size_t>(k)].path);
      verify(*f, k);
      slot = std::move(f);
    }
    return *slot;
  }

  void verify(const ShardFile& f, int k) const {
    const FileEntry& entry = ix_.files[static_cast<size_t>(k)];
    // Up to 1 MiB at a time; a small file needs no more than its size.
    std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(entry.bytes + 1, 1 << 20)));
    uint64_t h = checksum_init(), total = 0;
    for (;;) {
      const size_t n = f.read_some(buf.data(), buf.size(), total);
      if (n == 0) break;
      h = checksum_update(h, buf.data(), n);
      total += n;
    }
    TD_CHECK(total == entry.bytes,
             "checkpoint file '{}' holds {} bytes, the index says {} (truncated?)", f.path(), total,
             entry.bytes);
    TD_CHECK(checksum_hex(h) == entry.checksum,
             "checkpoint file '{}' fails its checksum (corrupted): {} instead of {}", f.path(),
             checksum_hex(h), entry.checksum);
    ShardHeader hd;
    f.read(&hd, sizeof hd, 0);
    TD_CHECK(std::memcmp(hd.magic, kMagic, sizeof kMagic) == 0 && hd.version == kVersion,
             "checkpoint file '{}' has a bad header (not a version {} shard file)", f.path(),
             kVersion);
    TD_CHECK(hd.rank == static_cast<uint32_t>(k) &&
                 hd.shards == static_cast<uint32_t>(ix_.meta.shard_size),
             "checkpoint file '{}' holds shard {} of {}, the index lists it as shard {} of {}",
             f.path(), hd.rank, hd.shards, k, ix_.meta.shard_size);
    TD_CHECK(hd.units == static_cast<uint32_t>(old_.num_units()),
             "checkpoint file '{}' holds {} units, its model has {}", f.path(), hd.units,
             old_.num_units());
    TD_CHECK(
        hd.floats == payload_floats(old_) && entry.bytes == sizeof hd + hd.floats * sizeof(float),
        "checkpoint file '{}' has {} values, its layout needs {}", f.path(), hd.floats,
        payload_floats(old_));
  }

  const Index& ix_;
  ModelLayout layout_;
  FlatLayout old_;
  std::vector<uint64_t> unit_offset_;  // byte offset of each unit's params in every file
  std::vector<std::unique_ptr<ShardFile>> files_;
};

}  // namespace

void checkpoint_save(const std::string& dir, const CheckpointMeta& meta, const FlatLayout& flat,
                     int shard_rank, const ShardState& state, Communicator& world, Device& device,
                     Stream& stream) {
  const int rank = world.rank();

  // Rank 0 checks the arguments and creates the directory; the broadcast of the outcome is
  // the barrier the writers wait behind.
  SaveRecord dir_rec;
  if (rank == 0) {
    const std::string id = new_save_id(dir, meta.step, meta.shard_size);
    std::memcpy(dir_rec.save_id, id.data(), id.size());
    record_errors(dir_rec, [&] {
      check_save_args(dir, meta, flat, shard_rank, state, world);
      std::error_code ec;
      fs::create_directories(dir, ec);
      TD_CHECK(fs::is_directory(dir), "cannot create checkpoint directory '{}': {}", dir,
               ec ? ec.message() : "a file of that name exists");
    });
  }
  broadcast_record(dir_rec, world, device, stream, "checkpoint save: directory");
  TD_CHECK(dir_rec.status != kFailed,
           "checkpoint save to '{}' (step {}) failed, no index written: rank 0: {}", dir, meta.step,
           record_message(dir_rec));

  const std::string save_id(dir_rec.save_id, strnlen(dir_rec.save_id, sizeof dir_rec.save_id));

  // Ranks 0 .. shard_size-1 (shard copy 0) write their files.
  SaveRecord mine;
  mine.shard_rank = static_cast<uint32_t>(shard_rank);
  mine.shards = static_cast<uint32_t>(meta.shard_size);
  mine.step = meta.step;
  record_errors(mine, [&] {
    if (rank != 0) check_save_args(dir, meta, flat, shard_rank, state, world);
    if (rank < meta.shard_size) {
      const std::string name = shard_file_name(meta.step, save_id, shard_rank, meta.shard_size);
      write_shard_file((fs::path(dir) / name).string(), flat, shard_rank, state, mine);
    }
  });

  // Every rank learns every outcome. A writer contributes its record only after its file is
  // committed (synced and renamed), so the gather is also the barrier before the index.
  std::vector<SaveRecord> records(static_cast<size_t>(world.size()));
  world.all_gather(stream, &mine, records.data(), kRecordFloats, DType::f32,
                   "checkpoint save: file records");
  device.stream_sync(stream);
  std::string failures;
  for (size_t r = 0; r < records.size(); ++r) {
    const SaveRecord& rec = records[r];
    std::string why;
    if (rec.status == kFailed) {
      why = record_message(rec);
    } else if (rec.step != records[0].step || rec.shards != records[0].shards) {
      why = fmt::format("it saves step {} at shard size {}, rank 0 step {} at shard size {}",
                        rec.step, rec.shards, records[0].step, records[0].shards);
    }
    if (!why.empty())
      failures += fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", r, why);
  }
  TD_CHECK(failures.empty(), "checkpoint save to '{}' (step {}) failed, no index written: {}", dir,
           meta.step, failures);

  // Every file is durable: rank 0 commits the index, and tells the others how it went.
  SaveRecord index_rec;
  if (rank == 0) record_errors(index_rec, [&] { commit_index(dir, meta, flat, save_id, records); });
  broadcast_record(index_rec, world, device, stream, "checkpoint save: index");
  TD_CHECK(index_rec.status != kFailed,
           "checkpoint save to '{}' (step {}) failed on rank 0 writing the index: {}", dir,
           meta.step, record_message(index_rec));
}

CheckpointMeta checkpoint_read_meta(const std::string& dir) {
  return read_index(dir).meta;
}

namespace {

// Arrays 0 .. arrays-1 (params, m, v) of shard `shard_rank` under `flat`.
std::vector<std::vector<std::vector<float>>> load_shard_arrays(const std::string& dir,
                                                               const FlatLayout& flat,
                                                               int shard_rank, int arrays) {
  const Index ix = read_index(dir);
  ShardReader reader(ix);
  const ModelLayout& layout = reader.layout();
  TD_CHECK(flat.num_units() == layout.num_units(),
           "checkpoint '{}' holds {} units (model '{}'), the layout to load has {}", dir,
           layout.num_units(), ix.meta.model.name, flat.num_units());
  for (int u = 0; u < flat.num_units(); ++u)
    TD_CHECK(flat.unit(u).numel == layout.unit(u).numel,
             "checkpoint '{}' unit {} ('{}') has {} parameters, the layout to load has {}", dir, u,
             layout.unit(u).name, layout.unit(u).numel, flat.unit(u).numel);
  TD_CHECK(shard_rank >= 0 && shard_rank < flat.shard_size(),
           "shard rank {} to load from checkpoint '{}' is outside [0, {})", shard_rank, dir,
           flat.shard_size());

  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(arrays));
  for (int which = 0; which < arrays; ++which) {
    auto& units = out[static_cast<size_t>(which)];
    units.resize(static_cast<size_t>(flat.num_units()));
    for (int u = 0; u < flat.num_units(); ++u) {
      const int64_t shard = flat.unit(u).shard, begin = flat.shard_begin(u, shard_rank);
      units[static_cast<size_t>(u)].resize(static_cast<size_t>(shard));
      reader.read(u, which, begin, shard, units[static_cast<size_t>(u)].data());
    }
  }
  return out;
}

}  // namespace

ShardState checkpoint_load_shard(const std::string& dir, const FlatLayout& flat, int shard_rank) {
  auto arrays = load_shard_arrays(dir, flat, shard_rank, 3);
  ShardState state;
  state.params = std::move(arrays[0]);
  state.m = std::move(arrays[1]);
  state.v = std::move(arrays[2]);
  return state;
}

std::vector<std::vector<float>> checkpoint_load_param_shard(const std::string& dir,
                                                            const FlatLayout& flat,
                                                            int shard_rank) {
  return std::move(load_shard_arrays(dir, flat, shard_rank, 1)[0]);
}

std::vector<std::vector<float>> checkpoint_load_params(const std::string& dir,
                                                       CheckpointMeta* meta) {
  const Index ix = read_index(dir);
  ShardReader reader(ix);
  std::vector<std::vector<float>> params;
  for (const UnitLayout& u : reader.layout().units()) {
    std::vector<float> p(static_cast<size_t>(u.numel));
    reader.read(u.index, 0, 0, u.numel, p.data());
    params.push_back(std::move(p));
  }
  if (meta != nullptr) *meta = ix.meta;
  return params;
}

struct CheckpointParamReader::Impl {
  explicit Impl(const std::string& d) : dir(d), ix(read_index(d)), reader(ix) {}
  std::string dir;
  Index ix;
  ShardReader reader;  // holds a reference to ix, declared before it
};

CheckpointParamReader::CheckpointParamReader(const std::string& dir)
    : impl_(std::make_unique<Impl>(dir)) {}

CheckpointParamReader::~CheckpointParamReader() = default;

const CheckpointMeta& CheckpointParamReader::meta() const {
  return impl_->ix.meta;
}

void CheckpointParamReader::read(int unit, int64_t begin, int64_t count, float* out) {
  const ModelLayout& layout = impl_->reader.layout();
  TD_CHECK(unit >= 0 && unit < layout.num_units(), "checkpoint '{}' has no unit {} (it has {})",
           impl_->dir, unit, layout.num_units());
  const int64_t numel = layout.unit(unit).numel;
  TD_CHECK(begin >= 0 && count >= 0 && begin + count <= numel,
           "elements [{}, {}) of unit {} of checkpoint '{}' are outside its {} parameters", begin,
           begin + count, layout.unit(unit).name, impl_->dir, numel);
  impl_->reader.read(unit, 0, begin, count, out);
}

std::vector<float> CheckpointParamReader::read_pieces(int unit,
                                                      const std::vector<TpPiece>& pieces) {
  std::vector<float> out(static_cast<size_t>(tp_pieces_numel(pieces)), 0.0f);
  int64_t at = 0;
  for (const TpPiece& p : pieces) {
    if (!p.zeros) read(unit, p.begin, p.count, out.data() + at);
    at += p.count;
  }
  return out;
}

void checkpoint_check_model(const CheckpointMeta& meta, const ModelConfig& expected) {
  ModelConfig a = meta.model, b = expected;
  a.name = b.name = "";
  TD_CHECK(a == b, "checkpoint holds model '{}' ({}), but the run asks for '{}' ({})",
           meta.model.name, model_config_to_json(meta.model).dump(), expected.name,
           model_config_to_json(expected).dump());
}

}  // namespace tandem
