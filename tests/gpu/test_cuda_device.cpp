// The CUDA device: memory, non-blocking prioritised streams, event ordering across streams
// (with a deliberate delay so a missing wait reads stale data), timing events, errors and
// the sticky stream failure the NCCL communicator relies on. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/cuda/cuda_device.h"
#include "device/device.h"
#include "gpu/gpu_test_util.h"

namespace tandem {
namespace {

using gpu_test::axpb_f32;
using gpu_test::fill_pattern_f32;
using gpu_test::sleep_ms;
using Clock = std::chrono::steady_clock;

// The delay of the producer stream: long enough that a consumer that does not wait runs
// (and reads) before the producer writes, even on a busy machine.
constexpr double kDelayMs = 200;

template <class F>
void expect_error_containing(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a tandem::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_SKIP_WITHOUT_GPU();
    gpu_ = gpu_test::local_gpu();
    dev_ = device_create_cuda(gpu_);
  }

  // n floats on the device, zeroed; freed at the end of the test.
  float* zeros(size_t n) {
    void* p = dev_->alloc(n * sizeof(float));
    owned_.emplace_back(p, Free{dev_.get()});
    const std::vector<float> z(n, 0.0f);
    dev_->copy_to_device(p, z.data(), n * sizeof(float));
    return static_cast<float*>(p);
  }

  std::vector<float> host(const float* p, size_t n) {
    std::vector<float> out(n);
    dev_->copy_to_host(out.data(), p, n * sizeof(float));
    return out;
  }

  static void expect_all(const std::vector<float>& v, float value, const char* what) {
    size_t bad = 0;
    for (float x : v) bad += x != value;
    EXPECT_EQ(bad, 0u) << what << ": expected every element to be " << value << ", first is "
                       << v.front();
  }

  struct Free {
    Device* dev;
    void operator()(void* p) const { dev->free(p); }
  };

  int gpu_ = 0;
  std::unique_ptr<Device> dev_;
  std::vector<std::unique_ptr<void, Free>> owned_;  // destroyed before dev_
};

// --- identity and memory -----------------------------------------------------------------

TEST_F(CudaDeviceTest, KindAndName) {
  EXPECT_EQ(dev_->kind(), DeviceKind::cuda);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, gpu_), cudaSuccess);
  const std::string name = dev_->name();
  EXPECT_NE(name.find("cuda:" + std::to_string(gpu_)), std::string::npos) << name;
  EXPECT_NE(name.find(prop.name), std::string::npos) << name;
  EXPECT_EQ(cuda_gpu_of(*dev_), gpu_);
  auto same = device_create(DeviceKind::cuda, gpu_);
  EXPECT_EQ(same->name(), name);
}

TEST_F(CudaDeviceTest, AllocCopyRoundTrip) {
  EXPECT_EQ(dev_->alloc(0), nullptr);
  dev_->free(nullptr);
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{4096}, size_t{1} << 20, size_t{48} << 20}) {
    void* p = dev_->alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    std::vector<unsigned char> src(bytes), dst(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
    dev_->copy_to_device(p, src.data(), bytes);
    dev_->copy_to_host(dst.data(), p, bytes);
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0) << bytes;
    dev_->free(p);
  }
  dev_->copy_to_device(nullptr, nullptr, 0);  // zero bytes: nothing to do
  expect_error_containing([&] { dev_->copy_to_host(nullptr, nullptr, 4); }, "null pointer");
}

// --- streams -----------------------------------------------------------------------------

TEST_F(CudaDeviceTest, StreamsAreNonBlockingWithPriorities) {
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  auto compute = dev_->stream_create("compute", 0);
  auto comm = dev_->stream_create("all-gather", 1);
  EXPECT_EQ(compute->name(), "compute");
  EXPECT_EQ(comm->name(), "all-gather");
  for (Stream* s : {compute.get(), comm.get()}) {
    unsigned flags = 0;
    ASSERT_EQ(cudaStreamGetFlags(cuda_stream_of(*s), &flags), cudaSuccess);
    EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking))
        << s->name();
    EXPECT_NE(cuda_stream_of(*s), nullptr) << "never the legacy default stream";
  }
  int p0 = 0, p1 = 0;
  ASSERT_EQ(cudaStreamGetPriority(cuda_stream_of(*compute), &p0), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(cuda_stream_of(*comm), &p1), cudaSuccess);
  EXPECT_EQ(p0, least);
  EXPECT_EQ(p1, greatest);
  EXPECT_LE(p1, p0) << "communication streams get the greatest (numerically lowest) priority";
  expect_error_containing([&] { dev_->stream_create("odd", 2); }, "priority 2");
}

TEST_F(CudaDeviceTest, SubmitRunsAtOnceOnTheHost) {
  auto s = dev_->stream_create("compute", 0);
  float* x = zeros(1000);
  bool ran = false;
  dev_->submit(*s, [&] {
    ran = true;
    fill_pattern_f32(cuda_stream_of(*s), x, 1000, 5.0f);
  });
  EXPECT_TRUE(ran) << "submit calls the closure before it returns";
  dev_->stream_sync(*s);
  const std::vector<float> v = host(x, 1000);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 5.0f + static_cast<float>(i % 7)) << i;
  expect_error_containing([&] { dev_->submit(*s, nullptr); }, "empty task");
  expect_error_containing([&] { dev_->submit(*s, [] { TD_THROW("from the closure"); }); },
                          "from the closure");
}

