// Tests of sharded checkpoints in one process: saves through the one-rank communicator and
// hand-written multi-shard checkpoints (the documented format), loaded at other shard sizes
// and alignments element by element; crash safety, cleanup, and every malformed input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "device/device.h"
#include "io/file.h"
#include "io/shard_checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "shard/flat.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("tandem_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The message of the tandem::Error f throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected a tandem::Error";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// A small GPT-2 whose unit sizes are not multiples of the alignments tested.
ModelConfig small_model() {
  return model_config_from_json({{"name", "ckpt-test"},
                                 {"family", "gpt2"},
                                 {"vocab", 51},
                                 {"vocab_padded", 51},
                                 {"context", 11},
                                 {"d_model", 12},
                                 {"n_layer", 2},
                                 {"n_head", 3},
                                 {"d_ff", 20}});
}

// Element f of array `which` (0 params, 1 m, 2 v) of unit u in the global state: distinct,
// nonzero and exact in fp32 within the model; zero in the padding past numel.
float global_value(const ModelLayout& layout, int u, int which, int64_t f) {
  if (f >= layout.unit(u).numel) return 0.0f;
  uint64_t h = (static_cast<uint64_t>(u) << 40) ^ (static_cast<uint64_t>(which) << 32) ^
               static_cast<uint64_t>(f);
  h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return static_cast<float>(h & 0xffffff) + 1.0f;
}

// Shard `rank` of the global state under `flat`.
ShardState global_shard(const ModelLayout& layout, const FlatLayout& flat, int rank) {
  ShardState s;
  for (int u = 0; u < flat.num_units(); ++u) {
    std::vector<float> a[3];
    for (int which = 0; which < 3; ++which)
      for (int64_t e = 0; e < flat.unit(u).shard; ++e)
        a[which].push_back(global_value(layout, u, which, flat.shard_begin(u, rank) + e));
    s.params.push_back(std::move(a[0]));
    s.m.push_back(std::move(a[1]));
    s.v.push_back(std::move(a[2]));
  }
  return s;
}

// Number of elements of `got` that differ from shard `rank` of the global state.
int64_t mismatches(const ModelLayout& layout, const FlatLayout& flat, int rank,
                   const ShardState& got) {
  const ShardState want = global_shard(layout, flat, rank);
  int64_t bad = 0;
  if (got.params.size() != want.params.size() || got.m.size() != want.m.size() ||
      got.v.size() != want.v.size())
    return -1;
  for (size_t u = 0; u < want.params.size(); ++u) {
    if (got.params[u] != want.params[u]) ++bad;
    if (got.m[u] != want.m[u]) ++bad;
    if (got.v[u] != want.v[u]) ++bad;
  }
  return bad;
}

CheckpointMeta make_meta(const ModelConfig& model, int64_t step, int shard_size, int64_t align) {
  CheckpointMeta meta;
  meta.model = model;
  meta.step = step;
  meta.seed = 1234567890123ull;
  meta.world_size = shard_size;
  meta.strategy = shard_size > 1 ? "full" : "none";
  meta.shard_size = shard_size;
  meta.align = align;
  meta.train = {{"lr", 0.001}, {"steps", 100}};
  meta.data = {{"global_batch", 8}, {"seq", 16}, {"sequences_consumed", 8 * step}};
  return meta;
}

// The one-rank world: a CPU device, its communicator and a stream.
struct OneRank {
  std::unique_ptr<Device> device = device_create_cpu();
  std::unique_ptr<Communicator> world = comm_world(*device, CommOptions{});
  std::unique_ptr<Stream> stream = device->stream_create("checkpoint");

  void save(const std::string& dir, const CheckpointMeta& meta, const ShardState& state) {
    const FlatLayout flat(ModelLayout(meta.model), meta.shard_size, meta.align);
    checkpoint_save(dir, meta, flat, 0, state, *world, *device, *stream);
  }
  // Saves the global state at shard size 1.
  void save_global(const std::string& dir, const ModelConfig& model, int64_t step,
                   int64_t align = 64) {
    const ModelLayout layout(model);
    save(dir, make_meta(model, step, 1, align),
         global_shard(layout, FlatLayout(layout, 1, align), 0));
  }
};

