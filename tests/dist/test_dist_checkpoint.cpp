// Sharded checkpoints across ranks: every rank holds its shard of one global state, the
// world saves collectively (plain FSDP and hybrid-like shard sizes below the world size),
// and every rank reloads it at other shard sizes; a failing rank leaves no index anywhere.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "dist/dist_env.h"
#include "io/shard_checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "shard/flat.h"

namespace tandem::dist {
namespace {

namespace fs = std::filesystem;

// A small GPT-2 whose unit sizes are not multiples of the alignments tested.
ModelConfig small_model() {
  return model_config_from_json({{"name", "dist-ckpt-test"},
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

bool equal(const ShardState& a, const ShardState& b) {
  return a.params == b.params && a.m == b.m && a.v == b.v;
}

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

// Every test gets one directory all ranks share: rank 0 makes it, a broadcast names it.
class DistCheckpoint : public testing::Test {
 protected:
  void SetUp() override {
    char name[256] = {};
    if (rank == 0) {
      std::string templ = (fs::temp_directory_path() / "tandem_dist_ckpt_XXXXXX").string();
      if (::mkdtemp(templ.data()) != nullptr) std::strncpy(name, templ.c_str(), sizeof name - 1);
    }
    comm.broadcast(*stream, name, sizeof name / sizeof(float), DType::f32, 0, "checkpoint dir");
    dev.stream_sync(*stream);
    root = name;
    dir = root + "/ckpt";
  }
  void TearDown() override {
    barrier();
    std::error_code ec;
    if (rank == 0 && !root.empty()) fs::remove_all(root, ec);
  }

  void barrier() {
    comm.barrier(*stream, "checkpoint test");
    dev.stream_sync(*stream);
  }

  CheckpointMeta meta(int64_t step, int shard_size) const {
    CheckpointMeta m;
    m.model = small_model();
    m.step = step;
    m.seed = 99;
    m.world_size = size;
    m.strategy = shard_size == size ? "full" : "hybrid";
    m.shard_size = shard_size;
    m.align = 64;
    m.data = {{"global_batch", 4 * size}, {"seq", 8}, {"sequences_consumed", 4 * size * step}};
    return m;
  }

  // Saves the global state at `shard_size`: world rank r holds shard r % shard_size.
  void save(int64_t step, int shard_size) {
    const FlatLayout flat(layout, shard_size, 64);
    const int shard_rank = rank % shard_size;
    checkpoint_save(dir, meta(step, shard_size), flat, shard_rank,
                    global_shard(layout, flat, shard_rank), comm, dev, *stream);
  }

  // Every shard at shard sizes 1-4, alignments 1 and 64, loads as the global state.
  void expect_loads_everywhere() {
    for (int n = 1; n <= 4; ++n)
      for (int64_t align : {int64_t{1}, int64_t{64}}) {
        const FlatLayout flat(layout, n, align);
        for (int r = 0; r < n; ++r)
          EXPECT_TRUE(equal(checkpoint_load_shard(dir, flat, r), global_shard(layout, flat, r)))
              << "shard " << r << " of " << n << ", alignment " << align;
      }
  }

  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  Device& dev = device();
  Communicator& comm = world();
  std::unique_ptr<Stream> stream = dev.stream_create("checkpoint");
  const int rank = comm.rank();
  const int size = comm.size();
  const ModelLayout layout{small_model()};
  std::string root, dir;
};

TEST_F(DistCheckpoint, EveryShardSizeOfTheWorldLoadsAtAnyShardSize) {
  ASSERT_FALSE(root.empty()) << "rank 0 could not create a temporary directory";
  for (int s = 1; s <= size; ++s) {
    if (size % s != 0) continue;
    SCOPED_TRACE(fmt::format("saved at shard size {} of world {}", s, size));
    save(10 + s, s);
    const CheckpointMeta got = checkpoint_read_meta(dir);
    EXPECT_EQ(got.step, 10 + s);
    EXPECT_EQ(got.shard_size, s);
    EXPECT_EQ(got.world_size, size);
    EXPECT_EQ(got.data, meta(10 + s, s).data);
    // Only the new step's files remain, one per shard, whoever held copies.
    std::vector<std::string> want = {"index.json"};
    for (int r = 0; r < s; ++r)
      want.push_back(fmt::format("step-{:08d}-shard{}-of-{}.bin", 10 + s, r, s));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(listing(), want);
    expect_loads_everywhere();
    std::vector<float> expected;
    const auto params = checkpoint_load_params(dir);
    EXPECT_EQ(params.size(), static_cast<size_t>(layout.num_units()));
    for (int u = 0; u < layout.num_units() && static_cast<size_t>(u) < params.size(); ++u) {
      std::vector<float> p;
      for (int64_t f = 0; f < layout.unit(u).numel; ++f) p.push_back(global_value(layout, u, 0, f));
      EXPECT_EQ(params[static_cast<size_t>(u)], p) << "unit " << u;
    }
    barrier();  // everyone has read this checkpoint before the next save replaces it
  }
}

TEST_F(DistCheckpoint, FailureOnAnyRankLeavesThePreviousCheckpoint) {
  ASSERT_FALSE(root.empty()) << "rank 0 could not create a temporary directory";
  save(1, size);
  barrier();
  const int last = size - 1;

  // The last writer holds a state that does not fit the layout.
  {
    const FlatLayout flat(layout, size, 64);
    ShardState state = global_shard(layout, flat, rank);
    if (rank == last) state.v[0].pop_back();
    const std::string msg = error_of(
        [&] { checkpoint_save(dir, meta(2, size), flat, rank, state, comm, dev, *stream); });
    EXPECT_CONTAINS(msg, fmt::format("failed, no index written: rank {}: unit 0", last));
  }
  // The last writer cannot create its file: a directory sits where its temporary goes.
  if (rank == last)
    fs::create_directories(fmt::format("{}/step-00000003-shard{}-of-{}.bin.tmp", dir, last, size));
  barrier();
  EXPECT_CONTAINS(error_of([&] { save(3, size); }), fmt::format("rank {}: cannot create", last));
  barrier();
  if (rank == last)
    fs::remove(fmt::format("{}/step-00000003-shard{}-of-{}.bin.tmp", dir, last, size));
  // Ranks that disagree on what they save.
  if (size > 1) {
    const FlatLayout flat(layout, size, 64);
    const std::string msg = error_of([&] {
      checkpoint_save(dir, meta(rank == last ? 5 : 4, size), flat, rank,
                      global_shard(layout, flat, rank), comm, dev, *stream);
    });
    EXPECT_CONTAINS(
        msg, fmt::format("rank {}: it saves step 5 at shard size {}, rank 0 step 4", last, size));
  }
  // A rank holding a copy (not a writer) with a shard rank outside the layout.
  if (size > 1) {
    const FlatLayout flat(layout, 1, 64);
    const std::string msg = error_of([&] {
      checkpoint_save(dir, meta(6, 1), flat, rank == last ? 7 : 0, global_shard(layout, flat, 0),
                      comm, dev, *stream);
    });
    EXPECT_CONTAINS(msg, fmt::format("rank {}: shard rank 7 is outside [0, 1)", last));
  }

  barrier();
  EXPECT_EQ(checkpoint_read_meta(dir).step, 1);
  expect_loads_everywhere();
  // The next good save cleans up what the failed ones left.
  barrier();
  save(7, size);
  std::vector<std::string> want = {"index.json"};
  for (int r = 0; r < size; ++r)
    want.push_back(fmt::format("step-00000007-shard{}-of-{}.bin", r, size));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listing(), want);
}

}  // namespace
}  // namespace tandem::dist
