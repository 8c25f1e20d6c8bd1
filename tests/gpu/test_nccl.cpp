// The NCCL communicator through comm_world on a CUDA device. Without a launcher the world
// has one rank and no MPI; under mpirun (one GPU per rank) the same tests run at any size:
// every expected value is a closed form of the rank and the world size. Rank r's input is
// f(r, i) = 1 + r + (i % 7), small integers that f32 and bf16 sum exactly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/environment.h"
#include "comm/communicator.h"
#include "comm/cuda/nccl.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/cuda/cuda_device.h"
#include "device/device.h"
#include "gpu/gpu_test_util.h"

namespace tandem {
namespace {

using gpu_test::sleep_ms;

float f(int rank, size_t i) {
  return 1.0f + static_cast<float>(rank) + static_cast<float>(i % 7);
}

template <class F>
void expect_error_containing(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected a tandem::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// Finalises MPI after every test when the binary was started by mpirun.
class CommEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { comm_finalize(); }
};
[[maybe_unused]] const auto* const kCommEnvironment =
    ::testing::AddGlobalTestEnvironment(new CommEnvironment);

class NcclTest : public ::testing::TestWithParam<DType> {
 protected:
  // One device and one world for the whole suite (creating a world is a collective).
  static void SetUpTestSuite() {
    if (gpu_test::gpu_count() == 0) return;
    try {
      device_ = device_create_cuda(gpu_test::local_gpu()).release();
      world_ =
          comm_world(*device_, CommOptions{300, environment_from_process().launch.mpi}).release();
    } catch (const Error& e) {
      setup_error_ = e.describe();
    }
  }
  static void TearDownTestSuite() {
    delete world_;
    world_ = nullptr;
    delete device_;
    device_ = nullptr;
  }

  void SetUp() override {
    TD_SKIP_WITHOUT_GPU();
    ASSERT_NE(world_, nullptr) << "creating the NCCL world failed: " << setup_error_;
    dev_ = device_;
    rank_ = world_->rank();
    size_ = world_->size();
    comm_stream_ = dev_->stream_create("comm", 1);
    compute_ = dev_->stream_create("compute", 0);
  }

  void TearDown() override {
    if (comm_stream_) dev_->stream_sync(*comm_stream_);
    if (compute_) dev_->stream_sync(*compute_);
    for (void* p : owned_) dev_->free(p);
  }

  DType dtype() const { return GetParam(); }
  size_t es() const { return dtype_size(dtype()); }

  // n elements of dtype on the device holding `values` (converted for bf16).
  void* upload(const std::vector<float>& values) {
    void* p = dev_->alloc(values.size() * es());
    owned_.push_back(p);
    write(p, values);
    return p;
  }
  void write(void* p, const std::vector<float>& values) {
    if (dtype() == DType::f32) {
      dev_->copy_to_device(p, values.data(), values.size() * sizeof(float));
      return;
    }
    std::vector<uint16_t> h(values.size());
    for (size_t i = 0; i < values.size(); ++i) h[i] = bf16_from_f32(values[i]);
    dev_->copy_to_device(p, h.data(), h.size() * sizeof(uint16_t));
  }
  std::vector<float> download(const void* p, size_t n) {
    std::vector<float> out(n);
    if (dtype() == DType::f32) {
      dev_->copy_to_host(out.data(), p, n * sizeof(float));
      return out;
    }
    std::vector<uint16_t> h(n);
    dev_->copy_to_host(h.data(), p, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
    return out;
  }
  std::vector<float> mine(size_t n, size_t offset = 0) const {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = f(rank_, offset + i);
    return v;
  }
  // sum over ranks of f(r, i)
  float sum_f(size_t i) const {
    return static_cast<float>(size_) * (1.0f + static_cast<float>(i % 7)) +
           static_cast<float>(size_ * (size_ - 1) / 2);
  }

  static void expect_eq(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << ": got " << got[first]
                       << ", want " << want[first];
  }

  static inline Device* device_ = nullptr;
  static inline Communicator* world_ = nullptr;
  static inline std::string setup_error_;

  Device* dev_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<Stream> comm_stream_, compute_;
  std::vector<void*> owned_;
};

constexpr size_t kCount = 3001;  // odd, not a multiple of anything NCCL chunks by

TEST_P(NcclTest, WorldShape) {
  EXPECT_GE(size_, 1);
  EXPECT_GE(rank_, 0);
  EXPECT_LT(rank_, size_);
  EXPECT_EQ(world_->name(), "world");
  if (!environment_from_process().launch.mpi) {
    EXPECT_EQ(size_, 1) << "no launcher: one rank";
  }
  EXPECT_GE(nccl_version(), 21800);
  // [NVLS off]: set before the first NCCL init unless the user set it.
  EXPECT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
}

TEST_P(NcclTest, AllGather) {
  void* send = upload(mine(kCount));
  void* recv = upload(std::vector<float>(kCount * size_, -1.0f));
  world_->all_gather(*comm_stream_, send, recv, kCount, dtype(), "unit-0");
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount * size_);
  for (int r = 0; r < size_; ++r)
    for (size_t i = 0; i < kCount; ++i) want[r * kCount + i] = f(r, i);
  expect_eq(download(recv, kCount * size_), want, "all-gather");