// Writes a checkpoint of the global state at `shards` shards straight from the format in
// docs/formats.md (as `shards` ranks would), without checkpoint_save.
void write_by_hand(const std::string& dir, const ModelConfig& model, int64_t step, int shards,
                   int64_t align) {
  const ModelLayout layout(model);
  const FlatLayout flat(layout, shards, align);
  const CheckpointMeta meta = make_meta(model, step, shards, align);
  nlohmann::json units = nlohmann::json::array(), files = nlohmann::json::array();
  for (int u = 0; u < flat.num_units(); ++u)
    units.push_back({{"name", layout.unit(u).name},
                     {"numel", flat.unit(u).numel},
                     {"padded", flat.unit(u).padded},
                     {"shard", flat.unit(u).shard}});
  for (int r = 0; r < shards; ++r) {
    const ShardState s = global_shard(layout, flat, r);
    std::vector<char> bytes(32);
    std::memcpy(bytes.data(), "TNDMCKPT", 8);
    const uint32_t fields[4] = {2, static_cast<uint32_t>(r), static_cast<uint32_t>(shards),
                                static_cast<uint32_t>(flat.num_units())};
    std::memcpy(bytes.data() + 8, fields, 16);
    const uint64_t floats = 3 * static_cast<uint64_t>(flat.shard_total());
    std::memcpy(bytes.data() + 24, &floats, 8);
    for (int u = 0; u < flat.num_units(); ++u)
      for (const auto* a : {&s.params[static_cast<size_t>(u)], &s.m[static_cast<size_t>(u)],
                            &s.v[static_cast<size_t>(u)]}) {
        const char* p = reinterpret_cast<const char*>(a->data());
        bytes.insert(bytes.end(), p, p + a->size() * sizeof(float));
      }
    const std::string name = fmt::format("step-{:08d}-shard{}-of-{}.bin", step, r, shards);
    std::ofstream((fs::path(dir) / name).string(), std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    files.push_back(
        {{"rank", r},
         {"name", name},
         {"bytes", bytes.size()},
         {"checksum", checksum_hex(checksum_update(checksum_init(), bytes.data(), bytes.size()))}});
  }
  const nlohmann::json index = {{"format", "tandem-checkpoint"},
                                {"version", 2},
                                {"model", model_config_to_json(model)},
                                {"step", step},
                                {"seed", meta.seed},
                                {"world_size", shards},
                                {"strategy", meta.strategy},
                                {"shard_size", shards},
                                {"align", align},
                                {"train", meta.train},
                                {"data", meta.data},
                                {"units", units},
                                {"files", files}};
  std::ofstream((fs::path(dir) / "index.json").string()) << index.dump(2);
}

// Loads every shard at shard sizes 1, 2, 3, 4, 8 and alignments 1 and 64, checking every
// element (zeros past numel included).
void expect_loads_everywhere(const std::string& dir, const ModelConfig& model) {
  const ModelLayout layout(model);
  for (int n : {1, 2, 3, 4, 8})
    for (int64_t align : {int64_t{1}, int64_t{64}}) {
      const FlatLayout flat(layout, n, align);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(mismatches(layout, flat, r, checkpoint_load_shard(dir, flat, r)), 0)
            << "shard " << r << " of " << n << ", alignment " << align;
    }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ShardCheckpoint, SavedAtOneShardLoadsAtAnyShardSize) {
  for (int64_t align : {int64_t{1}, int64_t{64}}) {
    TempDir tmp;
    const std::string dir = tmp.file(fmt::format("ckpt-a{}", align));
    OneRank one;
    one.save_global(dir, small_model(), 7, align);
    expect_loads_everywhere(dir, small_model());
  }
}

TEST(ShardCheckpoint, WrittenAtSeveralShardsLoadsAtAnyShardSize) {
  for (int shards : {2, 3, 4})
    for (int64_t align : {int64_t{1}, int64_t{64}}) {
      TempDir tmp;
      const std::string dir = tmp.file(fmt::format("ckpt-{}-a{}", shards, align));
      fs::create_directories(dir);
      write_by_hand(dir, small_model(), 3, shards, align);
      SCOPED_TRACE(fmt::format("written at {} shards, alignment {}", shards, align));
      expect_loads_everywhere(dir, small_model());
    }
}

TEST(ShardCheckpoint, PresetModelRoundTrips) {
  TempDir tmp;
  const ModelConfig model = preset("llama-tiny");
  const ModelLayout layout(model);
  OneRank one;
  one.save_global(tmp.file("ckpt"), model, 1);
  const FlatLayout flat(layout, 3, 64);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(mismatches(layout, flat, r, checkpoint_load_shard(tmp.file("ckpt"), flat, r)), 0);
}

TEST(ShardCheckpoint, LoadParamsEqualsTheOriginal) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir);
  write_by_hand(dir, small_model(), 9, 3, 64);
  CheckpointMeta meta;
  const auto params = checkpoint_load_params(dir, &meta);
  const ModelLayout layout(small_model());
  ASSERT_EQ(params.size(), static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> want;
    for (int64_t f = 0; f < layout.unit(u).numel; ++f)
      want.push_back(global_value(layout, u, 0, f));
    EXPECT_EQ(params[static_cast<size_t>(u)], want) << "unit " << u;
  }
  EXPECT_EQ(meta.step, 9);
  EXPECT_EQ(meta.shard_size, 3);
  EXPECT_EQ(checkpoint_load_params(dir), params);
}