// A -> B -> C through events, with A delayed: without the waits B would read x before A
// wrote it (y = 1, z = 2) and C would read y before B wrote it (z = 0).
TEST_F(CudaDeviceTest, EventsOrderThreeStreams) {
  constexpr size_t n = 1 << 20;
  auto a = dev_->stream_create("a", 0);
  auto b = dev_->stream_create("b", 1);
  auto c = dev_->stream_create("c", 0);
  auto ea = dev_->event_create();
  auto eb = dev_->event_create();
  float* x = zeros(n);
  float* y = zeros(n);
  float* z = zeros(n);
  dev_->submit(*a, [&] {
    sleep_ms(cuda_stream_of(*a), kDelayMs);
    axpb_f32(cuda_stream_of(*a), x, x, n, 0.0f, 1.0f);  // x = 1
  });
  dev_->event_record(*ea, *a);
  dev_->stream_wait(*b, *ea);
  dev_->submit(*b, [&] { axpb_f32(cuda_stream_of(*b), y, x, n, 1.0f, 1.0f); });  // y = x + 1
  dev_->event_record(*eb, *b);
  dev_->stream_wait(*c, *eb);
  dev_->submit(*c, [&] { axpb_f32(cuda_stream_of(*c), z, y, n, 2.0f, 0.0f); });  // z = 2y
  dev_->stream_sync(*c);
  expect_all(host(z, n), 4.0f, "z after a -> b -> c");
  dev_->stream_sync(*a);
  dev_->stream_sync(*b);
}

// The control of the test above: with no wait, the consumer runs while the producer still
// sleeps, so streams really are concurrent (none of them serialises with another).
TEST_F(CudaDeviceTest, StreamsRunConcurrentlyWithoutWaits) {
  constexpr size_t n = 1 << 16;
  auto a = dev_->stream_create("a", 0);
  auto b = dev_->stream_create("b", 0);
  auto ea = dev_->event_create();
  float* x = zeros(n);
  float* y = zeros(n);
  dev_->submit(*a, [&] {
    sleep_ms(cuda_stream_of(*a), 4 * kDelayMs);
    axpb_f32(cuda_stream_of(*a), x, x, n, 0.0f, 1.0f);
  });
  dev_->event_record(*ea, *a);
  dev_->submit(*b, [&] { axpb_f32(cuda_stream_of(*b), y, x, n, 1.0f, 1.0f); });
  dev_->stream_sync(*b);
  EXPECT_FALSE(dev_->event_query(*ea)) << "the producer should still be sleeping";
  expect_all(host(y, n), 1.0f, "y read x before the producer wrote it");
  dev_->event_wait(*ea);
  EXPECT_TRUE(dev_->event_query(*ea));
  expect_all(host(x, n), 1.0f, "x after the producer");
}

TEST_F(CudaDeviceTest, EventWaitQueryAndNeverRecorded) {
  auto s = dev_->stream_create("s", 0);
  auto t = dev_->stream_create("t", 0);
  auto e = dev_->event_create();
  auto never = dev_->event_create();
  EXPECT_TRUE(dev_->event_query(*never));
  dev_->event_wait(*never);       // no-op
  dev_->stream_wait(*t, *never);  // no-op
  dev_->stream_sync(*t);
  dev_->submit(*s, [&] { sleep_ms(cuda_stream_of(*s), kDelayMs); });
  dev_->event_record(*e, *s);
  EXPECT_FALSE(dev_->event_query(*e));
  dev_->event_wait(*e);
  EXPECT_TRUE(dev_->event_query(*e));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a not-ready query leaves no error behind";
}