  // In place: send is this rank's block of recv.
  void* buf = upload(std::vector<float>(kCount * size_, -1.0f));
  write(static_cast<char*>(buf) + rank_ * kCount * es(), mine(kCount));
  world_->all_gather(*comm_stream_, static_cast<char*>(buf) + rank_ * kCount * es(), buf, kCount,
                     dtype(), "unit-0");
  dev_->stream_sync(*comm_stream_);
  expect_eq(download(buf, kCount * size_), want, "all-gather in place");
}

TEST_P(NcclTest, ReduceScatter) {
  const size_t total = kCount * size_;
  void* send = upload(mine(total));
  void* recv = upload(std::vector<float>(kCount, -1.0f));
  world_->reduce_scatter(*comm_stream_, send, recv, kCount, dtype(), "unit-1");
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = sum_f(rank_ * kCount + i);
  expect_eq(download(recv, kCount), want, "reduce-scatter");

  // In place: recv is this rank's block of send.
  void* buf = upload(mine(total));
  void* block = static_cast<char*>(buf) + rank_ * kCount * es();
  world_->reduce_scatter(*comm_stream_, buf, block, kCount, dtype(), "unit-1");
  dev_->stream_sync(*comm_stream_);
  expect_eq(download(block, kCount), want, "reduce-scatter in place");
}

TEST_P(NcclTest, AllReduce) {
  void* send = upload(mine(kCount));
  void* recv = upload(std::vector<float>(kCount, -1.0f));
  world_->all_reduce(*comm_stream_, send, recv, kCount, dtype(), "grad-norm");
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = sum_f(i);
  expect_eq(download(recv, kCount), want, "all-reduce");
  expect_eq(download(send, kCount), mine(kCount), "all-reduce leaves send alone");

  world_->all_reduce(*comm_stream_, send, send, kCount, dtype(), "grad-norm");
  dev_->stream_sync(*comm_stream_);
  expect_eq(download(send, kCount), want, "all-reduce in place");
}

TEST_P(NcclTest, Broadcast) {
  for (int root = 0; root < size_; ++root) {
    void* buf = upload(mine(kCount));
    world_->broadcast(*comm_stream_, buf, kCount, dtype(), root, "init");
    dev_->stream_sync(*comm_stream_);
    std::vector<float> want(kCount);
    for (size_t i = 0; i < kCount; ++i) want[i] = f(root, i);
    expect_eq(download(buf, kCount), want, "broadcast from root " + std::to_string(root));
  }
}

TEST_P(NcclTest, BarrierAndEmptyCollectives) {
  world_->barrier(*comm_stream_, "step");
  world_->barrier(*compute_, "step");
  void* buf = upload(mine(16));
  world_->all_reduce(*comm_stream_, buf, buf, 0, dtype(), "empty");
  world_->all_gather(*comm_stream_, buf, buf, 0, dtype(), "empty");
  dev_->stream_sync(*comm_stream_);
  dev_->stream_sync(*compute_);
  expect_eq(download(buf, 16), mine(16), "zero-count collectives touch nothing");
}

// The producer pattern of the engine: the compute stream writes the send buffer after a
// delay, records an event, and the communication stream waits on it before the
// collective. Without the wait the collective would sum the zeros that were there before.
TEST_P(NcclTest, CollectiveWaitsForProducerStream) {
  void* send = upload(std::vector<float>(kCount, 0.0f));
  void* recv = upload(std::vector<float>(kCount, 0.0f));
  auto produced = dev_->event_create();
  const float base = 1.0f + static_cast<float>(rank_);
  dev_->submit(*compute_, [&] {
    cudaStream_t s = cuda_stream_of(*compute_);
    sleep_ms(s, 200);
    if (dtype() == DType::f32)
      gpu_test::fill_pattern_f32(s, static_cast<float*>(send), kCount, base);
    else
      gpu_test::fill_pattern_bf16(s, send, kCount, base);
  });
  dev_->event_record(*produced, *compute_);
  dev_->stream_wait(*comm_stream_, *produced);
  world_->all_reduce(*comm_stream_, send, recv, kCount, dtype(), "unit-2");
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = sum_f(i);
  expect_eq(download(recv, kCount), want, "all-reduce after the producer");
}

TEST_P(NcclTest, DuplicateAndSplit) {
  std::unique_ptr<Communicator> dup = world_->duplicate("all-gather");
  EXPECT_EQ(dup->name(), "all-gather");
  EXPECT_EQ(dup->rank(), rank_);
  EXPECT_EQ(dup->size(), size_);
  void* buf = upload(mine(kCount));
  dup->all_reduce(*comm_stream_, buf, buf, kCount, dtype(), "unit-3");
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = sum_f(i);
  expect_eq(download(buf, kCount), want, "all-reduce on the duplicate");

  // Two colors by parity, reversed keys: ranks of a group are ordered by descending rank.
  const int color = rank_ % 2;
  std::unique_ptr<Communicator> part = world_->split(color, size_ - rank_, "replicate");
  int members = 0, before = 0;
  for (int r = 0; r < size_; ++r)
    if (r % 2 == color) {
      ++members;
      before += r > rank_;
    }
  EXPECT_EQ(part->size(), members);
  EXPECT_EQ(part->rank(), before);
  EXPECT_EQ(part->name(), "replicate");
  std::vector<float> one(kCount, 1.0f);
  void* ones = upload(one);
  part->all_reduce(*comm_stream_, ones, ones, kCount, dtype(), "unit-3");
  dev_->stream_sync(*comm_stream_);
  expect_eq(download(ones, kCount), std::vector<float>(kCount, static_cast<float>(members)),
            "all-reduce on the split");
  expect_error_containing([&] { world_->split(-1, 0, "bad"); }, "color -1 is negative");
}

TEST_P(NcclTest, ArgumentErrors) {
  void* buf = upload(mine(64));
  expect_error_containing([&] { world_->broadcast(*comm_stream_, buf, 64, dtype(), size_, "x"); },
                          "is not a rank");
  expect_error_containing(
      [&] {
        world_->all_reduce(*comm_stream_, buf, static_cast<char*>(buf) + es(), 32, dtype(), "x");
      },
      "overlap");
  expect_error_containing([&] { world_->all_reduce(*comm_stream_, nullptr, buf, 4, dtype(), "x"); },
                          "null send buffer");
  auto cpu = device_create_cpu();
  auto cpu_stream = cpu->stream_create("cpu", 0);
  expect_error_containing([&] { world_->all_reduce(*cpu_stream, buf, buf, 4, dtype(), "x"); },
                          "does not belong to a cuda device");
}

// A communicator destroyed with collectives still queued waits for them first.
TEST_P(NcclTest, DestroyDrainsPendingCollectives) {
  std::unique_ptr<Communicator> dup = world_->duplicate("short-lived");
  void* buf = upload(mine(kCount));
  dev_->submit(*comm_stream_, [&] { sleep_ms(cuda_stream_of(*comm_stream_), 200); });
  dup->all_reduce(*comm_stream_, buf, buf, kCount, dtype(), "unit-4");
  dup.reset();
  dev_->stream_sync(*comm_stream_);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = sum_f(i);
  expect_eq(download(buf, kCount), want, "all-reduce completed before the destroy");
}

// [NCCL timeouts]: a collective held back on the GPU past the timeout fails its stream with
// an error naming the operation, the label and the rank, and the communicator is aborted:
// every later call on it rethrows. Other communicators are unaffected.
TEST_P(NcclTest, TimeoutFailsStreamAndCommunicator) {
  CommOptions options;
  options.timeout_s = 0.5;
  std::unique_ptr<Communicator> world = comm_world(*dev_, options);
  void* buf = upload(mine(kCount));
  struct HookGuard {
    ~HookGuard() { nccl_set_test_hook({}); }
  } guard;
  nccl_set_test_hook([](CUstream_st* s) { sleep_ms(s, 2000); });
  world->all_reduce(*comm_stream_, buf, buf, kCount, dtype(), "unit-7");
  nccl_set_test_hook({});
  const std::string expected = "all-reduce 'unit-7' timed out after 0.5 s on rank " +
                               std::to_string(world->rank()) + " of " +
                               std::to_string(world->size()) + " (communicator world)";
  expect_error_containing([&] { dev_->stream_sync(*comm_stream_); }, expected);
  expect_error_containing([&] { dev_->stream_sync(*comm_stream_); }, expected);  // sticky
  expect_error_containing(
      [&] { world->all_reduce(*compute_, buf, buf, kCount, dtype(), "unit-8"); }, expected);
  expect_error_containing([&] { world->duplicate("after"); }, expected);
  world.reset();         // an aborted communicator is destroyed without hanging
  comm_stream_.reset();  // failed for good; TearDown must not sync it

  // The suite's world still works.
  world_->all_reduce(*compute_, buf, buf, kCount, dtype(), "unit-9");
  dev_->stream_sync(*compute_);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NcclTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

}  // namespace
}  // namespace tandem