TEST(ShardCheckpoint, IndexAndFilesFollowTheFormat) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 42);
  EXPECT_EQ(listing(dir),
            (std::vector<std::string>{"index.json", "step-00000042-shard0-of-1.bin"}));

  const nlohmann::json index = read_json(tmp.file("ckpt/index.json"));
  for (const char* key : {"format", "version", "model", "step", "seed", "world_size", "strategy",
                          "shard_size", "align", "train", "data", "units", "files"})
    EXPECT_TRUE(index.contains(key)) << key;
  EXPECT_EQ(index["format"], "tandem-checkpoint");
  EXPECT_EQ(index["version"], 2);
  EXPECT_EQ(index["step"], 42);
  EXPECT_EQ(index["shard_size"], 1);
  EXPECT_EQ(index["align"], 64);
  const ModelLayout layout(small_model());
  const FlatLayout flat(layout, 1, 64);
  ASSERT_EQ(index["units"].size(), static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto& j = index["units"][static_cast<size_t>(u)];
    EXPECT_EQ(j["name"], layout.unit(u).name);
    EXPECT_EQ(j["numel"], flat.unit(u).numel);
    EXPECT_EQ(j["padded"], flat.unit(u).padded);
    EXPECT_EQ(j["shard"], flat.unit(u).shard);
  }
  ASSERT_EQ(index["files"].size(), 1u);
  const auto& f = index["files"][0];
  EXPECT_EQ(f["rank"], 0);
  EXPECT_EQ(f["name"], "step-00000042-shard0-of-1.bin");
  const std::vector<char> bytes = file_read_all(tmp.file("ckpt/step-00000042-shard0-of-1.bin"));
  EXPECT_EQ(f["bytes"], bytes.size());
  EXPECT_EQ(bytes.size(), 32 + 12 * static_cast<size_t>(flat.shard_total()));
  EXPECT_EQ(f["checksum"],
            checksum_hex(checksum_update(checksum_init(), bytes.data(), bytes.size())));
  EXPECT_EQ(std::string(bytes.data(), 8), "TNDMCKPT");
  uint32_t fields[4];
  uint64_t floats;
  std::memcpy(fields, bytes.data() + 8, 16);
  std::memcpy(&floats, bytes.data() + 24, 8);
  EXPECT_EQ(fields[0], 2u);
  EXPECT_EQ(fields[1], 0u);
  EXPECT_EQ(fields[2], 1u);
  EXPECT_EQ(fields[3], static_cast<uint32_t>(layout.num_units()));
  EXPECT_EQ(floats, 3 * static_cast<uint64_t>(flat.shard_total()));
  // The first unit's params, then its m, start right after the header.
  float first[2];
  std::memcpy(&first[0], bytes.data() + 32, 4);
  std::memcpy(&first[1], bytes.data() + 32 + 4 * flat.unit(0).shard, 4);
  EXPECT_EQ(first[0], global_value(layout, 0, 0, 0));
  EXPECT_EQ(first[1], global_value(layout, 0, 1, 0));
}