TEST_F(CudaDeviceTest, TimingEvents) {
  auto s = dev_->stream_create("s", 0);
  auto t0 = dev_->event_create(true);
  auto t1 = dev_->event_create(true);
  auto plain = dev_->event_create(false);
  expect_error_containing([&] { dev_->event_elapsed_ms(*t0, *t1); }, "never recorded");
  dev_->event_record(*t0, *s);
  dev_->submit(*s, [&] { sleep_ms(cuda_stream_of(*s), 50); });
  dev_->event_record(*t1, *s);
  dev_->event_record(*plain, *s);
  dev_->stream_sync(*s);
  const double ms = dev_->event_elapsed_ms(*t0, *t1);
  EXPECT_GE(ms, 45.0);
  EXPECT_LT(ms, 2000.0);
  expect_error_containing([&] { dev_->event_elapsed_ms(*t0, *plain); },
                          "not created with timing=true");
  // Re-recorded behind a long sleep: not complete yet.
  dev_->submit(*s, [&] { sleep_ms(cuda_stream_of(*s), kDelayMs); });
  dev_->event_record(*t1, *s);
  expect_error_containing([&] { dev_->event_elapsed_ms(*t0, *t1); }, "has not completed");
  dev_->stream_sync(*s);
  EXPECT_GE(dev_->event_elapsed_ms(*t0, *t1), 45.0 + kDelayMs * 0.9);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The synchronous copies use the device's own stream: they neither wait for nor block
// the other streams.
TEST_F(CudaDeviceTest, SyncCopiesDoNotWaitForOtherStreams) {
  auto s = dev_->stream_create("s", 0);
  float* x = zeros(256);
  dev_->submit(*s, [&] { sleep_ms(cuda_stream_of(*s), 5 * kDelayMs); });
  const Clock::time_point t0 = Clock::now();
  std::vector<float> v(256, 1.0f);
  dev_->copy_to_device(x, v.data(), 256 * sizeof(float));
  dev_->copy_to_host(v.data(), x, 256 * sizeof(float));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, 2 * kDelayMs) << "a synchronous copy waited for another stream";
  dev_->stream_sync(*s);
}

// --- errors ------------------------------------------------------------------------------

TEST_F(CudaDeviceTest, BadFreeAndHugeAllocThrow) {
  try {
    dev_->free(reinterpret_cast<void*>(uintptr_t{0x1000}));
    ADD_FAILURE() << "freeing a pointer cudaMalloc never returned should throw";
  } catch (const Error& e) {
    EXPECT_NE(e.call().find("cudaFree"), std::string::npos) << e.call();
    EXPECT_NE(std::string(e.what()).find("cudaErrorInvalidValue"), std::string::npos) << e.what();
    EXPECT_NE(e.file().find("cuda_device"), std::string::npos) << e.file();
    EXPECT_GT(e.line(), 0);
    EXPECT_EQ(e.rank(), error_rank());
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed call leaves no error behind";
  expect_error_containing([&] { dev_->alloc(size_t{1} << 52); }, "cudaMalloc of");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // The device still works.
  auto s = dev_->stream_create("s", 0);
  float* x = zeros(64);
  dev_->submit(*s, [&] { fill_pattern_f32(cuda_stream_of(*s), x, 64, 1.0f); });
  dev_->stream_sync(*s);
  EXPECT_EQ(host(x, 64)[3], 4.0f);
}

TEST_F(CudaDeviceTest, ForeignStreamsAndEventsAreRejected) {
  auto cpu = device_create_cpu();
  auto cpu_stream = cpu->stream_create("cpu", 0);
  auto cpu_event = cpu->event_create();
  auto s = dev_->stream_create("s", 0);
  auto e = dev_->event_create();
  expect_error_containing([&] { dev_->stream_sync(*cpu_stream); }, "does not belong to a cuda");
  expect_error_containing([&] { dev_->event_record(*cpu_event, *s); }, "does not belong to a cuda");
  expect_error_containing([&] { cuda_stream_of(*cpu_stream); }, "does not belong to a cuda");
  expect_error_containing([&] { cuda_gpu_of(*cpu); }, "is not a cuda device");
  expect_error_containing([&] { cpu->stream_sync(*s); }, "does not belong to the cpu device");
  dev_->event_record(*e, *s);
  dev_->event_wait(*e);
}

// [CUDA stream failure]: a failure marked on one stream is rethrown by every host wait on
// it, on its events, and on streams that waited on its events; unrelated streams are fine.
TEST_F(CudaDeviceTest, StreamFailureIsStickyAndSpreadsAlongWaits) {
  auto a = dev_->stream_create("a", 1);
  auto b = dev_->stream_create("b", 0);
  auto c = dev_->stream_create("c", 0);
  auto ea = dev_->event_create(true);
  auto eb = dev_->event_create();
  dev_->event_record(*ea, *a);
  dev_->stream_wait(*b, *ea);
  dev_->event_record(*eb, *b);
  dev_->stream_sync(*a);
  dev_->stream_sync(*b);
  std::exception_ptr failure;
  try {
    TD_THROW("all-gather 'block-3' timed out (injected)");
  } catch (...) {
    failure = std::current_exception();
  }
  cuda_stream_fail(*cuda_stream_health(*a), failure);
  for (int round = 0; round < 2; ++round) {  // sticky
    expect_error_containing([&] { dev_->stream_sync(*a); }, "block-3");
    expect_error_containing([&] { dev_->stream_sync(*b); }, "block-3");
    expect_error_containing([&] { dev_->event_wait(*ea); }, "block-3");
    expect_error_containing([&] { dev_->event_query(*eb); }, "block-3");
    expect_error_containing([&] { dev_->event_elapsed_ms(*ea, *ea); }, "block-3");
  }
  dev_->stream_sync(*c);
  // The first failure wins.
  try {
    TD_THROW("second failure");
  } catch (...) {
    cuda_stream_fail(*cuda_stream_health(*a), std::current_exception());
  }
  expect_error_containing([&] { dev_->stream_sync(*a); }, "block-3");
}

}  // namespace
}  // namespace tandem