TEST(ShardCheckpoint, MetaRoundTrips) {
  TempDir tmp;
  OneRank one;
  const ModelLayout layout(small_model());
  CheckpointMeta meta = make_meta(small_model(), 17, 1, 1);
  meta.world_size = 4;  // hybrid-like: sharded over 1 of 4 ranks
  meta.strategy = "hybrid";
  one.save(tmp.file("ckpt"), meta, global_shard(layout, FlatLayout(layout, 1, 1), 0));
  const CheckpointMeta got = checkpoint_read_meta(tmp.file("ckpt"));
  EXPECT_TRUE(got.model == meta.model);
  EXPECT_EQ(got.model.name, "ckpt-test");
  EXPECT_EQ(got.step, 17);
  EXPECT_EQ(got.seed, meta.seed);
  EXPECT_EQ(got.world_size, 4);
  EXPECT_EQ(got.strategy, "hybrid");
  EXPECT_EQ(got.shard_size, 1);
  EXPECT_EQ(got.align, 1);
  EXPECT_EQ(got.train, meta.train);
  EXPECT_EQ(got.data, meta.data);
}

TEST(ShardCheckpoint, NewSaveRemovesOlderFiles) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  write_text(tmp.file("ckpt/notes.txt"), "kept");
  write_text(tmp.file("ckpt/step-00000003-shard1-of-2.bin"), "stale");
  write_text(tmp.file("ckpt/step-00000004-shard0-of-1.bin.tmp"), "partial");
  one.save_global(dir, small_model(), 10);
  EXPECT_EQ(listing(dir),
            (std::vector<std::string>{"index.json", "notes.txt", "step-00000010-shard0-of-1.bin"}));
  EXPECT_EQ(checkpoint_read_meta(dir).step, 10);
  expect_loads_everywhere(dir, small_model());

  // A save at the same step replaces the files in place.
  one.save_global(dir, small_model(), 10);
  EXPECT_EQ(checkpoint_read_meta(dir).step, 10);
  const ModelLayout layout(small_model());
  const FlatLayout flat(layout, 2);
  EXPECT_EQ(mismatches(layout, flat, 1, checkpoint_load_shard(dir, flat, 1)), 0);
}

TEST(ShardCheckpoint, CrashBeforeTheIndexKeepsThePreviousCheckpoint) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  // A later save that died after writing (part of) its files but before the index.
  write_text(tmp.file("ckpt/step-00000010-shard0-of-2.bin"), "complete but never indexed");
  write_text(tmp.file("ckpt/step-00000010-shard1-of-2.bin.tmp"), "partial");
  write_text(tmp.file("ckpt/index.json.tmp"), "{\"format\": \"tandem-che");
  EXPECT_EQ(checkpoint_read_meta(dir).step, 5);
  expect_loads_everywhere(dir, small_model());
}

TEST(ShardCheckpoint, FailedSaveWritesNoIndex) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  const ModelLayout layout(small_model());

  // A state that does not fit the layout.
  ShardState bad = global_shard(layout, FlatLayout(layout, 1, 64), 0);
  bad.m[1].pop_back();
  std::string msg = error_of([&] { one.save(dir, make_meta(small_model(), 10, 1, 64), bad); });
  EXPECT_CONTAINS(msg, dir);
  EXPECT_CONTAINS(msg, "(step 10) failed, no index written: rank 0: unit 1 of the shard state");

  // A file that cannot be written: a directory where its temporary goes.
  fs::create_directories(tmp.file("ckpt/step-00000010-shard0-of-1.bin.tmp"));
  msg = error_of([&] { one.save_global(dir, small_model(), 10); });
  EXPECT_CONTAINS(msg, "failed, no index written");
  EXPECT_CONTAINS(msg, "rank 0: cannot create");
  fs::remove(tmp.file("ckpt/step-00000010-shard0-of-1.bin.tmp"));

  EXPECT_EQ(checkpoint_read_meta(dir).step, 5);
  expect_loads_everywhere(dir, small_model());

  // Meta and layout that disagree.
  CheckpointMeta meta = make_meta(small_model(), 11, 1, 64);
  meta.align = 32;
  msg = error_of([&] {
    const FlatLayout flat(layout, 1, 64);
    checkpoint_save(dir, meta, flat, 0, global_shard(layout, flat, 0), *one.world, *one.device,
                    *one.stream);
  });
  EXPECT_CONTAINS(msg, "alignment 32");
  // More shards than ranks.
  msg = error_of([&] {
    const FlatLayout flat(layout, 2, 64);
    checkpoint_save(dir, make_meta(small_model(), 11, 2, 64), flat, 0,
                    global_shard(layout, flat, 0), *one.world, *one.device, *one.stream);
  });
  EXPECT_CONTAINS(msg, "shard size 2 exceeds the 1 ranks");
  EXPECT_EQ(checkpoint_read_meta(dir).step, 5);

  // A directory that cannot be created.
  write_text(tmp.file("file"), "x");
  msg = error_of([&] { one.save_global(tmp.file("file/ckpt"), small_model(), 1); });
  EXPECT_CONTAINS(msg, "cannot create checkpoint directory");
}

TEST(ShardCheckpoint, CorruptionIsDetected) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir);
  write_by_hand(dir, small_model(), 2, 2, 64);
  const std::string file = tmp.file("ckpt/step-00000002-shard1-of-2.bin");
  std::vector<char> bytes = file_read_all(file);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(file, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  EXPECT_EQ(checkpoint_read_meta(dir).step, 2);  // sizes still match: the index reads fine
  const ModelLayout layout(small_model());
  std::string msg = error_of([&] { checkpoint_load_shard(dir, FlatLayout(layout, 1), 0); });
  EXPECT_CONTAINS(msg, "step-00000002-shard1-of-2.bin' fails its checksum");
  msg = error_of([&] { checkpoint_load_params(dir); });
  EXPECT_CONTAINS(msg, "fails its checksum");
  // A shard made only of the intact file's elements still loads.
  EXPECT_EQ(mismatches(layout, FlatLayout(layout, 2, 64), 0,
                       checkpoint_load_shard(dir, FlatLayout(layout, 2, 64), 0)),
            0);

  // A header that disagrees with the index, under a valid checksum.
  bytes[bytes.size() / 2] ^= 0x10;
  bytes[12] = 0;  // shard rank 1 -> 0
  std::ofstream(file, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  nlohmann::json index = read_json(tmp.file("ckpt/index.json"));
  index["files"][1]["checksum"] =
      checksum_hex(checksum_update(checksum_init(), bytes.data(), bytes.size()));
  write_text(tmp.file("ckpt/index.json"), index.dump());
  msg = error_of([&] { checkpoint_load_params(dir); });
  EXPECT_CONTAINS(msg, "holds shard 0 of 2, the index lists it as shard 1 of 2");
}

TEST(ShardCheckpoint, MalformedCheckpointsFailClearly) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  const std::string index_path = tmp.file("ckpt/index.json");
  const nlohmann::json good = read_json(index_path);
  const std::string shard = tmp.file("ckpt/step-00000005-shard0-of-1.bin");

  // Each case: the index (or nothing) to write, and a part of the expected message.
  auto expect_meta_error = [&](const nlohmann::json& index, const std::string& part) {
    write_text(index_path, index.dump());
    const std::string msg = error_of([&] { checkpoint_read_meta(dir); });
    EXPECT_CONTAINS(msg, dir);
    EXPECT_CONTAINS(msg, part);
  };

  EXPECT_CONTAINS(error_of([&] { checkpoint_read_meta(tmp.file("absent")); }), "does not exist");
  write_text(tmp.file("plain"), "x");
  EXPECT_CONTAINS(error_of([&] { checkpoint_read_meta(tmp.file("plain")); }), "is not a directory");
  fs::create_directories(tmp.file("empty"));
  EXPECT_CONTAINS(error_of([&] { checkpoint_read_meta(tmp.file("empty")); }), "has no index.json");

  write_text(index_path, "{ not json");
  EXPECT_CONTAINS(error_of([&] { checkpoint_read_meta(dir); }), "is not valid JSON");

  nlohmann::json j = good;
  j["format"] = "something-else";
  expect_meta_error(j, "is not a tandem checkpoint");
  expect_meta_error(nlohmann::json::array(), "is not a tandem checkpoint");
  j = good;
  j["version"] = 1;
  expect_meta_error(j, "has version 1 (this build reads 2)");
  for (const char* key : {"version", "model", "step", "seed", "world_size", "strategy",
                          "shard_size", "align", "units", "files"}) {
    j = good;
    j.erase(key);
    expect_meta_error(j, fmt::format("has no key '{}'", key));
  }
  j = good;
  j["model"]["d_model"] = 13;
  expect_meta_error(j, "has a bad model config: model config: d_model 13");
  j = good;
  j["model"]["colour"] = "blue";
  expect_meta_error(j, "has a bad model config");
  j = good;
  j["step"] = "five";
  expect_meta_error(j, "key 'step' must be an integer");
  j = good;
  j["world_size"] = 1e300;  // a float: converting it to int would be undefined
  expect_meta_error(j, "key 'world_size' must be an integer");
  j = good;
  j["align"] = int64_t{1} << 40;
  expect_meta_error(j, "alignment 1099511627776");
  j = good;
  j["model"]["n_layer"] = 1000000;  // far more than the shard files hold
  expect_meta_error(j, "shard files hold only");
  j = good;
  j["step"] = -1;
  expect_meta_error(j, "negative step");
  j = good;
  j["shard_size"] = 2;
  expect_meta_error(j, "shard size 2 for world size 1");
  j = good;
  j["align"] = 0;
  expect_meta_error(j, "alignment 0");
  j = good;
  j["units"].erase(1);
  expect_meta_error(j, "lists 3 units, its model has 4");
  j = good;
  j["units"][1]["numel"] = 5;
  expect_meta_error(j, "lists unit 1 as");
  j = good;
  j["units"][2]["shard"] = 64;
  expect_meta_error(j, "lists unit 2 as");
  j = good;
  j["files"].push_back(j["files"][0]);
  expect_meta_error(j, "lists 2 shard files, its shard size is 1");
  j = good;
  j["files"] = nlohmann::json::object();
  expect_meta_error(j, "lists 0 shard files");
  j = good;
  j["files"][0]["name"] = "../elsewhere.bin";
  expect_meta_error(j, "expected rank 0 'step-00000005-shard0-of-1.bin'");
  j = good;
  j["files"][0]["bytes"] = 100;
  expect_meta_error(j, "with 100 bytes, its layout needs");
  j = good;
  j["files"][0]["checksum"] = "xyz";
  expect_meta_error(j, "checksum 'xyz'");
  j = good;
  j["files"][0].erase("checksum");
  expect_meta_error(j, "is malformed");

  // A repeated key would silently win in nlohmann; the index refuses it.
  std::string text = good.dump();
  text.insert(text.find("\"step\":"), "\"step\":4,");
  write_text(index_path, text);
  std::string dup = error_of([&] { checkpoint_read_meta(dir); });
  EXPECT_CONTAINS(dup, index_path);
  EXPECT_CONTAINS(dup, "has the key 'step' twice");
  text = good.dump();
  text.insert(text.find("\"d_model\":"), "\"d_model\":16,");
  write_text(index_path, text);
  EXPECT_CONTAINS(error_of([&] { checkpoint_read_meta(dir); }),
                  "has the key 'd_model' twice (in 'model')");

  // The files themselves.
  write_text(index_path, good.dump());
  EXPECT_EQ(checkpoint_read_meta(dir).step, 5);
  const std::vector<char> bytes = file_read_all(shard);
  fs::resize_file(shard, bytes.size() - 4);
  std::string msg = error_of([&] { checkpoint_read_meta(dir); });
  EXPECT_CONTAINS(msg, "(truncated?)");
  EXPECT_CONTAINS(msg, shard);
  fs::remove(shard);
  msg = error_of([&] { checkpoint_load_params(dir); });
  EXPECT_CONTAINS(msg, "is missing its file");
  EXPECT_CONTAINS(msg, shard);
}

TEST(ShardCheckpoint, LoadRejectsAnotherModelsLayout) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  ModelConfig other = small_model();
  other.n_layer = 3;
  std::string msg =
      error_of([&] { checkpoint_load_shard(dir, FlatLayout(ModelLayout(other), 2), 0); });
  EXPECT_CONTAINS(msg, "holds 4 units (model 'ckpt-test'), the layout to load has 5");
  other = small_model();
  other.d_ff = 24;
  msg = error_of([&] { checkpoint_load_shard(dir, FlatLayout(ModelLayout(other), 2), 0); });
  EXPECT_CONTAINS(msg, "the layout to load has");
  msg = error_of([&] { checkpoint_load_shard(dir, FlatLayout(ModelLayout(small_model()), 2), 2); });
  EXPECT_CONTAINS(msg, "shard rank 2");
}

TEST(ShardCheckpoint, CheckModelComparesArchitectureOnly) {
  CheckpointMeta meta = make_meta(small_model(), 1, 1, 64);
  ModelConfig renamed = small_model();
  renamed.name = "another-name";
  checkpoint_check_model(meta, renamed);
  ModelConfig wider = small_model();
  wider.d_model = 24;
  EXPECT_CONTAINS(error_of([&] { checkpoint_check_model(meta, wider); }),
                  "checkpoint holds model 'ckpt-test'");
}

// A checkpoint is a run's last good state: NaN or Inf in any of parameters, first or second
// moments is refused before a file is written, naming the unit, and the previous
// checkpoint stays.
TEST(ShardCheckpoint, NonFiniteStateIsNeverSaved) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  OneRank one;
  one.save_global(dir, small_model(), 5);
  const ModelLayout layout(small_model());
  const FlatLayout flat(layout, 1, 64);
  for (int which = 0; which < 3; ++which) {
    ShardState bad = global_shard(layout, flat, 0);
    std::vector<float>& a = which == 0 ? bad.params[1] : which == 1 ? bad.m[1] : bad.v[1];
    a[3] = which == 2 ? std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::quiet_NaN();
    const std::string msg =
        error_of([&] { one.save(dir, make_meta(small_model(), 6, 1, 64), bad); });
    EXPECT_CONTAINS(msg, "(step 6) failed, no index written");
    EXPECT_CONTAINS(msg, "unit 1 ('" + layout.unit(1).name + "') holds non-finite");
    EXPECT_CONTAINS(msg, "refusing to save them");
    EXPECT_EQ(checkpoint_read_meta(dir).step, 5);
  }
  expect_loads_everywhere(dir, small_model());
}

}  // namespace
}  // namespace tandem
